package cache

import (
	"fmt"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mantle-mesh/mantle/services/cache/internal/nearmiss"
)

// outcomeStored is the stores metric's outcome for an answer that was stored; the other
// outcomes are the skip reasons.
const outcomeStored = "stored"

// Rejection reasons besides the near-miss ones (nearmiss.Reasons).
const (
	rejectBelowThreshold = "below_threshold"
)

// maxScenarioLabels bounds the scenario label: scenarios come from requests, and a label
// per value a client can invent would grow without limit. Configured scenarios always get
// their own series; other names get one until this many exist, then share "_other".
const maxScenarioLabels = 64

// metrics are the cache's Prometheus series. Hit rate per scenario is
// sum by (scenario) (rate(mantle_cache_lookups_total{result="hit"}[5m])) divided by the
// same without the result filter.
type metrics struct {
	lookups    *prometheus.CounterVec   // scenario, result, match
	degraded   *prometheus.CounterVec   // scenario, kind (stale, approximate)
	skips      *prometheus.CounterVec   // scenario, reason
	rejections *prometheus.CounterVec   // scenario, reason
	similarity *prometheus.HistogramVec // scenario, outcome (hit, rejected)
	stores     *prometheus.CounterVec   // outcome
	errors     *prometheus.CounterVec   // op
	coalesce   *prometheus.CounterVec   // outcome
	entries    prometheus.Gauge         // set by backends without a cheap count (Qdrant)

	labelsMu  sync.Mutex
	scenarios map[string]bool
}

func newMetrics(reg prometheus.Registerer, configured []string) (*metrics, error) {
	m := &metrics{
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_cache_lookups_total",
			Help: "Cache lookups by scenario, result (hit or miss) and match (exact, semantic, coalesced; none for misses).",
		}, []string{"scenario", "result", "match"}),
		degraded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_cache_degraded_hits_total",
			Help: "Hits served in cache-only or approximate mode by kind: stale (past TTL) or approximate (below the normal threshold).",
		}, []string{"scenario", "kind"}),
		skips: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_cache_lookup_skips_total",
			Help: "Lookups that did not search, or could not, by reason (volatile_prompt, backend_error, coalesce_timeout, ...).",
		}, []string{"scenario", "reason"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_cache_rejections_total",
			Help: "Near candidates rejected by reason: below_threshold, or a near-miss difference (number, date, negation, quote, entity).",
		}, []string{"scenario", "reason"}),
		similarity: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "mantle_cache_similarity",
			Help:    "Similarity of the best candidate of each semantic lookup, by outcome: hit, or rejected when no candidate answered.",
			Buckets: []float64{0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.88, 0.9, 0.92, 0.94, 0.96, 0.98, 0.99, 1},
		}, []string{"scenario", "outcome"}),
		stores: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_cache_stores_total",
			Help: "Answers offered to the cache by outcome: stored, or the policy's skip reason.",
		}, []string{"outcome"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_cache_backend_errors_total",
			Help: "Failed or skipped calls to the index or the embedder by operation; a failed lookup is served as a miss.",
		}, []string{"op"}),
		coalesce: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_cache_coalesce_total",
			Help: "Coalescing lookups by outcome: leased (answers for others), joined (got another request's answer), retried (the lease ended without an answer), overtaken (an answered lease ended between the lookup's read of the index and its try for the lease: the entry answers), timeout.",
		}, []string{"outcome"}),
		entries: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mantle_cache_qdrant_points",
			Help: "Points in the Qdrant collections this cache owns, as of the last sweep.",
		}),
		scenarios: map[string]bool{},
	}
	for _, c := range []prometheus.Collector{m.lookups, m.degraded, m.skips, m.rejections, m.similarity, m.stores, m.errors, m.coalesce} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register cache metrics: %w", err)
		}
	}
	// Every outcome starts at zero, so dashboards and rate() see a series before its first
	// event.
	m.stores.WithLabelValues(outcomeStored)
	for _, reason := range skipReasons {
		m.stores.WithLabelValues(string(reason))
	}
	for _, op := range []string{"get", "search", "put", "delete", "embed"} {
		m.errors.WithLabelValues(op)
	}
	for _, o := range []string{"leased", "joined", "overtaken", "retried", "timeout"} {
		m.coalesce.WithLabelValues(o)
	}
	for _, s := range slices.Sorted(slices.Values(configured)) {
		m.scenarios[s] = true
		m.lookups.WithLabelValues(s, "hit", "exact")
		m.lookups.WithLabelValues(s, "miss", "none")
		for _, r := range nearmiss.Reasons {
			m.rejections.WithLabelValues(s, string(r))
		}
	}
	return m, nil
}

// scenario returns the label value for a scenario name.
func (m *metrics) scenario(name string) string {
	m.labelsMu.Lock()
	defer m.labelsMu.Unlock()
	if m.scenarios[name] {
		return name
	}
	if len(m.scenarios) < maxScenarioLabels {
		m.scenarios[name] = true
		return name
	}
	return "_other"
}

// registerEmbeddedIndexMetrics exports the size, evictions and link backlog of an
// EmbeddedIndex. They belong to the backend: a shared Qdrant collection has its own size,
// not one per replica.
func registerEmbeddedIndexMetrics(reg prometheus.Registerer, idx *EmbeddedIndex) error {
	entries := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "mantle_cache_entries",
		Help: "Entries held by the embedded cache index, expired ones included until removed.",
	}, func() float64 { return float64(idx.Len()) })
	evictions := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "mantle_cache_evictions_total",
		Help: "Entries evicted from the embedded cache index because it was full (max_entries or max_bytes).",
	}, func() float64 { return float64(idx.Evictions()) })
	backlog := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "mantle_cache_link_backlog",
		Help: "Vectors stored in the embedded cache index but not yet linked into their partition's search graph.",
	}, func() float64 { return float64(idx.LinkBacklog()) })
	for _, c := range []prometheus.Collector{entries, evictions, backlog} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register cache index metrics: %w", err)
		}
	}
	return nil
}

// registerQdrantMetrics exports the point count the sweeper measures.
func registerQdrantMetrics(reg prometheus.Registerer, m *metrics) error {
	if err := reg.Register(m.entries); err != nil {
		return fmt.Errorf("register cache index metrics: %w", err)
	}
	return nil
}

// snapshotLoadsCounter registers the count of snapshot loads at start by result: loaded, or
// refused (too large, damaged, or of an old format: the cache started empty).
func snapshotLoadsCounter(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mantle_cache_snapshot_loads_total",
		Help: "Embedded index snapshots read at start by result: loaded, or refused (too large, damaged or of an old format; the cache started empty).",
	}, []string{"result"})
	if err := reg.Register(c); err != nil {
		return nil, fmt.Errorf("register cache snapshot metrics: %w", err)
	}
	c.WithLabelValues("loaded")
	c.WithLabelValues("refused")
	return c, nil
}
