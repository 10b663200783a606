package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// ErrClosed answers script calls made after the store was closed, or still
// queued when it was.
var ErrClosed = errors.New("redis: store closed")

// scriptBatcher sends the quota operations of concurrent callers to Redis together.
// Most of a decision's cost on both sides is per call (a round trip, a script's setup,
// Redis TIME, the reply's framing), not the operation, so one call for many operations
// is the main saving: the operations queued for one hash slot (all of them, on a single
// Redis) go as one call of batch.lua, and the calls for different slots as one pipeline.
//
// There is no timer: a worker sends whatever queued while its previous batch was in
// flight, so a lone caller pays no wait and busy callers share calls. Each call keeps
// its own reply and error, and a caller that gives up (its context ends) leaves the
// others alone: its operation is skipped when it has not been sent yet, and its reply
// is dropped when it has.
type scriptBatcher struct {
	client   redis.UniversalClient
	lib      *luaLib
	queue    chan *scriptCall
	maxBatch int
	workers  int
	// bySlot sends operations of different hash tags in different calls: a cluster or
	// ring client routes each call by its first key, and Redis Cluster refuses a call
	// whose keys span slots. A single Redis takes any keys in one call; a proxy or
	// managed service that fronts a cluster as one endpoint does not, and its first
	// CROSSSLOT refusal turns bySlot on (sendCalls).
	bySlot atomic.Bool
	// scripts is set once the server turned out to run no functions (Redis before 7.0,
	// or an ACL without FUNCTION): batches go as EVALSHA from then on.
	scripts atomic.Bool

	// busy counts round trips in flight (direct calls and batches), for the fast path.
	busy atomic.Int64

	start   sync.Once
	close   sync.Once
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	closing chan struct{} // closed by Close: workers stop taking calls
	stopped chan struct{} // closed once every worker has returned
}

// scriptCall is one caller's operation and where its reply goes.
type scriptCall struct {
	op   string // opReserve, opSettle, ...
	keys []string
	args []byte // the operation's arguments, a MessagePack array (msgpack.go)
	// gone is the caller's ctx.Done(): a call whose caller left is not sent.
	gone  <-chan struct{}
	reply chan scriptReply // buffered, so that a worker never waits for a caller
}

type scriptReply struct {
	v   string // the operation's reply, a MessagePack array (msgpack.go)
	err error
}

// Defaults of the batcher. Two workers keep one batch queued behind the one Redis is
// running, so that Redis does not idle for a round trip between them; a batch is
// bounded so that one call's reply cannot grow without limit.
const (
	batchWorkers = 2
	maxBatchSize = 128
)

func newScriptBatcher(client redis.UniversalClient, lib *luaLib) *scriptBatcher {
	_, single := client.(*redis.Client)
	b := &scriptBatcher{
		client:   client,
		lib:      lib,
		queue:    make(chan *scriptCall, 4*maxBatchSize),
		maxBatch: maxBatchSize,
		workers:  batchWorkers,
		closing:  make(chan struct{}),
		stopped:  make(chan struct{}),
	}
	b.bySlot.Store(!single)
	return b
}

var callPool = sync.Pool{New: func() any { return &scriptCall{reply: make(chan scriptReply, 1)} }}

// run sends operation op with keys and args in the next batch and waits for its reply.
func (b *scriptBatcher) run(ctx context.Context, op string, keys []string, args []byte) (string, error) {
	select {
	case <-b.closing:
		return "", ErrClosed
	default:
	}
	c := callPool.Get().(*scriptCall)
	c.op, c.keys, c.args = op, keys, args
	// Nothing in flight: nobody to share a call with, so the caller sends its own
	// rather than pay two goroutine hand-offs (measured: +40% latency and more CPU per
	// decision for a lone caller).
	if b.busy.CompareAndSwap(0, 1) {
		b.exec(ctx, []*scriptCall{c})
		b.busy.Add(-1)
		r := <-c.reply // exec answers every call it sends, and a direct call is sent
		b.recycle(c)
		return r.v, r.err
	}
	b.start.Do(b.startWorkers)
	c.gone = ctx.Done()
	select {
	case b.queue <- c:
	case <-ctx.Done():
		b.recycle(c)
		return "", ctx.Err()
	case <-b.closing:
		b.recycle(c)
		return "", ErrClosed
	}
	select {
	case r := <-c.reply:
		b.recycle(c)
		return r.v, r.err
	case <-ctx.Done():
		// A worker may still hold c: it is not reused.
		return "", ctx.Err()
	case <-b.stopped:
		// Workers finish their batches before they stop, so a call still without a
		// reply was queued but never sent.
		select {
		case r := <-c.reply:
			return r.v, r.err
		default:
			return "", ErrClosed
		}
	}
}

func (b *scriptBatcher) recycle(c *scriptCall) {
	*c = scriptCall{reply: c.reply}
	callPool.Put(c)
}

func (b *scriptBatcher) startWorkers() {
	// The workers' context is cancelled by Close, which ends a batch in flight.
	ctx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	b.wg.Add(b.workers)
	for range b.workers {
		go b.work(ctx)
	}
}

// Close stops the workers; callers still waiting get errBatcherClosed (or their
// batch's error). Calls after Close fail at once.
func (b *scriptBatcher) Close() {
	b.close.Do(func() {
		// Closing before starting would let a later run start workers nobody stops.
		b.start.Do(func() {})
		close(b.closing)
		if b.cancel != nil {
			b.cancel()
		}
		b.wg.Wait()
		close(b.stopped)
	})
}

func (b *scriptBatcher) work(ctx context.Context) {
	defer b.wg.Done()
	batch := make([]*scriptCall, 0, b.maxBatch)
	for {
		select {
		case <-b.closing:
			return
		case c := <-b.queue:
			batch = append(batch[:0], c)
		}
		// Whatever queued meanwhile rides along.
	fill:
		for len(batch) < b.maxBatch {
			select {
			case c := <-b.queue:
				batch = append(batch, c)
			default:
				break fill
			}
		}
		b.busy.Add(1)
		b.exec(ctx, batch)
		b.busy.Add(-1)
		clear(batch)
	}
}

// exec sends one batch and replies to every caller in it that has not left.
func (b *scriptBatcher) exec(ctx context.Context, batch []*scriptCall) {
	live := make([]*scriptCall, 0, len(batch))
	for _, c := range batch {
		select {
		case <-c.gone:
			// The caller has left: sending its operation would charge for nothing.
			continue
		default:
			live = append(live, c)
		}
	}
	if len(live) == 0 {
		return
	}
	groups, replies, errs := b.sendCalls(ctx, live)
	for i, g := range groups {
		for j, c := range g {
			if errs[i] != nil {
				c.reply <- scriptReply{err: errs[i]}
				continue
			}
			c.reply <- opReply(replies[i][j])
		}
	}
}

// sendCalls groups calls and sends them. When the server refuses a call whose keys span
// slots (CROSSSLOT), grouping by slot is turned on for good and the calls go again.
func (b *scriptBatcher) sendCalls(ctx context.Context, calls []*scriptCall) ([][]*scriptCall, [][]string, []error) {
	return sendGrouped(ctx, calls, &b.bySlot, b.send)
}

// sendGrouped is sendCalls with the sending passed in, for tests.
func sendGrouped(ctx context.Context, calls []*scriptCall, bySlot *atomic.Bool,
	send func(context.Context, [][]*scriptCall) ([][]string, []error),
) ([][]*scriptCall, [][]string, []error) {
	split := bySlot.Load()
	groups := group(calls, split)
	replies, errs := send(ctx, groups)
	if split || !redis.HasErrorPrefix(errs[0], "CROSSSLOT") {
		return groups, replies, errs
	}
	bySlot.Store(true)
	groups = group(calls, true)
	replies, errs = send(ctx, groups)
	return groups, replies, errs
}

// group splits calls into the groups that can share one call: all of them, or, by slot,
// those of one hash tag (an operation's keys share their tag).
func group(calls []*scriptCall, bySlot bool) [][]*scriptCall {
	if !bySlot {
		return [][]*scriptCall{calls}
	}
	var groups [][]*scriptCall
	index := make(map[string]int)
	for _, c := range calls {
		tag := hashTag(c.keys[0])
		i, ok := index[tag]
		if !ok {
			i = len(groups)
			index[tag] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], c)
	}
	return groups
}

// hashTag is the part of key Redis Cluster hashes: what the first {…} holds, or the
// whole key when there is no such non-empty part.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// How a batch is sent.
type sendMode int

const (
	sendFunction sendMode = iota // FCALL of the loaded library
	sendScript                   // EVALSHA
	sendEval                     // EVAL with the script's body, which also loads it
)

// send runs one batch.lua call per group and returns each group's replies, one per
// operation, or the group's error.
func (b *scriptBatcher) send(ctx context.Context, groups [][]*scriptCall) ([][]string, []error) {
	return sendBatch(ctx, groups, b.do, b.load, &b.scripts)
}

// sendBatch runs one batch.lua call per group with do and returns each group's
// replies, one per operation, or the group's error. It recovers from a server that
// lost the library or script (a restart, FUNCTION FLUSH, SCRIPT FLUSH) by loading it
// again with load, and from one without functions by setting scripts for good.
func sendBatch(ctx context.Context, groups [][]*scriptCall,
	do func(context.Context, [][]*scriptCall, []int, sendMode) []*redis.Cmd,
	load func(context.Context) error, scripts *atomic.Bool,
) ([][]string, []error) {
	mode := sendFunction
	if scripts.Load() {
		mode = sendScript
	}
	replies := make([][]string, len(groups))
	errs := make([]error, len(groups))
	todo := make([]int, len(groups))
	for i := range todo {
		todo[i] = i
	}
	// At most: FCALL, load and FCALL again or fall back to EVALSHA, then EVAL.
	for attempt := 0; attempt < 4 && len(todo) > 0; attempt++ {
		cmds := do(ctx, groups, todo, mode)
		again := todo[:0:0]
		next := mode
		for k, i := range todo {
			err := cmds[k].Err()
			switch {
			case err == nil:
				var packed string
				if packed, errs[i] = cmds[k].Text(); errs[i] == nil {
					replies[i], errs[i] = splitReplies(packed, len(groups[i]))
				}
				continue
			case mode == sendFunction && redis.HasErrorPrefix(err, "unknown command"):
				next = sendScript
			case mode == sendFunction && redis.HasErrorPrefix(err, "Function not found"):
				// next stays sendFunction once the library is loaded again.
			case mode == sendScript && redis.HasErrorPrefix(err, "NOSCRIPT"):
				next = sendEval
			default:
				errs[i] = err
				continue
			}
			errs[i] = err
			again = append(again, i)
		}
		if len(again) == 0 {
			break
		}
		if mode == sendFunction && next == sendFunction {
			if err := load(ctx); err != nil {
				if !refusesFunctions(err) {
					// Unreachable, loading, read-only, a failover: the library loads next time.
					for _, i := range again {
						errs[i] = fmt.Errorf("loading the quota functions: %w", err)
					}
					break
				}
				// Redis will not take the library (no FUNCTION LOAD for this user, say):
				// scripts do the same.
				next = sendScript
			}
		}
		if next == sendScript {
			scripts.Store(true)
		}
		mode, todo = next, again
	}
	return replies, errs
}

// refusesFunctions reports whether a FUNCTION LOAD error means the server will never
// take the library (a permission it lacks, a command it does not know), as opposed to
// a passing state (LOADING, READONLY, BUSY, CLUSTERDOWN, a lost connection).
func refusesFunctions(err error) bool {
	// HasErrorPrefix reads only Redis's own errors and ignores their "ERR ".
	for _, prefix := range []string{"NOPERM", "unknown command", "unknown subcommand"} {
		if redis.HasErrorPrefix(err, prefix) {
			return true
		}
	}
	return false
}

// do sends the calls of groups[todo...] in mode, as one command or one pipeline.
func (b *scriptBatcher) do(ctx context.Context, groups [][]*scriptCall, todo []int, mode sendMode) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(todo))
	if len(todo) == 1 {
		cmds[0] = b.client.Do(ctx, b.lib.command(mode, groups[todo[0]])...)
		return cmds
	}
	pipe := b.client.Pipeline()
	for k, i := range todo {
		cmds[k] = pipe.Do(ctx, b.lib.command(mode, groups[i])...)
	}
	// Exec's error is also each command's own; they are read one by one.
	_, _ = pipe.Exec(ctx)
	return cmds
}

// load loads the library on every node, replacing any of the same name (which has the
// same code, see luaLib).
func (b *scriptBatcher) load(ctx context.Context) error {
	loadOn := func(ctx context.Context, c *redis.Client) error {
		return c.FunctionLoadReplace(ctx, b.lib.code).Err()
	}
	switch c := b.client.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, loadOn)
	case *redis.Ring:
		return c.ForEachShard(ctx, loadOn)
	default:
		return b.client.FunctionLoadReplace(ctx, b.lib.code).Err()
	}
}
