package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// JetStream is a Store in a NATS JetStream key-value bucket, shared by every router
// replica. Each key holds one value: a claim (owner id and deadline) while a request runs,
// then its record. Every state change is a compare-and-set on the key's revision, so two
// replicas never both own a key and a record never overwrites a newer record.
type JetStream struct {
	kv               jetstream.KeyValue
	ttl, inflightTTL time.Duration
	clock            clockwork.Clock
	// id names this store in the claims it writes, so an operator reading the bucket can
	// tell which replica holds a key.
	id string

	mu sync.Mutex
	// claims maps a bucket key to the revision of the claim this store holds on it: the
	// compare-and-set token for Complete and Abandon.
	claims map[string]uint64

	// perTenant bounds the keys one tenant may hold in the bucket (0: no bound); tenants
	// holds this replica's view of each tenant's count (see full).
	perTenant int
	stream    jetstream.Stream
	bucket    string
	tenants   map[string]*tenantCount
}

// tenantCount is one replica's view of a tenant's keys in the bucket: the count read from
// the server at countedAt plus the keys this replica created since.
type tenantCount struct {
	n                  int
	countedAt, sweptAt time.Time
}

var _ Store = (*JetStream)(nil)

// NewJetStream creates the KV bucket (or binds it and updates its TTL to ttl) and returns a
// store over it. Records expire ttl after they are recorded, both by the bucket's TTL
// (which reclaims the space) and by the store's own check (which makes expiry exact). A
// claim older than inflightTTL may be taken over; it must be shorter than ttl, or the
// bucket could drop a claim while its owner still runs.
func NewJetStream(ctx context.Context, js jetstream.JetStream, bucket string, ttl, inflightTTL time.Duration) (*JetStream, error) {
	return newJetStream(ctx, js, bucket, ttl, inflightTTL, clockwork.NewRealClock())
}

func newJetStream(ctx context.Context, js jetstream.JetStream, bucket string, ttl, inflightTTL time.Duration, clock clockwork.Clock) (*JetStream, error) {
	if ttl <= 0 || inflightTTL <= 0 || inflightTTL >= ttl {
		return nil, fmt.Errorf("idempotency bucket %q: need 0 < inflightTTL (%s) < ttl (%s)", bucket, inflightTTL, ttl)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      bucket,
		Description: "mantle router idempotency records",
		// One value per key: the current claim or record. Older revisions are never read.
		History: 1,
		TTL:     ttl,
	})
	if err != nil {
		return nil, fmt.Errorf("idempotency bucket %q: %w", bucket, err)
	}
	stream, err := js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		return nil, fmt.Errorf("idempotency bucket %q: %w", bucket, err)
	}
	return &JetStream{
		kv:          kv,
		ttl:         ttl,
		inflightTTL: inflightTTL,
		clock:       clock,
		id:          uuid.NewString(),
		claims:      make(map[string]uint64),
		stream:      stream,
		bucket:      bucket,
		tenants:     make(map[string]*tenantCount),
	}, nil
}

// LimitPerTenant bounds the keys (claims and records) each tenant may hold in the bucket to
// n, as Memory.LimitPerTenant does: past it, Begin answers a new key of that tenant with
// ErrTenantFull, while its existing keys still replay. Keys are "<tenant>/<key>". Call it
// before the store is used. 0 means no bound.
//
// The count is the server's, shared by every replica, but each replica reads it only when
// its own running count (the last read plus the keys it created since) reaches half the
// limit, then at most once a second per tenant. So the bound holds across replicas within
// what the other replicas create between two reads: a tenant can go past n by at most
// n/2 plus one second of its creations elsewhere. Keys leave the count when the bucket's
// TTL removes them, or, for a tenant at its limit, when a sweep (at most once a second per
// tenant) finds them expired by this store's clock or abandoned.
func (s *JetStream) LimitPerTenant(n int) *JetStream {
	s.perTenant = n
	return s
}

// tenantSubjects is the stream subject filter of a tenant's keys.
func (s *JetStream) tenantSubjects(tenant string) string {
	return "$KV." + s.bucket + "." + tenantHash(tenant) + ".*"
}

// recountEvery bounds how often a replica reads a tenant's count, and sweeps a full tenant.
const recountEvery = time.Second

// maxSweep bounds the keys one sweep reads; they come oldest first, which is where the
// expired ones are.
const maxSweep = 256

// full reports whether tenant holds its limit of keys. It reads the count from the server
// when this replica's view is missing, or at least half the limit and a second old; a
// tenant at its limit is swept first.
func (s *JetStream) full(ctx context.Context, tenant string) (bool, error) {
	if s.perTenant <= 0 {
		return false, nil
	}
	now := s.clock.Now()
	s.mu.Lock()
	tc := s.tenants[tenant]
	stale := tc == nil || (2*tc.n >= s.perTenant && now.Sub(tc.countedAt) >= recountEvery)
	if !stale {
		full := tc.n >= s.perTenant
		s.mu.Unlock()
		return full, nil
	}
	s.mu.Unlock()
	n, err := s.count(ctx, tenant, false)
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	if tc = s.tenants[tenant]; tc == nil {
		tc = &tenantCount{}
		s.tenants[tenant] = tc
	}
	sweep := n >= s.perTenant && now.Sub(tc.sweptAt) >= recountEvery
	if sweep {
		tc.sweptAt = now
	}
	s.mu.Unlock()
	if sweep {
		if n, err = s.count(ctx, tenant, true); err != nil {
			return false, err
		}
	}
	s.mu.Lock()
	tc.n, tc.countedAt = n, now
	s.mu.Unlock()
	return n >= s.perTenant, nil
}

// added counts a key this replica created for tenant.
func (s *JetStream) added(tenant string) {
	if s.perTenant <= 0 {
		return
	}
	s.mu.Lock()
	if tc := s.tenants[tenant]; tc != nil {
		tc.n++
	}
	s.mu.Unlock()
}

// count returns how many keys tenant holds in the bucket: the pending count of a consumer
// of the last value of each of its keys, which the server computes without sending them.
// With sweep, it first reads the oldest maxSweep of those values and removes the ones that
// are abandoned (delete markers) or expired by this store's clock, and counts again.
func (s *JetStream) count(ctx context.Context, tenant string, sweep bool) (int, error) {
	cons, err := s.stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		FilterSubject:     s.tenantSubjects(tenant),
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: time.Minute, // the server removes it if the delete below is lost
	})
	if err != nil {
		return 0, fmt.Errorf("idempotency tenant count: %w", err)
	}
	defer func() {
		// Best effort: InactiveThreshold removes it anyway.
		_ = s.stream.DeleteConsumer(context.WithoutCancel(ctx), cons.CachedInfo().Name)
	}()
	n := int(cons.CachedInfo().NumPending)
	if !sweep || n == 0 {
		return n, nil
	}
	batch, err := cons.FetchNoWait(min(n, maxSweep))
	if err != nil {
		return 0, fmt.Errorf("idempotency tenant sweep: %w", err)
	}
	removed := 0
	for msg := range batch.Messages() {
		meta, err := msg.Metadata()
		if err != nil {
			continue
		}
		gone := msg.Headers().Get(kvOperationHeader) != ""
		if !gone {
			v, err := s.decodeValue(msg.Data(), meta.Sequence.Stream)
			gone = err == nil && v.expired
		}
		if !gone {
			continue
		}
		// Up to and including this value only: a claim written since stays.
		if err := s.stream.Purge(ctx, jetstream.WithPurgeSubject(msg.Subject()), jetstream.WithPurgeSequence(meta.Sequence.Stream+1)); err != nil {
			return 0, fmt.Errorf("idempotency tenant sweep: %w", err)
		}
		removed++
	}
	if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
		return 0, fmt.Errorf("idempotency tenant sweep: %w", err)
	}
	return n - removed, nil
}

// kvOperationHeader marks a delete or purge marker in a KV stream.
const kvOperationHeader = "KV-Operation"

// Begin implements Store.
func (s *JetStream) Begin(ctx context.Context, key string) (*Record, bool, error) {
	k := bucketKey(key)
	tenant := tenantOf(key)
	full, err := s.full(ctx, tenant)
	if err != nil {
		return nil, false, err
	}
	if !full {
		// The common case is a new request: one round trip. Update with revision 0
		// succeeds only if the key has never been written (or the bucket's TTL removed
		// it); unlike Create it does not read the key again when it exists, which keeps
		// a replay at two round trips.
		rev, err := s.kv.Update(ctx, k, s.claimValue(), 0)
		switch {
		case err == nil:
			s.hold(k, rev)
			s.added(tenant)
			return nil, true, nil
		case !isConflict(err):
			return nil, false, fmt.Errorf("idempotency claim: %w", err)
		}
	}
	// The key exists (or the tenant is full, and only a key that exists may go on). A
	// replay of a finished request needs only a read.
	e, err := s.kv.Get(ctx, k)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		if full {
			return nil, false, ErrTenantFull
		}
		// Abandoned (a delete marker) or expired since: claim it, or wait for whoever did.
		owned, err := s.create(ctx, k)
		if err != nil || owned {
			return nil, owned, err
		}
	case err != nil:
		return nil, false, fmt.Errorf("idempotency begin: %w", err)
	default:
		v, err := s.decode(e)
		if err != nil {
			return nil, false, err
		}
		if v.record != nil {
			return v.record, false, nil
		}
	}
	return s.wait(ctx, k)
}

// wait follows the key until this caller owns it or has its record. The watch delivers the
// key's latest value first and then every change, so nothing that happens after the Get in
// Begin is missed; each decision is a compare-and-set on the revision it saw, so a stale
// view only costs a failed write and the next update.
func (s *JetStream) wait(ctx context.Context, k string) (*Record, bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := s.kv.Watch(ctx, k)
	if err != nil {
		return nil, false, fmt.Errorf("idempotency watch: %w", err)
	}
	defer w.Stop()

	var (
		timer   clockwork.Timer
		expiry  <-chan time.Time // fires when the claim last seen reaches its deadline
		seenRev uint64           // revision of that claim
		seenAny bool
	)
	stopTimer := func() {
		if timer != nil {
			timer.Stop()
			timer, expiry = nil, nil
		}
	}
	defer stopTimer()

	for {
		select {
		case <-ctx.Done():
			return nil, false, ctx.Err()

		case <-expiry:
			stopTimer()
			owned, err := s.takeOver(ctx, k, seenRev)
			if err != nil || owned {
				return nil, owned, err
			}
			// Someone changed the key first; its update is on the way.

		case e, ok := <-w.Updates():
			if !ok {
				if err := ctx.Err(); err != nil {
					return nil, false, err
				}
				return nil, false, errors.New("idempotency watch: closed (connection lost)")
			}
			if e == nil {
				// End of the initial values. With none, the key vanished (expired) between
				// Begin's create and the watch: claim it.
				if !seenAny {
					owned, err := s.create(ctx, k)
					if err != nil || owned {
						return nil, owned, err
					}
				}
				continue
			}
			seenAny = true
			stopTimer()
			if e.Operation() != jetstream.KeyValuePut {
				// Abandoned: every waiter tries, one create wins, the others see its claim.
				owned, err := s.create(ctx, k)
				if err != nil || owned {
					return nil, owned, err
				}
				continue
			}
			v, err := s.decode(e)
			if err != nil {
				return nil, false, err
			}
			switch {
			case v.record != nil:
				return v.record, false, nil
			case v.expired:
				owned, err := s.takeOver(ctx, k, e.Revision())
				if err != nil || owned {
					return nil, owned, err
				}
			default:
				seenRev = e.Revision()
				timer = s.clock.NewTimer(v.deadline.Sub(s.clock.Now()))
				expiry = timer.Chan()
			}
		}
	}
}

// create claims k if it does not exist (or holds a delete marker).
func (s *JetStream) create(ctx context.Context, k string) (bool, error) {
	rev, err := s.kv.Create(ctx, k, s.claimValue())
	if isConflict(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("idempotency claim: %w", err)
	}
	s.hold(k, rev)
	return true, nil
}

// takeOver replaces the expired claim or record at revision rev with a claim of ours. A
// conflict usually means another writer got there first (its update is on the way to the
// watch), but it also happens when the bucket's TTL removed the value, which no watch
// reports; so a conflict is followed by a create, which fails unless the key is gone.
func (s *JetStream) takeOver(ctx context.Context, k string, rev uint64) (bool, error) {
	newRev, err := s.kv.Update(ctx, k, s.claimValue(), rev)
	if isConflict(err) {
		return s.create(ctx, k)
	}
	if err != nil {
		return false, fmt.Errorf("idempotency take over: %w", err)
	}
	s.hold(k, newRev)
	return true, nil
}

// maxCompleteAttempts bounds Complete's compare-and-set loop. Each failed attempt means
// another writer changed the key in between; the loop ends at the first record, so in
// practice it takes at most two.
const maxCompleteAttempts = 8

// Complete implements Store.
func (s *JetStream) Complete(ctx context.Context, key string, rec Record) error {
	k := bucketKey(key)
	if rec.At.IsZero() {
		rec.At = s.clock.Now()
	}
	value, err := json.Marshal(envelope{Kind: kindRecord, Response: rec.Response, Status: rec.Status, Fingerprint: rec.Fingerprint, At: rec.At})
	if err != nil {
		return fmt.Errorf("idempotency complete: %w", err)
	}

	// Fast path: replace our own claim.
	if rev, ok := s.release(k); ok {
		_, err := s.kv.Update(ctx, k, value, rev)
		if err == nil {
			return nil
		}
		if !isConflict(err) {
			return fmt.Errorf("idempotency complete: %w", err)
		}
	}
	// Our claim was taken over (we outlived inflightTTL) or we never held one. The answer
	// is still good: store it unless a record is already there.
	for range maxCompleteAttempts {
		e, err := s.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			_, err = s.kv.Create(ctx, k, value)
		} else if err == nil {
			v, derr := s.decode(e)
			if derr == nil && v.record != nil && !v.expired {
				return nil // first record wins
			}
			// A claim, an expired record or an unreadable value: replace it.
			_, err = s.kv.Update(ctx, k, value, e.Revision())
		}
		if err == nil {
			return nil
		}
		if !isConflict(err) {
			return fmt.Errorf("idempotency complete: %w", err)
		}
	}
	return fmt.Errorf("idempotency complete: key kept changing after %d attempts", maxCompleteAttempts)
}

// Abandon implements Store.
func (s *JetStream) Abandon(ctx context.Context, key string) error {
	k := bucketKey(key)
	rev, ok := s.release(k)
	if !ok {
		return nil
	}
	// Only if the key still holds our claim: a taken-over claim or a record stays.
	err := s.kv.Delete(ctx, k, jetstream.LastRevision(rev))
	if err != nil && !isConflict(err) {
		return fmt.Errorf("idempotency abandon: %w", err)
	}
	return nil
}

func (s *JetStream) hold(k string, rev uint64) {
	s.mu.Lock()
	s.claims[k] = rev
	s.mu.Unlock()
}

func (s *JetStream) release(k string) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rev, ok := s.claims[k]
	delete(s.claims, k)
	return rev, ok
}

// bucketKey maps a router key, "<tenant>/<key>" with any characters, to a valid KV key:
// the tenant's hash, a dot, the key's hash. SHA-256 keeps distinct keys distinct and bounds
// the length; the tenant token lets a tenant's keys be counted by subject.
func bucketKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return tenantHash(tenantOf(key)) + "." + hex.EncodeToString(sum[:])
}

// tenantHash is the bucket key token of a tenant: 128 bits of its SHA-256.
func tenantHash(tenant string) string {
	sum := sha256.Sum256([]byte(tenant))
	return hex.EncodeToString(sum[:16])
}

// isConflict reports whether err is a failed compare-and-set: the key exists, or its
// revision is not the one given. Create on a deleted key reports a lost race as a bare
// wrong-last-sequence error, so the API error codes are checked too.
func isConflict(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

const (
	kindClaim  = "claim"
	kindRecord = "record"
)

// envelope is the JSON value of a key. JSON rather than a binary layout so that
// `nats kv get` shows an operator what a key holds; the encoding costs little next to the
// round trip.
type envelope struct {
	Kind string `json:"kind"`
	// Claim.
	Owner    string    `json:"owner,omitempty"`
	Deadline time.Time `json:"deadline,omitzero"`
	// Record.
	Response    []byte    `json:"response,omitempty"`
	Status      []byte    `json:"status,omitempty"`
	Fingerprint []byte    `json:"fingerprint,omitempty"`
	At          time.Time `json:"at,omitzero"`
}

func (s *JetStream) claimValue() []byte {
	// Marshalling a struct of strings and times cannot fail.
	b, _ := json.Marshal(envelope{Kind: kindClaim, Owner: s.id, Deadline: s.clock.Now().Add(s.inflightTTL)})
	return b
}

// value is a decoded entry: a live record, or a claim with its deadline. expired is set
// for a claim past its deadline and for a record past its ttl; both may be replaced.
type value struct {
	record   *Record
	deadline time.Time
	expired  bool
}

func (s *JetStream) decode(e jetstream.KeyValueEntry) (value, error) {
	return s.decodeValue(e.Value(), e.Revision())
}

func (s *JetStream) decodeValue(data []byte, rev uint64) (value, error) {
	var env envelope
	if err := json.Unmarshal(data, &env); err != nil {
		return value{}, fmt.Errorf("idempotency: decode revision %d: %w", rev, err)
	}
	now := s.clock.Now()
	switch env.Kind {
	case kindClaim:
		return value{deadline: env.Deadline, expired: !now.Before(env.Deadline)}, nil
	case kindRecord:
		if !now.Before(env.At.Add(s.ttl)) {
			return value{expired: true}, nil
		}
		return value{record: &Record{Response: env.Response, Status: env.Status, Fingerprint: env.Fingerprint, At: env.At}}, nil
	}
	return value{}, fmt.Errorf("idempotency: revision %d has unknown kind %q", rev, env.Kind)
}
