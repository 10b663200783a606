package router

import (
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// What a request spent in mantle's own work, apart from waiting on providers and the
// waits mantle imposes on purpose (quota queue, retry backoff, cache coalescing), is the
// figure a gateway is judged by ("how much do you add?"). The router measures it per
// request (QualityContext.overhead, mantle_router_overhead_seconds) and the front door
// sends it in a Server-Timing header, so that it can be watched in production and read
// off a load test without subtracting two noisy latency distributions.

// HeaderServerTiming is the W3C Server-Timing header of the front door's answers:
// `mantle;dur=<ms>, upstream;dur=<ms>`.
const HeaderServerTiming = "Server-Timing"

// timeRequest sets how long the request took in mantle, upstream and held on purpose on
// the QualityContext the caller gets, and observes the overhead.
//
// An idempotent replay answers with the recorded QualityContext of the request that did
// the work: its attempts and waits were that request's, so the replay's figures replace
// them (no upstream time; its own waits, such as for the first request to finish).
func (r *Router) timeRequest(route string, qc *mantlev1.QualityContext, resp *routerv1.CompleteResponse, arrived, end time.Time) {
	// Wall-clock bounds: attempts' start times are wall-clock readings (timestamps).
	arrived, end = arrived.Round(0), end.Round(0)
	out, upstream := qc, upstreamBusy(qc.GetAttempts(), arrived, end)
	if q := resp.GetQuality(); q != nil && q != qc {
		out, upstream = q, 0
		out.Waited = qc.GetWaited()
	}
	rest := max(end.Sub(arrived)-upstream, 0) // mantle's, on purpose or not
	waited := out.GetWaited().AsDuration()
	if waited > rest { // a wait another service reported cannot outlast the request
		waited = rest
		out.Waited = durationpb.New(waited)
	}
	overhead := rest - waited
	out.Overhead, out.UpstreamLatency = durationpb.New(overhead), durationpb.New(upstream)
	r.deps.Metrics.overheadOf(route).Observe(overhead.Seconds())
}

// addWait adds d to the time the request was held on purpose (QualityContext.waited),
// which is not overhead. Only the request's own goroutine waits (never a hedge), so qc
// is not shared meanwhile.
func addWait(qc *mantlev1.QualityContext, d time.Duration) {
	if d <= 0 {
		return
	}
	sum := qc.GetWaited().AsDuration() + d
	if sum < d { // overflow: timeRequest bounds it by the request's own time
		sum = math.MaxInt64
	}
	qc.Waited = durationpb.New(sum)
}

// upstreamBusy is how long at least one of attempts was in flight within [from, to]:
// overlapping attempts (a hedge racing the first) count once.
func upstreamBusy(attempts []*mantlev1.Attempt, from, to time.Time) time.Duration {
	type span struct{ start, end time.Time }
	var buf [4]span // most requests make one attempt, few more than four
	spans := buf[:0]
	for _, a := range attempts {
		if a.GetStartedAt() == nil || a.GetLatency() == nil {
			continue
		}
		s := span{a.StartedAt.AsTime(), a.StartedAt.AsTime().Add(a.Latency.AsDuration())}
		if s.start.Before(from) {
			s.start = from
		}
		if s.end.After(to) {
			s.end = to
		}
		if s.end.After(s.start) {
			spans = append(spans, s)
		}
	}
	slices.SortFunc(spans, func(a, b span) int { return a.start.Compare(b.start) })
	var busy time.Duration
	var cur span
	for i, s := range spans {
		switch {
		case i == 0:
			cur = s
		case s.start.After(cur.end):
			busy += cur.end.Sub(cur.start)
			cur = s
		case s.end.After(cur.end):
			cur.end = s.end
		}
	}
	if len(spans) > 0 {
		busy += cur.end.Sub(cur.start)
	}
	return busy
}

// setServerTiming writes the Server-Timing header: mantle's time from arrival to now less
// the time upstream and the deliberate waits (which the QualityContext measured), in
// milliseconds.
func setServerTiming(h http.Header, arrived, now time.Time, qc *mantlev1.QualityContext) {
	upstream := qc.GetUpstreamLatency().AsDuration()
	own := max(now.Sub(arrived)-upstream-qc.GetWaited().AsDuration(), 0)
	b := make([]byte, 0, 48)
	b = append(b, "mantle;dur="...)
	b = strconv.AppendFloat(b, ms(own), 'f', 3, 64)
	b = append(b, ", upstream;dur="...)
	b = strconv.AppendFloat(b, ms(upstream), 'f', 3, 64)
	h.Set(HeaderServerTiming, string(b))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
