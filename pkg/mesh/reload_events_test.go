package mesh_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/services/quota"
)

// syncBuffer is a log sink several goroutines write to.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// all returns every JSON log line.
func (b *syncBuffer) all(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, l := range bytes.Split(b.buf.Bytes(), []byte("\n")) {
		var m map[string]any
		if json.Unmarshal(l, &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// lines returns the JSON log lines with the given message.
func (b *syncBuffer) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, l := range bytes.Split(b.buf.Bytes(), []byte("\n")) {
		var m map[string]any
		if json.Unmarshal(l, &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// TestReloadReportsWhatChanged: an accepted reload publishes the changed paths on
// mantle.events.config.reloaded and logs them; a rejected one publishes and logs the
// validation error, and the running configuration stays (the next diff is against it).
func TestReloadReportsWhatChanged(t *testing.T) {
	logs := &syncBuffer{}
	cfg := testConfig()
	m := meshtest.StartWith(t, cfg, meshtest.All, mesh.Options{LogOutput: logs})
	nc, err := nats.Connect(m.NATSURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	sub, err := nc.SubscribeSync("mantle.events.config.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	next := func(wantSubject string) *eventsv1.ConfigReloadEvent {
		t.Helper()
		msg, err := sub.NextMsg(10 * time.Second) // waits for the event, never longer
		if err != nil {
			t.Fatalf("no %s event: %v", wantSubject, err)
		}
		if msg.Subject != wantSubject {
			t.Fatalf("event on %s, want %s", msg.Subject, wantSubject)
		}
		var ev eventsv1.ConfigReloadEvent
		if err := proto.Unmarshal(msg.Data, &ev); err != nil {
			t.Fatal(err)
		}
		return &ev
	}

	// What meshtest set for the process, so that only the changes below differ.
	cfg.Target, cfg.Events = "all", mesh.EventsConfig{NATSURL: m.NATSURL}
	cfg.Server.GRPCListenAddress, cfg.Server.HTTPListenAddress = "127.0.0.1:0", "127.0.0.1:0"
	hedged := cfg
	hedged.Router.Routes = slices.Clone(cfg.Router.Routes)
	hedged.Router.Routes[0].Hedge.Enabled = true
	hedged.Quota.Tenants = map[string]quota.RateLimits{"tight": {RPM: 3, TPM: 100000}}
	if err := m.Router.Reload(context.Background(), hedged); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	ev := next(events.SubjectConfigReloaded)
	wantPaths := []string{"quota.tenants.tight.rpm", "router.routes.chat.hedge.enabled"}
	if !slices.Equal(ev.ChangedPaths, wantPaths) || ev.Error != "" || !slices.Equal(ev.Targets, []string{"all"}) {
		t.Errorf("reloaded event: paths %q error %q targets %q; want paths %q", ev.ChangedPaths, ev.Error, ev.Targets, wantPaths)
	}
	lines := logs.lines(t, "configuration reloaded")
	if len(lines) != 1 {
		t.Fatalf("%d 'configuration reloaded' lines, want 1", len(lines))
	}
	if got := lines[0]["changes"]; !strings.Contains(text(got), "router.routes.chat.hedge.enabled: false -> true") ||
		!strings.Contains(text(got), "quota.tenants.tight.rpm: 2 -> 3") {
		t.Errorf("log changes = %v", got)
	}

	bad := hedged
	bad.Router.Routes = slices.Clone(hedged.Router.Routes)
	bad.Router.Routes[0].Candidates = []string{"nonexistent"}
	bad.Router.Routes[0].Hedge.Enabled = false
	if err := m.Router.Reload(context.Background(), bad); err == nil {
		t.Fatal("Reload of a route with an unknown model succeeded")
	}
	ev = next(events.SubjectConfigRejected)
	if !strings.Contains(ev.Error, "nonexistent") || len(ev.ChangedPaths) != 0 {
		t.Errorf("rejected event: error %q paths %q; want the validation error naming the model", ev.Error, ev.ChangedPaths)
	}
	if lines := logs.lines(t, "configuration not reloaded; the running one is kept"); len(lines) != 1 || !strings.Contains(text(lines[0]["err"]), "nonexistent") {
		t.Errorf("rejection log lines = %v", lines)
	}

	// The rejected configuration never ran: reloading the running one back changes nothing
	// against hedged, so the diff is empty only if hedged is still current.
	if err := m.Router.Reload(context.Background(), hedged); err != nil {
		t.Fatal(err)
	}
	if ev := next(events.SubjectConfigReloaded); len(ev.ChangedPaths) != 0 {
		t.Errorf("reloading the running configuration changed %q; the rejected one must not have been kept", ev.ChangedPaths)
	}
}

// text prints a decoded log value.
func text(v any) string { return fmt.Sprint(v) }
