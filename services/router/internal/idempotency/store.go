package idempotency

import (
	"bytes"
	"context"
	"time"
)

// Record is the stored outcome of a request: the marshalled response (the router stores a
// proto-marshalled mantle.router.v1.CompleteResponse) or a terminal error.
type Record struct {
	// Response is the marshalled answer; nil when the request ended in a recorded error.
	Response []byte
	// Status is a marshalled google.rpc.Status (status.Convert(err).Proto()) for a recorded
	// error; nil on success.
	Status []byte
	// Fingerprint identifies the request the outcome answers (a hash of its body), so that
	// a key reused for another request is refused rather than answered with this outcome.
	// Empty in records written before fingerprints existed.
	Fingerprint []byte
	// At is when the outcome was recorded. Complete fills it in from the store's clock when
	// it is zero. The record expires ttl after At.
	At time.Time
}

// Store is what the router needs to make a request id (or a client Idempotency-Key)
// identify a request. Keys are already scoped by the router (tenant + key); a Store treats
// them as opaque strings.
//
// Ownership belongs to a key within one Store value: Complete and Abandon act on the claim
// this Store holds for the key, not on a per-caller token. That is unambiguous as long as
// inflightTTL is longer than any request may run (see the package documentation).
type Store interface {
	// Begin claims key. It returns (nil, true, nil) when the caller owns the request and
	// must call Complete or Abandon. When a record exists it returns (rec, false, nil).
	// When another caller owns the key and is still running, Begin waits until that caller
	// completes (returns its record), abandons (then this caller tries to claim again), its
	// claim outlives inflightTTL (then this caller takes it over), or ctx is done
	// (ctx.Err()).
	Begin(ctx context.Context, key string) (rec *Record, owner bool, err error)
	// Complete stores rec as the outcome of key, replacing the claim. If the key already
	// holds an unexpired record (a slower owner was taken over and finished second), the
	// first record stays and Complete returns nil: both answers are valid for the request,
	// and duplicates must keep seeing one of them.
	Complete(ctx context.Context, key string, rec Record) error
	// Abandon releases a claim without a record (the request failed in a way that may be
	// retried): one waiter, or the next caller, becomes the owner. It never removes a
	// record, and it is a no-op when this Store no longer holds the claim.
	Abandon(ctx context.Context, key string) error
}

// clone returns a deep copy of rec, so that neither the caller nor the store can change
// what the other holds.
func (r Record) clone() Record {
	return Record{Response: bytes.Clone(r.Response), Status: bytes.Clone(r.Status), Fingerprint: bytes.Clone(r.Fingerprint), At: r.At}
}
