package drill

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/drill/load"
	"github.com/mantle-mesh/mantle/pkg/sim"
)

// Report is the outcome of one scenario, both sides. Times are scenario time: measured
// wall-clock time divided by the time scale, except mantle's own time on each answer,
// which does not scale and is kept at its wall value (see scenarioLatency). It is what the
// JSON file holds.
type Report struct {
	Scenario    string  `json:"scenario"`
	Description string  `json:"description"`
	Seed        int64   `json:"seed"`
	TimeScale   float64 `json:"time_scale"`
	// Rate is requests per second and Duration seconds, both scenario time.
	Rate      float64 `json:"rate"`
	DurationS float64 `json:"duration_s"`
	BudgetMs  float64 `json:"budget_ms"`
	// Requests is how many requests each side was sent.
	Requests int `json:"requests"`
	// IncidentStartS and IncidentEndS bound the fault, when the scenario marks it.
	IncidentStartS *float64 `json:"incident_start_s,omitempty"`
	IncidentEndS   *float64 `json:"incident_end_s,omitempty"`
	// Target says what mantle ran as: the in-process mesh or a mesh at an address.
	Target    string    `json:"target"`
	StartedAt time.Time `json:"started_at"`
	// Build and Machine say what ran where, so figures can be compared across runs.
	Build   Build   `json:"build"`
	Machine Machine `json:"machine"`
	// BucketS is the width of the timeline buckets.
	BucketS float64 `json:"bucket_s"`
	Sides   []Side  `json:"sides"`
	// Checks are the scenario's targets evaluated on mantle's side.
	Checks []Check `json:"checks,omitempty"`
	// Tools holds a tool storm's figures (sessions, actions, query calls); its Sides then
	// carry only session counts.
	Tools *ToolReport `json:"tools,omitempty"`
}

// Build identifies the binary that ran the drill.
type Build struct {
	GoVersion string `json:"go_version"`
	// Revision is the VCS revision the binary was built from, when stamped; Modified says
	// the working tree had uncommitted changes.
	Revision string `json:"revision,omitempty"`
	Modified bool   `json:"modified,omitempty"`
}

// Machine describes the host. The drill shares it with whatever else runs there, and a
// busy machine stretches every latency (more so at strong time scales): LoadAverage and
// each side's generator lag say how busy it was.
type Machine struct {
	CPUs       int `json:"cpus"`
	GOMAXPROCS int `json:"gomaxprocs"`
	// LoadAverage is the 1-minute load average at the start and at the end, where known.
	LoadAverage [2]float64 `json:"load_average,omitempty"`
}

// Side is one side's results.
type Side struct {
	Name     string `json:"name"`
	Requests int    `json:"requests"`
	// Answered got an answer, at any ladder level; Failed did not.
	Answered    int     `json:"answered"`
	Failed      int     `json:"failed"`
	SuccessRate float64 `json:"success_rate"`
	// Correct got the answer a healthy model gives.
	Correct     int     `json:"correct"`
	CorrectRate float64 `json:"correct_rate"`
	// Wrong got an answer from a model that is not the right one (a refusal, a truncation,
	// broken JSON) and not marked as degraded: the silent failures a user is shown.
	Wrong int `json:"wrong"`
	// Flagged wrong answers came with a QualityContext saying they failed verification.
	Flagged int `json:"flagged"`
	// Degraded answers came from the ladder without a model (L2 cache, L3 template); Marked
	// is how many of them said so.
	Degraded int `json:"degraded"`
	Marked   int `json:"marked"`
	// Verified is how many answers mantle's verifier passed; nil for the naive client.
	Verified     *int     `json:"verified,omitempty"`
	VerifiedRate *float64 `json:"verified_rate,omitempty"`
	// WithinBudget were answered within the route's budget.
	WithinBudget int `json:"within_budget"`
	// Latency is over every request, answered or not: how long its user waited.
	Latency Latency `json:"latency"`
	// Overhead is mantle's own time per answered request and Waited the time it held one
	// on purpose (quota queue, waits between retries, an identical request's answer), as
	// its QualityContext reports them; nil for the naive client. Overhead is wall-clock
	// milliseconds, since mantle's work does not scale with the scenario; Waited is
	// scenario time like Latency, since the drill scales the waits (backoff, Retry-After).
	Overhead *Latency `json:"overhead,omitempty"`
	Waited   *Latency `json:"waited,omitempty"`
	// UpstreamCalls is every call the simulated provider received; Amplification is that
	// per request.
	UpstreamCalls int64   `json:"upstream_calls"`
	Amplification float64 `json:"amplification"`
	// Billed calls generated tokens; DuplicateBilled repeated an already billed request.
	Billed          int64   `json:"billed"`
	DuplicateBilled int64   `json:"duplicate_billed"`
	CostUSD         float64 `json:"cost_usd"`
	CostPer1kUSD    float64 `json:"cost_per_1k_requests_usd"`
	// Levels counts answers per ladder level (L0 primary, L1 backup or smaller model,
	// L2 cached related answer, L3 template); LevelShares divides by Answered.
	Levels      [4]int     `json:"levels"`
	LevelShares [4]float64 `json:"level_shares"`
	// DegradedReasons counts mantle's reasons for answers below L0, by kind.
	DegradedReasons map[string]int `json:"degraded_reasons,omitempty"`
	// ReasonExamples holds one request per degradation reason, with its audit trail.
	ReasonExamples map[string]Slow `json:"reason_examples,omitempty"`
	// Failures counts unanswered requests by reason.
	Failures map[string]int `json:"failures,omitempty"`
	// Models holds the simulator's counters per model.
	Models map[string]ModelCalls `json:"models"`
	// Breakers are mantle's breaker transitions per model (nil for the naive client).
	Breakers []ModelBreaker `json:"breakers,omitempty"`
	// RecoveryPeak is the most upstream calls in one second of scenario time in the minute
	// after the incident ended: the herd the recovering providers met.
	RecoveryPeak *int `json:"recovery_peak_calls_per_s,omitempty"`
	// Timeline is the run in buckets of Report.BucketS.
	Timeline []Bucket `json:"timeline"`
	// Slowest are the slowest requests with mantle's audit trail (wall-clock offsets and
	// durations), to show where their time went.
	Slowest []Slow `json:"slowest,omitempty"`
	// Shed requests were never sent: the generator already had its maximum in flight.
	Shed int `json:"shed"`
	// MaxLagMs is how far the load generator fell behind its schedule (wall time).
	MaxLagMs    float64 `json:"generator_max_lag_ms"`
	WallSeconds float64 `json:"wall_s"`
}

// Slow is one of the slowest requests.
type Slow struct {
	Index     int     `json:"index"`
	LatencyMs float64 `json:"latency_ms"`
	Level     int     `json:"level"`
	Failure   string  `json:"failure,omitempty"`
	Trail     string  `json:"audit_trail"`
}

// Latency percentiles in milliseconds of scenario time.
type Latency struct {
	P50  float64 `json:"p50_ms"`
	P95  float64 `json:"p95_ms"`
	P99  float64 `json:"p99_ms"`
	Max  float64 `json:"max_ms"`
	Mean float64 `json:"mean_ms"`
}

// ModelCalls are the simulator's counters for one model.
type ModelCalls struct {
	Calls           int64            `json:"calls"`
	Billed          int64            `json:"billed"`
	DuplicateBilled int64            `json:"duplicate_billed"`
	Outcomes        map[string]int64 `json:"outcomes"`
}

// ModelBreaker is the history of one model's breaker during the run.
type ModelBreaker struct {
	Model       string       `json:"model"`
	Transitions []Transition `json:"transitions"`
	// Trips is how many times it opened.
	Trips int `json:"trips"`
	// OpenAfterIncidentS is when it first opened, counted from the incident's start.
	OpenAfterIncidentS *float64 `json:"open_after_incident_s,omitempty"`
	// ClosedAfterIncidentS is when it closed for good, counted from the incident's end.
	ClosedAfterIncidentS *float64 `json:"closed_after_incident_end_s,omitempty"`
	// HalfOpenPeriods and MaxProbeCalls: how often it probed, and the most calls the model
	// received in one half-open period, counting the scout that opened it if one did (the
	// cap is router.breaker.half_open_probes).
	HalfOpenPeriods int `json:"half_open_periods"`
	MaxProbeCalls   int `json:"max_probe_calls"`
	ProbeCap        int `json:"probe_cap"`
}

// Transition is one breaker state change, at seconds of scenario time since the start.
type Transition struct {
	AtS    float64 `json:"at_s"`
	From   string  `json:"from"`
	To     string  `json:"to"`
	Reason string  `json:"reason"`
}

// Bucket is one slice of the timeline, by the requests' due times.
type Bucket struct {
	StartS   float64 `json:"start_s"`
	Requests int     `json:"requests"`
	Answered int     `json:"answered"`
	Correct  int     `json:"correct"`
	// Levels counts answers per ladder level.
	Levels        [4]int  `json:"levels"`
	P50Ms         float64 `json:"p50_ms"`
	P99Ms         float64 `json:"p99_ms"`
	UpstreamCalls int     `json:"upstream_calls"`
}

// Check is one target and whether mantle met it.
type Check struct {
	Name   string `json:"name"`
	Target string `json:"target"`
	Got    string `json:"got"`
	Met    bool   `json:"met"`
}

// Side returns the named side, or nil.
func (r *Report) Side(name string) *Side {
	for i := range r.Sides {
		if r.Sides[i].Name == name {
			return &r.Sides[i]
		}
	}
	return nil
}

// sideData is everything one side measured.
type sideData struct {
	name     string
	results  []result
	calls    []upstreamCall
	stats    sim.Stats
	breakers []*eventsv1.BreakerTransitionEvent
	start    time.Time // when the simulator was armed
	gen      load.Stats
	wall     time.Duration
}

// scenarioLatency is what the report divides by the time scale for a request that took
// wall of wall time: the wall time less the part of mantle's own time (its QualityContext
// overhead, measured on the answer) that the division would inflate. mantle's own work
// does not scale with the scenario, so at time scale 0.1 a 5 ms pause of its process
// would read as 50 ms of scenario time; kept out, it reads as the 5 ms it was. The
// providers' simulated time and the waits mantle scales are divided as before.
func (p *plan) scenarioLatency(wall time.Duration, r result) time.Duration {
	if !r.timed || r.overhead <= 0 || r.overhead > wall {
		return wall
	}
	return wall - time.Duration(float64(r.overhead)*(1-p.scale))
}

// summarize turns what one side measured into its report.
func (p *plan) summarize(d sideData, buckets int) Side {
	toS := func(wall time.Duration) float64 { return wall.Seconds() / p.scale }
	toMs := func(wall time.Duration) float64 { return float64(wall) / float64(time.Millisecond) / p.scale }
	budget := p.sc.d(p.s.Budget)

	sd := Side{Name: d.name, Requests: len(d.results), Failures: map[string]int{}, Models: map[string]ModelCalls{},
		Shed: d.gen.Shed, MaxLagMs: float64(d.gen.MaxLag) / float64(time.Millisecond), WallSeconds: d.wall.Seconds()}
	lat := make([]time.Duration, 0, len(d.results))
	var overhead, waited []time.Duration
	verified := 0
	for i, r := range d.results {
		lat = append(lat, r.latency)
		if !r.answered {
			sd.Failed++
			sd.Failures[r.failure]++
			continue
		}
		sd.Answered++
		if r.timed {
			overhead, waited = append(overhead, r.overhead), append(waited, r.waited)
		}
		// Every answer is exactly one of: correct, wrong (from a model) or degraded (from
		// the ladder), so the three add up to Answered.
		if r.correct && r.level < 2 {
			sd.Correct++
		}
		if r.verified {
			verified++
		}
		if r.level >= 0 {
			sd.Levels[r.level]++
		}
		if r.level >= 2 {
			sd.Degraded++
			if r.marked {
				sd.Marked++
			}
		} else if !r.correct {
			sd.Wrong++
			if r.flagged {
				sd.Flagged++
			}
		}
		if r.reason != "" {
			if sd.DegradedReasons == nil {
				sd.DegradedReasons = map[string]int{}
			}
			sd.DegradedReasons[r.reason]++
			if _, ok := sd.ReasonExamples[r.reason]; !ok {
				if sd.ReasonExamples == nil {
					sd.ReasonExamples = map[string]Slow{}
				}
				sd.ReasonExamples[r.reason] = Slow{Index: i, LatencyMs: toMs(r.latency), Level: r.level, Trail: r.trail}
			}
		}
		if r.latency <= budget {
			sd.WithinBudget++
		}
	}
	if d.name == SideMantle {
		sd.Verified = &verified
		rate := ratio(verified, sd.Requests)
		sd.VerifiedRate = &rate
	}
	sd.SuccessRate = ratio(sd.Answered, sd.Requests)
	sd.CorrectRate = ratio(sd.Correct, sd.Requests)
	for l := range sd.Levels {
		sd.LevelShares[l] = ratio(sd.Levels[l], sd.Answered)
	}
	sd.Latency = latencyOf(lat, toMs)
	if len(overhead) > 0 {
		wallMs := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
		own, held := latencyOf(overhead, wallMs), latencyOf(waited, toMs)
		sd.Overhead, sd.Waited = &own, &held
	}

	for _, name := range slices.Sorted(maps.Keys(d.stats.Models)) {
		ms := d.stats.Models[name]
		mc := ModelCalls{Calls: ms.Calls, Billed: ms.Billed, DuplicateBilled: ms.DuplicateBilled, Outcomes: map[string]int64{}}
		for o, n := range ms.Outcomes {
			mc.Outcomes[string(o)] = n
		}
		sd.Models[name] = mc
		sd.UpstreamCalls += ms.Calls
		sd.Billed += ms.Billed
		sd.DuplicateBilled += ms.DuplicateBilled
		sd.CostUSD += float64(ms.Billed) * p.callCost(name)
	}
	sd.Amplification = ratio64(sd.UpstreamCalls, int64(sd.Requests))
	sd.CostPer1kUSD = sd.CostUSD / math.Max(1, float64(sd.Requests)) * 1000

	if d.name == SideMantle {
		sd.Breakers = p.breakerHistory(d, toS)
	}
	if p.s.Incident != nil {
		peak := recoveryPeak(d.calls, p.sc.d(p.s.Incident.End), p.sc.d(time.Minute), p.sc.d(time.Second))
		sd.RecoveryPeak = &peak
	}
	sd.Timeline = timeline(d, buckets, p.sc.d(p.duration), toS, toMs)
	sd.Slowest = slowest(d.results, 5, toMs)
	return sd
}

// slowest returns the n slowest requests that carry an audit trail.
func slowest(results []result, n int, toMs func(time.Duration) float64) []Slow {
	idx := make([]int, 0, len(results))
	for i, r := range results {
		if r.trail != "" {
			idx = append(idx, i)
		}
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(results[b].latency, results[a].latency) })
	var out []Slow
	for _, i := range idx[:min(n, len(idx))] {
		r := results[i]
		out = append(out, Slow{Index: i, LatencyMs: toMs(r.latency), Level: r.level, Failure: r.failure, Trail: r.trail})
	}
	return out
}

// callCost is the estimated price of one billed call to model: the load's average prompt
// and answer sizes at the model's prices.
func (p *plan) callCost(model string) float64 {
	m, ok := p.s.Model(model)
	if !ok {
		return 0
	}
	return (p.avgPromptTokens*m.InputPricePerMillion + p.avgAnswerTokens*m.OutputPricePerMillion) / 1e6
}

// breakerHistory groups the breaker events by model and measures trips, recovery and the
// calls each half-open period let through.
func (p *plan) breakerHistory(d sideData, toS func(time.Duration) float64) []ModelBreaker {
	byModel := map[string][]*eventsv1.BreakerTransitionEvent{}
	for _, ev := range d.breakers {
		byModel[ev.Model] = append(byModel[ev.Model], ev)
	}
	var out []ModelBreaker
	for _, model := range slices.Sorted(maps.Keys(byModel)) {
		evs := byModel[model]
		slices.SortStableFunc(evs, func(a, b *eventsv1.BreakerTransitionEvent) int { return a.At.AsTime().Compare(b.At.AsTime()) })
		mb := ModelBreaker{Model: model, ProbeCap: p.s.Router.Breaker.HalfOpenProbes}
		var lastClose *float64
		for i, ev := range evs {
			at := ev.At.AsTime().Sub(d.start)
			t := Transition{AtS: toS(at), From: stateName(ev.From), To: stateName(ev.To), Reason: ev.Reason}
			mb.Transitions = append(mb.Transitions, t)
			switch ev.To {
			case mantlev1.BreakerState_BREAKER_STATE_OPEN:
				mb.Trips++
				lastClose = nil
				if inc := p.s.Incident; inc != nil && mb.OpenAfterIncidentS == nil && t.AtS >= inc.Start.Seconds() {
					v := t.AtS - inc.Start.Seconds()
					mb.OpenAfterIncidentS = &v
				}
			case mantlev1.BreakerState_BREAKER_STATE_CLOSED:
				if inc := p.s.Incident; inc != nil && t.AtS >= inc.End.Seconds() {
					v := t.AtS - inc.End.Seconds()
					lastClose = &v
				}
			case mantlev1.BreakerState_BREAKER_STATE_HALF_OPEN:
				mb.HalfOpenPeriods++
				end := d.wall
				if i+1 < len(evs) {
					end = evs[i+1].At.AsTime().Sub(d.start)
				}
				n := callsBetween(d.calls, model, at, end)
				if ev.Reason == "scout succeeded" {
					// The router's breaker moved to half-open when a scout, sent while it was
					// open, succeeded; that call is the trial's first probe.
					n++
				}
				mb.MaxProbeCalls = max(mb.MaxProbeCalls, n)
			}
		}
		mb.ClosedAfterIncidentS = lastClose
		out = append(out, mb)
	}
	return out
}

func stateName(s mantlev1.BreakerState) string {
	switch s {
	case mantlev1.BreakerState_BREAKER_STATE_OPEN:
		return "open"
	case mantlev1.BreakerState_BREAKER_STATE_HALF_OPEN:
		return "half_open"
	}
	return "closed"
}

// callsBetween counts calls to model that arrived in [from, to).
func callsBetween(calls []upstreamCall, model string, from, to time.Duration) int {
	n := 0
	for _, c := range calls {
		if c.Model == model && c.At >= from && c.At < to {
			n++
		}
	}
	return n
}

// recoveryPeak is the most calls (to any model) that arrived within one window of width
// step, over the span after end.
func recoveryPeak(calls []upstreamCall, end, span, step time.Duration) int {
	if step <= 0 {
		return 0
	}
	counts := map[int64]int{}
	peak := 0
	for _, c := range calls {
		if c.At < end || c.At >= end+span {
			continue
		}
		k := int64((c.At - end) / step)
		counts[k]++
		peak = max(peak, counts[k])
	}
	return peak
}

func timeline(d sideData, n int, span time.Duration, toS func(time.Duration) float64, toMs func(time.Duration) float64) []Bucket {
	if n < 1 || span <= 0 {
		return nil
	}
	width := span / time.Duration(n)
	if width <= 0 {
		width = 1
	}
	at := func(t time.Duration) int { return min(max(int(t/width), 0), n-1) }
	buckets := make([]Bucket, n)
	lat := make([][]time.Duration, n)
	for i := range buckets {
		buckets[i].StartS = toS(time.Duration(i) * width)
	}
	for _, r := range d.results {
		b := &buckets[at(r.due)]
		b.Requests++
		if r.answered {
			b.Answered++
		}
		if r.correct {
			b.Correct++
		}
		if r.answered && r.level >= 0 {
			b.Levels[r.level]++
		}
		lat[at(r.due)] = append(lat[at(r.due)], r.latency)
	}
	for _, c := range d.calls {
		if c.At < span {
			buckets[at(c.At)].UpstreamCalls++
		}
	}
	for i := range buckets {
		pc := load.Summarize(lat[i])
		buckets[i].P50Ms, buckets[i].P99Ms = toMs(pc.P50), toMs(pc.P99)
	}
	return buckets
}

// check evaluates the scenario's targets on mantle's side.
func (p *plan) check(sd *Side) []Check {
	t := p.s.Targets
	var out []Check
	pct := func(v float64) string { return fmt.Sprintf("%.2f%%", v*100) }
	if t.SuccessRate != nil {
		// Correct answers only: a ladder answer (a template, a related cached answer) is
		// honest about what it is, but it is not a success, and never counts toward the target.
		out = append(out, Check{"correct answers", ">= " + pct(*t.SuccessRate), pct(sd.CorrectRate), sd.CorrectRate >= *t.SuccessRate})
	}
	if t.P99 != nil {
		want := float64(*t.P99) / float64(time.Millisecond)
		out = append(out, Check{"P99 latency", fmt.Sprintf("<= %s", *t.P99), fmtMs(sd.Latency.P99), sd.Latency.P99 <= want})
	}
	if t.Amplification != nil {
		out = append(out, Check{"upstream calls per request", fmt.Sprintf("<= %.2f", *t.Amplification),
			fmt.Sprintf("%.3f", sd.Amplification), sd.Amplification <= *t.Amplification})
	}
	if t.DuplicateBilled != nil {
		out = append(out, Check{"duplicate billed calls", fmt.Sprintf("<= %d", *t.DuplicateBilled),
			fmt.Sprint(sd.DuplicateBilled), sd.DuplicateBilled <= *t.DuplicateBilled})
	}
	if t.BreakerOpenWithin != nil {
		got, met := "never opened", false
		if mb := sd.breaker(p.s.Route.Candidates[0]); mb != nil && mb.OpenAfterIncidentS != nil {
			got = fmt.Sprintf("%.1f s after the incident started", *mb.OpenAfterIncidentS)
			met = *mb.OpenAfterIncidentS <= t.BreakerOpenWithin.Seconds()
		}
		out = append(out, Check{"primary breaker opens", fmt.Sprintf("within %s of the incident start", *t.BreakerOpenWithin), got, met})
	}
	if t.AnsweredWithinBudget != nil {
		share := ratio(sd.WithinBudget, sd.Requests)
		out = append(out, Check{"answered within the budget", ">= " + pct(*t.AnsweredWithinBudget), pct(share), share >= *t.AnsweredWithinBudget})
	}
	if t.DegradedMarked {
		out = append(out, Check{"ladder answers marked", "all", fmt.Sprintf("%d of %d", sd.Marked, sd.Degraded), sd.Marked == sd.Degraded})
	}
	if t.ProbesWithinCap {
		most, periods := 0, 0
		for _, mb := range sd.Breakers {
			most = max(most, mb.MaxProbeCalls)
			periods += mb.HalfOpenPeriods
		}
		cap := p.s.Router.Breaker.HalfOpenProbes
		out = append(out, Check{"calls per half-open period", fmt.Sprintf("<= %d (half_open_probes)", cap),
			fmt.Sprintf("at most %d over %d periods", most, periods), most <= cap})
	}
	return out
}

func (sd *Side) breaker(model string) *ModelBreaker {
	for i := range sd.Breakers {
		if sd.Breakers[i].Model == model {
			return &sd.Breakers[i]
		}
	}
	return nil
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func ratio64(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// latencyOf summarises durations in milliseconds as toMs converts them (wall clock, or
// scenario time).
func latencyOf(ds []time.Duration, toMs func(time.Duration) float64) Latency {
	pc := load.Summarize(ds)
	return Latency{P50: toMs(pc.P50), P95: toMs(pc.P95), P99: toMs(pc.P99), Max: toMs(pc.Max), Mean: toMs(pc.Mean)}
}

func fmtMs(ms float64) string {
	if ms >= 10_000 {
		return fmt.Sprintf("%.1f s", ms/1000)
	}
	if ms >= 1000 {
		return fmt.Sprintf("%.2f s", ms/1000)
	}
	return fmt.Sprintf("%.0f ms", ms)
}
