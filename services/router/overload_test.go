package router

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
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
	d := newShedderDriver(t)
	h := newHarness(t, cfg, &harness{rand: func() float64 { return 0.2 }, schedulingDelay: d.delay})
	d.start(h)
	// Requests come in through the gRPC service, where the shedder decides (Router.Complete
	// itself, for callers in this process, does not shed).
	svc := &server{router: h.router}
	asks := func(p mantlev1.Priority) error {
		req := ask("chat")
		req.Priority = p
		_, err := svc.Complete(context.Background(), &routerv1.CompleteRequest{Request: req})
		return err
	}

	for range 3 { // the share climbs to 0.3
		d.interval(300 * time.Millisecond)
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
	if _, err := h.router.Complete(context.Background(), ask("chat")); err != nil {
		t.Errorf("Router.Complete while shedding: %v, want an answer: callers in this process are never shed", err)
	}
	req := ask("chat")
	req.Priority = mantlev1.Priority(99) // a number this build does not know: normal
	if _, err := svc.Complete(context.Background(), &routerv1.CompleteRequest{Request: req}); status.Code(err) != codes.Unavailable {
		t.Errorf("unknown priority: %v, want it shed as normal", err)
	}
	if got := counterValue(t, h.router.deps.Metrics.shed.WithLabelValues("normal")); got != 3 {
		t.Errorf("shed{priority=normal} = %v, want 3: an unknown priority counts as normal, not as a series of its own", got)
	}

	for range 6 { // under half the limit the share falls by 0.05 an interval, to zero
		d.interval(10 * time.Millisecond)
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
	req := ask("chat")
	req.Priority = mantlev1.Priority_PRIORITY_BATCH
	if _, err := (&server{router: h.router}).Complete(context.Background(), &routerv1.CompleteRequest{Request: req}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
}

// TestFrontDoorRefusesBeforeReadingTheBody: under overload the HTTP front door answers 503
// with Retry-After from the headers alone, so a refusal costs next to nothing; the
// priority header decides as it does over gRPC.
func TestFrontDoorRefusesBeforeReadingTheBody(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Overload = overload.Config{MaxSchedulingDelay: 100 * time.Millisecond, MaxShare: 0.9}
	d := newShedderDriver(t)
	h := newHarness(t, cfg, &harness{rand: func() float64 { return 0.2 }, schedulingDelay: d.delay})
	d.start(h)
	for range 3 { // share 0.3: rand's 0.2 sheds normal, not high
		d.interval(time.Second)
	}
	f := &frontDoor{router: h.router}

	for _, tc := range []struct {
		priority string
		body     string
		refused  bool
		status   int // of an admitted request
	}{
		{priority: "", refused: true},
		{priority: "batch", refused: true},
		{priority: "high", status: http.StatusOK},
		{priority: "critical", status: http.StatusOK},
		{priority: "critical", body: `{"model":`, status: http.StatusBadRequest}, // admitted, then refused as invalid
	} {
		if tc.body == "" {
			tc.body = `{"model":"chat","messages":[{"role":"user","content":"hi"}]}`
		}
		body := &watchedBody{Reader: strings.NewReader(tc.body)}
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", body)
		if tc.priority != "" {
			req.Header.Set(HeaderPriority, tc.priority)
		}
		w := httptest.NewRecorder()
		f.chatCompletions(w, req)
		if n := h.router.shedder.InFlight(); n != 0 {
			t.Errorf("priority %q: %d requests in flight after the response", tc.priority, n)
		}
		if !tc.refused {
			if w.Code != tc.status {
				t.Errorf("priority %q: HTTP %d %s, want %d", tc.priority, w.Code, w.Body, tc.status)
			}
			continue
		}
		if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" || !strings.Contains(w.Body.String(), `"code":"overloaded"`) {
			t.Errorf("priority %q: HTTP %d, Retry-After %q, body %s; want 503, 1, code overloaded", tc.priority, w.Code, w.Header().Get("Retry-After"), w.Body)
		}
		if body.read {
			t.Errorf("priority %q: the body of a refused request was read", tc.priority)
		}
	}
}

// watchedBody records whether anything read it.
type watchedBody struct {
	io.Reader
	read bool
}

func (b *watchedBody) Read(p []byte) (int, error) {
	b.read = true
	return b.Reader.Read(p)
}

// shedderDriver runs a router's shedder on its harness's fake clock and hands it the CPU
// wait of each interval.
type shedderDriver struct {
	t       *testing.T
	h       *harness
	ctx     context.Context
	cancel  context.CancelFunc
	asked   chan struct{}
	next    chan time.Duration
	waiting bool // the shedder is in a read, waiting for next
}

func newShedderDriver(t *testing.T) *shedderDriver {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return &shedderDriver{t: t, ctx: ctx, cancel: cancel, asked: make(chan struct{}), next: make(chan time.Duration)}
}

// delay is the harness's SchedulingDelay.
func (d *shedderDriver) delay() time.Duration {
	select {
	case d.asked <- struct{}{}:
	case <-d.ctx.Done():
		return 0
	}
	select {
	case v := <-d.next:
		return v
	case <-d.ctx.Done():
		return 0
	}
}

// start runs the shedder until the test ends.
func (d *shedderDriver) start(h *harness) {
	d.h = h
	ran := make(chan error, 1)
	go func() { ran <- h.router.shedder.Run(d.ctx) }()
	d.t.Cleanup(func() {
		d.cancel()
		if err := <-ran; err != nil {
			d.t.Errorf("Run: %v", err)
		}
	})
}

// tick moves the clock one interval on and waits until the shedder asks for its delay:
// it then has finished with the interval before.
func (d *shedderDriver) tick() {
	d.t.Helper()
	if err := d.h.clock.BlockUntilContext(d.ctx, 1); err != nil {
		d.t.Fatal(err)
	}
	d.h.clock.Advance(overload.Interval)
	<-d.asked
	d.waiting = true
}

// interval has the shedder adjust to delay, and returns once the adjustment is made.
func (d *shedderDriver) interval(delay time.Duration) {
	d.t.Helper()
	if !d.waiting {
		d.tick()
	}
	d.next <- delay
	d.tick()
}

// TestFrontDoorRejectsABadPriority: the priority header is read once, before the body, for
// admission; when it does not parse, the request (admitted as normal) is refused as invalid,
// naming the header, and leaves nothing in flight.
func TestFrontDoorRejectsABadPriority(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(), nil)
	f := &frontDoor{router: h.router}
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"chat","messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set(HeaderPriority, "urgent")
	w := httptest.NewRecorder()
	f.chatCompletions(w, req)
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), `"param":"x-mantle-priority"`) {
		t.Errorf("HTTP %d %s, want 400 naming x-mantle-priority", w.Code, w.Body)
	}
	if n := h.router.shedder.InFlight(); n != 0 {
		t.Errorf("%d requests in flight after the response", n)
	}
}
