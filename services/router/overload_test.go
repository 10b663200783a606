package router

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/router/internal/overload"
)

// TestOverloadShedsByPriority drives the shedder through an overload and out of it: while
// the CPU wait is over the limit, requests are refused with OVERLOADED by priority
// (critical never, batch first), each refusal is counted, and the start and the end of
// shedding are degradation events.
func TestOverloadShedsByPriority(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Overload = overload.Config{MaxSchedulingDelay: 100 * time.Millisecond, MinInFlight: 0, MaxShare: 0.9}
	delays := make(chan time.Duration)
	reads := make(chan struct{}, 1)
	h := newHarness(t, cfg, &harness{
		rand: func() float64 { return 0.2 },
		schedulingDelay: func() time.Duration {
			defer func() { reads <- struct{}{} }()
			return <-delays
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- h.router.shedder.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	// interval moves the clock one shedder interval on and has it read delay.
	interval := func(delay time.Duration) {
		t.Helper()
		if err := h.clock.BlockUntilContext(ctx, 1); err != nil {
			t.Fatal(err)
		}
		h.clock.Advance(overload.Interval)
		delays <- delay
		<-reads
	}
	asks := func(p mantlev1.Priority) error {
		req := ask("chat")
		req.Priority = p
		_, err := h.router.Complete(context.Background(), req)
		return err
	}

	for range 3 { // the share climbs to 0.3
		interval(300 * time.Millisecond)
	}
	if got := h.router.shedder.Share(); got < 0.29 || got > 0.31 {
		t.Fatalf("share after three overloaded intervals = %v, want 0.3", got)
	}
	// rand draws 0.2: normal (0.3) and batch (0.6) are shed; high (0.15) and critical are not.
	for _, tc := range []struct {
		priority mantlev1.Priority
		shed     bool
	}{
		{mantlev1.Priority_PRIORITY_CRITICAL, false},
		{mantlev1.Priority_PRIORITY_HIGH, false},
		{mantlev1.Priority_PRIORITY_UNSPECIFIED, true},
		{mantlev1.Priority_PRIORITY_NORMAL, true},
		{mantlev1.Priority_PRIORITY_BATCH, true},
	} {
		err := asks(tc.priority)
		if !tc.shed {
			if err != nil {
				t.Errorf("%v: %v, want an answer", tc.priority, err)
			}
			continue
		}
		if status.Code(err) != codes.Unavailable || rpc.ErrorInfo(err).GetReason() != ReasonOverloaded {
			t.Errorf("%v: %v, want UNAVAILABLE with reason OVERLOADED", tc.priority, err)
		}
		if d, ok := rpc.RetryDelay(err); !ok || d != time.Second {
			t.Errorf("%v: retry delay %v (%v), want 1s", tc.priority, d, ok)
		}
	}
	for label, want := range map[string]float64{"critical": 0, "high": 0, "normal": 2, "batch": 1} {
		if got := counterValue(t, h.router.deps.Metrics.shed.WithLabelValues(label)); got != want {
			t.Errorf("shed{priority=%s} = %v, want %v", label, got, want)
		}
	}
	if n := h.router.shedder.InFlight(); n != 0 {
		t.Errorf("%d requests still in flight after all ended", n)
	}

	for range 6 { // under half the limit the share falls by 0.05 an interval, to zero
		interval(10 * time.Millisecond)
	}
	if got := h.router.shedder.Share(); got != 0 {
		t.Fatalf("share after the overload = %v, want 0", got)
	}
	if err := asks(mantlev1.Priority_PRIORITY_BATCH); err != nil {
		t.Errorf("batch after the overload: %v, want an answer", err)
	}
	var reasons []string
	for _, m := range h.events.on(events.SubjectDegradation) {
		if ev := m.(*eventsv1.DegradationEvent); ev.GetRoute() == "overload" {
			reasons = append(reasons, ev.GetReason())
		}
	}
	want := []string{
		"router overloaded: P90 wait for a CPU 300ms over 100ms; shedding a share of new requests (batch first, critical never)",
		"router overload over: P90 wait for a CPU 10ms; every request admitted again",
	}
	if len(reasons) != len(want) || reasons[0] != want[0] || reasons[1] != want[1] {
		t.Errorf("overload events %q, want %q", reasons, want)
	}
}

// TestOverloadOffByConfiguration: with max_scheduling_delay 0 the shedder never runs, and
// a request is admitted whatever the CPU wait.
func TestOverloadOffByConfiguration(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Overload.MaxSchedulingDelay = 0
	h := newHarness(t, cfg, &harness{schedulingDelay: func() time.Duration {
		t.Error("the CPU wait was read with shedding off")
		return time.Hour
	}})
	if err := h.router.shedder.Run(context.Background()); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, err := h.router.Complete(context.Background(), ask("chat")); err != nil {
		t.Fatalf("Complete: %v", err)
	}
}
