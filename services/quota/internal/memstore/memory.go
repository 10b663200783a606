// Package memstore keeps the quota state in one process's memory, at the injected clock:
// the store of a single replica, and the local limiter a replica falls back to when
// Redis is unreachable.
package memstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mantle-mesh/mantle/services/quota/internal/ledger"
)

// Store is the in-memory quota store: for `mantle dev`, tests, single-replica
// deployments, and the local fallback of a Store. One mutex makes every operation
// atomic; each holds it for a few map lookups, so it is not a bottleneck at the request
// rates one replica serves.
type Store struct {
	clock        clockwork.Clock
	mu           sync.Mutex
	buckets      map[string]*bucket      // by bucket name; a missing entry is a full bucket
	budgets      map[string]*budgetState // by group
	reservations map[string]*memReservation
	retries      map[string]*retryWindow // by budget name
}

type memReservation struct {
	tenant    string
	expiresAt time.Time
	tokens    int64
	buckets   []ledger.BucketSpec // the charged ones
	budget    *ledger.BudgetCharge
	budgetDay int64
	meta      ledger.ReservationMeta
}

// New returns an empty store that decides at clock's time: every bucket
// starts full.
func New(clock clockwork.Clock) *Store {
	return &Store{
		clock:        clock,
		buckets:      make(map[string]*bucket),
		budgets:      make(map[string]*budgetState),
		reservations: make(map[string]*memReservation),
		retries:      make(map[string]*retryWindow),
	}
}

// Reserve implements Store.
func (s *Store) Reserve(ctx context.Context, c ledger.Charge) (ledger.Grant, error) {
	if err := ctx.Err(); err != nil {
		return ledger.Grant{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()

	if _, taken := s.reservations[c.ID]; taken {
		return ledger.Grant{}, fmt.Errorf("reservation id %s is already in use", c.ID)
	}
	// Check everything before touching anything: that is what makes a TPM refusal leave
	// the RPM bucket alone.
	var short []*ledger.ExhaustedError
	shadowRefused := make([]bool, len(c.Buckets))
	for i, spec := range c.Buckets {
		b := s.bucket(spec.Name())
		wait := b.wait(now, spec.Cost, spec.Limit)
		switch {
		case wait == 0:
		case spec.Shadow:
			shadowRefused[i] = true
		default:
			short = append(short, &ledger.ExhaustedError{Bucket: spec.Name(), Cost: spec.Cost, Remaining: b.remaining(now, spec.Limit), RetryAfter: wait})
		}
	}
	var budgetRefused bool
	var day int64
	if bc := c.Budget; bc != nil {
		var reset time.Duration
		day, reset = ledger.BudgetDay(now, bc.DayOffset)
		spent := s.budget(bc.Group).spentOn(day)
		if spent+bc.Cost > bc.Limit {
			if bc.Shadow {
				budgetRefused = true
			} else {
				short = append(short, &ledger.ExhaustedError{Bucket: bc.Group + ":budget", Cost: bc.Cost, Remaining: max(bc.Limit-spent, 0), RetryAfter: reset, Cause: ledger.CauseBudget})
			}
		}
	}
	if len(short) > 0 {
		return ledger.Grant{}, ledger.LongestWait(short)
	}

	res := &memReservation{tenant: c.Tenant, expiresAt: now.Add(c.TTL), tokens: c.Tokens, meta: c.Meta}
	g := ledger.Grant{At: now, ExpiresAt: res.expiresAt, Levels: make([]ledger.BucketLevel, len(c.Buckets))}
	for i, spec := range c.Buckets {
		b := s.bucket(spec.Name())
		if !shadowRefused[i] {
			b.take(now, spec.Cost, spec.Limit)
			res.buckets = append(res.buckets, spec)
		}
		g.Levels[i] = levelOf(spec, b, now)
		g.Levels[i].ShadowRefused = shadowRefused[i]
	}
	if bc := c.Budget; bc != nil {
		st := s.budget(bc.Group)
		if st.day != day {
			*st = budgetState{day: day}
		}
		if !budgetRefused {
			st.spent += bc.Cost
			res.budget, res.budgetDay = bc, day
		}
		g.Budget = budgetLevelOf(bc, st.spent, now)
		g.Budget.ShadowRefused = budgetRefused
	}
	s.reservations[c.ID] = res
	return g, nil
}

// Settle implements Store.
func (s *Store) Settle(ctx context.Context, tenant, id string, actual ledger.Actual, release bool) (ledger.Settlement, error) {
	if err := ctx.Err(); err != nil {
		return ledger.Settlement{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()

	r, ok := s.reservations[id]
	if !ok || r.tenant != tenant {
		// Another tenant's reservation is "not found" too, so tenants cannot probe each
		// other's reservation ids.
		return ledger.Settlement{}, ledger.ErrReservationNotFound
	}
	delete(s.reservations, id)
	if !now.Before(r.expiresAt) {
		return ledger.Settlement{}, ledger.ErrReservationNotFound
	}

	out := ledger.Settlement{At: now, Reserved: r.tokens, Meta: r.meta}
	actualTokens := ledger.ClampUsage(actual.Tokens)
	if release {
		actualTokens = 0
	}
	out.Refunded = r.tokens - actualTokens
	for _, spec := range r.buckets {
		b := s.bucket(spec.Name())
		b.take(now, ledger.SettleDelta(spec, actualTokens, release), spec.Limit)
		out.Levels = append(out.Levels, levelOf(spec, b, now))
	}
	if bc := r.budget; bc != nil {
		st := s.budget(bc.Group)
		if !release {
			out.CostNano = ledger.UsageCost(actual, bc.Price)
		}
		// Spending from an earlier day is history: that day's counter is gone.
		if st.day == r.budgetDay {
			st.spent = max(st.spent+out.CostNano-bc.Cost, 0)
		}
		day, _ := ledger.BudgetDay(now, bc.DayOffset)
		out.Budget = budgetLevelOf(bc, st.spentOn(day), now)
	}
	return out, nil
}

// Observe implements Store.
func (s *Store) Observe(ctx context.Context, obs []ledger.Observation) ([]ledger.BucketLevel, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	levels := make([]ledger.BucketLevel, len(obs))
	for i, o := range obs {
		b := s.bucket(o.Bucket.Name())
		if o.Remaining >= 0 {
			b.lower(now, o.Remaining, o.Reset, o.Bucket.Limit)
		}
		levels[i] = levelOf(o.Bucket, b, now)
	}
	return levels, nil
}

// CountRequest implements Store.
func (s *Store) CountRequest(_ context.Context, key string, overall bool, window time.Duration) {
	s.countRequests(key, overall, 1, window)
}

func (s *Store) countRequests(key string, overall bool, n float64, window time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	if overall {
		s.retryWindow(ledger.RetryOverall, now, window).requests += n
	}
	if key != "" {
		s.retryWindow(ledger.RetryKeyBudget(key), now, window).requests += n
	}
}

// AcquireRetry implements Store.
func (s *Store) AcquireRetry(ctx context.Context, ask ledger.RetryAsk) (ledger.RetryDecision, error) {
	if err := ctx.Err(); err != nil {
		return ledger.RetryDecision{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	_, elapsed := retryWindowAt(now, ask.Budget.Window)

	names := []string{ledger.RetryOverall}
	if ask.Key != "" {
		names = append(names, ledger.RetryKeyBudget(ask.Key))
	}
	var overall ledger.RetryDecision
	for i, name := range names {
		requests, retries := s.retryWindow(name, now, ask.Budget.Window).estimate(elapsed)
		d := ledger.RetryDecision{Granted: allowRetry(ask.Budget, requests, retries, ask.Format), Budget: name, Requests: requests, Retries: retries}
		if !d.Granted {
			return d, nil
		}
		if i == 0 {
			overall = d
		}
	}
	if ask.Tenant != "" {
		name := ledger.RetryTenantBudget(ask.Tenant)
		_, retries := s.retryWindow(name, now, ask.Budget.Window).estimate(elapsed)
		if !allowTenantRetry(ask.Budget, overall.Requests, retries) {
			return ledger.RetryDecision{Budget: name, Requests: overall.Requests, Retries: retries}, nil
		}
		names = append(names, name)
	}
	for _, name := range names {
		s.retries[name].tries++
	}
	overall.Retries++
	return overall, nil
}

// retryWindow returns the named budget's counters, rolled to now. Callers hold s.mu.
func (s *Store) retryWindow(name string, now time.Time, window time.Duration) *retryWindow {
	w, ok := s.retries[name]
	if !ok {
		w = &retryWindow{}
		s.retries[name] = w
	}
	win, _ := retryWindowAt(now, window)
	w.roll(win)
	return w
}

// Sweep implements Store. It also forgets buckets that have refilled completely (a
// missing entry reads as full) and budgets of past days, so memory stays proportional
// to recently active tenants and keys.
func (s *Store) Sweep(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()

	expired := 0
	for id, r := range s.reservations {
		if !now.Before(r.expiresAt) {
			delete(s.reservations, id)
			expired++
		}
	}
	for name, b := range s.buckets {
		if b.debt(now) == 0 {
			delete(s.buckets, name)
		}
	}
	// A budget day is at most a day plus the largest offset long, so two days back is
	// always over.
	today, _ := ledger.BudgetDay(now, 0)
	for group, st := range s.budgets {
		if st.day < today-2 {
			delete(s.budgets, group)
		}
	}
	return expired, nil
}

// bucket returns the named bucket, creating a full one on first use. Callers hold s.mu.
func (s *Store) bucket(name string) *bucket {
	b, ok := s.buckets[name]
	if !ok {
		b = &bucket{}
		s.buckets[name] = b
	}
	return b
}

// budget returns a group's budget state. Callers hold s.mu.
func (s *Store) budget(group string) *budgetState {
	st, ok := s.budgets[group]
	if !ok {
		st = &budgetState{}
		s.budgets[group] = st
	}
	return st
}

func levelOf(spec ledger.BucketSpec, b *bucket, now time.Time) ledger.BucketLevel {
	return ledger.BucketLevel{
		Name:      spec.Name(),
		Group:     spec.Group,
		Field:     spec.Field,
		Limit:     spec.Limit,
		Remaining: b.remaining(now, spec.Limit),
		Reset:     b.debt(now),
		Shadow:    spec.Shadow,
	}
}

func budgetLevelOf(bc *ledger.BudgetCharge, spent int64, now time.Time) *ledger.BudgetLevel {
	_, reset := ledger.BudgetDay(now, bc.DayOffset)
	return &ledger.BudgetLevel{Limit: bc.Limit, Spent: spent, Reset: reset, Shadow: bc.Shadow}
}

// ForgetBuckets makes every bucket full again, keeping reservations and budgets. A
// FailoverStore calls it when Redis is back: what its local limiter spent has been
// handed to Redis, and a later outage starts from what Redis said then.
func (s *Store) ForgetBuckets() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.buckets)
}

// Level is what the named bucket holds now at the given limit.
func (s *Store) Level(name string, limit int64) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.buckets[name]
	if !ok {
		return limit
	}
	return b.remaining(s.clock.Now(), limit)
}

// OpenReservations counts the reservations the store still holds, expired ones included
// until a Sweep deletes them.
func (s *Store) OpenReservations() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reservations)
}
