package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"

	"github.com/mantle-mesh/mantle/services/quota/internal/ledger"
)

// Store keeps quota state in Redis so that every replica shares it. Each operation
// on a group of buckets (a tenant's, or an upstream key's) is one Lua operation, atomic
// in Redis, deciding at Redis's TIME. The operations live in one function library
// (lua.go; a script on Redis before 7.0), and concurrent calls' operations go to Redis
// together, in one call per hash slot (redisbatch.go).
//
// # Layout
//
// A group's buckets and budget are one hash, <prefix>{<group>}:b, whose fields hold when
// each bucket is full again ("sec:nsec"; a missing field is a full bucket) and the budget
// day and spending. A reservation's record is a field of its tenant's hash, r|<id>
// (lua/prelude.lua has the details: records are refused once expired and swept from the
// hash a while later), or, when it charged no tenant bucket, a string
// <prefix>{tenant:<id>}:r:<id>. The hash tag {…} puts a tenant's buckets, budget and
// reservations in one cluster slot, which is what lets one script touch them all. Keys
// expire by themselves once their buckets are full again and their records expired, so
// Sweep has nothing to do.
//
// # Requests that charge a tenant and an upstream key
//
// An upstream key's buckets are shared by every tenant, so they live in the key's own
// slot, and no script can touch both. Reserve charges the key first, then the tenant
// (which records the reservation); when the tenant refuses, the key's charge is given
// back with a second script. All or nothing therefore holds for outcomes, but for a
// moment a refused request holds key capacity it then returns.
type Store struct {
	client     redis.UniversalClient
	scripter   redis.Scripter
	prefix     string
	clock      clockwork.Clock
	serverTime bool
	cacheTTL   time.Duration
	flushEvery time.Duration

	lib *luaLib
	// batch sends the operations of concurrent calls together; nil when Scripter was
	// given.
	batch *scriptBatcher
	// scripts is set once the Scripter's server turned out to run no functions.
	scripts atomic.Bool

	cache   overLimitCache
	pending pendingRequests
	// calls counts script round trips; tests use it to see the over-limit cache work.
	calls atomic.Int64
}

// RedisOptions configure a Store.
type Options struct {
	// Prefix starts every key.
	Prefix string
	// Clock is the replica's clock: it times the over-limit cache and, when ServerTime is
	// false, decides (tests pin decisions to a fake clock this way).
	Clock clockwork.Clock
	// ServerTime decides at Redis's TIME. Production sets it: replicas' clocks differ,
	// Redis's is one.
	ServerTime bool
	// OverLimitCache is how long a refusal is remembered locally; 0 turns it off.
	OverLimitCache time.Duration
	// FlushInterval is how often Run adds buffered request counts to Redis.
	FlushInterval time.Duration
	// Scripter runs the operations one by one, each as a script (a go-redis
	// AutoPipeliner, say); nil sends them through the store's own batcher
	// (redisbatch.go), which sends the operations of concurrent calls as one function
	// call: one round trip and one call's setup for many decisions. Close stops the
	// batcher.
	Scripter redis.Scripter
}

// NewRedisStore returns a store on client. It does not contact Redis.
func New(client redis.UniversalClient, opts Options) *Store {
	s := &Store{
		client:     client,
		scripter:   opts.Scripter,
		prefix:     opts.Prefix,
		clock:      opts.Clock,
		serverTime: opts.ServerTime,
		cacheTTL:   opts.OverLimitCache,
		flushEvery: opts.FlushInterval,
		lib:        quotaLib,
	}
	s.cache.entries = make(map[string]cacheEntry)
	s.pending.keys = make(map[string]float64)
	if s.flushEvery <= 0 {
		s.flushEvery = time.Second
	}
	if s.scripter == nil {
		s.scripter = client
		s.batch = newScriptBatcher(client, s.lib)
	} else if _, ok := s.scripter.(functionCaller); !ok {
		s.scripts.Store(true)
	}
	return s
}

// Close stops the store's batcher: calls still waiting, and any later call, fail. It
// does not close the client, which the caller owns.
func (s *Store) Close() error {
	if s.batch != nil {
		s.batch.Close()
	}
	return nil
}

// groupKey is the hash of a group's buckets. Braces and percent signs in ids are escaped
// so that the hash tag is exactly the group.
func (s *Store) groupKey(group string) string {
	return s.prefix + "{" + escapeTag(group) + "}:b"
}

// reservationKey is a reservation record of its own: one that charged no tenant bucket
// (an upstream key's only), or one an earlier version wrote. Others are recordField in
// the tenant's hash.
func (s *Store) reservationKey(tenant, id string) string {
	return s.prefix + "{" + escapeTag(ledger.TenantGroup(tenant)) + "}:r:" + id
}

// recordField is a reservation record's field in its tenant's hash; bucket fields never
// hold '|' (escapeField).
func recordField(id string) string { return "r|" + id }

func (s *Store) retryKey() string { return s.prefix + "{retry}:c" }

// newArgs starts an operation's arguments, an array of n values (msgpack.go), with the
// time they count among them: false for Redis TIME, else seconds and nanoseconds.
func (s *Store) newArgs(n int) []byte {
	b := mpArray(make([]byte, 0, 24+12*n), n)
	if s.serverTime {
		return mpBool(mpBool(b, false), false)
	}
	t := s.clock.Now()
	return mpInt(mpInt(b, t.Unix()), int64(t.Nanosecond()))
}

// run runs one quota operation (lua/batch.lua) and returns its reply.
func (s *Store) run(ctx context.Context, op string, keys []string, args []byte) (*reply, error) {
	s.calls.Add(1)
	var (
		v   string
		err error
	)
	if s.batch != nil {
		v, err = s.batch.run(ctx, op, keys, args)
	} else {
		v, err = s.runScript(ctx, op, keys, args)
	}
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	return newReply(v), nil
}

// functionCaller is a Scripter that can also call functions (go-redis's
// AutoPipeliner can, and batches FCall as it batches EvalSha).
type functionCaller interface {
	FCall(ctx context.Context, function string, keys []string, args ...any) *redis.Cmd
	FunctionLoadReplace(ctx context.Context, code string) *redis.StringCmd
}

// runScript runs one operation as a batch of one through the Scripter: by FCALL when
// the Scripter can call functions (NewRedisStore sets scripts when it cannot), else by
// EVALSHA, with the recovery sendBatch gives either.
func (s *Store) runScript(ctx context.Context, op string, keys []string, args []byte) (string, error) {
	fc, _ := s.scripter.(functionCaller)
	c := &scriptCall{op: op, keys: keys, args: args}
	list := opList(c)
	// The typed calls, which an AutoPipeliner batches (its Do does not).
	do := func(ctx context.Context, _ [][]*scriptCall, _ []int, mode sendMode) []*redis.Cmd {
		switch mode {
		case sendFunction:
			return []*redis.Cmd{fc.FCall(ctx, s.lib.name, keys, list)}
		case sendScript:
			return []*redis.Cmd{s.scripter.EvalSha(ctx, s.lib.script.Hash(), keys, list)}
		default:
			return []*redis.Cmd{s.scripter.Eval(ctx, s.lib.src, keys, list)}
		}
	}
	load := func(ctx context.Context) error { return fc.FunctionLoadReplace(ctx, s.lib.code).Err() }
	replies, errs := sendBatch(ctx, [][]*scriptCall{{c}}, do, load, &s.scripts)
	if errs[0] != nil {
		return "", errs[0]
	}
	r := opReply(replies[0][0])
	return r.v, r.err
}

// Reserve implements Store.
func (s *Store) Reserve(ctx context.Context, c ledger.Charge) (ledger.Grant, error) {
	if refusal := s.cache.check(s.clock.Now(), c); refusal != nil {
		return ledger.Grant{}, refusal
	}
	tenant := ledger.TenantGroup(c.Tenant)
	// Buckets by group, in charge order; the tenant's group (if charged) goes last
	// because it records the reservation and must know what the key's script charged.
	var order []string
	byGroup := map[string][]int{}
	for i, b := range c.Buckets {
		if _, ok := byGroup[b.Group]; !ok && b.Group != tenant {
			order = append(order, b.Group)
		}
		byGroup[b.Group] = append(byGroup[b.Group], i)
	}
	_, hasTenant := byGroup[tenant]
	if c.Budget != nil {
		hasTenant = true
	}

	g := ledger.Grant{Levels: make([]ledger.BucketLevel, len(c.Buckets))}
	var done []groupCharge // charged so far, to undo on a refusal
	charged := make([]bool, len(c.Buckets))
	undo := func() {
		// Best effort with a fresh context: the caller's may be the reason we stopped.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		for _, d := range done {
			_ = s.undoGroup(uctx, d, c)
		}
	}
	for _, group := range order {
		idx := byGroup[group]
		res, err := s.reserveGroup(ctx, group, c, idx, nil, "")
		if err != nil {
			undo()
			return ledger.Grant{}, err
		}
		if res.refusal != nil {
			undo()
			s.cache.remember(s.clock.Now(), c, res.refusal, s.cacheTTL)
			return ledger.Grant{}, res.refusal
		}
		done = append(done, groupCharge{group: group, idx: idx, charged: res.charged})
		for j, i := range idx {
			charged[i] = res.charged[j]
		}
		s.fill(&g, c, idx, res)
	}

	tail := recordTail(c, charged)
	if hasTenant {
		res, err := s.reserveGroup(ctx, tenant, c, byGroup[tenant], c.Budget, tail)
		if err != nil {
			undo()
			return ledger.Grant{}, err
		}
		if res.refusal != nil {
			undo()
			s.cache.remember(s.clock.Now(), c, res.refusal, s.cacheTTL)
			return ledger.Grant{}, res.refusal
		}
		s.fill(&g, c, byGroup[tenant], res)
		g.Budget = res.budget
	} else {
		// An upstream-key-only reservation: the record still lives with the tenant, so
		// that Settle finds it by tenant and id like any other. Its expiry is on the
		// key script's clock; with no bucket charged at all (an unconfigured key) there
		// was no script, and the replica's clock stands in.
		if g.At.IsZero() {
			g.At = s.clock.Now()
		}
		exp := g.At.Add(c.TTL)
		rec := fmt.Sprintf("%d:%d||-|%s", exp.Unix(), exp.Nanosecond(), tail)
		if err := s.client.Set(ctx, s.reservationKey(c.Tenant, c.ID), rec, c.TTL+time.Minute).Err(); err != nil {
			undo()
			return ledger.Grant{}, fmt.Errorf("redis: %w", err)
		}
	}
	g.ExpiresAt = g.At.Add(c.TTL)
	return g, nil
}

// groupCharge is what one group's script charged, for undoing it.
type groupCharge struct {
	group   string
	idx     []int
	charged []bool
}

func (s *Store) undoGroup(ctx context.Context, d groupCharge, c ledger.Charge) error {
	var ops []adjustOp
	for j, i := range d.idx {
		if d.charged[j] {
			b := c.Buckets[i]
			ops = append(ops, adjustOp{field: b.Field, take: -b.Cost, limit: b.Limit})
		}
	}
	_, err := s.adjustGroup(ctx, d.group, ops)
	return err
}

// groupResult is one reserve script's answer.
type groupResult struct {
	at      time.Time
	refusal *ledger.ExhaustedError
	charged []bool
	debts   []time.Duration
	flags   []int64
	budget  *ledger.BudgetLevel
}

func (s *Store) reserveGroup(ctx context.Context, group string, c ledger.Charge, idx []int, budget *ledger.BudgetCharge, tail string) (groupResult, error) {
	n := 4 + 3*len(idx) + 4
	if tail != "" {
		n += 3
	}
	args := s.newArgs(n)
	args = mpInt(mpInt(args, int64(ledger.MaxDebt)), int64(len(idx)))
	for _, i := range idx {
		b := c.Buckets[i]
		args = mpString(args, escapeField(b.Field))
		args = mpInt(args, int64(ledger.DurationOf(b.Cost, b.Limit)))
		args = mpInt(args, flagArg(b.Shadow))
	}
	if budget != nil {
		args = mpInt(mpInt(args, budget.Cost), budget.Limit)
		args = mpInt(mpInt(args, int64(budget.DayOffset/time.Second)), flagArg(budget.Shadow))
	} else {
		args = mpInt(mpInt(mpInt(mpInt(args, -1), 0), 0), 0)
	}
	if tail != "" {
		args = mpString(mpString(mpInt(args, int64(c.TTL)), tail), recordField(c.ID))
	}
	r, err := s.run(ctx, opReserve, []string{s.groupKey(group)}, args)
	if err != nil {
		return groupResult{}, err
	}
	granted := r.int() == 1
	res := groupResult{at: r.time(), charged: make([]bool, len(idx)), debts: make([]time.Duration, len(idx)), flags: make([]int64, len(idx))}
	var short []*ledger.ExhaustedError
	for j, i := range idx {
		wait, debt, flag := time.Duration(r.int()), time.Duration(r.int()), r.int()
		b := c.Buckets[i]
		res.debts[j], res.flags[j], res.charged[j] = debt, flag, flag == 0
		if flag == 1 {
			short = append(short, &ledger.ExhaustedError{Bucket: b.Name(), Cost: b.Cost, Remaining: ledger.RemainingAt(debt, b.Limit), RetryAfter: wait})
		}
	}
	spent, reset, bflag := r.int(), time.Duration(r.int()), r.int()
	if budget != nil {
		if bflag == 1 {
			short = append(short, &ledger.ExhaustedError{Bucket: budget.Group + ":budget", Cost: budget.Cost, Remaining: max(budget.Limit-spent, 0), RetryAfter: reset, Cause: ledger.CauseBudget})
		}
		res.budget = &ledger.BudgetLevel{Limit: budget.Limit, Spent: spent, Reset: reset, Shadow: budget.Shadow, ShadowRefused: bflag == 2}
	}
	if r.err != nil {
		return groupResult{}, r.err
	}
	if !granted {
		if len(short) == 0 {
			return groupResult{}, errors.New("redis: reserve script refused without naming a bucket")
		}
		res.refusal = ledger.LongestWait(short)
	}
	return res, nil
}

// fill copies a group's levels into the grant.
func (s *Store) fill(g *ledger.Grant, c ledger.Charge, idx []int, res groupResult) {
	g.At = res.at
	for j, i := range idx {
		b := c.Buckets[i]
		g.Levels[i] = ledger.BucketLevel{
			Name: b.Name(), Group: b.Group, Field: b.Field, Limit: b.Limit, Remaining: ledger.RemainingAt(res.debts[j], b.Limit), Reset: res.debts[j],
			Shadow: b.Shadow, ShadowRefused: res.flags[j] == 2,
		}
	}
}

// recordTail is the part of a reservation record the caller writes: tokens | budget |
// tenant buckets | meta. The tenant's buckets are listed in charge order; the script's
// mask says which it charged. Meta carries the key's buckets and what was charged there.
func recordTail(c ledger.Charge, charged []bool) string {
	// Appended by hand: fmt's formatting was most of the cost of building the record.
	b := make([]byte, 0, 128)
	b = strconv.AppendInt(b, c.Tokens, 10)
	b = append(b, '|')
	if bc := c.Budget; bc != nil {
		b = strconv.AppendInt(b, bc.Cost, 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, bc.Price.Input, 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, bc.Price.Output, 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, int64(bc.DayOffset/time.Second), 10)
	} else {
		b = append(b, '-')
	}
	b = append(b, '|')
	tenant := ledger.TenantGroup(c.Tenant)
	first := true
	for _, bucket := range c.Buckets {
		if bucket.Group == tenant {
			if !first {
				b = append(b, ';')
			}
			first = false
			b = appendBucketSpec(b, bucket)
		}
	}
	b = append(b, '|')
	// Meta, in query-string form without a map: m=<model>&e=<estimate>&k=<key>&b=...
	b = append(b, "m="...)
	b = append(b, url.QueryEscape(c.Meta.Model)...)
	if c.Meta.EstimatedInput > 0 {
		b = append(b, "&e="...)
		b = strconv.AppendInt(b, c.Meta.EstimatedInput, 10)
	}
	if c.Meta.UpstreamKey != "" {
		b = append(b, "&k="...)
		b = append(b, url.QueryEscape(c.Meta.UpstreamKey)...)
	}
	// The key's buckets, with what was charged there: group,spec,charged.
	for i, bucket := range c.Buckets {
		if bucket.Group == tenant {
			continue
		}
		kb := append([]byte(bucket.Group+","), appendBucketSpec(nil, bucket)...)
		kb = append(kb, ',')
		kb = append(kb, boolArg(charged[i])...)
		b = append(b, "&b="...)
		b = append(b, url.QueryEscape(string(kb))...)
	}
	return string(b) // the escaping leaves no '|'
}

// appendBucketSpec appends "field,kind,cost,limit,shadow" (parseBucketSpec reads it).
func appendBucketSpec(b []byte, bucket ledger.BucketSpec) []byte {
	b = append(b, escapeField(bucket.Field)...)
	b = append(b, ',')
	b = append(b, kindArg(bucket.Kind)...)
	b = append(b, ',')
	b = strconv.AppendInt(b, bucket.Cost, 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, bucket.Limit, 10)
	b = append(b, ',')
	return append(b, boolArg(bucket.Shadow)...)
}

// Settle implements Store.
func (s *Store) Settle(ctx context.Context, tenant, id string, actual ledger.Actual, release bool) (ledger.Settlement, error) {
	group := ledger.TenantGroup(tenant)
	tokens := ledger.ClampUsage(actual.Tokens)
	args := s.newArgs(8)
	args = mpInt(mpInt(args, int64(ledger.MaxDebt)), tokens)
	args = mpInt(mpInt(args, ledger.ClampUsage(actual.Input)), ledger.ClampUsage(actual.Output))
	args = mpString(mpInt(args, flagArg(release)), recordField(id))
	r, err := s.run(ctx, opSettle, []string{s.groupKey(group), s.reservationKey(tenant, id)}, args)
	if err != nil {
		return ledger.Settlement{}, err
	}
	if r.int() == 0 {
		return ledger.Settlement{}, ledger.ErrReservationNotFound
	}
	at := r.time()
	reserved, cost, spent, reset := r.int(), r.int(), r.int(), time.Duration(r.int())
	metaRaw, bucketsRaw, mask := r.str(), r.str(), r.str()
	var debts []time.Duration
	for r.more() {
		debts = append(debts, time.Duration(r.int()))
	}
	if r.err != nil {
		return ledger.Settlement{}, r.err
	}
	rec, err := parseRecord(group, bucketsRaw, mask, metaRaw)
	if err != nil {
		return ledger.Settlement{}, fmt.Errorf("redis: reservation %s: %w", id, err)
	}
	if len(rec.tenantCharged) != len(debts) {
		return ledger.Settlement{}, fmt.Errorf("redis: reservation %s: %d charged buckets, %d debts", id, len(rec.tenantCharged), len(debts))
	}
	if release {
		tokens = 0
	}
	out := ledger.Settlement{At: at, Reserved: reserved, Refunded: reserved - tokens, CostNano: cost, Meta: rec.meta}
	for i, b := range rec.tenantCharged {
		out.Levels = append(out.Levels, levelAt(b, debts[i]))
	}
	if spent >= 0 {
		out.Budget = &ledger.BudgetLevel{Spent: spent, Reset: reset}
	}

	// The key's buckets live in the key's slot: correct them with a second script.
	if len(rec.keyCharged) > 0 {
		ops := make([]adjustOp, len(rec.keyCharged))
		for i, b := range rec.keyCharged {
			ops[i] = adjustOp{field: b.Field, take: ledger.SettleDelta(b, tokens, release), limit: b.Limit}
		}
		kd, err := s.adjustGroup(ctx, rec.keyCharged[0].Group, ops)
		if err != nil {
			return ledger.Settlement{}, err
		}
		for i, b := range rec.keyCharged {
			out.Levels = append(out.Levels, levelAt(b, kd[i]))
		}
	}
	return out, nil
}

// record is the part of a reservation record Settle needs after the script ran.
type record struct {
	tenantCharged []ledger.BucketSpec
	keyCharged    []ledger.BucketSpec
	meta          ledger.ReservationMeta
}

func parseRecord(tenantGroup, buckets, mask, metaRaw string) (record, error) {
	var rec record
	if buckets != "" {
		i := 0
		for spec := range strings.SplitSeq(buckets, ";") {
			b, err := parseBucketSpec(tenantGroup, spec)
			if err != nil {
				return record{}, err
			}
			if i < len(mask) && mask[i] == '1' {
				rec.tenantCharged = append(rec.tenantCharged, b)
			}
			i++
		}
	}
	for part := range strings.SplitSeq(metaRaw, "&") {
		name, raw, _ := strings.Cut(part, "=")
		value, err := url.QueryUnescape(raw)
		if err != nil {
			return record{}, fmt.Errorf("malformed meta %q: %w", part, err)
		}
		switch name {
		case "m":
			rec.meta.Model = value
		case "k":
			rec.meta.UpstreamKey = value
		case "e":
			rec.meta.EstimatedInput, _ = strconv.ParseInt(value, 10, 64)
		case "b":
			// group,field,kind,cost,limit,shadow,charged
			group, rest, ok := strings.Cut(value, ",")
			i := strings.LastIndexByte(rest, ',')
			if !ok || i < 0 {
				return record{}, fmt.Errorf("malformed key bucket %q", value)
			}
			b, err := parseBucketSpec(group, rest[:i])
			if err != nil {
				return record{}, err
			}
			if rest[i+1:] == "1" {
				rec.keyCharged = append(rec.keyCharged, b)
			}
		}
	}
	return rec, nil
}

// parseBucketSpec reads "field,kind,cost,limit,shadow".
func parseBucketSpec(group, spec string) (ledger.BucketSpec, error) {
	// Cut, not Split: Settle parses every charged bucket, and Split allocates.
	var f [5]string
	rest := spec
	for i := range 4 {
		var ok bool
		if f[i], rest, ok = strings.Cut(rest, ","); !ok {
			return ledger.BucketSpec{}, fmt.Errorf("malformed bucket %q", spec)
		}
	}
	if strings.IndexByte(rest, ',') >= 0 {
		return ledger.BucketSpec{}, fmt.Errorf("malformed bucket %q", spec)
	}
	f[4] = rest
	field, err := url.PathUnescape(f[0])
	if err != nil {
		return ledger.BucketSpec{}, fmt.Errorf("malformed bucket field %q: %w", f[0], err)
	}
	cost, err1 := strconv.ParseInt(f[2], 10, 64)
	limit, err2 := strconv.ParseInt(f[3], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return ledger.BucketSpec{}, fmt.Errorf("malformed bucket %q: %w", spec, err)
	}
	kind := ledger.KindRequests
	if f[1] == "t" {
		kind = ledger.KindTokens
	}
	return ledger.BucketSpec{Group: group, Field: field, Kind: kind, Cost: cost, Limit: limit, Shadow: f[4] == "1"}, nil
}

// adjustOp is one bucket change of the adjust script: take tokens (mode 't') or lower
// the bucket to a provider's remaining count (mode 'f').
type adjustOp struct {
	field     string
	take      int64
	observe   bool
	remaining int64
	reset     time.Duration
	limit     int64
}

// adjustGroup runs the adjust script and returns each bucket's debt afterwards.
func (s *Store) adjustGroup(ctx context.Context, group string, ops []adjustOp) ([]time.Duration, error) {
	if len(ops) == 0 {
		return nil, nil
	}
	args := s.newArgs(4 + 5*len(ops))
	args = mpInt(mpInt(args, int64(ledger.MaxDebt)), int64(len(ops)))
	for _, op := range ops {
		args = mpString(args, escapeField(op.field))
		if op.observe {
			args = mpInt(mpInt(mpString(args, "f"), op.remaining), int64(op.reset))
		} else {
			args = mpInt(mpInt(mpString(args, "t"), op.take), 0)
		}
		args = mpInt(args, op.limit)
	}
	r, err := s.run(ctx, opAdjust, []string{s.groupKey(group)}, args)
	if err != nil {
		return nil, err
	}
	r.time()
	debts := make([]time.Duration, len(ops))
	for i := range debts {
		debts[i] = time.Duration(r.int())
	}
	return debts, r.err
}

// Observe implements Store.
func (s *Store) Observe(ctx context.Context, obs []ledger.Observation) ([]ledger.BucketLevel, error) {
	levels := make([]ledger.BucketLevel, len(obs))
	// Observations of one key share a group; group them to make one call per group.
	for start := 0; start < len(obs); {
		end := start
		for end < len(obs) && obs[end].Bucket.Group == obs[start].Bucket.Group {
			end++
		}
		ops := make([]adjustOp, 0, end-start)
		for _, o := range obs[start:end] {
			ops = append(ops, adjustOp{field: o.Bucket.Field, observe: true, remaining: min(o.Remaining, o.Bucket.Limit), reset: min(max(o.Reset, 0), ledger.MaxDebt), limit: o.Bucket.Limit})
		}
		debts, err := s.adjustGroup(ctx, obs[start].Bucket.Group, ops)
		if err != nil {
			return nil, err
		}
		for i, d := range debts {
			b := obs[start+i].Bucket
			levels[start+i] = levelAt(b, d)
		}
		start = end
	}
	return levels, nil
}

// CountRequest implements Store. Requests are counted locally and added to Redis by
// Run every FlushInterval (and by AcquireRetry), so that the hot path pays no round
// trip to the retry budget's single hash.
func (s *Store) CountRequest(_ context.Context, key string, overall bool, window time.Duration) {
	s.pending.add(key, overall, window)
}

// AcquireRetry implements Store.
func (s *Store) AcquireRetry(ctx context.Context, ask ledger.RetryAsk) (ledger.RetryDecision, error) {
	overall, forKey := s.pending.take(ask.Key)
	d, err := s.retryCall(ctx, ask.Budget, ask.Key, ask.Tenant, ask.Format, true, overall, forKey)
	if err != nil {
		s.pending.giveBack(ask.Key, overall, forKey, ask.Budget.Window)
	}
	return d, err
}

func (s *Store) retryCall(ctx context.Context, cfg ledger.RetryBudget, key, tenant string, format, acquire bool, overall, forKey float64) (ledger.RetryDecision, error) {
	args := s.newArgs(13)
	args = mpInt(args, int64(cfg.Window/time.Second))
	args = mpFloat(mpInt(mpFloat(args, cfg.Ratio), int64(cfg.Floor)), cfg.FormatOnlyAbove)
	args = mpInt(mpInt(args, flagArg(format)), flagArg(acquire))
	args = mpFloat(mpFloat(mpString(args, key), overall), forKey)
	args = mpFloat(mpString(args, tenant), cfg.TenantShare)
	r, err := s.run(ctx, opRetry, []string{s.retryKey()}, args)
	if err != nil {
		return ledger.RetryDecision{}, err
	}
	granted, refusing := r.int() == 1, r.int()
	requests, _ := strconv.ParseFloat(r.str(), 64)
	retries, _ := strconv.ParseFloat(r.str(), 64)
	d := ledger.RetryDecision{Granted: granted, Budget: ledger.RetryOverall, Requests: requests, Retries: retries}
	switch refusing {
	case 2:
		d.Budget = ledger.RetryKeyBudget(key)
	case 3:
		d.Budget = ledger.RetryTenantBudget(tenant)
	}
	return d, r.err
}

// flush adds the buffered request counts to Redis.
func (s *Store) flush(ctx context.Context) error {
	var errs []error
	for _, p := range s.pending.drain() {
		if _, err := s.retryCall(ctx, ledger.RetryBudget{Window: p.window}, p.key, "", false, false, p.overall, p.forKey); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Sweep implements Store. Redis expires reservations and full buckets by itself; only
// the local over-limit cache is pruned.
func (s *Store) Sweep(context.Context) (int, error) {
	s.cache.prune(s.clock.Now())
	return 0, nil
}

// Run flushes buffered request counts every FlushInterval until ctx is done.
func (s *Store) Run(ctx context.Context) error {
	ticker := s.clock.NewTicker(s.flushEvery)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.Chan():
			// Lost counts only make the budget a little stricter; the next tick tries
			// again with new ones.
			_ = s.flush(ctx)
		}
	}
}

// Ping checks that Redis answers.
func (s *Store) Ping(ctx context.Context) error {
	return s.client.Ping(ctx).Err()
}

// Now is the decision clock: Redis's TIME, or the replica's clock when the store
// decides at it (ServerTime false).
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	if !s.serverTime {
		return s.clock.Now(), nil
	}
	t, err := s.client.Time(ctx).Result()
	if err != nil {
		return time.Time{}, fmt.Errorf("redis: %w", err)
	}
	return t, nil
}

// epochKey holds the epoch marker: written once by the first replica that finds it
// missing, never expiring. A marker that changed, or went missing, means Redis lost
// its data (a restart without persistence, a flush, a failover to an empty replica).
func (s *Store) epochKey() string { return s.prefix + "epoch" }

// Epoch returns Redis's epoch marker; when there is none it writes value and reports
// created.
func (s *Store) Epoch(ctx context.Context, value string) (marker string, created bool, err error) {
	key := s.epochKey()
	for range 2 {
		v, err := s.client.Get(ctx, key).Result()
		if err == nil {
			return v, false, nil
		}
		if !errors.Is(err, redis.Nil) {
			return "", false, fmt.Errorf("redis: %w", err)
		}
		ok, err := s.client.SetNX(ctx, key, value, 0).Result()
		if err != nil {
			return "", false, fmt.Errorf("redis: %w", err)
		}
		if ok {
			return value, true, nil
		}
		// Another replica wrote it between the two calls: read theirs.
	}
	return "", false, errors.New("redis: the epoch marker changes faster than it can be read")
}

// levelAt is the level of a bucket with the given debt.
func levelAt(b ledger.BucketSpec, debt time.Duration) ledger.BucketLevel {
	return ledger.BucketLevel{Name: b.Name(), Group: b.Group, Field: b.Field, Limit: b.Limit, Remaining: ledger.RemainingAt(debt, b.Limit), Reset: debt, Shadow: b.Shadow}
}

// flagArg is a flag as the operations take it (msgpack.go): 1 or 0.
func flagArg(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func boolArg(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

func kindArg(k ledger.Kind) string {
	if k == ledger.KindTokens {
		return "t"
	}
	return "r"
}

// escapeTag escapes the characters that would end or nest a hash tag.
func escapeTag(s string) string {
	if !strings.ContainsAny(s, "{}%") {
		return s
	}
	r := strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")
	return r.Replace(s)
}

// escapeField escapes the separators of the record format in a bucket field.
func escapeField(s string) string {
	if !strings.ContainsAny(s, "%,;| ") {
		return s
	}
	return url.PathEscape(s)
}

// reply reads an operation's reply (an array, see msgpack.go) in order, remembering the
// first error.
type reply struct {
	b   string
	i   int // offset of the next value
	n   int // values left
	err error
}

func newReply(b string) *reply {
	r := &reply{b: b}
	kind, n, i := mpHeader(b, 0)
	if kind != mpArr {
		r.err = ErrMalformedReply
		return r
	}
	r.n, r.i = int(n), i
	return r
}

func (r *reply) more() bool { return r.n > 0 }

// next reads the next value's header; ok is false after the last one or an error.
func (r *reply) next() (kind mpKind, v uint64, ok bool) {
	if r.err != nil {
		return mpBad, 0, false
	}
	if r.n == 0 {
		r.err = errors.New("redis: script reply has fewer values than wanted")
		return mpBad, 0, false
	}
	kind, v, i := mpHeader(r.b, r.i)
	if kind == mpBad || kind == mpArr || kind == mpMap || (kind == mpStr && v > uint64(len(r.b)-i)) {
		r.err = ErrMalformedReply
		return mpBad, 0, false
	}
	r.n--
	r.i = i
	if kind == mpStr {
		r.i += int(v)
	}
	return kind, v, true
}

// int reads an integer. Lua numbers beyond int64 come as floats; they saturate.
func (r *reply) int() int64 {
	kind, v, ok := r.next()
	if !ok {
		return 0
	}
	switch kind {
	case mpInteger:
		return int64(v)
	case mpUint:
		return int64(min(v, math.MaxInt64))
	case mpFloat32:
		return floatToInt(float64(math.Float32frombits(uint32(v))))
	case mpFloat64:
		return floatToInt(math.Float64frombits(v))
	case mpNil:
		return 0
	}
	r.err = fmt.Errorf("redis: script reply value is not an integer")
	return 0
}

func floatToInt(f float64) int64 {
	switch {
	case f >= math.MaxInt64:
		return math.MaxInt64
	case f <= math.MinInt64:
		return math.MinInt64
	}
	return int64(f)
}

func (r *reply) str() string {
	kind, v, ok := r.next()
	if !ok || kind == mpNil {
		return ""
	}
	if kind != mpStr {
		r.err = fmt.Errorf("redis: script reply value is not a string")
		return ""
	}
	return r.b[r.i-int(v) : r.i]
}

// time reads the script's decision time (s, ns).
func (r *reply) time() time.Time {
	sec, nsec := r.int(), r.int()
	return time.Unix(sec, nsec)
}

// overLimitCache remembers buckets Redis refused, so that requests they cannot cover
// are refused without a round trip. An entry estimates the bucket's level from the
// refill since the refusal; it ignores what other replicas take (which would only make
// the refusal more right) and what they refund (which is why entries live briefly).
type overLimitCache struct {
	mu      sync.Mutex
	entries map[string]cacheEntry
}

type cacheEntry struct {
	remaining int64
	limit     int64 // 0 for budgets, which do not refill
	at, until time.Time
}

func (c *overLimitCache) check(now time.Time, ch ledger.Charge) *ledger.ExhaustedError {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) == 0 {
		return nil
	}
	var short []*ledger.ExhaustedError
	for _, b := range ch.Buckets {
		if b.Shadow {
			continue
		}
		e, ok := c.entries[b.Name()]
		if !ok {
			continue
		}
		if !now.Before(e.until) {
			delete(c.entries, b.Name())
			continue
		}
		level := min(e.remaining+ledger.TokensIn(now.Sub(e.at), b.Limit), b.Limit)
		if b.Cost > level {
			short = append(short, &ledger.ExhaustedError{Bucket: b.Name(), Cost: b.Cost, Remaining: level, RetryAfter: ledger.DurationOf(b.Cost-level, b.Limit)})
		}
	}
	if bc := ch.Budget; bc != nil && !bc.Shadow {
		name := bc.Group + ":budget"
		if e, ok := c.entries[name]; ok {
			if !now.Before(e.until) {
				delete(c.entries, name)
			} else if bc.Cost > e.remaining {
				short = append(short, &ledger.ExhaustedError{Bucket: name, Cost: bc.Cost, Remaining: e.remaining, RetryAfter: e.until.Sub(now), Cause: ledger.CauseBudget})
			}
		}
	}
	if len(short) == 0 {
		return nil
	}
	return ledger.LongestWait(short)
}

// remember caches every short bucket of a refusal for at most ttl.
func (c *overLimitCache) remember(now time.Time, ch ledger.Charge, refusal *ledger.ExhaustedError, ttl time.Duration) {
	if ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, name := range refusal.Short {
		for _, b := range ch.Buckets {
			if b.Name() == name {
				level := remainingFor(refusal, name)
				wait := ledger.DurationOf(b.Cost-level, b.Limit)
				c.entries[name] = cacheEntry{remaining: level, limit: b.Limit, at: now, until: now.Add(min(ttl, max(wait, 0)))}
			}
		}
		if bc := ch.Budget; bc != nil && name == bc.Group+":budget" && refusal.Bucket == name {
			c.entries[name] = cacheEntry{remaining: refusal.Remaining, at: now, until: now.Add(min(ttl, refusal.RetryAfter))}
		}
	}
}

// remainingFor returns what the refusal said the named bucket held. Only the longest
// wait's level is known exactly; other short buckets are cached as empty, which errs
// towards one extra round trip, never towards admitting.
func remainingFor(refusal *ledger.ExhaustedError, name string) int64 {
	if refusal.Bucket == name {
		return refusal.Remaining
	}
	return 0
}

func (c *overLimitCache) prune(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, e := range c.entries {
		if !now.Before(e.until) {
			delete(c.entries, name)
		}
	}
}

// pendingRequests buffers request counts for the retry budget.
type pendingRequests struct {
	mu      sync.Mutex
	window  time.Duration
	overall float64
	keys    map[string]float64
}

type pendingBatch struct {
	window  time.Duration
	key     string
	overall float64
	forKey  float64
}

func (p *pendingRequests) add(key string, overall bool, window time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.window = window
	if overall {
		p.overall++
	}
	if key != "" {
		p.keys[key]++
	}
}

// take removes the overall count and key's count for an AcquireRetry to add.
func (p *pendingRequests) take(key string) (overall, forKey float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	overall, p.overall = p.overall, 0
	if key != "" {
		forKey = p.keys[key]
		delete(p.keys, key)
	}
	return overall, forKey
}

func (p *pendingRequests) giveBack(key string, overall, forKey float64, window time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.window = window
	p.overall += overall
	if key != "" && forKey > 0 {
		p.keys[key] += forKey
	}
}

// drain empties the buffer into one batch per key (the overall count rides on the
// first, or on a key-less batch when there are no keys).
func (p *pendingRequests) drain() []pendingBatch {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.overall == 0 && len(p.keys) == 0 {
		return nil
	}
	out := []pendingBatch{}
	for key, n := range p.keys {
		out = append(out, pendingBatch{window: p.window, key: key, forKey: n})
	}
	if len(out) == 0 {
		out = append(out, pendingBatch{window: p.window})
	}
	out[0].overall = p.overall
	p.overall = 0
	clear(p.keys)
	return out
}

// Client is the client the store sends through; benchmarks read Redis's own CPU time
// with it.
func (s *Store) Client() redis.UniversalClient { return s.client }

// SendScripts makes the store send EVALSHA from now on, as it does to a Redis without
// functions (before 7.0), so that tests run both paths against one Redis.
func (s *Store) SendScripts() { s.batch.scripts.Store(true) }

// RoundTrips is how many operations the store has sent to Redis; the over-limit cache
// is measured by the ones it saved.
func (s *Store) RoundTrips() int64 { return s.calls.Load() }
