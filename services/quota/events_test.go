package quota

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/pkg/natsembed"
	"github.com/mantle-mesh/mantle/services/quota/internal/ledger"
	"github.com/mantle-mesh/mantle/services/quota/internal/memstore"
)

// Rejections and near-limit signals reach NATS, one message type per subject, with
// tenant and reason.
func TestEventsOnNATS(t *testing.T) {
	t.Parallel()
	srv, err := natsembed.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	log := slog.New(slog.DiscardHandler)
	pub, err := events.Connect(context.Background(), srv.URL(), log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	sub, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sub.Close)
	msgs := make(chan *nats.Msg, 16)
	for _, subject := range []string{"mantle.events.quota", "mantle.events.quota.near_limit"} {
		if _, err := sub.ChanSubscribe(subject, msgs); err != nil {
			t.Fatal(err)
		}
	}
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}

	clock := clockwork.NewFakeClockAt(t0)
	svc, err := newService(testConfig(), serviceDeps{Store: memstore.New(clock), Clock: clock, Metrics: prometheus.NewRegistry(), Log: log, Events: pub})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := svc.Reserve(ctx, reserveRequest{Tenant: "acme", RequestID: "r1", Model: "m", InputTokens: 5000, MaxOutputTokens: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Reserve(ctx, reserveRequest{Tenant: "acme", RequestID: "r2", Model: "m", InputTokens: 5000, MaxOutputTokens: 1}); !errors.Is(err, ledger.ErrExhausted) {
		t.Fatalf("err = %v, want exhausted", err)
	}

	got := map[string]proto.Message{}
	for len(got) < 2 {
		select {
		case m := <-msgs:
			var msg proto.Message = &eventsv1.QuotaRejectionEvent{}
			if m.Subject == "mantle.events.quota.near_limit" {
				msg = &eventsv1.QuotaNearLimitEvent{}
			}
			if err := proto.Unmarshal(m.Data, msg); err != nil {
				t.Fatalf("%s: %v", m.Subject, err)
			}
			got[m.Subject] = msg
		case <-time.After(10 * time.Second): // a failure timeout, not a wait
			t.Fatalf("received %v, want a rejection and a near-limit event", got)
		}
	}
	rej := got["mantle.events.quota"].(*eventsv1.QuotaRejectionEvent)
	if rej.GetTenant() != "acme" || rej.GetReason() != "QUOTA_EXHAUSTED" || rej.GetRequestId() != "r2" || rej.GetBucket() != "tenant:acme:tpm" {
		t.Errorf("rejection = %v", rej)
	}
	near := got["mantle.events.quota.near_limit"].(*eventsv1.QuotaNearLimitEvent)
	if near.GetTenant() != "acme" || near.GetReason() != "NEAR_LIMIT" || near.GetRequestId() != "r1" || near.GetBucket() != "tenant:acme:tpm" {
		t.Errorf("near limit = %v", near)
	}
}
