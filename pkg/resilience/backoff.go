package resilience

import (
	"math/rand/v2"
	"time"
)

// Backoff is "full jitter" exponential backoff: a uniform delay in
// [0, min(cap, base*2^retry)), with retry counted from 0. Spreading the whole interval
// (rather than adding a little jitter to a fixed delay) is what keeps retries from many
// callers from arriving in waves. cap <= 0 means no cap; base <= 0 gives 0. rnd returns a
// uniform value in [0, 1); nil uses math/rand/v2. The caller still has to check the delay
// against the request's remaining deadline.
func Backoff(retry int, base, cap time.Duration, rnd func() float64) time.Duration {
	if base <= 0 {
		return 0
	}
	if cap <= 0 {
		cap = time.Duration(1<<63 - 1)
	}
	ceiling := base
	for i := 0; i < retry && ceiling < cap; i++ {
		if ceiling > cap/2 {
			ceiling = cap // doubling would pass the cap (or overflow)
			break
		}
		ceiling *= 2
	}
	ceiling = min(ceiling, cap)
	if rnd == nil {
		rnd = rand.Float64
	}
	d := time.Duration(rnd() * float64(ceiling))
	// float64 rounding can land on the ceiling itself for large ceilings; stay below it.
	return max(0, min(d, ceiling-1))
}
