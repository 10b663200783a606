package router

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	cachev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/cache/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
)

func TestUpstreamBusy(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	at := func(startMs, latencyMs int) *mantlev1.Attempt {
		return &mantlev1.Attempt{
			StartedAt: timestamppb.New(t0.Add(time.Duration(startMs) * time.Millisecond)),
			Latency:   durationpb.New(time.Duration(latencyMs) * time.Millisecond),
		}
	}
	for _, tt := range []struct {
		name     string
		attempts []*mantlev1.Attempt
		from, to int // ms after t0
		want     time.Duration
	}{
		{"no attempts", nil, 0, 100, 0},
		{"one attempt", []*mantlev1.Attempt{at(10, 50)}, 0, 100, 50 * time.Millisecond},
		{"retries one after another", []*mantlev1.Attempt{at(10, 20), at(40, 30)}, 0, 100, 50 * time.Millisecond},
		{"a hedge overlapping the first counts once", []*mantlev1.Attempt{at(10, 60), at(30, 20)}, 0, 100, 60 * time.Millisecond},
		{"a hedge outlasting the first", []*mantlev1.Attempt{at(30, 50), at(10, 40)}, 0, 100, 70 * time.Millisecond},
		{"touching spans", []*mantlev1.Attempt{at(10, 10), at(20, 10)}, 0, 100, 20 * time.Millisecond},
		{"five attempts, out of order", []*mantlev1.Attempt{at(80, 5), at(10, 5), at(40, 5), at(60, 5), at(20, 5)}, 0, 100, 25 * time.Millisecond},
		{"a replay's attempts ran before it arrived", []*mantlev1.Attempt{at(10, 50)}, 200, 210, 0},
		{"clipped to the request's window", []*mantlev1.Attempt{at(10, 50)}, 30, 40, 10 * time.Millisecond},
		{"an attempt without timing is left out", []*mantlev1.Attempt{{Latency: durationpb.New(time.Second)}, {StartedAt: timestamppb.New(t0)}}, 0, 100, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := upstreamBusy(tt.attempts, t0.Add(time.Duration(tt.from)*time.Millisecond), t0.Add(time.Duration(tt.to)*time.Millisecond))
			if got != tt.want {
				t.Errorf("upstreamBusy = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestOverheadIsWhatMantleAdds: a request whose provider takes 40 ms and whose verifier
// takes 2 ms (on the fake clock) reports 2 ms of overhead and 40 ms upstream, in the
// QualityContext, the Server-Timing header and the metric.
func TestOverheadIsWhatMantleAdds(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClockAt(time.Now())
	answer := reply("forty milliseconds", 3, 2)
	answer.advance = 40 * time.Millisecond
	h := newHarness(t, testConfig(), &harness{
		clock:     clock,
		providers: map[string]*fakeProvider{"a": newFakeProvider(answer)},
		verifier: &fakeVerifier{verdict: func(in *verifierv1.VerifyRequest) (*verifierv1.VerifyResponse, error) {
			clock.Advance(2 * time.Millisecond)
			return pass(in), nil
		}},
	})
	f := &frontDoor{router: h.router}
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"chat","messages":[{"role":"user","content":"hi"}]}`))
	w := httptest.NewRecorder()
	f.chatCompletions(w, req)
	if w.Code != http.StatusOK {
		t.Fatalf("HTTP %d: %s", w.Code, w.Body)
	}
	if got, want := w.Header().Get(HeaderServerTiming), "mantle;dur=2.000, upstream;dur=40.000"; got != want {
		t.Errorf("Server-Timing = %q, want %q", got, want)
	}
	var body struct {
		Mantle struct {
			Overhead        string `json:"overhead"`
			UpstreamLatency string `json:"upstream_latency"`
		} `json:"mantle"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if body.Mantle.Overhead != "0.002s" || body.Mantle.UpstreamLatency != "0.040s" {
		t.Errorf("mantle.overhead %q, upstream_latency %q; want 0.002s and 0.040s", body.Mantle.Overhead, body.Mantle.UpstreamLatency)
	}
	var m dto.Metric
	if err := h.router.deps.Metrics.overhead.WithLabelValues("chat").(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	hist := m.GetHistogram()
	if hist.GetSampleCount() != 1 || hist.GetSampleSum() != 0.002 {
		t.Errorf("mantle_router_overhead_seconds{route=chat}: %d samples summing to %g, want 1 of 0.002", hist.GetSampleCount(), hist.GetSampleSum())
	}
}

// TestReplayOverheadIsTheReplays: an idempotent replay answers with the recorded
// QualityContext, whose attempts ran before the replay arrived: its upstream time is 0
// and its overhead the replay's own.
func TestReplayOverheadIsTheReplays(t *testing.T) {
	t.Parallel()
	answer := reply("once", 3, 2)
	answer.advance = 30 * time.Millisecond
	h := newHarness(t, testConfig(), &harness{idempotency: true, providers: map[string]*fakeProvider{"a": newFakeProvider(answer)}})
	req := ask("chat")
	req.IdempotencyKey = "order-42"
	first, err := h.router.Complete(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if got := first.Quality.GetUpstreamLatency().AsDuration(); got != 30*time.Millisecond {
		t.Errorf("first: upstream %v, want 30ms", got)
	}
	h.clock.Advance(time.Second)
	again, err := h.router.Complete(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if h.calls("a") != 1 {
		t.Fatalf("%d provider calls, want 1 (the second is a replay)", h.calls("a"))
	}
	q := again.GetQuality()
	if len(q.GetAttempts()) != 1 || q.GetUpstreamLatency().AsDuration() != 0 || q.GetOverhead().AsDuration() != 0 {
		t.Errorf("replay: %d attempts, upstream %v, overhead %v; want the recorded attempt, 0 upstream and 0 overhead (the fake clock did not move)",
			len(q.GetAttempts()), q.GetUpstreamLatency().AsDuration(), q.GetOverhead().AsDuration())
	}
}

// TestWaitsAreNotOverhead: time mantle holds a request on purpose (the quota queue, a
// provider's Retry-After, an identical request's answer) is waited, not overhead.
func TestWaitsAreNotOverhead(t *testing.T) {
	t.Parallel()
	slow := reply("forty milliseconds", 3, 2)
	slow.advance = 40 * time.Millisecond
	for _, tt := range []struct {
		name  string
		h     func(clock *clockwork.FakeClock) *harness
		drive func(t *testing.T, h *harness)
		// want: waited, upstream latency and overhead
		waited, upstream, overhead time.Duration
	}{
		{
			name: "the quota queue",
			h: func(clock *clockwork.FakeClock) *harness {
				return &harness{quota: &fakeQuota{queued: 300 * time.Millisecond, clock: clock},
					providers: map[string]*fakeProvider{"a": newFakeProvider(slow)}}
			},
			waited: 300 * time.Millisecond, upstream: 40 * time.Millisecond,
		},
		{
			name: "a provider's Retry-After",
			h: func(*clockwork.FakeClock) *harness {
				return &harness{providers: map[string]*fakeProvider{"a": newFakeProvider(rateLimited(2*time.Second), slow)}}
			},
			drive: func(t *testing.T, h *harness) {
				h.blockUntil(t, 1)
				h.clock.Advance(2 * time.Second)
			},
			waited: 2 * time.Second, upstream: 40 * time.Millisecond,
		},
		{
			name: "an identical request's answer",
			h: func(clock *clockwork.FakeClock) *harness {
				return &harness{cache: &fakeCache{hit: &cachev1.Entry{Id: "e1", Content: "shared", SourceModel: "a"}, coalesced: 500 * time.Millisecond, clock: clock}}
			},
			waited: 500 * time.Millisecond,
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clock := clockwork.NewFakeClockAt(time.Now())
			hh := tt.h(clock)
			hh.clock = clock
			h := newHarness(t, testConfig(), hh)
			ch := h.start(context.Background(), ask("chat"))
			if tt.drive != nil {
				tt.drive(t, h)
			}
			d := await(t, ch)
			if d.err != nil {
				t.Fatal(d.err)
			}
			q := d.resp.GetQuality()
			got := []time.Duration{q.GetWaited().AsDuration(), q.GetUpstreamLatency().AsDuration(), q.GetOverhead().AsDuration()}
			if want := []time.Duration{tt.waited, tt.upstream, tt.overhead}; !slices.Equal(got, want) {
				t.Errorf("waited, upstream, overhead = %v, want %v", got, want)
			}
		})
	}
}
