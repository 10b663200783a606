package resilience

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// BudgetConfig is a retry budget. The yaml keys match the router's retry_budget block.
type BudgetConfig struct {
	// Ratio is the largest share of requests that retries and failovers may add.
	Ratio float64 `yaml:"ratio"`
	// Floor is how many retries a window always allows, so that a quiet replica can still
	// retry.
	Floor int `yaml:"floor"`
	// Window is the sliding window requests and retries are counted over.
	Window time.Duration `yaml:"window"`
	// Buckets is how many slices the window slides by.
	Buckets int `yaml:"buckets"`
	// FormatOnlyAbove: above this retry rate only format retries (malformed output,
	// refusal, truncation) are allowed.
	FormatOnlyAbove float64 `yaml:"format_only_above"`
}

// DefaultBudgetConfig returns the defaults from DESIGN.md ("Defaults").
func DefaultBudgetConfig() BudgetConfig {
	return BudgetConfig{Ratio: 0.2, Floor: 10, Window: 60 * time.Second, Buckets: 12, FormatOnlyAbove: 0.15}
}

// Validate checks the config; each message names its yaml key.
func (c BudgetConfig) Validate() error {
	c = c.filled()
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Ratio < 0 {
		add("ratio: must not be negative, got %v", c.Ratio)
	}
	if c.Floor < 0 {
		add("floor: must not be negative, got %d", c.Floor)
	}
	if c.Window <= 0 {
		add("window: must be positive, got %s", c.Window)
	}
	if c.Buckets <= 0 {
		add("buckets: must be positive, got %d", c.Buckets)
	} else if c.Window > 0 && c.Window < time.Duration(c.Buckets) {
		add("buckets: %d buckets do not fit in window %s", c.Buckets, c.Window)
	}
	if c.FormatOnlyAbove < 0 {
		add("format_only_above: must not be negative, got %v", c.FormatOnlyAbove)
	}
	return errors.Join(errs...)
}

// Window fields of a budget.
const (
	fieldRequests = iota
	fieldRetries
	budgetFields
)

// Budget caps retries (and hedges, which cost the same) as a share of requests over a
// sliding window, so an upstream incident cannot multiply the load sent to it. Keep one per
// key and one overall; a retry needs both (see Allowed). It is safe for concurrent use.
//
// The rule, with requests and retries counted over the window and
// rate = retries / max(requests, 1):
//
//  1. retries < Floor: allowed, whatever the kind.
//  2. otherwise, if rate > FormatOnlyAbove and the retry is not a format retry: refused.
//  3. otherwise allowed when retries+1 <= Ratio*requests, refused when not.
//
// So no window ever admits more than max(Floor, Ratio*requests) retries. The floor also
// holds off format-only mode: with a handful of requests a single retry is a high rate, and
// the floor exists precisely so that a quiet service can still retry.
type Budget struct {
	cfg    BudgetConfig
	clock  clockwork.Clock
	mu     sync.Mutex
	window *Window
}

// NewBudget returns an empty budget. cfg must be valid (see Validate); a zero cfg takes the
// defaults. clock defaults to the real clock.
func NewBudget(cfg BudgetConfig, clock clockwork.Clock) *Budget {
	if cfg == (BudgetConfig{}) {
		cfg = DefaultBudgetConfig()
	}
	cfg = cfg.filled()
	if err := cfg.Validate(); err != nil {
		panic(fmt.Sprintf("resilience.NewBudget: %v", err)) //nolint:forbidigo // validated configuration: a programming error
	}
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	return &Budget{cfg: cfg, clock: clock, window: mustWindow(cfg.Window, cfg.Buckets, budgetFields, clock)}
}

// Request counts one original request (its first attempt).
func (b *Budget) Request() {
	now := b.clock.Now()
	b.mu.Lock()
	b.window.AddAt(now, fieldRequests, 1)
	b.mu.Unlock()
}

// TryRetry reports whether a retry or hedge may go now and, if so, counts it. format marks
// a retry meant to fix the answer's format (malformed JSON to a more format-stable model).
func (b *Budget) TryRetry(format bool) bool {
	now := b.clock.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.allowedLocked(now, format) {
		return false
	}
	b.window.AddAt(now, fieldRetries, 1)
	return true
}

// Allowed reports whether TryRetry would succeed now, without counting anything. A caller
// that needs two budgets (the key's and the overall one) checks both with Allowed and then
// spends both with TryRetry; two racing callers may overshoot by one retry each, never more.
func (b *Budget) Allowed(format bool) bool {
	now := b.clock.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.allowedLocked(now, format)
}

func (b *Budget) allowedLocked(now time.Time, format bool) bool {
	requests, retries := b.countsLocked(now)
	if retries < b.cfg.Floor {
		return true
	}
	if !format && rate(requests, retries) > b.cfg.FormatOnlyAbove {
		return false
	}
	return float64(retries+1) <= b.cfg.Ratio*float64(requests)
}

// FormatOnly reports whether only format retries may go now (rule 2 above is in force).
func (b *Budget) FormatOnly() bool {
	now := b.clock.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	requests, retries := b.countsLocked(now)
	return retries >= b.cfg.Floor && rate(requests, retries) > b.cfg.FormatOnlyAbove
}

// Snapshot returns the window's requests, retries and retry rate.
func (b *Budget) Snapshot() (requests, retries int, retryRate float64) {
	now := b.clock.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	requests, retries = b.countsLocked(now)
	return requests, retries, rate(requests, retries)
}

func (b *Budget) countsLocked(now time.Time) (requests, retries int) {
	var buf [budgetFields]int
	sums := b.window.SumsAt(now, buf[:])
	return sums[fieldRequests], sums[fieldRetries]
}

func rate(requests, retries int) float64 {
	return float64(retries) / float64(max(requests, 1))
}

// filled gives a zero Window or Buckets the default: a config written without them (a
// struct literal, a YAML block that omits them) means "the usual slicing".
func (c BudgetConfig) filled() BudgetConfig {
	d := DefaultBudgetConfig()
	if c.Window == 0 {
		c.Window = d.Window
	}
	if c.Buckets == 0 {
		c.Buckets = d.Buckets
	}
	return c
}
