package quota

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/mantle-mesh/mantle/services/quota/internal/ledger"
)

// maxSeenTenants bounds the tenants a replica remembers for DescribeUsage: tenant ids come
// from requests, and a set that any caller can grow must not grow without limit.
const maxSeenTenants = 1000

// tenantUsage is one tenant's request and token buckets as they stand.
type tenantUsage struct {
	Tenant string
	Levels levelPair
}

// Usage reports the RPM and TPM buckets of tenants without charging them: the given
// tenants, or when there are none, the configured tenants and those this replica admitted
// recently, sorted by tenant. It reads through Store.Observe with unknown remaining counts,
// which every Store leaves unchanged, so no Store needed a read operation of its own.
func (s *service) Usage(ctx context.Context, tenants []string) ([]tenantUsage, error) {
	if len(tenants) == 0 {
		tenants = slices.Concat(slices.Collect(maps.Keys(s.cfg.Tenants)), s.seen.list())
	}
	slices.Sort(tenants)
	tenants = slices.Compact(tenants)
	obs := make([]ledger.Observation, 0, 2*len(tenants))
	for _, t := range tenants {
		if t == "" {
			continue
		}
		rpm, tpm := s.cfg.tenantLimits(t)
		group := ledger.TenantGroup(t)
		obs = append(obs,
			ledger.Observation{Bucket: ledger.NewSpec(group, ledger.FieldRPM, ledger.KindRequests, 0, rpm.limit, rpm.shadow), Remaining: -1},
			ledger.Observation{Bucket: ledger.NewSpec(group, ledger.FieldTPM, ledger.KindTokens, 0, tpm.limit, tpm.shadow), Remaining: -1},
		)
	}
	if len(obs) == 0 {
		return nil, nil
	}
	levels, err := s.store.Observe(ctx, obs)
	if err != nil {
		return nil, fmt.Errorf("read tenant buckets: %w", err)
	}
	out := make([]tenantUsage, 0, len(levels)/2)
	for i := 0; i+1 < len(levels); i += 2 {
		out = append(out, tenantUsage{Tenant: obs[i].Bucket.Group[len("tenant:"):], Levels: levelPair{Requests: levels[i], Tokens: levels[i+1]}})
	}
	return out, nil
}

// seenTenants remembers the tenants a replica admitted, most recent last seen kept when
// full. The zero value is ready to use.
type seenTenants struct {
	mu   sync.Mutex
	last map[string]time.Time
}

func (s *seenTenants) add(tenant string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == nil {
		s.last = map[string]time.Time{}
	}
	if _, ok := s.last[tenant]; !ok && len(s.last) >= maxSeenTenants {
		// Forget the tenant seen longest ago; a linear scan, but only when a new tenant
		// arrives at a full set.
		oldest, when := "", at
		for t, w := range s.last {
			if w.Before(when) || oldest == "" {
				oldest, when = t, w
			}
		}
		delete(s.last, oldest)
	}
	s.last[tenant] = at
}

func (s *seenTenants) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Collect(maps.Keys(s.last))
}
