package session

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jonboulle/clockwork"
	"golang.org/x/time/rate"
)

// Manager keeps agent sessions in a Store: it opens them at their first step, records
// every step, charges budgets, replays completed steps, and ends sessions. Every change is
// a compare-and-set of the session's record, so replicas sharing a store (JetStream) never
// lose each other's changes.
type Manager struct {
	cfg   Config
	store Store
	clock clockwork.Clock
	sched *Scheduler

	mu      sync.Mutex
	opening map[string]*rate.Limiter // per tenant: new sessions per minute

	// onEvent receives the changes operators watch (OnEvent); nil for none.
	onEvent func(ctx context.Context, ev Event)
}

// NewManager returns a manager over store. cfg must be valid (Config.Validate).
func NewManager(cfg Config, store Store, clock clockwork.Clock) *Manager {
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	return &Manager{cfg: cfg, store: store, clock: clock, sched: NewScheduler(cfg.Scheduler), opening: map[string]*rate.Limiter{}}
}

// Scheduler is the manager's parallelism scheduler (its per-tool levels).
func (m *Manager) Scheduler() *Scheduler { return m.sched }

// Now is the manager's clock's time.
func (m *Manager) Now() time.Time { return m.clock.Now() }

// ParallelCap is the cap on s's tool calls running at once, at now.
func (m *Manager) ParallelCap(s *Session, now time.Time) int { return m.sched.Cap(now, toolsOf(s)...) }

// Bounds of the strings a request carries into a session's record.
const (
	maxIDLen     = 128
	maxReasonLen = 512
)

// BeginRequest opens a step (and the session, at its first step).
type BeginRequest struct {
	// Tenant owns the session: the session's key includes it, so no other tenant reaches it.
	Tenant    string
	SessionID string
	StepID    string
	Kind      Kind
	// Target is the model or tool the step calls.
	Target string
	// Required: the step's failure ends the session with a partial result.
	Required bool
	// Fingerprint is a digest of the step's request; a step id reused with another
	// fingerprint is refused.
	Fingerprint string
	// Budget is the session's, when this step opens it; zero fields take the defaults.
	// Ignored for an existing session.
	Budget Budget
	// ToolKind is the tool's kind for a tool step (query, action, external).
	ToolKind string
	// Deadline is the caller's deadline for the step (zero: none): the step's lease.
	Deadline time.Time
}

// BeginResult says how the step goes on.
type BeginResult struct {
	// Replay: the step was completed before (or awaits a confirmation): Step is its
	// record, with its result; the caller answers with it and calls nothing.
	Replay bool
	Step   Step
	// Left is what is left of the session's budget; the step runs under it.
	Left Left
	// Degraded: the session is degraded (sticky); the step serves its degraded form.
	Degraded bool
	// ActionsNeedConfirmation: the session's action tools need a person's confirmation.
	ActionsNeedConfirmation bool
	// ParallelCap is the session's cap on tool calls running at once.
	ParallelCap int
}

// EndRequest records a step's outcome.
type EndRequest struct {
	Tenant    string
	SessionID string
	StepID    string
	Status    StepStatus
	// Result is recorded for a completed step (done, degraded, stale), within the bounds.
	Result         []byte
	AnsweredBy     string
	Reason         string
	Tokens         int64
	CostUSD        float64
	IdempotencyKey string
	ConfirmationID string
	StaleAge       time.Duration
	// TimedOut: the step's call timed out (feeds the scheduler).
	TimedOut bool
}

// EndResult is the session after the step.
type EndResult struct {
	State     State
	EndReason string
	Left      Left
	// Recorded: the step's result was recorded (false when it was too large, when there
	// was none, or when the step had ended already).
	Recorded bool
}

func validID(field, v string) error {
	if v == "" || len(v) > maxIDLen {
		return invalid(field, "want 1 to %d characters, got %d", maxIDLen, len(v))
	}
	for i := range len(v) {
		if v[i] <= ' ' || v[i] > '~' {
			return invalid(field, "want printable ASCII without spaces")
		}
	}
	return nil
}

func validOptional(field, v string) error {
	if v == "" {
		return nil
	}
	return validID(field, v)
}

// clip bounds a free text to maxReasonLen bytes, on a character boundary.
func clip(s string) string {
	if len(s) <= maxReasonLen {
		return s
	}
	s = s[:maxReasonLen]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

func (r BeginRequest) validate(maxBudget BudgetConfig) error {
	if err := validID("session_id", r.SessionID); err != nil {
		return err
	}
	if err := validID("step_id", r.StepID); err != nil {
		return err
	}
	if r.Kind != KindModel && r.Kind != KindTool {
		return invalid("kind", "want model or tool, got %q", r.Kind)
	}
	if err := validID("target", r.Target); err != nil {
		return err
	}
	if err := validOptional("fingerprint", r.Fingerprint); err != nil {
		return err
	}
	switch {
	case r.Kind == KindTool && r.ToolKind != ToolQuery && r.ToolKind != ToolAction && r.ToolKind != ToolExternal:
		return invalid("tool_kind", "a tool step needs query, action or external, got %q", r.ToolKind)
	case r.Kind == KindModel && r.ToolKind != "":
		return invalid("tool_kind", "only for tool steps")
	}
	b := r.Budget
	switch {
	case b.Deadline < 0 || b.Tokens < 0 || b.CostUSD < 0 || b.Steps < 0:
		return invalid("budget", "must not be negative")
	case b.Deadline > maxBudget.Deadline:
		return invalid("budget.deadline", "at most %s", maxBudget.Deadline)
	case b.Tokens > maxBudget.MaxTokens:
		return invalid("budget.max_tokens", "at most %d", maxBudget.MaxTokens)
	case b.CostUSD > maxBudget.MaxCostUSD:
		return invalid("budget.max_cost_usd", "at most %v", maxBudget.MaxCostUSD)
	case b.Steps > maxBudget.MaxSteps:
		return invalid("budget.max_steps", "at most %d", maxBudget.MaxSteps)
	}
	return nil
}

// budget fills the fields of a requested budget left at zero with the defaults.
func (m *Manager) budget(b Budget) Budget {
	d := m.cfg.DefaultBudget
	if b.Deadline == 0 {
		b.Deadline = d.Deadline
	}
	if b.Tokens == 0 {
		b.Tokens = d.MaxTokens
	}
	if b.CostUSD == 0 {
		b.CostUSD = d.MaxCostUSD
	}
	if b.Steps == 0 {
		b.Steps = d.MaxSteps
	}
	return b
}

// hash16 is a key token: 128 bits of the SHA-256 of v, in hex. Ids may hold characters
// a KV key may not, and a fixed length bounds the key.
func hash16(v string) string {
	sum := sha256.Sum256([]byte(v))
	return hex.EncodeToString(sum[:16])
}

// sessionKey is the store key of a tenant's session: the tenant is part of it, so one
// tenant's id never reaches another tenant's session.
func sessionKey(tenant, id string) string { return "s." + hash16(tenant) + "." + hash16(id) }

// resultKey is a fresh store key for a step's result. Each recording gets its own, so a
// slower runner of a step that was taken over never overwrites the result recorded first.
func resultKey(tenant, id string) string {
	return "r." + hash16(tenant) + "." + hash16(id) + "." + uuid.NewString()
}

// ttl is how long a session's keys live after a write at now: until its deadline plus the
// retention period.
func (m *Manager) ttl(s *Session, now time.Time) time.Duration {
	return max(s.deadline().Sub(now), 0) + m.cfg.Retention
}

// maxCASAttempts bounds a read-modify-write loop. Each failed attempt means another writer
// changed the session in between; parallel steps of one session are few.
const maxCASAttempts = 32

// errNoWrite is returned by a change that leaves the session as it was.
var errNoWrite = errors.New("no write")

// change is a read-modify-write of one session: it gets the session (nil when it does not
// exist) and returns the session to write, errNoWrite to write nothing, or an error.
type change func(s *Session, now time.Time) (*Session, error)

// update applies fn to the session at key until its compare-and-set succeeds, and returns
// what was written (or read, with errNoWrite).
func (m *Manager) update(ctx context.Context, key string, fn change) (*Session, error) {
	for range maxCASAttempts {
		var cur *Session
		value, rev, err := m.store.Get(ctx, key)
		switch {
		case errors.Is(err, ErrNotFound):
		case err != nil:
			return nil, m.storeErr(ctx, err)
		default:
			if cur, err = decode(value); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
			}
		}
		now := m.clock.Now()
		var in *Session
		if cur != nil {
			in = cur.clone()
		}
		next, err := fn(in, now)
		if errors.Is(err, errNoWrite) {
			return cur, nil
		}
		if err != nil {
			return nil, err
		}
		next.UpdatedAt = now
		b, err := json.Marshal(next)
		if err != nil {
			return nil, fmt.Errorf("session encode: %w", err)
		}
		if cur == nil {
			_, err = m.store.Create(ctx, key, b, m.ttl(next, now))
		} else {
			_, err = m.store.Update(ctx, key, b, rev, m.ttl(next, now))
		}
		switch {
		case err == nil:
			m.notify(ctx, cur, next)
			return next, nil
		case errors.Is(err, ErrConflict), errors.Is(err, ErrNotFound):
			continue
		default:
			return nil, m.storeErr(ctx, err)
		}
	}
	return nil, fmt.Errorf("%w: the session kept changing over %d attempts", ErrUnavailable, maxCASAttempts)
}

// storeErr maps a store error: the caller's own cancellation stays itself.
func (m *Manager) storeErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

func decode(b []byte) (*Session, error) {
	var s Session
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("session decode: %w", err)
	}
	// The record comes from a store others write: a null step would be dereferenced by
	// every operation on the session.
	for i, st := range s.Steps {
		if st == nil {
			return nil, fmt.Errorf("session decode: steps[%d] is null", i)
		}
	}
	return &s, nil
}

// allowNew spends one of the tenant's new sessions for this minute.
func (m *Manager) allowNew(tenant string, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.opening[tenant]
	if l == nil {
		// Tenants come from the authentication configuration, so the map is bounded by
		// it; the bound below only guards against a misuse.
		if len(m.opening) >= 10_000 {
			clear(m.opening)
		}
		per := m.cfg.NewSessionsPerMinute
		l = rate.NewLimiter(rate.Limit(float64(per)/60), per)
		m.opening[tenant] = l
	}
	return l.AllowN(now, 1)
}

// Begin opens a step. It replays a step that was completed before; it runs it (again) when
// it never ran, failed, was cancelled, was not recorded, or its runner's lease ran out. A
// tool step waits while the session has as many tool steps running as its parallel cap,
// until one ends or ctx is done.
func (m *Manager) Begin(ctx context.Context, req BeginRequest) (BeginResult, error) {
	if err := req.validate(m.cfg.MaxBudget); err != nil {
		return BeginResult{}, err
	}
	key := sessionKey(req.Tenant, req.SessionID)
	var w Watch
	defer func() {
		if w != nil {
			w.Stop()
		}
	}()
	for {
		res, wakeAt, err := m.tryBegin(ctx, key, req)
		if err != nil || wakeAt.IsZero() {
			return res, err
		}
		// At the cap: wait for a change of the session (a step ending), a lease running
		// out, or the scheduler's next window. The watch starts before the next read, so
		// no change between the two is missed.
		if w == nil {
			if w, err = m.store.Watch(ctx, key); err != nil {
				return BeginResult{}, m.storeErr(ctx, err)
			}
			continue
		}
		if err := m.waitChange(ctx, w, wakeAt); err != nil {
			return BeginResult{}, err
		}
	}
}

// waitChange returns when w reports a change, at wakeAt, or with ctx's error.
func (m *Manager) waitChange(ctx context.Context, w Watch, wakeAt time.Time) error {
	t := m.clock.NewTimer(wakeAt.Sub(m.clock.Now()))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-w.Changes():
	case <-t.Chan():
	}
	return nil
}

// tryBegin is one attempt of Begin. A non-zero wakeAt means the step waits for a slot.
func (m *Manager) tryBegin(ctx context.Context, key string, req BeginRequest) (res BeginResult, wakeAt time.Time, err error) {
	var ended *EndedError
	var loaded *Step
	_, err = m.update(ctx, key, func(s *Session, now time.Time) (*Session, error) {
		res, wakeAt, ended, loaded = BeginResult{}, time.Time{}, nil, nil
		if s == nil {
			if !m.allowNew(req.Tenant, now) {
				return nil, ErrTooManySessions
			}
			s = &Session{ID: req.SessionID, Tenant: req.Tenant, State: StateActive, Budget: m.budget(req.Budget), CreatedAt: now}
		}
		// A completed step replays even in an ended session: an agent that resumes
		// rebuilds its state from the record and learns of the end at its first step
		// that was not recorded.
		st := s.step(req.StepID)
		if st != nil {
			if st.Kind != req.Kind || (st.Fingerprint != "" && req.Fingerprint != "" && st.Fingerprint != req.Fingerprint) {
				return nil, fmt.Errorf("%w: step %q was begun as a %s step with another request", ErrStepConflict, req.StepID, st.Kind)
			}
			switch {
			case (st.Status.completed() && !st.RecordTooLarge) || st.Status == StatusPendingConfirmation:
				res = m.result(s, now, req.StepID)
				res.Replay, res.Step = true, *st
				loaded = st
				return nil, errNoWrite
			case st.live(now):
				return nil, fmt.Errorf("%w: step %q runs until %s", ErrStepInProgress, req.StepID, st.LeaseUntil.Format(time.RFC3339))
			}
		}
		if !s.active() {
			ended = &EndedError{State: s.State, Reason: s.EndReason}
			return nil, errNoWrite
		}
		if reason := s.exhausted(now, true); reason != "" {
			if st == nil && len(s.Steps) < m.cfg.MaxBudget.MaxSteps {
				st = &Step{ID: req.StepID, Kind: req.Kind, Target: req.Target, ToolKind: req.ToolKind, StartedAt: now}
				s.Steps = append(s.Steps, st)
			}
			if st != nil {
				st.Status, st.EndedAt, st.Reason = StatusSkipped, now, "the session's "+reason+" budget ran out first"
			}
			s.end(now, StateEndedPartial, reason)
			ended = &EndedError{State: s.State, Reason: s.EndReason}
			return s, nil
		}
		if req.Kind == KindTool {
			capN := m.sched.Cap(now, append(toolsOf(s), req.Target)...)
			running := 0
			var firstLease time.Time
			for _, o := range s.Steps {
				if o.Kind == KindTool && o.live(now) {
					running++
					if firstLease.IsZero() || o.LeaseUntil.Before(firstLease) {
						firstLease = o.LeaseUntil
					}
				}
			}
			if running >= capN {
				wakeAt = now.Add(m.cfg.Scheduler.Window)
				if firstLease.Before(wakeAt) {
					wakeAt = firstLease
				}
				return nil, errNoWrite
			}
		}
		if st == nil {
			st = &Step{ID: req.StepID, Kind: req.Kind}
			s.Steps = append(s.Steps, st)
		}
		*st = Step{
			ID: req.StepID, Kind: req.Kind, Status: StatusRunning, Target: req.Target, Required: req.Required,
			Fingerprint: req.Fingerprint, ToolKind: req.ToolKind, Attempts: st.Attempts + 1,
			StartedAt: now, LeaseUntil: m.lease(s, req.Deadline, now),
		}
		s.StepsBegun++
		degraded := m.degradedFor(s, st.ID, now)
		res = m.result(s, now, st.ID)
		res.Degraded = degraded
		return s, nil
	})
	switch {
	case err != nil:
		return BeginResult{}, time.Time{}, err
	case ended != nil:
		return BeginResult{}, time.Time{}, ended
	case !wakeAt.IsZero():
		return BeginResult{}, wakeAt, nil
	}
	if loaded != nil && loaded.ResultKey != "" {
		if res.Step.Result, err = m.loadResult(ctx, loaded.ResultKey); err != nil {
			return BeginResult{}, time.Time{}, err
		}
	}
	return res, time.Time{}, nil
}

// result is what Begin answers about the session (not the step) at now.
func (m *Manager) result(s *Session, now time.Time, stepID string) BeginResult {
	return BeginResult{
		Left:                    s.left(now),
		Degraded:                s.Degraded && s.ProbeStep != stepID,
		ActionsNeedConfirmation: s.ActionsNeedConfirmation,
		ParallelCap:             m.sched.Cap(now, toolsOf(s)...),
	}
}

// loadResult reads a recorded result. A result that is gone (expired before its session,
// which only a store whose keys were removed by hand can do) reads as none.
func (m *Manager) loadResult(ctx context.Context, key string) ([]byte, error) {
	b, _, err := m.store.Get(ctx, key)
	if errors.Is(err, ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, m.storeErr(ctx, err)
	}
	return b, nil
}

// lease is how long a step begun at now holds its id: the caller's deadline, within the
// session's deadline and the configured bound.
func (m *Manager) lease(s *Session, callerDeadline time.Time, now time.Time) time.Time {
	until := now.Add(m.cfg.MaxStepLease)
	if d := s.deadline(); d.Before(until) {
		until = d
	}
	if !callerDeadline.IsZero() && callerDeadline.Before(until) {
		until = callerDeadline
	}
	return until
}

// toolsOf lists the tools a session has called.
func toolsOf(s *Session) []string {
	var tools []string
	seen := map[string]bool{}
	for _, st := range s.Steps {
		if st.Kind == KindTool && !seen[st.Target] {
			seen[st.Target] = true
			tools = append(tools, st.Target)
		}
	}
	return tools
}

// degradedFor decides whether the step just begun serves the degraded form: a degraded
// session does until degraded_until; then one step at a time (the probe) tries the full
// form.
func (m *Manager) degradedFor(s *Session, stepID string, now time.Time) bool {
	if !s.Degraded {
		return false
	}
	if s.ProbeStep == stepID {
		return false
	}
	if now.Before(s.DegradedUntil) {
		return true
	}
	if p := s.step(s.ProbeStep); p != nil && p.live(now) {
		return true // another step is trying the full form
	}
	s.ProbeStep = stepID
	return false
}

// End records a step's outcome, charges its usage and applies what follows from it:
// degradation (sticky), recovery, a required step's failure, a budget running out. A step
// that has ended already is left as it is (the first outcome recorded wins), but a step
// cancelled or pending confirmation takes a later outcome: its runner finished after all.
func (m *Manager) End(ctx context.Context, req EndRequest) (EndResult, error) {
	if err := validID("session_id", req.SessionID); err != nil {
		return EndResult{}, err
	}
	if err := validID("step_id", req.StepID); err != nil {
		return EndResult{}, err
	}
	if !req.Status.endable() {
		return EndResult{}, invalid("status", "want done, degraded, stale, pending_confirmation, failed or cancelled, got %q", req.Status)
	}
	if err := validOptional("answered_by", req.AnsweredBy); err != nil {
		return EndResult{}, err
	}
	if err := validOptional("idempotency_key", req.IdempotencyKey); err != nil {
		return EndResult{}, err
	}
	if err := validOptional("confirmation_id", req.ConfirmationID); err != nil {
		return EndResult{}, err
	}
	if req.Tokens < 0 || req.CostUSD < 0 || req.StaleAge < 0 {
		return EndResult{}, invalid("usage", "tokens, cost_usd and stale_age must not be negative")
	}
	key := sessionKey(req.Tenant, req.SessionID)

	// The result is written under a key of its own before the session records it, so the
	// session's record stays small and a result is never half there. Whether it fits is
	// decided on the session as read here and checked again in the compare-and-set below;
	// a result that lost its place there is left to expire with its key.
	value, _, err := m.store.Get(ctx, key)
	if errors.Is(err, ErrNotFound) {
		return EndResult{}, ErrSessionNotFound
	}
	if err != nil {
		return EndResult{}, m.storeErr(ctx, err)
	}
	cur, err := decode(value)
	if err != nil {
		return EndResult{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	st := cur.step(req.StepID)
	if st == nil {
		return EndResult{}, fmt.Errorf("%w: %q", ErrStepNotFound, req.StepID)
	}
	var rkey string
	if st.takesEnd() && req.Status.completed() && len(req.Result) > 0 && m.fits(cur, st.Kind, len(req.Result)) {
		rkey = resultKey(req.Tenant, req.SessionID)
		if _, err := m.store.Create(ctx, rkey, req.Result, m.ttl(cur, m.clock.Now())); err != nil {
			if !errors.Is(err, ErrFull) {
				return EndResult{}, m.storeErr(ctx, err)
			}
			rkey = "" // the store is full: the step completes unrecorded
		}
	}

	var out EndResult
	var ended bool
	var tool string
	s, err := m.update(ctx, key, func(s *Session, now time.Time) (*Session, error) {
		out, ended, tool = EndResult{}, false, ""
		if s == nil {
			return nil, ErrSessionNotFound
		}
		st := s.step(req.StepID)
		if st == nil {
			return nil, fmt.Errorf("%w: %q", ErrStepNotFound, req.StepID)
		}
		if !st.takesEnd() {
			return nil, errNoWrite
		}
		wasActive := s.active()
		st.Status, st.EndedAt, st.LeaseUntil = req.Status, now, time.Time{}
		st.AnsweredBy, st.Reason = req.AnsweredBy, clip(req.Reason)
		st.IdempotencyKey, st.ConfirmationID, st.StaleAge = req.IdempotencyKey, req.ConfirmationID, req.StaleAge
		st.Tokens += req.Tokens
		st.CostUSD += req.CostUSD
		s.Tokens += req.Tokens
		s.CostUSD += req.CostUSD
		st.ResultKey, st.ResultBytes, st.RecordTooLarge = "", 0, false
		if req.Status.completed() && len(req.Result) > 0 {
			if rkey != "" && m.fits(s, st.Kind, len(req.Result)) {
				st.ResultKey, st.ResultBytes = rkey, len(req.Result)
				s.ResultBytes += len(req.Result)
				out.Recorded = true
			} else {
				st.RecordTooLarge = true
			}
		}
		if st.Kind == KindTool {
			tool = st.Target
		}
		if wasActive {
			m.degrade(s, st, now)
			switch {
			case req.Status == StatusFailed && st.Required:
				s.end(now, StateEndedPartial, EndRequiredStepFailed)
			default:
				if reason := s.exhausted(now, false); reason != "" {
					s.end(now, StateEndedPartial, reason)
				}
			}
		}
		ended = true
		return s, nil
	})
	if err != nil {
		return EndResult{}, err
	}
	if ended && tool != "" {
		m.sched.Record(tool, req.TimedOut, m.clock.Now())
	}
	out.State, out.EndReason, out.Left = s.State, s.EndReason, s.left(m.clock.Now())
	return out, nil
}

// takesEnd reports whether End may still set the step's outcome.
func (st *Step) takesEnd() bool {
	return st.Status == StatusRunning || st.Status == StatusCancelled || st.Status == StatusPendingConfirmation
}

// fits reports whether a result of n bytes of a step of kind may be recorded in s.
func (m *Manager) fits(s *Session, kind Kind, n int) bool {
	limit := m.cfg.MaxModelResultBytes
	if kind == KindTool {
		limit = m.cfg.MaxToolResultBytes
	}
	return n <= limit && s.ResultBytes+n <= m.cfg.MaxSessionResultBytes
}

// degrade applies a step's outcome to the session's sticky degradation.
func (m *Manager) degrade(s *Session, st *Step, now time.Time) {
	d := m.cfg.Degradation
	worse := st.Status == StatusDegraded || st.Status == StatusStale
	switch {
	case s.Degraded && s.ProbeStep == st.ID:
		s.ProbeStep = ""
		switch {
		case st.Status == StatusDone:
			s.Degraded, s.DegradedUntil = false, time.Time{}
		case worse:
			s.Degradations++
			s.DegradedUntil = now.Add(d.RecoveryInterval)
		default:
			// The probe did not answer either way: try again after the interval.
			s.DegradedUntil = now.Add(d.RecoveryInterval)
		}
	case !s.Degraded && worse:
		s.Degraded = true
		s.Degradations++
		s.DegradedUntil = now.Add(d.StickyFor)
	}
	if d.ConfirmActionsAfter > 0 && s.Degradations >= d.ConfirmActionsAfter {
		s.ActionsNeedConfirmation = true
	}
}

// Get returns a tenant's session, with the results of its completed steps when
// withResults. An active session past its deadline is ended first (partial, deadline).
func (m *Manager) Get(ctx context.Context, tenant, id string, withResults bool) (*Session, error) {
	if err := validID("session_id", id); err != nil {
		return nil, err
	}
	key := sessionKey(tenant, id)
	s, err := m.update(ctx, key, func(s *Session, now time.Time) (*Session, error) {
		if s == nil {
			return nil, ErrSessionNotFound
		}
		if s.active() && !now.Before(s.deadline()) {
			s.end(now, StateEndedPartial, EndDeadline)
			return s, nil
		}
		return nil, errNoWrite
	})
	if err != nil {
		return nil, err
	}
	if withResults {
		for _, st := range s.Steps {
			if st.ResultKey == "" {
				continue
			}
			if st.Result, err = m.loadResult(ctx, st.ResultKey); err != nil {
				return nil, err
			}
		}
	}
	return s, nil
}

// Cancel ends a tenant's session at its request: steps in flight are cancelled, actions in
// flight are marked for confirmation, and whoever waits on the session (AwaitEnd) learns
// it at once. Cancelling a cancelled session returns it as it is; a session that ended
// otherwise is ErrEnded.
func (m *Manager) Cancel(ctx context.Context, tenant, id, reason string) (*Session, error) {
	return m.finish(ctx, tenant, id, StateCancelled, EndCancelled, reason)
}

// Complete ends a tenant's session that its agent has finished; steps still running are
// cancelled. Completing a completed session returns it as it is.
func (m *Manager) Complete(ctx context.Context, tenant, id string) (*Session, error) {
	return m.finish(ctx, tenant, id, StateCompleted, EndCompleted, "")
}

func (m *Manager) finish(ctx context.Context, tenant, id string, state State, endReason, note string) (*Session, error) {
	if err := validID("session_id", id); err != nil {
		return nil, err
	}
	return m.update(ctx, sessionKey(tenant, id), func(s *Session, now time.Time) (*Session, error) {
		switch {
		case s == nil:
			return nil, ErrSessionNotFound
		case s.State == state:
			return nil, errNoWrite
		case !s.active():
			return nil, &EndedError{State: s.State, Reason: s.EndReason}
		}
		s.end(now, state, endReason)
		if note != "" {
			for _, st := range s.Steps {
				if st.EndedAt.Equal(now) && (st.Status == StatusCancelled || st.Status == StatusPendingConfirmation) {
					st.Reason = clip(st.Reason + ": " + note)
				}
			}
		}
		return s, nil
	})
}

// AwaitEnd blocks until a tenant's session is no longer active and returns it; or until
// ctx is done. A router running a model step of the session waits on it to cancel the
// step when the session is cancelled.
func (m *Manager) AwaitEnd(ctx context.Context, tenant, id string) (*Session, error) {
	if err := validID("session_id", id); err != nil {
		return nil, err
	}
	key := sessionKey(tenant, id)
	w, err := m.store.Watch(ctx, key)
	if err != nil {
		return nil, m.storeErr(ctx, err)
	}
	defer w.Stop()
	for {
		s, err := m.Get(ctx, tenant, id, false)
		if err != nil {
			return nil, err
		}
		if !s.active() {
			return s, nil
		}
		// Wake at the deadline too: Get ends the session then.
		if err := m.waitChange(ctx, w, s.deadline()); err != nil {
			return nil, err
		}
	}
}
