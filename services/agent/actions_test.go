package agent

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mantle-mesh/mantle/pkg/natsembed"
)

// fakeConfirmer is the verifier's review queue, in memory: the consumer-side fake of
// confirmer.
type fakeConfirmer struct {
	mu        sync.Mutex
	opened    []Confirmation
	decisions map[string]Decision
	results   map[string]string
	fail      bool
}

func (f *fakeConfirmer) open(_ context.Context, c Confirmation) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return "", errors.New("verifier unreachable")
	}
	f.opened = append(f.opened, c)
	if c.Attempt != "1" {
		// The verifier's ids are per run of a key.
		return "cf-" + c.IdempotencyKey + "-" + c.Attempt, nil
	}
	return "cf-" + c.IdempotencyKey, nil
}

func (f *fakeConfirmer) get(_ context.Context, _, id string) (Decision, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.decisions[id], f.results[id], nil
}

func (f *fakeConfirmer) decide(id string, d Decision, result string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.decisions[id], f.results[id] = d, result
}

func newActionHarness(t *testing.T, store actionStore) (*harness, *fakeConfirmer) {
	t.Helper()
	h := newHarness(t, action("order"))
	fc := &fakeConfirmer{decisions: map[string]Decision{}, results: map[string]string{}}
	h.tools.confirm = fc
	if store != nil {
		h.tools.actions = store
	}
	return h, fc
}

// actionStores are the stores the action tests run against: memory, and JetStream KV on
// an embedded NATS server.
func actionStores(t *testing.T) map[string]func(h *harness) actionStore {
	t.Helper()
	srv, err := natsembed.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	n := 0
	return map[string]func(h *harness) actionStore{
		"memory": func(h *harness) actionStore { return newMemoryActions(time.Hour, h.clock) },
		"jetstream": func(*harness) actionStore {
			mu.Lock()
			defer mu.Unlock()
			n++
			return newJetStreamActions(js, "actions_"+string(rune('a'+n)), time.Hour)
		},
	}
}

// TestActionsRunOnce: an action runs at most once per key, whatever the caller repeats.
func TestActionsRunOnce(t *testing.T) {
	t.Parallel()
	for storeName, newStore := range actionStores(t) {
		t.Run(storeName, func(t *testing.T) {
			t.Parallel()
			t.Run("repeat answers from the record", func(t *testing.T) {
				h, _ := newActionHarness(t, nil)
				h.tools.actions = newStore(h)
				h.script("order", answer(`{"order":"o-1"}`))
				req := CallRequest{Name: "order", Arguments: `{"sku":"a","qty":1}`, IdempotencyKey: "order-1"}
				first, err := h.call(t, req)
				if err != nil || first.Status != StatusOK {
					t.Fatalf("first call = %+v, %v", first, err)
				}
				// The same arguments written another way are the same call.
				req.Arguments = `{"qty":1, "sku":"a"}`
				for range 3 {
					again, err := h.call(t, req)
					if err != nil || again.Status != StatusReplayed || again.Result != `{"order":"o-1"}` {
						t.Fatalf("repeat = %+v, %v; want the recorded result", again, err)
					}
				}
				if n := h.backends["order"].count(); n != 1 {
					t.Errorf("backend ran the action %d times, want 1", n)
				}
				// Another tenant's same key is another action.
				other, err := h.call(t, CallRequest{Tenant: "beta", Name: "order", Arguments: `{"sku":"a","qty":1}`, IdempotencyKey: "order-1"})
				if err != nil || other.Status != StatusOK {
					t.Errorf("another tenant's call with the same key = %+v, %v", other, err)
				}
				keys := h.backends["order"].keys
				if len(keys) != 2 || keys[0] == keys[1] || keys[0] == "order-1" || keys[0] == "" {
					t.Errorf("backend keys %q: want one per tenant, neither the raw caller key", keys)
				}
			})
			t.Run("key reused with other arguments", func(t *testing.T) {
				h, _ := newActionHarness(t, nil)
				h.tools.actions = newStore(h)
				if _, err := h.call(t, CallRequest{Name: "order", Arguments: `{"qty":1}`, IdempotencyKey: "k"}); err != nil {
					t.Fatal(err)
				}
				_, err := h.call(t, CallRequest{Name: "order", Arguments: `{"qty":2}`, IdempotencyKey: "k"})
				if !errors.Is(err, ErrKeyReused) {
					t.Errorf("other arguments under the key = %v, want ErrKeyReused", err)
				}
				if n := h.backends["order"].count(); n != 1 {
					t.Errorf("backend called %d times, want 1", n)
				}
			})
			t.Run("derived key from session and step", func(t *testing.T) {
				h, _ := newActionHarness(t, nil)
				h.tools.actions = newStore(h)
				req := CallRequest{Name: "order", SessionID: "s-1", StepID: "3"}
				for range 2 {
					if _, err := h.call(t, req); err != nil {
						t.Fatal(err)
					}
				}
				if n := h.backends["order"].count(); n != 1 {
					t.Errorf("backend called %d times for one session step, want 1", n)
				}
				if _, err := h.call(t, CallRequest{Name: "order"}); err == nil {
					t.Error("an action without a key or a session step ran")
				}
			})
			t.Run("not run: the key is free again", func(t *testing.T) {
				h, _ := newActionHarness(t, nil)
				h.tools.actions = newStore(h)
				h.script("order", fail(failRefused, "unavailable"), answer(`{"order":"o-2"}`))
				req := CallRequest{Name: "order", IdempotencyKey: "k2"}
				if _, err := h.call(t, req); err == nil {
					t.Fatal("a refused action reported success")
				}
				res, err := h.call(t, req)
				if err != nil || res.Status != StatusOK {
					t.Fatalf("the caller's repeat of an action that did not run = %+v, %v", res, err)
				}
			})
		})
	}
}

// TestActionConfirmation: an unknown outcome is never retried; a person decides, and the
// repeat answers by the decision.
func TestActionConfirmation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		decision Decision
		result   string
		want     Status
		runs     int // backend calls in all
	}{
		{"happened, with the person's result", DecisionHappened, `{"order":"o-9"}`, StatusReplayed, 1},
		{"did not happen: the repeat runs it", DecisionNotHappened, "", StatusOK, 2},
		{"still pending", DecisionPending, "", StatusPendingConfirmation, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, fc := newActionHarness(t, nil)
			h.script("order", fail(failUnknown, "timeout"), answer(`{"order":"o-10"}`))
			req := CallRequest{Name: "order", Arguments: `{"sku":"b"}`, IdempotencyKey: "k", SessionID: "s", StepID: "2"}
			res, err := h.call(t, req)
			if err != nil || res.Status != StatusPendingConfirmation || res.ConfirmationID != "cf-k" {
				t.Fatalf("timed-out action = %+v, %v; want pending confirmation", res, err)
			}
			if len(fc.opened) != 1 || fc.opened[0].Tool != "order" || fc.opened[0].Arguments != `{"sku":"b"}` || fc.opened[0].StepID != "2" {
				t.Fatalf("confirmations opened: %+v", fc.opened)
			}
			fc.decide("cf-k", tc.decision, tc.result)
			res, err = h.call(t, req)
			if err != nil || res.Status != tc.want {
				t.Fatalf("repeat after %s = %+v, %v; want %s", tc.name, res, err, statusName(tc.want))
			}
			if tc.result != "" && res.Result != tc.result {
				t.Errorf("result %q, want the person's %q", res.Result, tc.result)
			}
			if n := h.backends["order"].count(); n != tc.runs {
				t.Errorf("backend called %d times, want %d", n, tc.runs)
			}
		})
	}
	t.Run("verifier unreachable: opened by the next repeat", func(t *testing.T) {
		t.Parallel()
		h, fc := newActionHarness(t, nil)
		fc.fail = true
		h.script("order", fail(failUnknown, "reset"))
		req := CallRequest{Name: "order", IdempotencyKey: "k"}
		res, err := h.call(t, req)
		if err != nil || res.Status != StatusPendingConfirmation || res.ConfirmationID != "" {
			t.Fatalf("= %+v, %v; want pending without a confirmation id", res, err)
		}
		fc.fail = false
		res, err = h.call(t, req)
		if err != nil || res.ConfirmationID != "cf-k" || len(fc.opened) != 1 {
			t.Fatalf("repeat = %+v, %v (opened %d); want the confirmation opened now", res, err, len(fc.opened))
		}
		if n := h.backends["order"].count(); n != 1 {
			t.Errorf("backend called %d times, want 1", n)
		}
	})
	t.Run("not happened, then unknown again: the new run is a new confirmation", func(t *testing.T) {
		t.Parallel()
		h, fc := newActionHarness(t, nil)
		h.script("order", fail(failUnknown, "timeout"), fail(failUnknown, "timeout"), answer(`{"order":"o-3"}`))
		req := CallRequest{Name: "order", IdempotencyKey: "k"}
		if res, err := h.call(t, req); err != nil || res.ConfirmationID != "cf-k" {
			t.Fatalf("first run = %+v, %v", res, err)
		}
		fc.decide("cf-k", DecisionNotHappened, "")
		res, err := h.call(t, req)
		if err != nil || res.Status != StatusPendingConfirmation || res.ConfirmationID != "cf-k-2" {
			t.Fatalf("second run, unknown again = %+v, %v; want a new confirmation", res, err)
		}
		if len(fc.opened) != 2 || fc.opened[0].Attempt != "1" || fc.opened[1].Attempt != "2" {
			t.Fatalf("confirmations opened: %+v; want runs 1 and 2", fc.opened)
		}
		// The first run's decision does not answer for the second.
		if res, err := h.call(t, req); err != nil || res.Status != StatusPendingConfirmation {
			t.Fatalf("repeat = %+v, %v; want still pending", res, err)
		}
		fc.decide("cf-k-2", DecisionHappened, `{"order":"o-2"}`)
		if res, err := h.call(t, req); err != nil || res.Status != StatusReplayed || res.Result != `{"order":"o-2"}` {
			t.Fatalf("after happened = %+v, %v", res, err)
		}
		if n := h.backends["order"].count(); n != 2 {
			t.Errorf("backend called %d times, want 2 (one per run)", n)
		}
	})
	t.Run("a claim left running by a dead replica goes to a person", func(t *testing.T) {
		t.Parallel()
		h, fc := newActionHarness(t, nil)
		sk := storeKey("acme", "k")
		fp := digest([]byte("order"), []byte("{}"))
		if _, _, err := h.tools.actions.claim(context.Background(), sk, actionRecord{State: actionRunning, Fingerprint: fp, Tool: "order", Started: h.clock.Now()}); err != nil {
			t.Fatal(err)
		}
		if _, err := h.call(t, CallRequest{Name: "order", IdempotencyKey: "k"}); !errors.Is(err, ErrActionInProgress) {
			t.Fatalf("repeat while running = %v, want ErrActionInProgress", err)
		}
		h.clock.Advance(time.Minute)
		res, err := h.call(t, CallRequest{Name: "order", IdempotencyKey: "k"})
		if err != nil || res.Status != StatusPendingConfirmation || len(fc.opened) != 1 {
			t.Fatalf("repeat after the claim's time = %+v, %v; want a confirmation", res, err)
		}
		if n := h.backends["order"].count(); n != 0 {
			t.Errorf("backend called %d times, want 0", n)
		}
	})
}

// TestActionsRefusedWithoutTheirStore: with the jetstream backend and no NATS, actions
// are refused and queries served.
func TestActionsRefusedWithoutTheirStore(t *testing.T) {
	t.Parallel()
	h := newHarness(t, action("order"), query("weather"))
	h.tools.actions = unavailableActions{}
	if _, err := h.call(t, CallRequest{Name: "order", IdempotencyKey: "k"}); !errors.Is(err, ErrActionsUnavailable) {
		t.Errorf("action = %v, want ErrActionsUnavailable", err)
	}
	if _, err := h.call(t, CallRequest{Name: "weather"}); err != nil {
		t.Errorf("query = %v, want served", err)
	}
	if n := h.backends["order"].count(); n != 0 {
		t.Errorf("action backend called %d times", n)
	}
}
