package router

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	cachev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/cache/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
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

// TestOverheadIsWhatMantleAdds: a request whose body takes 1 ms to read, that waits
// 300 ms in the quota queue, whose provider takes 40 ms and whose verifier takes 2 ms (on
// the fake clock) reports 3 ms of overhead, 40 ms upstream and 300 ms waited, in the
// QualityContext, the Server-Timing header and the metric.
func TestOverheadIsWhatMantleAdds(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClockAt(time.Now())
	answer := reply("forty milliseconds", 3, 2)
	answer.advance = 40 * time.Millisecond
	h := newHarness(t, testConfig(), &harness{
		clock:     clock,
		quota:     &fakeQuota{queued: 300 * time.Millisecond, clock: clock},
		providers: map[string]*fakeProvider{"a": newFakeProvider(answer)},
		verifier: &fakeVerifier{verdict: func(in *verifierv1.VerifyRequest) (*verifierv1.VerifyResponse, error) {
			clock.Advance(2 * time.Millisecond)
			return pass(in), nil
		}},
	})
	f := &frontDoor{router: h.router}
	body := &slowBody{Reader: strings.NewReader(`{"model":"chat","messages":[{"role":"user","content":"hi"}]}`), clock: clock, takes: time.Millisecond}
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", body)
	w := httptest.NewRecorder()
	f.chatCompletions(w, req)
	if w.Code != http.StatusOK {
		t.Fatalf("HTTP %d: %s", w.Code, w.Body)
	}
	if got, want := w.Header().Get(HeaderServerTiming), "mantle;dur=3.000, upstream;dur=40.000"; got != want {
		t.Errorf("Server-Timing = %q, want %q", got, want)
	}
	var out struct {
		Mantle struct {
			Overhead        string `json:"overhead"`
			UpstreamLatency string `json:"upstream_latency"`
			Waited          string `json:"waited"`
		} `json:"mantle"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	if m := out.Mantle; m.Overhead != "0.003s" || m.UpstreamLatency != "0.040s" || m.Waited != "0.300s" {
		t.Errorf("mantle.overhead %q, upstream_latency %q, waited %q; want 0.003s, 0.040s and 0.300s", m.Overhead, m.UpstreamLatency, m.Waited)
	}
	var m dto.Metric
	if err := h.router.deps.Metrics.overhead.WithLabelValues("chat").(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	hist := m.GetHistogram()
	if hist.GetSampleCount() != 1 || hist.GetSampleSum() != 0.003 {
		t.Errorf("mantle_router_overhead_seconds{route=chat}: %d samples summing to %g, want 1 of 0.003", hist.GetSampleCount(), hist.GetSampleSum())
	}
}

// slowBody is a request body whose first read takes a while on the clock.
type slowBody struct {
	io.Reader
	clock *clockwork.FakeClock
	takes time.Duration
	read  bool
}

func (b *slowBody) Read(p []byte) (int, error) {
	if !b.read {
		b.read = true
		b.clock.Advance(b.takes)
	}
	return b.Reader.Read(p)
}

// TestReplayOverheadIsTheReplays: an idempotent replay answers with the recorded
// QualityContext of the request that did the work; its timings are the replay's own: no
// upstream time, and no wait of the first request's (here 300 ms in the quota queue).
func TestReplayOverheadIsTheReplays(t *testing.T) {
	t.Parallel()
	answer := reply("once", 3, 2)
	answer.advance = 30 * time.Millisecond
	clock := clockwork.NewFakeClockAt(time.Now())
	h := newHarness(t, testConfig(), &harness{clock: clock, idempotency: true,
		quota:     &fakeQuota{queued: 300 * time.Millisecond, clock: clock},
		providers: map[string]*fakeProvider{"a": newFakeProvider(answer)}})
	req := ask("chat")
	req.IdempotencyKey = "order-42"
	first, err := h.router.Complete(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := timings(first.GetQuality()), []time.Duration{300 * time.Millisecond, 30 * time.Millisecond, 0}; !slices.Equal(got, want) {
		t.Errorf("first: waited, upstream, overhead = %v, want %v", got, want)
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
	if len(q.GetAttempts()) != 1 || q.GetOverhead() == nil || q.GetUpstreamLatency() == nil {
		t.Fatalf("replay: %d attempts, overhead %v, upstream %v; want the recorded attempt and both timings set", len(q.GetAttempts()), q.GetOverhead(), q.GetUpstreamLatency())
	}
	if got := timings(q); !slices.Equal(got, []time.Duration{0, 0, 0}) {
		t.Errorf("replay: waited, upstream, overhead = %v, want none (the fake clock did not move)", got)
	}
}

// TestDuplicateWaitsForTheFirst: a duplicate that arrives while the first request runs
// waits for its answer; that wait is waited, not overhead.
func TestDuplicateWaitsForTheFirst(t *testing.T) {
	t.Parallel()
	answer := reply("once", 3, 2)
	answer.release = make(chan struct{})
	h := newHarness(t, testConfig(), &harness{idempotency: true, providers: map[string]*fakeProvider{"a": newFakeProvider(answer)}})
	req := ask("chat")
	req.IdempotencyKey = "order-43"
	first := h.start(context.Background(), req)
	<-h.providers["a"].started
	dup := h.start(context.Background(), req)
	h.blockUntil(t, 1) // the duplicate waits for the first's record
	h.clock.Advance(time.Second)
	close(answer.release)
	if d := await(t, first); d.err != nil {
		t.Fatal(d.err)
	}
	d := await(t, dup)
	if d.err != nil {
		t.Fatal(d.err)
	}
	if got, want := timings(d.resp.GetQuality()), []time.Duration{time.Second, 0, 0}; !slices.Equal(got, want) {
		t.Errorf("duplicate: waited, upstream, overhead = %v, want %v", got, want)
	}
}

// TestQuotaRefusalAfterAWait: quota refuses a request it had queued for 1.5 s and says
// so (ErrorInfo waited_ms); the failed request's context counts that as waited.
func TestQuotaRefusalAfterAWait(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, waitedMs string
		// want: waited, upstream, overhead
		want []time.Duration
	}{
		{"as reported", "1500", []time.Duration{1500 * time.Millisecond, 0, 0}},
		{"less than the request took", "1000", []time.Duration{time.Second, 0, 500 * time.Millisecond}},
		{"an absurd figure: no longer than the request", "9223372036854775807", []time.Duration{1500 * time.Millisecond, 0, 0}},
		{"not a number: not a wait", "soon", []time.Duration{0, 0, 1500 * time.Millisecond}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clock := clockwork.NewFakeClockAt(time.Now())
			st, err := status.New(codes.ResourceExhausted, "displaced from the quota queue by a higher priority request").WithDetails(
				&errdetails.ErrorInfo{Reason: rpc.ReasonQuotaExhausted, Domain: "quota.mantle", Metadata: map[string]string{"cause": "shed", "waited_ms": tt.waitedMs}})
			if err != nil {
				t.Fatal(err)
			}
			h := newHarness(t, testConfig(), &harness{clock: clock, quota: &fakeQuota{queued: 1500 * time.Millisecond, clock: clock, reserveErr: st.Err()}})
			_, err = h.router.Complete(context.Background(), ask("chat"))
			var failed *failedRequest
			if status.Code(err) != codes.ResourceExhausted || !errors.As(err, &failed) {
				t.Fatalf("err = %v, want the quota's refusal with the request's context", err)
			}
			if got := timings(failed.quality); !slices.Equal(got, tt.want) {
				t.Errorf("waited, upstream, overhead = %v, want %v", got, tt.want)
			}
		})
	}
}

// timings are a QualityContext's waited, upstream latency and overhead.
func timings(q *mantlev1.QualityContext) []time.Duration {
	return []time.Duration{q.GetWaited().AsDuration(), q.GetUpstreamLatency().AsDuration(), q.GetOverhead().AsDuration()}
}

// TestWaitsAreNotOverhead: time mantle holds a request on purpose (the quota queue, a
// provider's Retry-After, an identical request's answer) is waited, not overhead; the
// verifier's 2 ms (on a fresh answer or a cache hit) and a cache's own work are overhead.
func TestWaitsAreNotOverhead(t *testing.T) {
	t.Parallel()
	slow := reply("forty milliseconds", 3, 2)
	slow.advance = 40 * time.Millisecond
	entry := &cachev1.Entry{Id: "e1", Content: "shared", SourceModel: "a"}
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
			waited: 300 * time.Millisecond, upstream: 40 * time.Millisecond, overhead: 2 * time.Millisecond,
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
			waited: 2 * time.Second, upstream: 40 * time.Millisecond, overhead: 2 * time.Millisecond,
		},
		{
			name: "an identical request's answer",
			h: func(clock *clockwork.FakeClock) *harness {
				return &harness{cache: &fakeCache{hit: entry, coalesced: 500 * time.Millisecond, takes: time.Millisecond, clock: clock}}
			},
			// The cache's 1 ms and the verifier's 2 ms: a hit is verified for this request.
			waited: 500 * time.Millisecond, overhead: 3 * time.Millisecond,
		},
		{
			name: "a cache hit is mantle's work",
			h: func(clock *clockwork.FakeClock) *harness {
				return &harness{cache: &fakeCache{hit: entry, takes: 3 * time.Millisecond, clock: clock}}
			},
			overhead: 5 * time.Millisecond, // the cache's 3 ms and the hit's verification
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clock := clockwork.NewFakeClockAt(time.Now())
			hh := tt.h(clock)
			hh.clock = clock
			hh.verifier = &fakeVerifier{verdict: func(in *verifierv1.VerifyRequest) (*verifierv1.VerifyResponse, error) {
				clock.Advance(2 * time.Millisecond)
				return pass(in), nil
			}}
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
			if q.GetOverhead() == nil || q.GetUpstreamLatency() == nil {
				t.Fatalf("overhead %v, upstream latency %v: want both set", q.GetOverhead(), q.GetUpstreamLatency())
			}
			got := timings(q)
			if want := []time.Duration{tt.waited, tt.upstream, tt.overhead}; !slices.Equal(got, want) {
				t.Errorf("waited, upstream, overhead = %v, want %v", got, want)
			}
		})
	}
}
