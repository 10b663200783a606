package resilience

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// State is a breaker's state.
type State int

// Breaker states. Closed lets calls through and watches them; open refuses them; half-open
// lets a few probes through to learn whether the upstream has recovered.
const (
	StateClosed State = iota
	StateOpen
	StateHalfOpen
)

func (s State) String() string {
	switch s {
	case StateClosed:
		return "closed"
	case StateOpen:
		return "open"
	case StateHalfOpen:
		return "half_open"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// BreakerConfig is the policy of one breaker. The yaml keys match the router's breaker block.
type BreakerConfig struct {
	// Window is the sliding window of each breaker, which the rates are computed over.
	Window time.Duration `yaml:"window"`
	// Buckets is how many slices the window slides by.
	Buckets int `yaml:"buckets"`
	// MinCalls is how many calls the window needs before the rates can trip the breaker,
	// so that three failures out of four calls at night do not open it.
	MinCalls int `yaml:"min_calls"`
	// FailureRate is the failure share that trips the breaker, in (0, 1].
	FailureRate float64 `yaml:"failure_rate"`
	// SlowCall is the latency above which a call counts as slow, whether it succeeded or not;
	// 0 turns slow-call tracking off.
	SlowCall time.Duration `yaml:"slow_call"`
	// SlowCallRate is the slow-call share that trips the breaker, in (0, 1]. This is what
	// opens a provider whose answers are all correct but arrive at P99 40 s.
	SlowCallRate float64 `yaml:"slow_call_rate"`
	// ConsecutiveFailures trips the breaker after this many failures in a row, without
	// waiting for min_calls; 0 turns this off.
	ConsecutiveFailures int `yaml:"consecutive_failures"`
	// OpenDuration is the first open period; each re-trip from half-open doubles it, and so
	// does a trip within max_open_duration of the breaker closing (a flap).
	OpenDuration time.Duration `yaml:"open_duration"`
	// MaxOpenDuration caps the doubled open period (before jitter).
	MaxOpenDuration time.Duration `yaml:"max_open_duration"`
	// ScoutInterval is how often an open breaker lets one call through (a scout) to check
	// whether the provider is back; 0 means open_duration, a negative value turns scouting
	// off. A scout that succeeds ends the open period at once and counts as the first probe
	// of the half-open trial. The doubling of open periods spares a dead upstream but would
	// notice a recovery up to max_open_duration late; a scout costs one call per interval,
	// so the upstream stays spared while a recovery is seen within one interval (Envoy lifts
	// an ejected host early with an active health check the same way).
	ScoutInterval time.Duration `yaml:"scout_interval"`
	// OpenJitter spreads every open period uniformly by up to this fraction either way, in
	// [0, 1), so that replicas that tripped together do not probe together.
	OpenJitter float64 `yaml:"open_jitter"`
	// HalfOpenProbes is how many calls a half-open breaker admits per period, those that
	// lost a hedge (and so return no verdict) included; every one with a verdict must
	// succeed, and not be slow, and more than half must have one, to close it.
	HalfOpenProbes int `yaml:"half_open_probes"`
}

// DefaultBreakerConfig returns the defaults from DESIGN.md ("Defaults").
func DefaultBreakerConfig() BreakerConfig {
	return BreakerConfig{
		Window:              60 * time.Second,
		Buckets:             12,
		MinCalls:            20,
		FailureRate:         0.5,
		SlowCall:            10 * time.Second,
		SlowCallRate:        0.5,
		ConsecutiveFailures: 5,
		OpenDuration:        30 * time.Second,
		MaxOpenDuration:     5 * time.Minute,
		OpenJitter:          0.2,
		HalfOpenProbes:      3,
	}
}

// Validate checks the config; each message names its yaml key.
func (c BreakerConfig) Validate() error {
	c = c.filled()
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Window <= 0 {
		add("window: must be positive, got %s", c.Window)
	}
	if c.Buckets <= 0 {
		add("buckets: must be positive, got %d", c.Buckets)
	} else if c.Window > 0 && c.Window < time.Duration(c.Buckets) {
		add("buckets: %d buckets do not fit in window %s", c.Buckets, c.Window)
	}
	if c.MinCalls < 1 {
		add("min_calls: must be at least 1, got %d", c.MinCalls)
	}
	if !(c.FailureRate > 0 && c.FailureRate <= 1) {
		add("failure_rate: must be in (0, 1], got %v", c.FailureRate)
	}
	if c.SlowCall < 0 {
		add("slow_call: must not be negative (0 disables), got %s", c.SlowCall)
	}
	if !(c.SlowCallRate > 0 && c.SlowCallRate <= 1) {
		add("slow_call_rate: must be in (0, 1], got %v", c.SlowCallRate)
	}
	if c.ConsecutiveFailures < 0 {
		add("consecutive_failures: must not be negative (0 disables), got %d", c.ConsecutiveFailures)
	}
	if c.OpenDuration <= 0 {
		add("open_duration: must be positive, got %s", c.OpenDuration)
	}
	if c.MaxOpenDuration < c.OpenDuration {
		add("max_open_duration: must be at least open_duration (%s), got %s", c.OpenDuration, c.MaxOpenDuration)
	}
	if !(c.OpenJitter >= 0 && c.OpenJitter < 1) {
		add("open_jitter: must be in [0, 1), got %v", c.OpenJitter)
	}
	if c.HalfOpenProbes < 1 {
		add("half_open_probes: must be at least 1, got %d", c.HalfOpenProbes)
	}
	return errors.Join(errs...)
}

// Transition is one change of a breaker's state, delivered to the onTransition callback.
type Transition struct {
	From, To State
	// Reason says why, for people: "error rate 62% over 40 calls", "probe failed", ...
	Reason string
	// FailureRate and SlowRate are the evidence of the state being left: the closed window
	// when it trips, the probes so far when half-open ends, zero when open ends.
	FailureRate, SlowRate float64
	At                    time.Time
}

// BreakerSnapshot is a breaker's state for DescribeRoutes and metrics.
type BreakerSnapshot struct {
	State State
	// Reason is the reason of the last transition ("" before the first).
	Reason string
	// FailureRate, SlowRate and Calls are the evidence behind the current state: the live
	// window while closed; what caused the last trip while open or half-open.
	FailureRate, SlowRate float64
	Calls                 int
	// OpenUntil is when an open breaker will admit probes (zero unless open).
	OpenUntil time.Time
	// Trips counts the trips of the current episode: 1 after the first, 2 after a probe
	// re-opened it or the breaker flapped, and so on. It sets the open period; 0 while
	// closed.
	Trips int
	// NextScout is when an open breaker will admit its next scout (zero unless open and
	// scouting).
	NextScout time.Time
}

// ReasonNoVerdict starts the reason of a half-open trial that re-opened because most of its
// probes returned no verdict (they were abandoned). It is not a trip: Trips stays as it was.
const ReasonNoVerdict = "no probe verdict"

// Window fields of a breaker.
const (
	fieldCalls = iota
	fieldFailures
	fieldSlow
	breakerFields
)

// Breaker is a circuit breaker for one upstream key (provider, model, API key, scenario).
// It is safe for concurrent use.
//
// Outcomes count only in the period they were admitted in: a call admitted while closed
// that finishes after the breaker opened, or a probe that finishes after another probe
// re-opened it, is ignored. A period is the time between two transitions.
//
// A breaker that trips again within MaxOpenDuration of closing is flapping: the upstream
// fails often enough to trip it and succeeds often enough to pass a short half-open trial
// (three probes all succeed 34% of the time when 30% of calls fail). Its trips then count
// on from the episode before, so the open period keeps doubling instead of starting over,
// and it does not scout: a scout is a shortcut for a steadily open breaker, and with it a
// flapping one closed again within seconds (the seed-incident drill saw 16 to 21 trips in
// ten minutes, each close sending the next seconds' requests to the slow primary). Envoy
// damps outlier ejection the same way: each ejection of a host lasts longer than the last.
type Breaker struct {
	cfg          BreakerConfig
	clock        clockwork.Clock
	rnd          func() float64
	onTransition func(Transition)

	mu          sync.Mutex
	state       State
	gen         uint64 // incremented on every transition; permits carry the gen they were issued in
	window      *Window
	consecutive int       // failures in a row while closed
	openUntil   time.Time // when open ends
	trips       int       // of the current episode; kept after a close to tell a flap
	closedAt    time.Time // when a half-open trial last closed the breaker
	flapping    bool      // the current episode began with a trip soon after a close
	reason      string
	failureRate float64 // evidence of the last trip
	slowRate    float64
	tripCalls   int
	// Half-open bookkeeping for the current period.
	probes          int // admitted and not cancelled: in flight plus completed
	probesDone      int // completed successfully
	probesAbandoned int // sent, ended without a verdict (Abandon)
	// Open-period scouting (see BreakerConfig.ScoutInterval).
	nextScout time.Time // zero when scouting is off or not open
	scoutOut  bool      // a scout is in flight
	// Transition delivery (see NewBreaker).
	pending  []Transition // not yet delivered, oldest first
	emitting bool         // a goroutine is delivering pending
}

// NewBreaker returns a closed breaker. cfg must be valid (see Validate); a zero cfg takes the
// defaults. clock and rnd (uniform in [0, 1)) default to the real clock and math/rand/v2.
// onTransition, if not nil, is called once per transition, in order, outside the breaker's
// lock; it may read the breaker's Snapshot. If it calls Allow or Done and that causes another
// transition, that transition is delivered after the current callback returns.
//
// Delivery is in order across goroutines: while one goroutine is delivering, transitions made
// by others are queued and that goroutine delivers them too, so Allow or Done may return
// before the callback for its own transition has run (never before it is queued).
func NewBreaker(cfg BreakerConfig, clock clockwork.Clock, rnd func() float64, onTransition func(Transition)) *Breaker {
	if cfg == (BreakerConfig{}) {
		cfg = DefaultBreakerConfig()
	}
	cfg = cfg.filled()
	if err := cfg.Validate(); err != nil {
		panic(fmt.Sprintf("resilience.NewBreaker: %v", err)) //nolint:forbidigo // validated configuration: a programming error
	}
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	if rnd == nil {
		rnd = rand.Float64
	}
	return &Breaker{
		cfg:          cfg,
		clock:        clock,
		rnd:          rnd,
		onTransition: onTransition,
		window:       mustWindow(cfg.Window, cfg.Buckets, breakerFields, clock),
	}
}

// Permit is the right to make one call through a breaker. End it in one of three ways:
//
//   - Done: the call was made and its outcome says something about the upstream's health;
//   - Abandon: the call was sent but gave no verdict (a hedge that lost and was cancelled,
//     a caller that went away mid-call, a 429): nothing is recorded, but a half-open probe
//     or a scout stays spent, because the upstream did receive the call;
//   - Cancel: the call was never sent (no bulkhead place, budget refused): nothing is
//     recorded and a probe's or scout's place is given back.
//
// Every admitted permit must end in one of them (defer Cancel right after Allow: it is a
// no-op after Done or Abandon): a half-open probe that is never finished keeps its place,
// and the breaker stays half-open until it is. The zero Permit is inert.
type Permit struct {
	b *Breaker
	p *permit
}

type permit struct {
	gen      uint64
	halfOpen bool
	scout    bool // admitted while open (see BreakerConfig.ScoutInterval)
	finished bool // guarded by the breaker's mu
}

// ending is how a permit ended.
type ending int

const (
	endDone    ending = iota // a verdict: success or failure, with latency
	endAbandon               // sent, no verdict
	endCancel                // never sent
)

// Allow asks to make a call now. Closed always admits; open refuses until its period has
// passed, then moves to half-open, except for one scout per ScoutInterval; half-open admits
// at most HalfOpenProbes probes in its period (a cancelled probe gives its place back, an
// abandoned one does not).
func (b *Breaker) Allow() (Permit, bool) {
	b.mu.Lock()
	now := b.clock.Now()
	b.advanceLocked(now)
	var p Permit
	ok := false
	switch b.state {
	case StateClosed:
		p, ok = Permit{b: b, p: &permit{gen: b.gen}}, true
	case StateHalfOpen:
		if b.probes < b.cfg.HalfOpenProbes {
			b.probes++
			p, ok = Permit{b: b, p: &permit{gen: b.gen, halfOpen: true}}, true
		}
	case StateOpen:
		// One scout at a time: a second one would only tell us the same thing.
		if !b.nextScout.IsZero() && !b.scoutOut && !now.Before(b.nextScout) {
			b.scoutOut = true
			b.scheduleScoutLocked(now)
			p, ok = Permit{b: b, p: &permit{gen: b.gen, scout: true}}, true
		}
	}
	b.unlockAndEmit()
	return p, ok
}

// Trial reports whether the permit was admitted to test a breaker that is not closed: a
// half-open probe or a scout. A caller that treats calls to a healthy upstream differently
// (a failover to it needs no retry budget) asks this.
func (p Permit) Trial() bool { return p.p != nil && (p.p.halfOpen || p.p.scout) }

// Scout reports whether the permit is an open breaker's scout (see
// BreakerConfig.ScoutInterval): a caller may send it beside the request instead of in its
// way, since the request has a healthier choice.
func (p Permit) Scout() bool { return p.p != nil && p.p.scout }

// Done records the outcome of the admitted call: failure counts toward the error rate, and
// latency toward the slow-call rate even when the call succeeded. Only the first Done,
// Abandon or Cancel of a permit counts.
func (p Permit) Done(failure bool, latency time.Duration) {
	if p.b == nil {
		return
	}
	p.b.finish(p.p, endDone, failure, latency)
}

// Abandon releases a permit whose call was sent but whose result says nothing about the
// upstream's health: a hedge that lost and was cancelled, a caller that went away mid-call,
// a 429 (the key cools down instead). Nothing is recorded, and a half-open probe keeps its
// place for the rest of the period: half_open_probes bounds the calls a recovering upstream
// receives per period, and an abandoned probe was one of them (with Cancel, a hedged router
// let 4 to 9 calls per period reach a recovering primary; mantle drill). An abandoned scout
// is spent too: the next one waits for the next interval.
//
// A trial whose probes all ended, some without a verdict, is decided by those that have
// one: it closes when at least one succeeded and none failed, and when none returned a
// verdict it re-opens for the period it had before (ReasonNoVerdict), not counted as a trip:
// nothing failed, but nothing showed the upstream is back either.
func (p Permit) Abandon() {
	if p.b == nil {
		return
	}
	p.b.finish(p.p, endAbandon, false, 0)
}

// Cancel releases a permit whose call was never sent (no bulkhead place, the retry budget
// refused): nothing is recorded, and a cancelled probe or scout gives its place back.
func (p Permit) Cancel() {
	if p.b == nil {
		return
	}
	p.b.finish(p.p, endCancel, false, 0)
}

func (b *Breaker) finish(p *permit, end ending, failure bool, latency time.Duration) {
	b.mu.Lock()
	if p.finished {
		b.mu.Unlock()
		return
	}
	p.finished = true
	now := b.clock.Now()
	b.advanceLocked(now)
	if p.gen != b.gen {
		// Admitted in an earlier period: that period's verdict is in already.
		b.mu.Unlock()
		return
	}
	slow := b.cfg.SlowCall > 0 && latency > b.cfg.SlowCall
	switch {
	case p.scout:
		b.scoutOut = false
		switch end {
		case endCancel:
			b.nextScout = now // never sent: the turn is not used up
		case endDone:
			b.recordScoutLocked(now, failure, slow)
		}
	case end == endCancel:
		if p.halfOpen {
			b.probes--
		}
	case end == endAbandon:
		if p.halfOpen {
			b.probesAbandoned++
			b.settleTrialLocked(now)
		}
	case b.state == StateClosed:
		b.recordClosedLocked(now, failure, slow)
	case b.state == StateHalfOpen:
		b.recordProbeLocked(now, failure, slow, latency)
	}
	b.unlockAndEmit()
}

// recordScoutLocked applies a scout's verdict. A failed (or slow) scout leaves the open
// period as it was: it cost one call, which is what scouting budgets for, so it does not
// lengthen the backoff. A good one ends the open period and is the trial's first probe.
func (b *Breaker) recordScoutLocked(now time.Time, failure, slow bool) {
	if failure || slow {
		return
	}
	b.transitionLocked(now, StateHalfOpen, "scout succeeded", 0, 0)
	b.probes, b.probesDone = 1, 1
	b.settleTrialLocked(now)
}

func (b *Breaker) recordClosedLocked(now time.Time, failure, slow bool) {
	b.window.AddAt(now, fieldCalls, 1)
	if failure {
		b.window.AddAt(now, fieldFailures, 1)
		b.consecutive++
	} else {
		b.consecutive = 0
	}
	if slow {
		b.window.AddAt(now, fieldSlow, 1)
	}
	calls, fr, sr := b.ratesLocked(now)
	var reason string
	switch {
	case calls >= b.cfg.MinCalls && fr >= b.cfg.FailureRate:
		reason = fmt.Sprintf("error rate %s over %d calls", percent(fr), calls)
	case calls >= b.cfg.MinCalls && b.cfg.SlowCall > 0 && sr >= b.cfg.SlowCallRate:
		reason = fmt.Sprintf("slow-call rate %s (>%s) over %d calls", percent(sr), b.cfg.SlowCall, calls)
	case b.cfg.ConsecutiveFailures > 0 && b.consecutive >= b.cfg.ConsecutiveFailures:
		reason = fmt.Sprintf("%d consecutive failures", b.consecutive)
	default:
		return
	}
	b.tripLocked(now, reason, fr, sr, calls)
}

func (b *Breaker) recordProbeLocked(now time.Time, failure, slow bool, latency time.Duration) {
	completed := b.probesDone + 1
	switch {
	case failure:
		b.tripLocked(now, "probe failed", 1/float64(completed), 0, completed)
	case slow:
		b.tripLocked(now, fmt.Sprintf("probe slow (%s > %s)", latency.Round(time.Millisecond), b.cfg.SlowCall),
			0, 1/float64(completed), completed)
	default:
		b.probesDone = completed
		b.settleTrialLocked(now)
	}
}

// settleTrialLocked ends a half-open trial once every probe place is used and every probe
// has ended without failing: it closes when most probes succeeded, and re-opens for the
// current trip's period (no trip counted) when most returned no verdict. A probe without a
// verdict was usually outrun by a hedge or outlived its caller: an upstream that answers
// one probe in three in time is not yet one to send every request to again, and closing on
// it flaps within a second.
func (b *Breaker) settleTrialLocked(now time.Time) {
	if b.probesDone+b.probesAbandoned < b.cfg.HalfOpenProbes {
		return
	}
	if b.probesDone*2 <= b.cfg.HalfOpenProbes {
		reason := fmt.Sprintf("%s (%d probes abandoned)", ReasonNoVerdict, b.probesAbandoned)
		if b.probesDone > 0 {
			reason = fmt.Sprintf("%s (%d of %d probes abandoned)", ReasonNoVerdict, b.probesAbandoned, b.cfg.HalfOpenProbes)
		}
		b.openUntil = now.Add(openPeriod(b.cfg, b.trips, b.rnd()))
		b.transitionLocked(now, StateOpen, reason, 0, 0)
		return
	}
	reason := "probes succeeded"
	if b.probesAbandoned > 0 {
		reason = fmt.Sprintf("probes succeeded (%d of %d without a verdict)", b.probesAbandoned, b.cfg.HalfOpenProbes)
	}
	b.transitionLocked(now, StateClosed, reason, 0, 0)
	b.window.Reset()
	b.consecutive = 0
	b.closedAt = now // trips stay: a trip soon after this is a flap (see Breaker)
	b.failureRate, b.slowRate, b.tripCalls = 0, 0, 0
}

// ratesLocked returns the calls in the window and their failure and slow-call rates.
func (b *Breaker) ratesLocked(now time.Time) (calls int, failureRate, slowRate float64) {
	var buf [breakerFields]int
	sums := b.window.SumsAt(now, buf[:])
	calls = sums[fieldCalls]
	if calls == 0 {
		return 0, 0, 0
	}
	return calls, float64(sums[fieldFailures]) / float64(calls), float64(sums[fieldSlow]) / float64(calls)
}

// tripLocked opens the breaker for an open period that doubles with each trip of the
// episode, capped, then jittered. A trip from closed starts a new episode unless it is a
// flap (see Breaker).
func (b *Breaker) tripLocked(now time.Time, reason string, fr, sr float64, calls int) {
	if b.state == StateClosed {
		since := now.Sub(b.closedAt)
		b.flapping = b.trips > 0 && since < b.cfg.MaxOpenDuration
		if b.flapping {
			reason = fmt.Sprintf("%s; flapping: %s after closing", reason, since.Round(time.Millisecond))
		} else {
			b.trips = 0
		}
	}
	b.trips++
	b.failureRate, b.slowRate, b.tripCalls = fr, sr, calls
	b.openUntil = now.Add(openPeriod(b.cfg, b.trips, b.rnd()))
	b.transitionLocked(now, StateOpen, reason, fr, sr)
}

// openPeriod is the open period after the given trip (1 for the first since close) with
// jitter draw r in [0, 1): base = min(MaxOpenDuration, OpenDuration*2^(trip-1)), then spread
// uniformly over [base*(1-OpenJitter), base*(1+OpenJitter)). The cap bounds the base, not
// the jittered period, so replicas that all reached the cap still probe at different times.
func openPeriod(cfg BreakerConfig, trip int, r float64) time.Duration {
	base := cfg.OpenDuration
	for i := 1; i < trip && base < cfg.MaxOpenDuration; i++ {
		base *= 2
	}
	base = min(base, cfg.MaxOpenDuration)
	return jittered(cfg.OpenJitter, base, r)
}

// jittered spreads d uniformly over [d*(1-jitter), d*(1+jitter)) with draw r in [0, 1).
func jittered(jitter float64, d time.Duration, r float64) time.Duration {
	factor := 1 + jitter*(2*r-1)
	return time.Duration(math.Round(float64(d) * factor))
}

// scoutInterval is ScoutInterval with 0 meaning OpenDuration; negative means no scouting.
func (c BreakerConfig) scoutInterval() time.Duration {
	if c.ScoutInterval == 0 {
		return c.OpenDuration
	}
	return c.ScoutInterval
}

// transitionLocked moves to state to. Entering open, the caller has set openUntil; the first
// scout is due one jittered ScoutInterval after the period began.
func (b *Breaker) transitionLocked(now time.Time, to State, reason string, fr, sr float64) {
	b.pending = append(b.pending, Transition{From: b.state, To: to, Reason: reason, FailureRate: fr, SlowRate: sr, At: now})
	b.state = to
	b.reason = reason
	b.gen++
	b.probes, b.probesDone, b.probesAbandoned = 0, 0, 0
	b.nextScout, b.scoutOut = time.Time{}, false
	if to != StateOpen {
		b.openUntil = time.Time{}
	} else {
		b.scheduleScoutLocked(now)
	}
}

// scheduleScoutLocked sets when the next scout is due: one jittered ScoutInterval from now,
// or never in this period when scouting is off or the open period ends first (half-open
// then takes over).
func (b *Breaker) scheduleScoutLocked(now time.Time) {
	b.nextScout = time.Time{}
	if iv := b.cfg.scoutInterval(); iv > 0 && !b.flapping {
		if next := now.Add(jittered(b.cfg.OpenJitter, iv, b.rnd())); next.Before(b.openUntil) {
			b.nextScout = next
		}
	}
}

// advanceLocked moves an open breaker whose period has passed to half-open. It runs lazily
// on every call, so a breaker needs no timer goroutine.
func (b *Breaker) advanceLocked(now time.Time) {
	if b.state == StateOpen && !now.Before(b.openUntil) {
		b.transitionLocked(now, StateHalfOpen, "open period elapsed", 0, 0)
	}
}

// unlockAndEmit releases mu and delivers queued transitions in order, unless another
// goroutine is already delivering (it will deliver these too).
func (b *Breaker) unlockAndEmit() {
	if b.emitting || len(b.pending) == 0 || b.onTransition == nil {
		if b.onTransition == nil {
			b.pending = b.pending[:0]
		}
		b.mu.Unlock()
		return
	}
	b.emitting = true
	for len(b.pending) > 0 {
		batch := b.pending
		b.pending = nil
		b.mu.Unlock()
		for _, t := range batch {
			b.onTransition(t)
		}
		b.mu.Lock()
	}
	b.emitting = false
	b.mu.Unlock()
}

// Snapshot returns the breaker's state, moving it to half-open first if its open period has
// passed.
func (b *Breaker) Snapshot() BreakerSnapshot {
	b.mu.Lock()
	now := b.clock.Now()
	b.advanceLocked(now)
	s := BreakerSnapshot{State: b.state, Reason: b.reason, Trips: b.trips, OpenUntil: b.openUntil, NextScout: b.nextScout}
	if b.state == StateClosed {
		s.Trips = 0 // kept inside only to tell a flap
		s.Calls, s.FailureRate, s.SlowRate = b.ratesLocked(now)
	} else {
		s.FailureRate, s.SlowRate, s.Calls = b.failureRate, b.slowRate, b.tripCalls
	}
	b.unlockAndEmit()
	return s
}

// percent formats a rate as "62%".
func percent(r float64) string { return fmt.Sprintf("%.0f%%", r*100) }

// filled gives a zero Window or Buckets the default: a config written without them (a
// struct literal, a YAML block that omits them) means "the usual slicing".
func (c BreakerConfig) filled() BreakerConfig {
	d := DefaultBreakerConfig()
	if c.Window == 0 {
		c.Window = d.Window
	}
	if c.Buckets == 0 {
		c.Buckets = d.Buckets
	}
	return c
}
