package router

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// localLimiter is a per-tenant requests-per-minute limiter kept in this replica's memory.
// It stands in for the quota service only while that is unreachable.
type localLimiter struct {
	rpm      int
	mu       sync.Mutex
	limiters map[string]*rate.Limiter
}

func newLocalLimiter(rpm int) *localLimiter {
	return &localLimiter{rpm: rpm, limiters: map[string]*rate.Limiter{}}
}

// allow takes one request for tenant at now (the injected clock's time).
func (l *localLimiter) allow(tenant string, now time.Time) bool {
	if l.rpm <= 0 {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	lim, ok := l.limiters[tenant]
	if !ok {
		lim = rate.NewLimiter(rate.Limit(float64(l.rpm)/60), l.rpm)
		l.limiters[tenant] = lim
	}
	return lim.AllowN(now, 1)
}
