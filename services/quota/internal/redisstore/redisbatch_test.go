package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"

	"github.com/mantle-mesh/mantle/services/quota/internal/ledger"
)

// freshLib returns a quota library no Redis has seen (its name and script hash are
// new), so that its first FCALL answers "Function not found" and its first EVALSHA
// NOSCRIPT, and deletes it from the test Redis when the test ends.
func freshLib(t *testing.T, c *redis.Client) *luaLib {
	t.Helper()
	var b [8]byte
	_, _ = rand.Read(b[:])
	lib := newLuaLib("-- " + hex.EncodeToString(b[:]))
	t.Cleanup(func() { _ = c.FunctionDelete(context.Background(), lib.name).Err() })
	return lib
}

// echoOp is an adjust of no buckets decided at second sec: its reply is {sec, 0}.
func echoOp(sec int) []byte { return mpArgs(sec, 0, int64(ledger.MaxDebt), 0) }

// runInts runs an operation whose reply is integers, and returns them.
func runInts(b *scriptBatcher, ctx context.Context, op string, keys []string, args []byte) ([]int64, error) {
	v, err := b.run(ctx, op, keys, args)
	if err != nil {
		return nil, err
	}
	r := newReply(v)
	var out []int64
	for r.more() {
		out = append(out, r.int())
	}
	return out, r.err
}

// takeOp takes one token from bucket f (limit 60) at second 1.
func takeOp() []byte { return mpArgs(1, 0, int64(ledger.MaxDebt), 1, "f", "t", 1, 0, 60) }

// batcherModes are the ways a batcher sends: by function or by script, and in one
// call or one call per hash slot.
type batcherMode struct {
	name    string
	scripts bool
	bySlot  bool
}

var batcherModes = []batcherMode{
	{"functions", false, false},
	{"functions by slot", false, true},
	{"scripts", true, false},
	{"scripts by slot", true, true},
}

// newTestBatcher returns a client of the test Redis, a key prefix of the test's own and
// a batcher in mode m on a library no Redis has seen, closed when the test ends.
func newTestBatcher(t *testing.T, m batcherMode) (*redis.Client, string, *scriptBatcher) {
	t.Helper()
	c := newTestRedisClient(t)
	b := newScriptBatcher(c, freshLib(t, c))
	b.scripts.Store(m.scripts)
	b.bySlot.Store(m.bySlot)
	t.Cleanup(b.Close)
	return c, testPrefix(t, c), b
}

func TestBatcherKeepsEachCallersReplyAndError(t *testing.T) {
	for _, m := range batcherModes {
		t.Run(m.name, func(t *testing.T) {
			c, prefix, b := newTestBatcher(t, m)
			ctx := context.Background()
			// A string where a bucket hash belongs: its operations fail with WRONGTYPE.
			wrong := prefix + "{wrong}:b"
			if err := c.Set(ctx, wrong, "x", 0).Err(); err != nil {
				t.Fatal(err)
			}

			const callers = 200
			var wg sync.WaitGroup
			errs := make(chan error, callers)
			for i := range callers {
				wg.Go(func() {
					if i%7 == 0 {
						_, err := b.run(ctx, opAdjust, []string{wrong}, echoOp(i+1))
						if !redis.HasErrorPrefix(err, "WRONGTYPE") {
							errs <- fmt.Errorf("caller %d: error %w, want WRONGTYPE", i, err)
						}
						return
					}
					// Callers spread over a few hash tags, as tenants do.
					key := fmt.Sprintf("%s{t%d}:b", prefix, i%5)
					v, err := runInts(b, ctx, opAdjust, []string{key}, echoOp(i+1))
					if err != nil {
						errs <- fmt.Errorf("caller %d: %w", i, err)
						return
					}
					if len(v) != 2 || v[0] != int64(i+1) || v[1] != int64(0) {
						errs <- fmt.Errorf("caller %d: reply %v", i, v)
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}

// A server that lost the library (a restart, FUNCTION FLUSH) or the script (SCRIPT
// FLUSH) gets it again, and the call that found it missing still gets its reply.
func TestBatcherReloadsWhatRedisLost(t *testing.T) {
	for _, m := range batcherModes {
		t.Run(m.name, func(t *testing.T) {
			c, prefix, b := newTestBatcher(t, m)
			ctx := context.Background()
			for i := range 3 {
				if i == 2 && !m.scripts {
					// Lost after it was loaded. (Scripts are only ever new here: SCRIPT
					// FLUSH would disturb every other user of the test Redis.)
					if err := c.FunctionDelete(ctx, b.lib.name).Err(); err != nil {
						t.Fatal(err)
					}
				}
				v, err := runInts(b, ctx, opAdjust, []string{prefix + "{a}:b"}, echoOp(i+1))
				if err != nil || len(v) != 2 || v[0] != int64(i+1) {
					t.Fatalf("call %d: %v, %v", i, v, err)
				}
			}
			if got := b.scripts.Load(); got != m.scripts {
				t.Errorf("sending scripts = %v, want %v", got, m.scripts)
			}
		})
	}
}

// A server that will not run functions for this client (an ACL without FUNCTION, as
// managed Redis services set them; before Redis 7.0 the command is unknown) gets
// scripts, for good, and the call that found out still gets its reply.
func TestBatcherFallsBackToScripts(t *testing.T) {
	admin := newTestRedisClient(t)
	ctx := context.Background()
	c := admin
	user := "mantle-test-" + strings.Trim(testPrefix(t, admin), ":{}")
	err := admin.Do(ctx, "ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-function").Err()
	switch {
	case err == nil:
		t.Cleanup(func() { admin.Do(context.Background(), "ACL", "DELUSER", user) })
		opts := *admin.Options()
		opts.Username, opts.Password = user, "pw"
		c = redis.NewClient(&opts)
		t.Cleanup(func() { _ = c.Close() })
	case redis.HasErrorPrefix(err, "unknown command"):
		// Redis before 6.0: no ACL, and no FUNCTION either.
	default:
		t.Fatal(err)
	}
	prefix := testPrefix(t, c)
	b := newScriptBatcher(c, freshLib(t, c))
	t.Cleanup(b.Close)
	v, err := runInts(b, ctx, opAdjust, []string{prefix + "{a}:b"}, echoOp(7))
	if err != nil || len(v) != 2 || v[0] != int64(7) {
		t.Fatalf("reply %v, %v", v, err)
	}
	if !b.scripts.Load() {
		t.Fatal("still sending functions after Redis refused to load them")
	}
}

// A library Redis fails to load for another reason (here it does not compile; in
// production LOADING, READONLY or a failover) fails the calls that needed it, and does
// not give up functions: the next call tries again.
func TestBatcherKeepsFunctionsAfterOtherLoadErrors(t *testing.T) {
	c := newTestRedisClient(t)
	prefix := testPrefix(t, c)
	b := newScriptBatcher(c, freshLib(t, c))
	t.Cleanup(b.Close)
	b.lib.code = "#!lua name=" + b.lib.name + "\nthis is not Lua\n"
	_, err := b.run(context.Background(), opAdjust, []string{prefix + "{a}:b"}, echoOp(7))
	if err == nil || !strings.Contains(err.Error(), "loading the quota functions") {
		t.Fatalf("run = %v, want the load error", err)
	}
	if b.scripts.Load() {
		t.Fatal("fell back to scripts for good on an error that may pass")
	}
}

// A server that refuses keys of several slots in one call (a proxy or managed service
// fronting a cluster as one endpoint) turns grouping by slot on for good, and the
// refused batch goes again, grouped.
func TestSendGroupedAfterCrossSlot(t *testing.T) {
	calls := []*scriptCall{{keys: []string{"q:{t1}:b"}}, {keys: []string{"q:{t2}:b"}}, {keys: []string{"q:{t1}:r:9", "q:{t1}:b"}}}
	var sent [][]int // group sizes of each send
	send := func(_ context.Context, groups [][]*scriptCall) ([][]string, []error) {
		var sizes []int
		replies, errs := make([][]string, len(groups)), make([]error, len(groups))
		for i, g := range groups {
			sizes = append(sizes, len(g))
			tags := map[string]bool{}
			for _, c := range g {
				tags[hashTag(c.keys[0])] = true
			}
			if len(tags) > 1 {
				errs[i] = redis.ErrCrossSlot
				continue
			}
			for range g {
				replies[i] = append(replies[i], "\x91\x01") // {1}
			}
		}
		sent = append(sent, sizes)
		return replies, errs
	}
	var bySlot atomic.Bool
	groups, _, errs := sendGrouped(context.Background(), calls, &bySlot, send)
	if !bySlot.Load() {
		t.Error("grouping by slot is still off after CROSSSLOT")
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("group %d: %v", i, err)
		}
	}
	if len(groups) != 2 || len(sent) != 2 || len(sent[0]) != 1 || sent[0][0] != 3 {
		t.Errorf("sends %v, groups %d; want one of 3 refused, then one per tag", sent, len(groups))
	}
	// From then on the first send is grouped.
	sent = nil
	sendGrouped(context.Background(), calls, &bySlot, send)
	if len(sent) != 1 || len(sent[0]) != 2 {
		t.Errorf("after the switch: sends %v, want one send of two groups", sent)
	}
}

func TestBatcherSkipsCallersThatLeft(t *testing.T) {
	for _, m := range batcherModes {
		t.Run(m.name, func(t *testing.T) {
			c, prefix, b := newTestBatcher(t, m)

			left := make(chan struct{})
			close(left)
			gone := &scriptCall{op: opAdjust, keys: []string{prefix + "{gone}:b"}, args: takeOp(), gone: left, reply: make(chan scriptReply, 1)}
			live := &scriptCall{op: opAdjust, keys: []string{prefix + "{live}:b"}, args: takeOp(), reply: make(chan scriptReply, 1)}
			// One batch, run the way a worker runs it.
			b.exec(context.Background(), []*scriptCall{gone, live})

			if r := <-live.reply; r.err != nil {
				t.Fatalf("live caller: %v, %v", r.v, r.err)
			}
			select {
			case r := <-gone.reply:
				t.Fatalf("a caller that left got a reply: %v", r)
			default:
			}
			if n, err := c.Exists(context.Background(), prefix+"{gone}:b").Result(); err != nil || n != 0 {
				t.Fatalf("the operation of a caller that left ran (exists=%d, %v)", n, err)
			}
		})
	}
}

func TestBatcherCancelledCallerDoesNotFailOthers(t *testing.T) {
	c := newTestRedisClient(t)
	prefix := testPrefix(t, c)
	b := newScriptBatcher(c, quotaLib)
	t.Cleanup(b.Close)
	key := []string{prefix + "{a}:b"}

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			if i%2 == 0 {
				// Either it left before its reply or the reply won the race; both are fine,
				// as long as nobody else notices.
				if _, err := b.run(cancelled, opAdjust, key, echoOp(1)); err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("cancelled caller: %v", err)
				}
				return
			}
			v, err := runInts(b, context.Background(), opAdjust, key, echoOp(i))
			if err != nil || len(v) != 2 || v[0] != int64(i) {
				t.Errorf("caller %d: %v, %v", i, v, err)
			}
		})
	}
	wg.Wait()
}

func TestBatcherClose(t *testing.T) {
	c := newTestRedisClient(t)
	prefix := testPrefix(t, c)
	key := []string{prefix + "{a}:b"}
	b := newScriptBatcher(c, quotaLib)
	ctx := context.Background()
	if _, err := b.run(ctx, opAdjust, key, echoOp(1)); err != nil {
		t.Fatal(err)
	}
	b.Close()
	b.Close() // twice is harmless
	if _, err := b.run(ctx, opAdjust, key, echoOp(1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v, want errBatcherClosed", err)
	}

	// Closed before first use: no worker starts, calls fail.
	b2 := newScriptBatcher(c, quotaLib)
	b2.Close()
	if _, err := b2.run(ctx, opAdjust, key, echoOp(1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v, want errBatcherClosed", err)
	}
}

// A malformed batch is refused as a whole, not misread.
func TestBatchRefusesMalformedOperations(t *testing.T) {
	c := newTestRedisClient(t)
	b := newScriptBatcher(c, quotaLib)
	t.Cleanup(b.Close)
	for _, op := range []string{"x", ""} {
		_, err := b.run(context.Background(), op, []string{"k"}, nil)
		if err == nil || !strings.Contains(err.Error(), "malformed operation") {
			t.Errorf("operation %q: %v, want a malformed operation error", op, err)
		}
	}
}

func TestHashTag(t *testing.T) {
	for _, tt := range []struct{ key, want string }{
		{"p:{tenant:acme}:b", "tenant:acme"},
		{"p:{tenant:acme}:r:{x}", "tenant:acme"},
		{"{}x{y}", "{}x{y}"}, // an empty first tag: the whole key
		{"p:{open", "p:{open"},
		{"plain", "plain"},
	} {
		if got := hashTag(tt.key); got != tt.want {
			t.Errorf("hashTag(%q) = %q, want %q", tt.key, got, tt.want)
		}
	}
}

// onlyScripter hides everything of a client but the Scripter methods.
type onlyScripter struct{ redis.Scripter }

// A store given a Scripter runs each operation on its own: by FCALL when the Scripter
// can send any command (an AutoPipeliner), by EVALSHA otherwise or when the server has
// no functions, loading the library or script it finds missing either way.
func TestRedisStoreThroughScripter(t *testing.T) {
	for _, tt := range []struct {
		name        string
		plain       bool // only the Scripter methods
		scripts     bool // the server is taken to have no functions
		wantScripts bool
	}{
		{name: "auto-pipeliner, functions"},
		{name: "auto-pipeliner, scripts", scripts: true, wantScripts: true},
		{name: "plain scripter", plain: true, wantScripts: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestRedisClient(t)
			ap, err := c.AutoPipeline()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = ap.Close() })
			var scripter redis.Scripter = ap
			if tt.plain {
				scripter = onlyScripter{ap}
			}
			clock := clockwork.NewFakeClockAt(t0)
			store := New(c, Options{Prefix: testPrefix(t, c), Clock: clock, Scripter: scripter})
			t.Cleanup(func() { _ = store.Close() })
			store.lib = freshLib(t, c)
			if tt.scripts {
				store.scripts.Store(true)
			}
			ctx := context.Background()
			spec := ledger.BucketSpec{Group: "tenant:acme", Field: ledger.FieldTPM, Kind: ledger.KindTokens, Cost: 60, Limit: 600}
			for i := range 2 {
				id := fmt.Sprint("r", i)
				g, err := store.Reserve(ctx, ledger.Charge{ID: id, Tenant: "acme", TTL: time.Minute, Tokens: 60, Buckets: []ledger.BucketSpec{spec}})
				if err != nil {
					t.Fatal(err)
				}
				if want := int64(600 - 60*(i+1)); g.Levels[0].Remaining != want {
					t.Fatalf("reservation %d: remaining %d, want %d", i, g.Levels[0].Remaining, want)
				}
				if _, err := store.Settle(ctx, "acme", id, ledger.Actual{Tokens: 60}, false); err != nil {
					t.Fatal(err)
				}
				if _, err := store.Settle(ctx, "acme", id, ledger.Actual{Tokens: 60}, false); !errors.Is(err, ledger.ErrReservationNotFound) {
					t.Fatalf("second settle: %v, want ErrReservationNotFound", err)
				}
				if i == 0 && !tt.plain && !tt.scripts {
					// Lost after it was loaded: loaded again.
					if err := c.FunctionDelete(ctx, store.lib.name).Err(); err != nil {
						t.Fatal(err)
					}
				}
			}
			if got := store.scripts.Load(); got != tt.wantScripts {
				t.Errorf("sending scripts = %v, want %v", got, tt.wantScripts)
			}
		})
	}
}
