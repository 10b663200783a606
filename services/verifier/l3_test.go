package verifier

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/services/verifier/internal/semantic"
)

// startL3 runs a verifier with cfg and embedder (nil: the built-in one) on a fake clock
// until the test ends.
func startL3(t *testing.T, cfg Config, emb Embedder) (*Verifier, *clockwork.FakeClock) {
	t.Helper()
	clock := clockwork.NewFakeClockAt(testNow)
	v, err := NewWithDeps(cfg, Deps{Clock: clock, Embedder: emb})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = v.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return v, clock
}

// verifyL3 verifies an answer to request id and fails the test unless its L3 is pending.
func verifyL3(t *testing.T, v *Verifier, id, content string) {
	t.Helper()
	verdict, err := v.Verify(context.Background(), Answer{
		Content:  content,
		Messages: []Message{{Role: "user", Content: "how long does a refund take?"}},
		Quality:  &mantlev1.QualityContext{RequestId: id, Tenant: "acme"},
		Tenant:   "acme",
	})
	if err != nil || !verdict.L3Pending {
		t.Fatalf("Verify %s = %+v, %v; want L3 pending", id, verdict, err)
	}
}

// awaitResult waits, without asking the workers to hurry (as GetFollowUp does), until
// request id's checks have finished.
func awaitResult(t *testing.T, v *Verifier, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	ev, err := v.l3.results.get(ctx, id, true)
	if err != nil || ev.GetRequestId() != id {
		t.Fatalf("result of %s = %v, %v", id, ev, err)
	}
}

// TestL3TakesAnswersInBatches: an answer waits up to batch_delay for its checks, so that
// the workers wake once for every answer queued meanwhile; a queue a quarter full, a
// caller waiting for a result, or no delay at all wakes them at once.
func TestL3TakesAnswersInBatches(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	t.Cleanup(cancel)

	t.Run("the batch waits for the delay", func(t *testing.T) {
		t.Parallel()
		cfg := DefaultConfig()
		v, clock := startL3(t, cfg, nil)
		for i := range 3 {
			verifyL3(t, v, fmt.Sprint("batch-", i), "A refund takes five working days.")
		}
		// One timer for the three; until it fires no worker has been told of them.
		if err := clock.BlockUntilContext(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if queued, woken := len(v.l3.jobs), len(v.l3.wake); queued != 3 || woken != 0 {
			t.Fatalf("before the delay: %d queued, %d wake-ups; want 3 and none", queued, woken)
		}
		clock.Advance(cfg.L3.BatchDelay)
		for i := range 3 {
			awaitResult(t, v, fmt.Sprint("batch-", i))
		}
		// The next answer starts a batch of its own.
		verifyL3(t, v, "later", "A refund takes five working days.")
		if err := clock.BlockUntilContext(ctx, 1); err != nil {
			t.Fatal(err)
		}
		clock.Advance(cfg.L3.BatchDelay)
		awaitResult(t, v, "later")
	})

	t.Run("a long queue does not wait", func(t *testing.T) {
		t.Parallel()
		cfg := DefaultConfig()
		cfg.L3.QueueSize = 8 // a quarter full at two
		v, _ := startL3(t, cfg, nil)
		verifyL3(t, v, "first", "A refund takes five working days.")
		verifyL3(t, v, "second", "A refund takes five working days.")
		awaitResult(t, v, "first")
		awaitResult(t, v, "second")
	})

	t.Run("a waiting caller does not wait for the batch", func(t *testing.T) {
		t.Parallel()
		v, _ := startL3(t, DefaultConfig(), nil)
		verifyL3(t, v, "asked", "A refund takes five working days.")
		waitCtx, cancel := context.WithTimeout(ctx, waitFor)
		defer cancel()
		ev, err := v.l3.followUp(waitCtx, "asked", true)
		if err != nil || ev.GetRequestId() != "asked" {
			t.Fatalf("followUp = %v, %v", ev, err)
		}
	})

	t.Run("no delay", func(t *testing.T) {
		t.Parallel()
		cfg := DefaultConfig()
		cfg.L3.BatchDelay = 0
		v, _ := startL3(t, cfg, nil)
		verifyL3(t, v, "now", "A refund takes five working days.")
		awaitResult(t, v, "now")
	})
}

// TestL3SlowChecksRunSideBySide: a worker that has run checks for chainAfter with more
// queued wakes another, so that checks which call out (here an embedder that waits) do not
// queue behind one another.
func TestL3SlowChecksRunSideBySide(t *testing.T) {
	t.Parallel()
	emb := &gateEmbedder{started: make(chan string, 8), release: make(chan struct{})}
	cfg := DefaultConfig()
	cfg.L3.BatchDelay = time.Minute // only the chain and the kick below wake a worker (the clock stays short of it)
	v, clock := startL3(t, cfg, emb)
	emb.clock = clock
	verifyL3(t, v, "slow", "slow answer")
	verifyL3(t, v, "gated-1", "gated answer")
	verifyL3(t, v, "gated-2", "gated answer")
	v.l3.kick()
	// The first check takes chainAfter; both gated ones must then be running at once.
	for range 2 {
		select {
		case <-emb.started:
		case <-time.After(waitFor):
			t.Fatal("the gated checks did not run side by side")
		}
	}
	close(emb.release)
	awaitResult(t, v, "gated-1")
	awaitResult(t, v, "gated-2")
}

// gateEmbedder is the built-in embedder, except that embedding "slow answer" moves the
// clock on by chainAfter and embedding "gated answer" waits until release is closed.
type gateEmbedder struct {
	clock   *clockwork.FakeClock
	once    sync.Once
	started chan string
	release chan struct{}
}

func (g *gateEmbedder) Embed(ctx context.Context, text string) ([]float32, error) {
	switch {
	case strings.HasPrefix(text, "slow"):
		g.once.Do(func() { g.clock.Advance(chainAfter) })
	case strings.HasPrefix(text, "gated"):
		g.started <- text
		select {
		case <-g.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return semantic.NewLexical(64).Embed(ctx, text)
}
