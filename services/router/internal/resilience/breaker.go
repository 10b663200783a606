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
	// Window is the length of the sliding window the rates are computed over.
	Window time.Duration `yaml:"window"`
	// Buckets is how many slices the window slides by.
	Buckets int `yaml:"buckets"`
	// MinCalls is how many calls the window must hold before its rates can trip the
	// breaker, so three failures out of four calls at night do not open it.
	MinCalls int `yaml:"min_calls"`
	// FailureRate trips the breaker when failures/calls reaches it.
	FailureRate float64 `yaml:"failure_rate"`
	// SlowCall is the latency above which a call counts as slow, whether it succeeded or not;
	// 0 disables slow-call tracking.
	SlowCall time.Duration `yaml:"slow_call"`
	// SlowCallRate trips the breaker when slow/calls reaches it. This is what opens a
	// provider whose answers are all correct but arrive at P99 40 s.
	SlowCallRate float64 `yaml:"slow_call_rate"`
	// ConsecutiveFailures trips the breaker after this many failures in a row, without
	// waiting for MinCalls; 0 disables the fast trip.
	ConsecutiveFailures int `yaml:"consecutive_failures"`
	// OpenDuration is the first open period; each re-trip from half-open doubles it.
	OpenDuration time.Duration `yaml:"open_duration"`
	// MaxOpenDuration caps the doubled open period (before jitter).
	MaxOpenDuration time.Duration `yaml:"max_open_duration"`
	// OpenJitter spreads each open period uniformly by up to this fraction either way, so
	// replicas that tripped together do not probe together.
	OpenJitter float64 `yaml:"open_jitter"`
	// HalfOpenProbes is how many probes half-open admits; all must succeed (and not be slow)
	// for the breaker to close.
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
	// Trips counts trips since the breaker last closed: 1 after the first, 2 after a probe
	// re-opened it, and so on. It sets the open period and resets on close.
	Trips int
}

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
	trips       int
	reason      string
	failureRate float64 // evidence of the last trip
	slowRate    float64
	tripCalls   int
	// Half-open bookkeeping for the current period.
	probes     int // admitted and not cancelled: in flight plus completed
	probesDone int // completed successfully
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
		panic(fmt.Sprintf("resilience.NewBreaker: %v", err))
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

// Permit is the right to make one call through a breaker. Report its outcome with Done, or
// release it with Cancel when the outcome says nothing about the upstream's health. Every
// admitted permit must end in one of the two (defer Cancel right after Allow: it is a no-op
// after Done): a half-open probe that is never finished keeps its place, and the breaker
// stays half-open until it is. The zero Permit is inert.
type Permit struct {
	b *Breaker
	p *permit
}

type permit struct {
	gen      uint64
	halfOpen bool
	finished bool // guarded by the breaker's mu
}

// Allow asks to make a call now. Closed always admits; open refuses until its period has
// passed, then moves to half-open; half-open admits at most HalfOpenProbes probes in its
// period (a cancelled probe gives its place back).
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
	}
	b.unlockAndEmit()
	return p, ok
}

// Done records the outcome of the admitted call: failure counts toward the error rate, and
// latency toward the slow-call rate even when the call succeeded. Only the first Done or
// Cancel of a permit counts.
func (p Permit) Done(failure bool, latency time.Duration) {
	if p.b == nil {
		return
	}
	p.b.finish(p.p, true, failure, latency)
}

// Cancel releases the permit without recording an outcome, for results that say nothing
// about the upstream's health: a 429 (the key cools down instead), a caller that went away,
// a call that was never sent. A cancelled probe frees its half-open place.
func (p Permit) Cancel() {
	if p.b == nil {
		return
	}
	p.b.finish(p.p, false, false, 0)
}

func (b *Breaker) finish(p *permit, record, failure bool, latency time.Duration) {
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
	case !record:
		if p.halfOpen {
			b.probes--
		}
	case b.state == StateClosed:
		b.recordClosedLocked(now, failure, slow)
	case b.state == StateHalfOpen:
		b.recordProbeLocked(now, failure, slow, latency)
	}
	b.unlockAndEmit()
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
		if b.probesDone >= b.cfg.HalfOpenProbes {
			b.transitionLocked(now, StateClosed, "probes succeeded", 0, 0)
			b.window.Reset()
			b.consecutive = 0
			b.trips = 0
			b.failureRate, b.slowRate, b.tripCalls = 0, 0, 0
		}
	}
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

// tripLocked opens the breaker for an open period that doubles with each trip since the last
// close, capped, then jittered.
func (b *Breaker) tripLocked(now time.Time, reason string, fr, sr float64, calls int) {
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
	factor := 1 + cfg.OpenJitter*(2*r-1)
	return time.Duration(math.Round(float64(base) * factor))
}

func (b *Breaker) transitionLocked(now time.Time, to State, reason string, fr, sr float64) {
	b.pending = append(b.pending, Transition{From: b.state, To: to, Reason: reason, FailureRate: fr, SlowRate: sr, At: now})
	b.state = to
	b.reason = reason
	b.gen++
	b.probes, b.probesDone = 0, 0
	if to != StateOpen {
		b.openUntil = time.Time{}
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
	s := BreakerSnapshot{State: b.state, Reason: b.reason, Trips: b.trips, OpenUntil: b.openUntil}
	if b.state == StateClosed {
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
