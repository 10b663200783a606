package quota

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// errBatcherClosed answers script calls made after the store was closed, or still
// queued when it was.
var errBatcherClosed = errors.New("redis: store closed")

// scriptBatcher sends the scripts of concurrent callers to Redis as pipelines. Most of
// a decision's cost on both sides is the round trip (a write, a read, two wake-ups per
// side), not the script, so one round trip for many decisions is the main saving.
//
// There is no timer: a worker sends whatever queued while its previous pipeline was in
// flight, so a lone caller pays no wait and busy callers share round trips. Each call
// keeps its own reply and error, and a caller that gives up (its context ends) leaves
// the others alone: its script is skipped when it has not been sent yet, and its reply
// is dropped when it has.
type scriptBatcher struct {
	client   redis.UniversalClient
	queue    chan *scriptCall
	maxBatch int
	workers  int

	// busy counts round trips in flight (direct calls and pipelines), for the fast path.
	busy atomic.Int64

	start   sync.Once
	close   sync.Once
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	closing chan struct{} // closed by Close: workers stop taking calls
	stopped chan struct{} // closed once every worker has returned
}

// scriptCall is one caller's script and where its reply goes.
type scriptCall struct {
	script *redis.Script
	keys   []string
	args   []any
	// gone is the caller's ctx.Done(): a call whose caller left is not sent.
	gone  <-chan struct{}
	reply chan scriptReply // buffered, so that a worker never waits for a caller
}

type scriptReply struct {
	v   []any
	err error
}

// Defaults of the batcher. Two workers keep one pipeline queued behind the one Redis is
// running, so that Redis does not idle for a round trip between them; a batch is
// bounded so that one pipeline's reply cannot grow without limit.
const (
	batchWorkers = 2
	maxBatchSize = 128
)

func newScriptBatcher(client redis.UniversalClient) *scriptBatcher {
	return &scriptBatcher{
		client:   client,
		queue:    make(chan *scriptCall, 4*maxBatchSize),
		maxBatch: maxBatchSize,
		workers:  batchWorkers,
		closing:  make(chan struct{}),
		stopped:  make(chan struct{}),
	}
}

var callPool = sync.Pool{New: func() any { return &scriptCall{reply: make(chan scriptReply, 1)} }}

// run sends script with keys and args in the next pipeline and waits for its reply.
func (b *scriptBatcher) run(ctx context.Context, script *redis.Script, keys []string, args []any) ([]any, error) {
	select {
	case <-b.closing:
		return nil, errBatcherClosed
	default:
	}
	// Nothing in flight: nobody to share a round trip with, so the caller sends its own
	// script rather than pay two goroutine hand-offs (measured: +40% latency and more
	// CPU per decision for a lone caller).
	if b.busy.CompareAndSwap(0, 1) {
		defer b.busy.Add(-1)
		return script.Run(ctx, b.client, keys, args...).Slice()
	}
	b.start.Do(b.startWorkers)
	c := callPool.Get().(*scriptCall)
	c.script, c.keys, c.args, c.gone = script, keys, args, ctx.Done()
	select {
	case b.queue <- c:
	case <-ctx.Done():
		b.recycle(c)
		return nil, ctx.Err()
	case <-b.closing:
		b.recycle(c)
		return nil, errBatcherClosed
	}
	select {
	case r := <-c.reply:
		b.recycle(c)
		return r.v, r.err
	case <-ctx.Done():
		// A worker may still hold c: it is not reused.
		return nil, ctx.Err()
	case <-b.stopped:
		// Workers finish their pipelines before they stop, so a call still without a
		// reply was queued but never sent.
		select {
		case r := <-c.reply:
			return r.v, r.err
		default:
			return nil, errBatcherClosed
		}
	}
}

func (b *scriptBatcher) recycle(c *scriptCall) {
	*c = scriptCall{reply: c.reply}
	callPool.Put(c)
}

func (b *scriptBatcher) startWorkers() {
	// The workers' context is cancelled by Close, which ends a pipeline in flight.
	ctx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	b.wg.Add(b.workers)
	for range b.workers {
		go b.work(ctx)
	}
}

// Close stops the workers; callers still waiting get errBatcherClosed (or their
// pipeline's error). Calls after Close fail at once.
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
	cmds := make([]*redis.Cmd, 0, b.maxBatch)
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
		cmds = b.exec(ctx, batch, cmds[:0])
		b.busy.Add(-1)
		clear(batch)
		clear(cmds)
	}
}

// exec runs one batch as a pipeline and replies to every caller.
func (b *scriptBatcher) exec(ctx context.Context, batch []*scriptCall, cmds []*redis.Cmd) []*redis.Cmd {
	pipe := b.client.Pipeline()
	sent := 0
	for _, c := range batch {
		select {
		case <-c.gone:
			// The caller has left: sending its script would charge for nothing.
			cmds = append(cmds, nil)
			continue
		default:
		}
		cmds = append(cmds, c.script.EvalSha(ctx, pipe, c.keys, c.args...))
		sent++
	}
	if sent == 0 {
		return cmds
	}
	// Exec's error is also each command's own; they are read one by one below.
	_, _ = pipe.Exec(ctx)

	// Scripts Redis does not know (a restart, SCRIPT FLUSH) go again with their body;
	// EVAL also loads them for next time.
	var again redis.Pipeliner
	for i, cmd := range cmds {
		if cmd != nil && redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			if again == nil {
				again = b.client.Pipeline()
			}
			c := batch[i]
			cmds[i] = c.script.Eval(ctx, again, c.keys, c.args...)
		}
	}
	if again != nil {
		_, _ = again.Exec(ctx)
	}
	for i, c := range batch {
		if cmds[i] == nil {
			continue
		}
		v, err := cmds[i].Slice()
		c.reply <- scriptReply{v: v, err: err}
	}
	return cmds
}
