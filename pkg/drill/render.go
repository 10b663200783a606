package drill

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// levelNames label the ladder levels in tables and charts.
var levelNames = [4]string{"L0 primary", "L1 backup/smaller model", "L2 cached related answer", "L3 template"}

// row is one line of the side-by-side table: a label and a value per side.
type row struct {
	label  string
	values []string
}

// rows lays out the side-by-side comparison shared by the terminal table and the HTML page.
func (r *Report) rows() []row {
	if r.Tools != nil {
		return r.toolRows()
	}
	var rows []row
	add := func(label string, f func(s *Side) string) {
		rw := row{label: label}
		for i := range r.Sides {
			rw.values = append(rw.values, f(&r.Sides[i]))
		}
		rows = append(rows, rw)
	}
	pct := func(v float64) string { return fmt.Sprintf("%.2f%%", v*100) }
	share := func(n, of int) string { return fmt.Sprintf("%s (%d)", pct(ratio(n, of)), n) }
	add("answered", func(s *Side) string { return share(s.Answered, s.Requests) })
	add("  correct answer", func(s *Side) string { return share(s.Correct, s.Requests) })
	add("  wrong answer from a model", func(s *Side) string {
		if s.Flagged > 0 {
			return fmt.Sprintf("%s, %d flagged by the verifier", share(s.Wrong, s.Requests), s.Flagged)
		}
		return share(s.Wrong, s.Requests)
	})
	add("  ladder answer (L2/L3), marked", func(s *Side) string {
		if s.Degraded == 0 {
			return "-"
		}
		return fmt.Sprintf("%s (%d of %d marked)", pct(ratio(s.Degraded, s.Requests)), s.Marked, s.Degraded)
	})
	add("  passed mantle's verifier", func(s *Side) string {
		if s.Verified == nil {
			return "-"
		}
		return share(*s.Verified, s.Requests)
	})
	add("failed", func(s *Side) string { return share(s.Failed, s.Requests) })
	add("answered within the budget", func(s *Side) string { return share(s.WithinBudget, s.Requests) })
	add("latency P50", func(s *Side) string { return fmtMs(s.Latency.P50) })
	add("latency P95", func(s *Side) string { return fmtMs(s.Latency.P95) })
	add("latency P99", func(s *Side) string { return fmtMs(s.Latency.P99) })
	add("latency max", func(s *Side) string { return fmtMs(s.Latency.Max) })
	add("mantle's own time P50 / P99 (wall)", func(s *Side) string {
		if s.Overhead == nil {
			return "-"
		}
		return fmt.Sprintf("%.2f / %.2f ms", s.Overhead.P50, s.Overhead.P99)
	})
	add("held on purpose P99 / max", func(s *Side) string {
		if s.Waited == nil {
			return "-"
		}
		return fmt.Sprintf("%s / %s", fmtMs(s.Waited.P99), fmtMs(s.Waited.Max))
	})
	add("upstream calls per request", func(s *Side) string {
		return fmt.Sprintf("%.3f (%d calls)", s.Amplification, s.UpstreamCalls)
	})
	add("billed calls", func(s *Side) string { return fmt.Sprint(s.Billed) })
	add("duplicate billed calls", func(s *Side) string { return fmt.Sprint(s.DuplicateBilled) })
	add("cost estimate", func(s *Side) string {
		return fmt.Sprintf("$%.4f ($%.4f per 1000 requests)", s.CostUSD, s.CostPer1kUSD)
	})
	for l, name := range levelNames {
		add("answers at "+name, func(s *Side) string {
			if s.Answered == 0 {
				return "-"
			}
			return fmt.Sprintf("%.2f%%", s.LevelShares[l]*100)
		})
	}
	models := map[string]bool{}
	for _, s := range r.Sides {
		for _, mb := range s.Breakers {
			models[mb.Model] = true
		}
	}
	for _, model := range slices.Sorted(maps.Keys(models)) {
		add("breaker "+model, func(s *Side) string {
			mb := s.breaker(model)
			if mb == nil {
				return "-"
			}
			return mb.summary()
		})
	}
	if r.IncidentEndS != nil {
		add("recovery peak (calls/s)", func(s *Side) string {
			if s.RecoveryPeak == nil {
				return "-"
			}
			return fmt.Sprintf("%d (offered load %.0f/s)", *s.RecoveryPeak, r.Rate)
		})
	}
	add("why answers degraded", func(s *Side) string { return failureList(s.DegradedReasons, 3) })
	add("failures", func(s *Side) string { return failureList(s.Failures, 4) })
	return rows
}

func (mb *ModelBreaker) summary() string {
	var parts []string
	if mb.OpenAfterIncidentS != nil {
		parts = append(parts, fmt.Sprintf("open %.1f s after the incident began", *mb.OpenAfterIncidentS))
	}
	if mb.ClosedAfterIncidentS != nil {
		parts = append(parts, fmt.Sprintf("closed %.1f s after it ended", *mb.ClosedAfterIncidentS))
	}
	parts = append(parts, fmt.Sprintf("%d trips", mb.Trips))
	if mb.HalfOpenPeriods > 0 {
		parts = append(parts, fmt.Sprintf("at most %d calls per half-open period", mb.MaxProbeCalls))
	}
	return strings.Join(parts, "; ")
}

// failureList names the n most frequent failure reasons.
func failureList(f map[string]int, n int) string {
	if len(f) == 0 {
		return "-"
	}
	keys := slices.Collect(maps.Keys(f))
	slices.SortFunc(keys, func(a, b string) int {
		if f[a] != f[b] {
			return f[b] - f[a]
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for i, k := range keys {
		if i == n {
			parts = append(parts, fmt.Sprintf("+%d more", len(keys)-n))
			break
		}
		parts = append(parts, fmt.Sprintf("%s %d", k, f[k]))
	}
	return strings.Join(parts, ", ")
}

// Header describes the run in two lines.
func (r *Report) Header() string {
	wall := time.Duration(r.DurationS * r.TimeScale * float64(time.Second)).Round(time.Second)
	lag := 0.0
	for _, s := range r.Sides {
		lag = max(lag, s.MaxLagMs)
	}
	if r.Tools != nil {
		return fmt.Sprintf("%s: %s\n%d agent sessions of 5 steps per side: %g/s for %s of scenario time, replayed at time scale %g (%s of wall time per side), seed %d; mantle is the %s.\nCounts are taken at the tool backends (executions per action, calls per query) and by the agents (how each session ended). Machine: %d CPUs, load average %.1f to %.1f.",
			r.Scenario, r.Description, r.Requests, r.Rate, clockTime(time.Duration(r.DurationS*float64(time.Second))),
			r.TimeScale, clockTime(wall), r.Seed, r.Target, r.Machine.CPUs, r.Machine.LoadAverage[0], r.Machine.LoadAverage[1])
	}
	return fmt.Sprintf("%s: %s\n%d requests per side: %g/s for %s of scenario time, replayed at time scale %g (%s of wall time per side), seed %d; mantle is the %s.\nTimes are scenario time (measured wall time divided by the time scale, mantle's own time on each answer kept at its wall value). Machine: %d CPUs, load average %.1f to %.1f; the load generator fell behind by up to %.0f ms of wall time.",
		r.Scenario, r.Description, r.Requests, r.Rate, clockTime(time.Duration(r.DurationS*float64(time.Second))),
		r.TimeScale, clockTime(wall), r.Seed, r.Target, r.Machine.CPUs, r.Machine.LoadAverage[0], r.Machine.LoadAverage[1], lag)
}

// WriteText writes the side-by-side table and the target checks.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	b.WriteString(r.Header())
	b.WriteString("\n\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "\t")
	for _, s := range r.Sides {
		fmt.Fprintf(tw, "%s\t", s.Name)
	}
	fmt.Fprintln(tw)
	for _, rw := range r.rows() {
		fmt.Fprintf(tw, "%s\t%s\t\n", rw.label, strings.Join(rw.values, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Checks) > 0 {
		b.WriteString("\ntargets (mantle)\n")
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		for _, c := range r.Checks {
			verdict := "met"
			if !c.Met {
				verdict = "MISSED"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", c.Name, c.Target, c.Got, verdict)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
