package quota

import (
	"context"
	"time"

	"github.com/mantle-mesh/mantle/services/quota/internal/ledger"
)

// stateStore keeps bucket levels, budgets, open reservations and retry counters. The
// service owns the policy (which buckets apply, their limits and costs, priorities,
// events) and this interface; a store makes each operation atomic and decides at its own
// clock: memstore.Store at the injected clock, redisstore.Store at Redis's TIME, so that
// replicas with skewed clocks agree.
//
// Limits travel with every call, in the style of envoyproxy/ratelimit, so a changed
// limit applies at once and a Store needs no configuration of its own.
type stateStore interface {
	// Reserve takes every bucket's cost and the budget's, and records the reservation,
	// all or nothing. When an enforced bucket (or the budget) is short it changes nothing
	// and returns an *ExhaustedError naming the one that needs the longest to cover its
	// part. A shadow bucket that is short is not charged and is reported as
	// ShadowRefused; it never refuses.
	Reserve(ctx context.Context, c ledger.Charge) (ledger.Grant, error)
	// Settle deletes the tenant's reservation id and corrects the buckets it charged by
	// the difference between reserved and actual usage; release returns everything,
	// requests included, as if the request had never been admitted. It returns
	// ErrReservationNotFound when the reservation does not exist, belongs to another
	// tenant, or expired at or before now.
	Settle(ctx context.Context, tenant, id string, actual ledger.Actual, release bool) (ledger.Settlement, error)
	// Observe lowers the named buckets to what the provider reported; it never raises
	// them. It returns their levels afterwards.
	Observe(ctx context.Context, obs []ledger.Observation) ([]ledger.BucketLevel, error)
	// CountRequest adds one request to the retry budget's counts (windows of the given
	// size): overall when overall is set, and key's when key is not empty. It may
	// buffer; counts are best effort.
	CountRequest(ctx context.Context, key string, overall bool, window time.Duration)
	// AcquireRetry decides one retry against the overall budget, the key's when ask.Key
	// is set and the tenant's share when ask.Tenant is set, and counts it when all allow
	// it.
	AcquireRetry(ctx context.Context, ask ledger.RetryAsk) (ledger.RetryDecision, error)
	// Sweep deletes the reservations that expired and returns how many it deleted.
	Sweep(ctx context.Context) (int, error)
}
