package quota

import (
	"context"
	"time"
)

// Store keeps bucket levels, budgets, open reservations and retry counters. The Service
// owns the policy (which buckets apply, their limits and costs, priorities, events); a
// Store makes each operation atomic and decides at its own clock: MemoryStore at the
// injected clock, RedisStore at Redis's TIME, so that replicas with skewed clocks agree.
//
// Limits travel with every call, in the style of envoyproxy/ratelimit, so a changed
// limit applies at once and a Store needs no configuration of its own.
type Store interface {
	// Reserve takes every bucket's cost and the budget's, and records the reservation,
	// all or nothing. When an enforced bucket (or the budget) is short it changes nothing
	// and returns an *ExhaustedError naming the one that needs the longest to cover its
	// part. A shadow bucket that is short is not charged and is reported as
	// ShadowRefused; it never refuses.
	Reserve(ctx context.Context, c Charge) (Grant, error)
	// Settle deletes the tenant's reservation id and corrects the buckets it charged by
	// the difference between reserved and actual usage; release returns everything,
	// requests included, as if the request had never been admitted. It returns
	// ErrReservationNotFound when the reservation does not exist, belongs to another
	// tenant, or expired at or before now.
	Settle(ctx context.Context, tenant, id string, actual Actual, release bool) (Settlement, error)
	// Observe lowers the named buckets to what the provider reported; it never raises
	// them. It returns their levels afterwards.
	Observe(ctx context.Context, obs []Observation) ([]BucketLevel, error)
	// CountRequest adds one request to the retry budget's counts (windows of the given
	// size): overall when overall is set, and key's when key is not empty. It may
	// buffer; counts are best effort.
	CountRequest(ctx context.Context, key string, overall bool, window time.Duration)
	// AcquireRetry decides one retry against the overall budget, the key's when ask.Key
	// is set and the tenant's share when ask.Tenant is set, and counts it when all allow
	// it.
	AcquireRetry(ctx context.Context, ask RetryAsk) (RetryDecision, error)
	// Sweep deletes the reservations that expired and returns how many it deleted.
	Sweep(ctx context.Context) (int, error)
}

// Kind says how Settle corrects a bucket.
type Kind uint8

const (
	// KindRequests buckets count requests: the charge stands at Settle (the request was
	// made) and is returned only on release.
	KindRequests Kind = iota
	// KindTokens buckets count tokens: Settle replaces the estimate by the actual usage.
	KindTokens
)

// BucketSpec is one bucket a request charges.
type BucketSpec struct {
	// Group is the owner of the bucket: "tenant:<id>" or "key:<id>". A Redis Store keeps
	// a group's buckets together (one hash in one cluster slot).
	Group string
	// Field names the bucket within its group: "rpm", "tpm", "model:<model>:tpm".
	Field  string
	Kind   Kind
	Cost   int64
	Limit  int64
	Shadow bool
	// name caches Group:Field; specs made by newSpec carry it.
	name string
}

// newSpec builds a spec with its name computed once.
func newSpec(group, field string, kind Kind, cost, limit int64, shadow bool) BucketSpec {
	return BucketSpec{Group: group, Field: field, Kind: kind, Cost: cost, Limit: limit, Shadow: shadow, name: group + ":" + field}
}

// Name is the bucket's full name, as errors, events and QuotaFailure show it.
func (b BucketSpec) Name() string {
	if b.name != "" {
		return b.name
	}
	return b.Group + ":" + b.Field
}

// BudgetCharge is the money part of a reservation, in nano-dollars.
type BudgetCharge struct {
	// Group is the tenant's group; the budget lives with its buckets.
	Group  string
	Cost   int64
	Limit  int64
	Shadow bool
	// DayOffset moves the day boundary from 00:00 UTC.
	DayOffset time.Duration
	// Price is kept with the reservation so that Settle can price the actual usage.
	Price NanoPrice
}

// NanoPrice is a price in nano-dollars per token, rounded up.
type NanoPrice struct {
	Input, Output int64
}

// Charge is everything one Reserve takes.
type Charge struct {
	ID     string
	Tenant string
	TTL    time.Duration
	// Tokens is what the reservation holds against its token buckets; Settle corrects it.
	Tokens int64
	// Buckets are the tenant's buckets first, then the upstream key's.
	Buckets []BucketSpec
	// Budget is nil when the tenant has no money budget.
	Budget *BudgetCharge
	// Meta is kept with the reservation and handed back by Settle.
	Meta ReservationMeta
}

// ReservationMeta is what the Service needs back at Settle time.
type ReservationMeta struct {
	Model string
	// EstimatedInput is the service's own raw estimate of the input tokens (before any
	// learned correction); 0 when the caller supplied input_tokens or the count was exact.
	EstimatedInput int64
	// UpstreamKey is the key the reservation charged, if any.
	UpstreamKey string
}

// Grant is a successful Reserve.
type Grant struct {
	// At is the store's time of the decision.
	At        time.Time
	ExpiresAt time.Time
	// Levels parallels Charge.Buckets.
	Levels []BucketLevel
	Budget *BudgetLevel
}

// BucketLevel is the state of one bucket, in the shape of rate-limit response headers.
type BucketLevel struct {
	// Name is Group:Field.
	Name         string
	Group, Field string
	Limit        int64
	// Remaining is what can be taken now; 0 while the bucket is overdrawn.
	Remaining int64
	// Reset is how long until the bucket is full again.
	Reset  time.Duration
	Shadow bool
	// ShadowRefused: a shadow bucket that could not cover the cost and was not charged.
	ShadowRefused bool
}

// BudgetLevel is the state of a money budget, in nano-dollars.
type BudgetLevel struct {
	Limit, Spent int64
	// Reset is how long until the next day boundary.
	Reset         time.Duration
	Shadow        bool
	ShadowRefused bool
}

// Actual is the usage a provider reported.
type Actual struct {
	// Tokens is the total the token buckets are corrected to.
	Tokens        int64
	Input, Output int64
}

// Settlement is the outcome of Store.Settle.
type Settlement struct {
	At time.Time
	// Reserved is the reservation's tokens; Refunded is Reserved minus the actual tokens
	// (negative for an overrun), or Reserved on release.
	Reserved, Refunded int64
	// Levels are the corrected buckets, in charge order; shadow-refused buckets, which
	// were never charged, are left out.
	Levels []BucketLevel
	Budget *BudgetLevel
	// CostNano is the actual usage at the reservation's price; 0 without a budget.
	CostNano int64
	Meta     ReservationMeta
}

// Observation is what a provider's rate-limit headers said about one bucket.
type Observation struct {
	Bucket BucketSpec // Cost is unused
	// Remaining is the provider's count; -1 when unknown (the bucket is left alone).
	Remaining int64
	// Reset is how long until the provider's limit is fully replenished.
	Reset time.Duration
}

// RetryAsk asks for one retry.
type RetryAsk struct {
	// Key is the upstream key; empty checks the overall budget only.
	Key string
	// Tenant is the tenant the retry is for; when set, the retry also needs room in that
	// tenant's share of the budget (Budget.TenantShare), counted where the budget is.
	Tenant string
	Format bool
	Budget RetryBudgetConfig
}

// RetryDecision answers a RetryAsk.
type RetryDecision struct {
	Granted bool
	// Budget is the refusing budget ("retry:overall", "retry:key:<id>" or
	// "retry:tenant:<id>"), or "retry:overall" when granted.
	Budget            string
	Requests, Retries float64
}

// Retry budget names, as AcquireRetryResponse.budget shows them.
const retryOverall = "retry:overall"

func retryKeyBudget(key string) string { return "retry:key:" + key }
