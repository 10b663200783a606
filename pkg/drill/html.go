package drill

import (
	"fmt"
	"html"
	"html/template"
	"io"
	"math"
	"strings"
	"time"
)

// WriteHTML writes the report as one self-contained page: the side-by-side table, the
// target checks, and inline SVG charts of latency, success rate and upstream calls over
// time. It loads nothing from anywhere, so it can be attached to a ticket or archived.
func (r *Report) WriteHTML(w io.Writer) error {
	type sideRow struct {
		Label  string
		Values []string
	}
	data := struct {
		R      *Report
		Header []string
		Sides  []string
		Rows   []sideRow
		Charts []template.HTML
		Breaks []breakerRows
	}{R: r, Header: strings.Split(r.Header(), "\n")}
	for _, s := range r.Sides {
		data.Sides = append(data.Sides, s.Name)
	}
	for _, rw := range r.rows() {
		data.Rows = append(data.Rows, sideRow{Label: rw.label, Values: rw.values})
	}
	data.Charts = r.charts()
	for _, s := range r.Sides {
		for _, mb := range s.Breakers {
			data.Breaks = append(data.Breaks, breakerRows{Side: s.Name, ModelBreaker: mb})
		}
	}
	return pageTemplate.Execute(w, data)
}

type breakerRows struct {
	Side string
	ModelBreaker
}

var pageTemplate = template.Must(template.New("drill").Funcs(template.FuncMap{
	"seconds": func(v float64) string { return fmt.Sprintf("%.1f s", v) },
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>mantle drill: {{.R.Scenario}}</title>
<style>
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.15em;margin-top:2em}
p.meta{color:#555;margin:.2em 0}
table{border-collapse:collapse;margin:.8em 0}
td,th{padding:.3em .8em;border-bottom:1px solid #e4e4e4;text-align:left;vertical-align:top}
th{background:#f6f6f6}
td.v{font-variant-numeric:tabular-nums}
.met{color:#1a7f37;font-weight:600}.missed{color:#c62828;font-weight:600}
svg{display:block;margin:.6em 0 1.6em;background:#fff}
.legend span{display:inline-block;margin-right:1.2em}
</style></head><body>
<h1>mantle drill: {{.R.Scenario}}</h1>
{{range .Header}}<p class="meta">{{.}}</p>
{{end}}<p class="meta">Started {{.R.StartedAt.Format "2006-01-02 15:04:05 MST"}}.</p>
<h2>Side by side</h2>
<table><tr><th></th>{{range .Sides}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr><td>{{.Label}}</td>{{range .Values}}<td class="v">{{.}}</td>{{end}}</tr>
{{end}}</table>
{{if .R.Checks}}<h2>Targets (mantle)</h2>
<table><tr><th>target</th><th>wanted</th><th>measured</th><th></th></tr>
{{range .R.Checks}}<tr><td>{{.Name}}</td><td>{{.Target}}</td><td class="v">{{.Got}}</td><td>{{if .Met}}<span class="met">met</span>{{else}}<span class="missed">missed</span>{{end}}</td></tr>
{{end}}</table>{{end}}
{{if .Charts}}<h2>Over time</h2>
<p class="meta">Each point is one bucket of {{printf "%.1f" .R.BucketS}} s of scenario time, by when requests were due.{{if .R.IncidentStartS}} The shaded band is the incident.{{end}}</p>
{{range .Charts}}{{.}}
{{end}}{{end}}
{{if .Breaks}}<h2>Breaker transitions</h2>
{{range .Breaks}}<p><b>{{.Model}}</b> ({{.Side}}): {{.Trips}} trips, {{.HalfOpenPeriods}} half-open periods, at most {{.MaxProbeCalls}} calls in one (cap {{.ProbeCap}}).</p>
<table><tr><th>at</th><th>from</th><th>to</th><th>reason</th></tr>
{{range .Transitions}}<tr><td class="v">{{seconds .AtS}}</td><td>{{.From}}</td><td>{{.To}}</td><td>{{.Reason}}</td></tr>
{{end}}</table>
{{end}}{{end}}
<h2>How to read this</h2>
{{if .R.Tools}}<p>Each side runs the same agent sessions of five steps (a model call, the query tool, the action tool, the query tool, a model call).
A session <b>completed, fresh</b> ran every step with fresh results; <b>stale data</b>: at least one query was answered from its last good result (marked);
<b>partial</b>: a step failed; <b>pending confirmation</b>: an action's outcome is unknown and waits for a person; <b>hung</b>: no answer within the drill's guard.
<b>Actions executed twice</b> and <b>query calls per logical query</b> are counted at the tool backends, which perform every action they receive.
The session events and tool breaker transitions are what mantle's agent published on NATS.</p>
{{else}}<p><b>answered</b> counts every request its caller got an answer for, at any ladder level;
<b>correct answer</b> is the answer a healthy model gives (the simulator answers deterministically, so the drill knows it);
a <b>wrong answer, not marked</b> came from a model but is a refusal, a truncation or broken JSON passed on as if it were fine.
Ladder answers (L2 cached related answer, L3 template) are not model answers; they are counted as answered when they say what they are.
<b>Upstream calls per request</b> counts every call the simulated provider received, retries and hedges included;
<b>duplicate billed calls</b> are billed calls that repeated a request already billed on the same model.
Latency covers every request, answered or not: it is how long its user waited. The cost estimate prices every billed call at the model's prices.</p>{{end}}
</body></html>
`))

// chartSeries is one line of a chart.
type chartSeries struct {
	name   string
	color  string
	dashed bool
	// ys has one value per bucket; NaN leaves a gap.
	ys []float64
}

var sideColors = map[string]string{SideMantle: "#1f6fb5", SideNaive: "#c62828"}

func (r *Report) charts() []template.HTML {
	if r.Tools != nil {
		// A tool storm's figures are counts per side, in the table.
		return nil
	}
	var lat, succ, calls []chartSeries
	for _, s := range r.Sides {
		color := sideColors[s.Name]
		p50, p99, ok, correct, ups := nanSlice(len(s.Timeline)), nanSlice(len(s.Timeline)), nanSlice(len(s.Timeline)), nanSlice(len(s.Timeline)), nanSlice(len(s.Timeline))
		for i, b := range s.Timeline {
			ups[i] = float64(b.UpstreamCalls) / r.BucketS
			if b.Requests == 0 {
				continue
			}
			p50[i], p99[i] = b.P50Ms, b.P99Ms
			ok[i] = float64(b.Answered) / float64(b.Requests) * 100
			correct[i] = float64(b.Correct) / float64(b.Requests) * 100
		}
		lat = append(lat, chartSeries{s.Name + " P99", color, false, p99}, chartSeries{s.Name + " P50", color, true, p50})
		succ = append(succ, chartSeries{s.Name + " answered", color, false, ok}, chartSeries{s.Name + " correct", color, true, correct})
		calls = append(calls, chartSeries{s.Name, color, false, ups})
	}
	pct := func(v float64) string { return fmt.Sprintf("%.0f%%", v) }
	charts := []template.HTML{
		r.chart("Latency (log scale)", lat, true, fmtMs),
		r.chart("Requests answered and correct (%)", succ, false, pct),
	}
	if m := r.Side(SideMantle); m != nil {
		var levels []chartSeries
		for l, color := range levelColors {
			ys := nanSlice(len(m.Timeline))
			for i, b := range m.Timeline {
				if b.Answered > 0 {
					ys[i] = float64(b.Levels[l]) / float64(b.Answered) * 100
				}
			}
			levels = append(levels, chartSeries{strings.SplitN(levelNames[l], " ", 2)[0] + " " + levelShort[l], color, false, ys})
		}
		charts = append(charts, r.chart("mantle's answers by ladder level (%)", levels, false, pct))
	}
	return append(charts, r.chart("Upstream calls per second", calls, false, func(v float64) string { return fmt.Sprintf("%.0f", v) }))
}

var (
	levelColors = [4]string{"#1f6fb5", "#2e9d5b", "#b58b1f", "#7b3fa0"}
	levelShort  = [4]string{"primary", "backup", "cache", "template"}
)

func nanSlice(n int) []float64 {
	s := make([]float64, n)
	for i := range s {
		s[i] = math.NaN()
	}
	return s
}

// chart draws series over the run's buckets as an inline SVG line chart.
func (r *Report) chart(title string, series []chartSeries, logY bool, label func(float64) string) template.HTML {
	const w, h, left, right, top, bottom = 1060.0, 300.0, 70.0, 20.0, 30.0, 40.0
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range series {
		for _, y := range s.ys {
			if !math.IsNaN(y) && (!logY || y > 0) {
				lo, hi = math.Min(lo, y), math.Max(hi, y)
			}
		}
	}
	if math.IsInf(lo, 0) {
		lo, hi = 0, 1
	}
	var ticks []float64
	if logY {
		lo, hi = math.Pow(10, math.Floor(math.Log10(math.Max(lo, 1)))), math.Pow(10, math.Ceil(math.Log10(math.Max(hi, 1.0001))))
		for v := lo; v <= hi*1.0001; v *= 10 {
			ticks = append(ticks, v)
		}
	} else {
		lo = 0
		if strings.Contains(title, "%") {
			hi = 100
		}
		hi = niceCeil(hi)
		for i := 0; i <= 4; i++ {
			ticks = append(ticks, hi*float64(i)/4)
		}
	}
	yOf := func(v float64) float64 {
		f := (v - lo) / (hi - lo)
		if logY {
			f = (math.Log10(math.Max(v, lo)) - math.Log10(lo)) / (math.Log10(hi) - math.Log10(lo))
		}
		return top + (1-f)*(h-top-bottom)
	}
	span := r.DurationS
	xOf := func(t float64) float64 { return left + t/span*(w-left-right) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" role="img" aria-label="%s">`, w, h, w, h, html.EscapeString(title))
	fmt.Fprintf(&b, `<text x="%.0f" y="18" font-size="14" font-weight="600">%s</text>`, left, html.EscapeString(title))
	if r.IncidentStartS != nil && r.IncidentEndS != nil {
		x0, x1 := xOf(*r.IncidentStartS), xOf(math.Min(*r.IncidentEndS, span))
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.0f" width="%.1f" height="%.0f" fill="#f3d9a4" fill-opacity="0.35"/>`, x0, top, math.Max(0, x1-x0), h-top-bottom)
	}
	for _, t := range ticks {
		y := yOf(t)
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#e4e4e4"/>`, left, w-right, y, y)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" font-size="11" text-anchor="end" fill="#555">%s</text>`, left-6, y+4, html.EscapeString(label(t)))
	}
	for i := 0; i <= 6; i++ {
		t := span * float64(i) / 6
		x := xOf(t)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" font-size="11" text-anchor="middle" fill="#555">%s</text>`, x, h-bottom+16, clockTime(secondsDur(t)))
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="11" text-anchor="middle" fill="#555">scenario time (m:ss)</text>`, (left+w-right)/2, h-6)
	for _, s := range series {
		dash := ""
		if s.dashed {
			dash = ` stroke-dasharray="5 4"`
		}
		for _, seg := range segments(s.ys) {
			var pts []string
			for _, i := range seg {
				mid := (float64(i) + 0.5) * r.BucketS
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", xOf(mid), yOf(s.ys[i])))
			}
			if len(seg) == 1 {
				mid := (float64(seg[0]) + 0.5) * r.BucketS
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="2" fill="%s"/>`, xOf(mid), yOf(s.ys[seg[0]]), s.color)
				continue
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.8"%s points="%s"/>`, s.color, dash, strings.Join(pts, " "))
		}
	}
	// The legend runs along the top, right of the title (about 8 px per character at 14 px).
	lx := left + max(300, 8.5*float64(len(title))+30)
	for _, s := range series {
		dash := ""
		if s.dashed {
			dash = ` stroke-dasharray="5 4"`
		}
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="14" y2="14" stroke="%s" stroke-width="2"%s/>`, lx, lx+22, s.color, dash)
		fmt.Fprintf(&b, `<text x="%.0f" y="18" font-size="11">%s</text>`, lx+26, html.EscapeString(s.name))
		lx += 140
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // built here from numbers and escaped text
}

func secondsDur(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// segments splits the indices of ys into runs without NaN.
func segments(ys []float64) [][]int {
	var out [][]int
	var cur []int
	for i, y := range ys {
		if math.IsNaN(y) {
			if len(cur) > 0 {
				out = append(out, cur)
				cur = nil
			}
			continue
		}
		cur = append(cur, i)
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	exp := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*exp >= v {
			return m * exp
		}
	}
	return 10 * exp
}
