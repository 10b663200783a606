package cache

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// outcomeStored is the stores metric's outcome for an answer that was stored; the other
// outcomes are the skip reasons.
const outcomeStored = "stored"

type metrics struct {
	// hits and misses are the two children of mantle_cache_lookups_total, resolved once so
	// the lookup path does not hash label values.
	hits   prometheus.Counter
	misses prometheus.Counter
	stores *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	lookups := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mantle_cache_lookups_total",
		Help: "Cache lookups by result (hit or miss).",
	}, []string{"result"})
	stores := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mantle_cache_stores_total",
		Help: "Answers offered to the cache by outcome: stored, or the policy's skip reason.",
	}, []string{"outcome"})
	for _, c := range []prometheus.Collector{lookups, stores} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register cache metrics: %w", err)
		}
	}
	// Every outcome starts at zero, so dashboards and rate() see a series before its first
	// event.
	stores.WithLabelValues(outcomeStored)
	for _, reason := range skipReasons {
		stores.WithLabelValues(string(reason))
	}
	return &metrics{
		hits:   lookups.WithLabelValues("hit"),
		misses: lookups.WithLabelValues("miss"),
		stores: stores,
	}, nil
}

// registerMemoryIndexMetrics exports the size and evictions of a MemoryIndex. They belong to
// the backend: a shared Qdrant collection has its own size, not one per replica.
func registerMemoryIndexMetrics(reg prometheus.Registerer, idx *MemoryIndex) error {
	entries := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "mantle_cache_entries",
		Help: "Entries held by the in-memory cache index, expired ones included until removed.",
	}, func() float64 { return float64(idx.Len()) })
	evictions := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "mantle_cache_evictions_total",
		Help: "Entries evicted from the in-memory cache index because it was full (max_entries).",
	}, func() float64 { return float64(idx.Evictions()) })
	for _, c := range []prometheus.Collector{entries, evictions} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register cache index metrics: %w", err)
		}
	}
	return nil
}
