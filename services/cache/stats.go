package cache

import (
	"maps"
	"slices"
	"sync"
	"time"
)

// lookupStats counts this replica's ordinary lookups and hits per scenario since it
// started, for DescribeStats (status pages). Prometheus has the same numbers as rates;
// these are totals a page can show without a metrics backend. Scenario names are the
// metrics' bounded labels, so the map cannot grow without limit.
type lookupStats struct {
	since time.Time

	mu         sync.Mutex
	byScenario map[string]ScenarioStats
}

// ScenarioStats are the ordinary lookups of one scenario and how many of them hit.
type ScenarioStats struct {
	Scenario      string
	Lookups, Hits int64
}

// Stats are a replica's lookup totals since Since, overall and per scenario (sorted).
type Stats struct {
	Since         time.Time
	Lookups, Hits int64
	Scenarios     []ScenarioStats
}

func newLookupStats(since time.Time) *lookupStats {
	return &lookupStats{since: since, byScenario: map[string]ScenarioStats{}}
}

func (l *lookupStats) record(scenario string, hit bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.byScenario[scenario]
	st.Scenario = scenario
	st.Lookups++
	if hit {
		st.Hits++
	}
	l.byScenario[scenario] = st
}

func (l *lookupStats) snapshot() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := Stats{Since: l.since}
	for _, name := range slices.Sorted(maps.Keys(l.byScenario)) {
		st := l.byScenario[name]
		out.Lookups += st.Lookups
		out.Hits += st.Hits
		out.Scenarios = append(out.Scenarios, st)
	}
	return out
}

// Stats returns the replica's ordinary lookups (not cache-only or approximate ones, which
// the router's degradation ladder makes) and hits since it started.
func (s *Service) Stats() Stats { return s.stats.snapshot() }
