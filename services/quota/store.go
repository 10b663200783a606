package quota

import (
	"context"
	"time"
)

// Store keeps bucket levels and open reservations. The Service owns the policy (limits,
// costs, validation, events); a Store only makes each operation atomic. MemoryStore
// guards everything with one mutex; a Redis Store will run each method as one script,
// so that replicas share buckets.
//
// key names whose buckets are charged, for example "tenant:acme". A Store names the
// key's buckets key+":rpm" and key+":tpm". Limits are passed on every call, in the
// style of envoyproxy/ratelimit, so a changed limit applies at once and a Store needs
// no configuration of its own.
type Store interface {
	// Reserve takes cost from key's buckets and records res, all or nothing. When a
	// bucket is short it changes nothing and returns an *ExhaustedError naming the
	// bucket that needs the longest to cover its part of the cost.
	Reserve(ctx context.Context, now time.Time, key string, limits RateLimits, res Reservation) (Levels, error)
	// Settle deletes reservation id of key and corrects key's TPM bucket by the
	// difference between reserved and actual tokens. It returns ErrReservationNotFound
	// when the reservation does not exist, belongs to another key, or expired at or
	// before now.
	Settle(ctx context.Context, now time.Time, key string, limits RateLimits, id string, actualTokens int64) (Settlement, error)
	// Sweep deletes the reservations that expired at or before now and returns how
	// many it deleted.
	Sweep(ctx context.Context, now time.Time) (int, error)
}

// Cost is what one request takes from its buckets.
type Cost struct {
	Requests int64
	Tokens   int64
}

// Reservation is a charge that Settle can still correct until ExpiresAt.
type Reservation struct {
	ID        string
	Cost      Cost
	ExpiresAt time.Time
}

// Levels describes a key's buckets after an operation.
type Levels struct {
	Requests Level
	Tokens   Level
}

// Level is the state of one bucket, in the shape of rate-limit response headers.
type Level struct {
	Limit int64
	// Remaining is what can be taken now; 0 while the bucket is overdrawn.
	Remaining int64
	// Reset is how long until the bucket is full again.
	Reset time.Duration
}

// Settlement is the outcome of Store.Settle.
type Settlement struct {
	// Refunded is reserved minus actual tokens: positive when tokens went back to the
	// bucket, negative when the overrun was charged.
	Refunded int64
	Levels   Levels
}
