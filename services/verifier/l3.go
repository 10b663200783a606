package verifier

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/services/verifier/internal/semantic"
)

// l3Job is one delivered answer waiting for its semantic checks.
type l3Job struct {
	answer  Answer
	verdict Verdict
	risk    riskInputs
	at      time.Time
}

// l3Runner runs L3 on a bounded pool: Verify hands it jobs without waiting, workers score
// them, recompute the risk with the L3 signals, open a review when the risk now calls for
// one, and publish a QualityFollowUpEvent. A full queue sheds the job (the answer simply
// gets no L3) rather than slowing Verify down.
//
// The workers take the queued jobs in batches (L3Config.BatchDelay): a worker woken for
// every answer, parked again after its 20 µs of checks, cost the mesh about 4% more CPU a
// request (docs/design/019-l3-in-batches.md).
type l3Runner struct {
	cfg    L3Config
	scorer *semantic.Scorer
	v      *Verifier
	jobs   chan l3Job
	// wake tells a waiting worker to take the queued jobs; it holds a signal per worker.
	wake chan struct{}
	// kickAt is the queue length at which a worker is woken without waiting for the batch.
	kickAt int

	// mu guards armed and timer: armed while timer will wake a worker for the jobs queued.
	mu    sync.Mutex
	armed bool
	timer clockwork.Timer

	results *followUps
}

func newL3Runner(cfg L3Config, scorer *semantic.Scorer, v *Verifier) *l3Runner {
	return &l3Runner{cfg: cfg, scorer: scorer, v: v, jobs: make(chan l3Job, cfg.QueueSize),
		wake: make(chan struct{}, cfg.Workers), kickAt: max(1, cfg.QueueSize/4), results: newFollowUps(cfg.FollowUps)}
}

// chainAfter is how long a worker takes jobs alone before it wakes another for the rest:
// checks that call out (the judge, an embedding model) take turns of milliseconds each and
// are run side by side, while a batch of the built-in checks is one worker's work.
const chainAfter = time.Millisecond

// queued makes sure a worker takes the job just queued: at once without a batch delay or
// when the queue is long, otherwise within BatchDelay of the oldest job waiting.
func (r *l3Runner) queued() {
	if r.cfg.BatchDelay <= 0 || len(r.jobs) >= r.kickAt {
		r.kick()
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.armed {
		return // the timer, still to fire, wakes a worker after this job was queued
	}
	r.armed = true
	if r.timer == nil {
		r.timer = r.v.clock.AfterFunc(r.cfg.BatchDelay, r.fire)
		return
	}
	r.timer.Reset(r.cfg.BatchDelay)
}

// fire is the batch timer's: the jobs queued so far are due.
func (r *l3Runner) fire() {
	r.mu.Lock()
	r.armed = false
	r.mu.Unlock()
	r.kick()
}

// kick wakes a waiting worker, which takes every job queued by then. A signal that does
// not fit is not needed: those in wake are taken after it was sent, with the same effect.
func (r *l3Runner) kick() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// followUp returns (or waits for) the result of requestID's checks; a caller who waits
// does not wait for the batch.
func (r *l3Runner) followUp(ctx context.Context, requestID string, wait bool) (*eventsv1.QualityFollowUpEvent, error) {
	if wait {
		r.kick()
	}
	return r.results.get(ctx, requestID, wait)
}

// submitL3 queues the semantic checks of a delivered answer and reports whether they will
// run. Answers from skipped fallback levels, cache hits and the judge's own answers get
// none.
func (v *Verifier) submitL3(a Answer, verdict Verdict, risk riskInputs, at time.Time) bool {
	if v.l3 == nil {
		return false
	}
	if a.scenario() != "" && a.scenario() == v.cfg.L3.Judge.Scenario {
		return false // the judge's own answer: judging it would loop
	}
	if v.skipL3.has(a.Quality.GetFallbackLevel()) {
		return false
	}
	if a.Quality.GetCacheHit() {
		// A cached answer had its L3 check when it was first given; the router verifies
		// each hit again for the L1 checks and the rules of the scenario asking now.
		return false
	}
	requestID := a.Quality.GetRequestId()
	if requestID != "" && !v.l3.results.start(requestID) {
		return true // already running for another candidate of this request
	}
	// The job outlives the call: it must not share the caller's QualityContext, which the
	// caller may go on changing. (CloneVT of nil is nil.)
	a.Quality = a.Quality.CloneVT()
	select {
	case v.l3.jobs <- l3Job{answer: a, verdict: verdict, risk: risk, at: at}:
		v.l3.queued()
		return true
	default:
		v.metrics.l3.WithLabelValues("shed").Inc()
		v.l3.results.abandon(requestID)
		return false
	}
}

func levelName(l mantlev1.FallbackLevel) string {
	return strings.ToLower(strings.TrimPrefix(l.String(), "FALLBACK_LEVEL_"))
}

// levelSet is a set of fallback levels, one bit each: every Verify asks it, and naming a
// level (the enum's String goes through its descriptor) cost more than the rest of the
// question.
type levelSet uint64

// levelsNamed returns the set of the levels named (as degraded.skip_l3_levels names them).
func levelsNamed(names []string) levelSet {
	var s levelSet
	for num := range mantlev1.FallbackLevel_name {
		if l := mantlev1.FallbackLevel(num); l >= 0 && l < 64 && slices.Contains(names, levelName(l)) {
			s |= 1 << l
		}
	}
	return s
}

func (s levelSet) has(l mantlev1.FallbackLevel) bool { return l >= 0 && l < 64 && s&(1<<l) != 0 }

// run starts the workers and returns when ctx is done and they have stopped. Jobs still
// queued then are dropped: L3 is advisory, and waiters are released.
func (r *l3Runner) run(ctx context.Context) {
	var wg sync.WaitGroup
	for range r.cfg.Workers {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-r.wake:
					r.drain(ctx)
				}
			}
		})
	}
	wg.Wait()
	r.mu.Lock()
	if r.timer != nil {
		r.timer.Stop()
	}
	r.mu.Unlock()
	for {
		select {
		case job := <-r.jobs:
			r.results.abandon(job.answer.Quality.GetRequestId())
		default:
			return
		}
	}
}

// drain runs the queued jobs until there are none left, waking another worker for the
// rest once it has run for chainAfter (and is still behind).
func (r *l3Runner) drain(ctx context.Context) {
	start, chained := r.v.clock.Now(), false
	for ctx.Err() == nil {
		select {
		case job := <-r.jobs:
			r.process(ctx, job)
		default:
			return
		}
		if !chained && len(r.jobs) > 0 && r.v.clock.Since(start) >= chainAfter {
			chained = true
			r.kick()
		}
	}
}

// process runs the checks of one job.
func (r *l3Runner) process(ctx context.Context, job l3Job) {
	v, a := r.v, job.answer
	requestID := a.Quality.GetRequestId()
	refs := slices.Concat(a.References, v.cfg.Scenarios[a.scenario()].References)
	question := a.question()
	key := ""
	if question != "" {
		key = a.Tenant + "/" + a.scenario() + "/" + semantic.NormalizeQuestion(question)
	}
	res, err := r.scorer.Score(ctx, semantic.Input{Key: key, Question: question, Answer: job.verdict.Content, References: refs})
	if err != nil {
		v.metrics.l3.WithLabelValues("failed").Inc()
		v.log.WarnContext(ctx, "l3 check failed", "request_id", requestID, "err", err)
		r.results.abandon(requestID)
		return
	}
	v.metrics.l3.WithLabelValues("done").Inc()
	if res.JudgeErr != nil {
		v.log.DebugContext(ctx, "l3 judge skipped", "request_id", requestID, "err", res.JudgeErr)
	}

	var extra []signal
	if res.Confidence < v.cfg.Risk.LowConfidence {
		extra = append(extra, signal{name: SignalLowConfidence, dim: dimOutput, value: 1})
	}
	if res.HasHistory && res.Divergence > v.cfg.Risk.Divergence {
		extra = append(extra, signal{name: SignalDivergence, dim: dimOutput, value: 1})
	}
	risk := job.risk.score(extra)
	verdict := job.verdict
	verdict.Risk, verdict.RiskScore = risk, risk.Score

	reviewID := ""
	if job.verdict.ReviewID == "" && risk.Score >= risk.Threshold {
		reviewID = v.openReview(ctx, reviewFor(a, verdict, job.risk, "l3", v.cfg, v.clock.Now()))
	}
	grade := mantlev1.QualityGrade_QUALITY_GRADE_HIGH
	switch {
	case res.Confidence < v.cfg.Risk.LowConfidence:
		grade = mantlev1.QualityGrade_QUALITY_GRADE_LOW
	case res.Confidence < 0.7 || len(extra) > 0:
		grade = mantlev1.QualityGrade_QUALITY_GRADE_MEDIUM
	}
	ev := &eventsv1.QualityFollowUpEvent{
		At: timestamppb.New(v.clock.Now()), RequestId: requestID, Tenant: a.Tenant, Scenario: a.scenario(),
		L3Confidence: res.Confidence, Grade: grade,
		Detail:    l3Detail(res, risk.Score),
		Relevance: res.Relevance, Consistency: res.Consistency, HasReferences: res.HasReferences,
		Divergence: res.Divergence, JudgeScore: res.JudgeScore, Judged: res.Judged,
		RiskScore: risk.Score, ReviewId: reviewID, Signals: risk.Signals, Model: a.Model,
	}
	v.events.Publish(ctx, events.SubjectQuality, ev)
	r.results.finish(requestID, ev)
}

// l3Detail is a follow-up's detail, "relevance=0.80 consistency=0.00 divergence=0.00
// judge=0.00 risk=0.12", appended into one buffer (as %.2f prints them): fmt boxed each
// of its numbers, every L3 check.
func l3Detail(res semantic.Result, risk float64) string {
	var buf [96]byte
	b := buf[:0]
	for i, f := range [...]struct {
		name string
		v    float64
	}{{"relevance=", res.Relevance}, {"consistency=", res.Consistency}, {"divergence=", res.Divergence}, {"judge=", res.JudgeScore}, {"risk=", risk}} {
		if i > 0 {
			b = append(b, ' ')
		}
		b = strconv.AppendFloat(append(b, f.name...), f.v, 'f', 2, 64)
	}
	return string(b)
}

// followUps keeps the latest L3 results for GetFollowUp and wakes callers waiting for one.
type followUps struct {
	max int

	mu      sync.Mutex
	results map[string]*eventsv1.QualityFollowUpEvent
	order   []string // insertion order of results, for eviction
	pending map[string]chan struct{}
}

func newFollowUps(max int) *followUps {
	return &followUps{max: max, results: map[string]*eventsv1.QualityFollowUpEvent{}, pending: map[string]chan struct{}{}}
}

// start marks a request's L3 as running; false when it already is or is done.
func (f *followUps) start(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.pending[id]; ok {
		return false
	}
	if _, ok := f.results[id]; ok {
		return false
	}
	f.pending[id] = make(chan struct{})
	return true
}

func (f *followUps) finish(id string, ev *eventsv1.QualityFollowUpEvent) {
	if id == "" {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.results[id]; !ok {
		f.order = append(f.order, id)
		if len(f.order) > f.max {
			delete(f.results, f.order[0])
			f.order = f.order[1:]
		}
	}
	f.results[id] = ev
	if ch, ok := f.pending[id]; ok {
		close(ch)
		delete(f.pending, id)
	}
}

// abandon releases waiters of a request whose L3 will not finish.
func (f *followUps) abandon(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ch, ok := f.pending[id]; ok {
		close(ch)
		delete(f.pending, id)
	}
}

// get returns the result for id, or (when wait is set and L3 is still running) waits for
// it until ctx is done.
func (f *followUps) get(ctx context.Context, id string, wait bool) (*eventsv1.QualityFollowUpEvent, error) {
	f.mu.Lock()
	ev, done := f.results[id]
	ch, running := f.pending[id]
	f.mu.Unlock()
	if done || !running || !wait {
		return ev, nil
	}
	select {
	case <-ch:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.results[id], nil
}
