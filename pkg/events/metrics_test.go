package events

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestSpoolMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	// The publisher's dropped counter registered first: the spool must share it.
	dropped, err := registerShared(reg, newDroppedCounter())
	if err != nil {
		t.Fatal(err)
	}
	s, err := OpenSpool(t.TempDir(), SpoolLimits{MaxRecords: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Instrument(reg); err != nil {
		t.Fatal(err)
	}
	const subject = "mantle.review.requests"
	for i := range 3 {
		_, err := s.Append(SpoolRecord{Subject: subject, MsgID: fmt.Sprint(i), Data: []byte("x")})
		if i < 2 && err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		if i == 2 && !errors.Is(err, ErrSpoolFull) {
			t.Fatalf("append over the limit: err = %v, want ErrSpoolFull", err)
		}
	}
	if got := counterValue(t, s.metrics.Load().spooled.WithLabelValues(subject)); got != 2 {
		t.Errorf("spooled = %v, want 2", got)
	}
	if got := counterValue(t, dropped.WithLabelValues(subject, dropSpoolFull)); got != 1 {
		t.Errorf("dropped{reason=spool_full} = %v, want 1 (on the shared counter)", got)
	}

	// The first publish fails: nothing is replayed; the second flush replays both.
	fail := true
	publish := func(context.Context, SpoolRecord) error {
		if fail {
			fail = false
			return errors.New("nats down")
		}
		return nil
	}
	if _, err := s.Flush(t.Context(), publish); err == nil {
		t.Fatal("flush with a failing publish succeeded")
	}
	if got := counterValue(t, s.metrics.Load().replayed.WithLabelValues(subject)); got != 0 {
		t.Errorf("replayed after a failed flush = %v, want 0", got)
	}
	if n, err := s.Flush(t.Context(), publish); err != nil || n != 2 {
		t.Fatalf("flush = %d, %v; want 2, nil", n, err)
	}
	if got := counterValue(t, s.metrics.Load().replayed.WithLabelValues(subject)); got != 2 {
		t.Errorf("replayed = %v, want 2", got)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	gauge := -1.0
	for _, mf := range mfs {
		if mf.GetName() == "mantle_events_spool_records" {
			gauge = mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	if gauge != 0 {
		t.Errorf("mantle_events_spool_records = %v, want 0 after the flush (-1: not exported)", gauge)
	}
}

// counterValue reads a counter (prometheus/testutil would need modules go.sum does not pin).
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func TestDropReason(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err  error
		want string
	}{
		{nats.ErrReconnectBufExceeded, dropBufferFull},
		{fmt.Errorf("publish: %w", nats.ErrConnectionClosed), dropClosed},
		{nats.ErrBadSubject, dropError},
		{nats.ErrMaxPayload, dropTooLarge},
		{errors.New("proto: cannot marshal"), dropError},
	}
	for _, tt := range tests {
		if got := dropReason(tt.err); got != tt.want {
			t.Errorf("dropReason(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

func TestRegisterSharedRefusesADifferentMetric(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	if err := reg.Register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mantle_events_dropped_total", Help: "h"}, []string{"subject"})); err != nil {
		t.Fatal(err)
	}
	if _, err := registerShared(reg, newDroppedCounter()); err == nil {
		t.Error("a dropped counter with other labels was accepted as the shared one")
	}
}
