package resilience_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mantle-mesh/mantle/pkg/resilience"
)

var errRateLimited = errors.New("429")

// One attempt of the router's loop: the key must not be cooling down, the bulkhead must
// have room and the breaker must admit the call; the outcome goes back to the breaker,
// except a 429, which cools the key down instead.
func Example() {
	clock := clockwork.NewFakeClock()
	breaker := resilience.NewBreaker(resilience.DefaultBreakerConfig(), clock, nil, func(t resilience.Transition) {
		fmt.Printf("breaker %s -> %s: %s\n", t.From, t.To, t.Reason)
	})
	bulkhead := resilience.NewBulkhead(200)
	cooldown := resilience.NewCooldown(clock)

	attempt := func(call func() (time.Duration, error)) string {
		if cooldown.Active() {
			return "skip: cooling down"
		}
		release, ok := bulkhead.TryAcquire()
		if !ok {
			return "skip: bulkhead full"
		}
		defer release()
		permit, ok := breaker.Allow()
		if !ok {
			return "skip: breaker open"
		}
		defer permit.Cancel() // no-op once Done has run
		latency, err := call()
		switch {
		case errors.Is(err, errRateLimited):
			cooldown.Set(20 * time.Second) // the Retry-After hint; not a breaker failure
			return "rate limited"
		case err != nil:
			permit.Done(true, latency)
			return "failed"
		}
		permit.Done(false, latency)
		return "ok"
	}

	fmt.Println(attempt(func() (time.Duration, error) { return 0, errRateLimited }))
	fmt.Println(attempt(func() (time.Duration, error) { return time.Second, nil }))
	clock.Advance(20 * time.Second)
	for range 5 {
		attempt(func() (time.Duration, error) { return time.Second, errors.New("503") })
	}
	fmt.Println(attempt(func() (time.Duration, error) { return time.Second, nil }))
	// Output:
	// rate limited
	// skip: cooling down
	// breaker closed -> open: 5 consecutive failures
	// skip: breaker open
}

// The budget decides whether a failed attempt may be retried at all; Backoff says when.
func ExampleBudget() {
	clock := clockwork.NewFakeClock()
	budget := resilience.NewBudget(resilience.DefaultBudgetConfig(), clock)
	for range 100 {
		budget.Request()
	}
	admitted := 0
	for budget.TryRetry(false) {
		admitted++
	}
	_, _, rate := budget.Snapshot()
	fmt.Printf("%d retries admitted, rate %.0f%%, format retries still allowed: %v\n", admitted, rate*100, budget.TryRetry(true))
	fmt.Println("second retry waits at most", resilience.Backoff(1, 200*time.Millisecond, 1500*time.Millisecond, func() float64 { return 0.999 }).Round(time.Millisecond))
	// Output:
	// 16 retries admitted, rate 16%, format retries still allowed: true
	// second retry waits at most 400ms
}
