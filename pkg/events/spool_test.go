package events

import (
	"context"
	"errors"
	"fmt"
	"github.com/mantle-mesh/mantle/pkg/natsembed"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

func rec(i int) SpoolRecord {
	return SpoolRecord{Subject: "mantle.review.requests", MsgID: fmt.Sprintf("rv_%d", i), Data: []byte(fmt.Sprintf("payload %d 复核", i))}
}

// collect is a Flush publish function that records what it was given and fails from the
// failAt-th call on (0: never).
type collect struct {
	got    []SpoolRecord
	failAt int
}

func (c *collect) publish(_ context.Context, r SpoolRecord) error {
	if c.failAt > 0 && len(c.got)+1 >= c.failAt {
		return errors.New("nats: no servers available")
	}
	r.Seq = 0 // compared without sequence numbers
	c.got = append(c.got, r)
	return nil
}

func openSpool(t *testing.T, dir string, limits SpoolLimits) *Spool {
	t.Helper()
	s, err := OpenSpool(dir, limits)
	if err != nil {
		t.Fatalf("OpenSpool: %v", err)
	}
	return s
}

func appendAll(t *testing.T, s *Spool, recs ...SpoolRecord) {
	t.Helper()
	for _, r := range recs {
		if _, err := s.Append(r); err != nil {
			t.Fatalf("Append(%s): %v", r.MsgID, err)
		}
	}
}

func TestSpoolFlushesInOrderAndSurvivesReopen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := openSpool(t, dir, SpoolLimits{})
	appendAll(t, s, rec(1), rec(2), rec(3))
	if got := s.Len(); got != 3 {
		t.Fatalf("Len = %d, want 3", got)
	}

	// A new process finds the records and continues the sequence after them.
	s2 := openSpool(t, dir, SpoolLimits{})
	if got := s2.Len(); got != 3 {
		t.Fatalf("Len after reopen = %d, want 3", got)
	}
	seq, err := s2.Append(rec(4))
	if err != nil || seq != 4 {
		t.Fatalf("Append after reopen = %d, %v; want sequence 4", seq, err)
	}
	var c collect
	n, err := s2.Flush(context.Background(), c.publish)
	if err != nil || n != 4 {
		t.Fatalf("Flush = %d, %v; want 4, nil", n, err)
	}
	if diff := cmp.Diff([]SpoolRecord{rec(1), rec(2), rec(3), rec(4)}, c.got); diff != "" {
		t.Errorf("published (-want +got):\n%s", diff)
	}
	if got := s2.Len(); got != 0 {
		t.Errorf("Len after flush = %d, want 0", got)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*"+spoolSuffix)); len(left) != 0 {
		t.Errorf("record files left after flush: %v", left)
	}
}

func TestSpoolFlushStopsAtFirstFailureAndKeepsTheRest(t *testing.T) {
	t.Parallel()
	s := openSpool(t, t.TempDir(), SpoolLimits{})
	appendAll(t, s, rec(1), rec(2), rec(3))
	c := collect{failAt: 2}
	n, err := s.Flush(context.Background(), c.publish)
	if n != 1 || err == nil {
		t.Fatalf("Flush = %d, %v; want 1 and an error", n, err)
	}
	if got := s.Len(); got != 2 {
		t.Fatalf("Len = %d, want 2 (the failed record and the one behind it)", got)
	}
	// The outage ends: the rest goes out, in order, exactly once.
	c.failAt = 0
	if n, err := s.Flush(context.Background(), c.publish); n != 2 || err != nil {
		t.Fatalf("second Flush = %d, %v; want 2, nil", n, err)
	}
	if diff := cmp.Diff([]SpoolRecord{rec(1), rec(2), rec(3)}, c.got); diff != "" {
		t.Errorf("published (-want +got):\n%s", diff)
	}
}

func TestSpoolRecovery(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// damage changes the spool directory between two processes.
		damage      func(t *testing.T, dir string)
		wantLen     int
		wantPublish []SpoolRecord
		wantCorrupt int
	}{
		{
			name: "unfinished write is discarded",
			damage: func(t *testing.T, dir string) {
				if err := os.WriteFile(filepath.Join(dir, spoolTmp+"9"), []byte("half a rec"), 0o600); err != nil {
					t.Fatal(err)
				}
			},
			wantLen: 2, wantPublish: []SpoolRecord{rec(1), rec(2)},
		},
		{
			name: "damaged record is quarantined, the next one still goes out",
			damage: func(t *testing.T, dir string) {
				path := filepath.Join(dir, spoolName(1))
				raw, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				raw[len(raw)/2] ^= 0xff
				if err := os.WriteFile(path, raw, 0o600); err != nil {
					t.Fatal(err)
				}
			},
			wantLen: 2, wantPublish: []SpoolRecord{rec(2)}, wantCorrupt: 1,
		},
		{
			name: "truncated record is quarantined",
			damage: func(t *testing.T, dir string) {
				if err := os.Truncate(filepath.Join(dir, spoolName(2)), 3); err != nil {
					t.Fatal(err)
				}
			},
			wantLen: 2, wantPublish: []SpoolRecord{rec(1)}, wantCorrupt: 1,
		},
		{
			name: "foreign files are ignored",
			damage: func(t *testing.T, dir string) {
				if err := os.WriteFile(filepath.Join(dir, "README"), []byte("hi"), 0o600); err != nil {
					t.Fatal(err)
				}
			},
			wantLen: 2, wantPublish: []SpoolRecord{rec(1), rec(2)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			appendAll(t, openSpool(t, dir, SpoolLimits{}), rec(1), rec(2))
			tt.damage(t, dir)
			s := openSpool(t, dir, SpoolLimits{})
			if got := s.Len(); got != tt.wantLen {
				t.Errorf("Len = %d, want %d", got, tt.wantLen)
			}
			if left, _ := filepath.Glob(filepath.Join(dir, spoolTmp+"*")); len(left) != 0 {
				t.Errorf("temporary files left: %v", left)
			}
			var c collect
			if _, err := s.Flush(context.Background(), c.publish); err != nil {
				t.Fatalf("Flush: %v", err)
			}
			if diff := cmp.Diff(tt.wantPublish, c.got); diff != "" {
				t.Errorf("published (-want +got):\n%s", diff)
			}
			corrupt, _ := filepath.Glob(filepath.Join(dir, spoolCorrupt, "*"))
			if len(corrupt) != tt.wantCorrupt {
				t.Errorf("quarantined %d records, want %d", len(corrupt), tt.wantCorrupt)
			}
			if got := s.Len(); got != 0 {
				t.Errorf("Len after flush = %d, want 0", got)
			}
		})
	}
}

func TestSpoolLimits(t *testing.T) {
	t.Parallel()
	size := int64(len(encodeSpoolRecord(rec(1))))
	tests := []struct {
		name   string
		limits SpoolLimits
	}{
		{"records", SpoolLimits{MaxRecords: 2}},
		{"bytes", SpoolLimits{MaxBytes: 2*size + 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := openSpool(t, t.TempDir(), tt.limits)
			appendAll(t, s, rec(1), rec(2))
			if _, err := s.Append(rec(3)); !errors.Is(err, ErrSpoolFull) {
				t.Fatalf("third Append = %v, want ErrSpoolFull", err)
			}
			var c collect
			if _, err := s.Flush(context.Background(), c.publish); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Append(rec(3)); err != nil {
				t.Errorf("Append after flush = %v, want room again", err)
			}
		})
	}
}

func TestSpoolConcurrentAppends(t *testing.T) {
	t.Parallel()
	s := openSpool(t, t.TempDir(), SpoolLimits{})
	const n = 32
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if _, err := s.Append(rec(i)); err != nil {
				t.Errorf("Append: %v", err)
			}
		})
	}
	wg.Wait()
	var c collect
	if got, err := s.Flush(context.Background(), c.publish); got != n || err != nil {
		t.Fatalf("Flush = %d, %v; want %d", got, err, n)
	}
	seen := map[string]bool{}
	for _, r := range c.got {
		seen[r.MsgID] = true
	}
	if len(seen) != n {
		t.Errorf("published %d distinct records, want %d", len(seen), n)
	}
}

func TestSpoolFlushHonoursCancellation(t *testing.T) {
	t.Parallel()
	s := openSpool(t, t.TempDir(), SpoolLimits{})
	appendAll(t, s, rec(1))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var c collect
	if n, err := s.Flush(ctx, c.publish); n != 0 || !errors.Is(err, context.Canceled) {
		t.Fatalf("Flush = %d, %v; want 0, context.Canceled", n, err)
	}
	if s.Len() != 1 {
		t.Errorf("Len = %d, want the record kept", s.Len())
	}
}

// embeddedJetStream starts an embedded NATS server for the test and connects to it.
func embeddedJetStream(t *testing.T) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	srv, err := natsembed.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

func TestPublishToJetStreamDeduplicates(t *testing.T) {
	t.Parallel()
	_, js := embeddedJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SPOOLTEST", Subjects: []string{"mantle.review.requests"}})
	if err != nil {
		t.Fatal(err)
	}
	publish := PublishToJetStream(js)
	// The same record twice, as after a crash between publishing and deleting it.
	for range 2 {
		if err := publish(ctx, rec(1)); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Errorf("stream holds %d messages, want 1 (the replay is de-duplicated)", info.State.Msgs)
	}
}

// TestSpoolMovesARefusedRecordAsideAndGoesOn: a record over the server's max payload was
// retried forever, every other record waiting behind it. Against a real server, it is moved
// to dead/ and counted, and the records behind it are published.
func TestSpoolMovesARefusedRecordAsideAndGoesOn(t *testing.T) {
	t.Parallel()
	nc, js := embeddedJetStream(t)
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "DEAD_T", Subjects: []string{"mantle.review.requests"}}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := openSpool(t, dir, SpoolLimits{MaxRecordBytes: 4 << 20})
	reg := prometheus.NewRegistry()
	if err := s.Instrument(reg); err != nil {
		t.Fatal(err)
	}
	var dead []string
	s.OnDeadLetter(func(r SpoolRecord, err error) { dead = append(dead, r.MsgID) })
	tooBig := SpoolRecord{Subject: "mantle.review.requests", MsgID: "rv_big", Data: make([]byte, nc.MaxPayload()+1)}
	appendAll(t, s, rec(1), tooBig, rec(2), rec(3))

	n, err := s.Flush(ctx, PublishToJetStream(js))
	if err != nil || n != 3 {
		t.Fatalf("Flush = %d, %v; want the 3 other records published", n, err)
	}
	if s.Len() != 0 {
		t.Errorf("%d records left in the spool", s.Len())
	}
	if diff := cmp.Diff([]string{"rv_big"}, dead); diff != "" {
		t.Errorf("dead-lettered (-want +got):\n%s", diff)
	}
	moved, err := os.ReadDir(filepath.Join(dir, spoolDead))
	if err != nil || len(moved) != 1 {
		t.Errorf("dead/ holds %v (%v), want the refused record", moved, err)
	}
	if got := counterValue(t, s.metrics.Load().deadLettered.WithLabelValues("mantle.review.requests")); got != 1 {
		t.Errorf("mantle_events_dead_lettered_total = %v, want 1", got)
	}
	stream, err := js.Stream(ctx, "DEAD_T")
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil || info.State.Msgs != 3 {
		t.Errorf("stream holds %d messages (%v), want 3", info.State.Msgs, err)
	}
}

func TestSpoolRefusesRecordsOverItsLimit(t *testing.T) {
	t.Parallel()
	s := openSpool(t, t.TempDir(), SpoolLimits{MaxRecordBytes: 10})
	if _, err := s.Append(SpoolRecord{Subject: "s", Data: make([]byte, 11)}); !errors.Is(err, ErrRecordTooLarge) {
		t.Fatalf("Append(11 bytes) = %v, want ErrRecordTooLarge", err)
	}
	if _, err := s.Append(SpoolRecord{Subject: "s", Data: make([]byte, 10)}); err != nil {
		t.Fatalf("Append(10 bytes) = %v", err)
	}
}
