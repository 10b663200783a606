// Command tracewaits reads a Go execution trace (runtime/trace, as `mantle bench-load
// --trace` writes one per mode) and reports how long goroutines blocked where their stack
// names a given function, and how long they then waited for a CPU once woken: the numbers
// `go tool trace -pprof=sync` sums but does not count or spread.
//
//	go run ./tracewaits ../t.all.trace
//	go run ./tracewaits -at 'index=(*EmbeddedIndex).Search' -at 'quota=memstore.(*Store)' ../t.all.trace
//
// A goroutine counts under the first -at whose text is part of a function name on its stack
// when it blocks (any blocking: locks, channels, select). Durations are in milliseconds.
// For blocks of -long or more, it names the waker (its innermost mantle functions) and how
// long the waker had been running: a waker that ran long held what the others waited for.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/exp/trace"
)

// site is one -at flag: a label and the text a blocked goroutine's stack must contain.
type site struct{ label, text string }

type sites []site

func (s *sites) String() string { return fmt.Sprint(*s) }

func (s *sites) Set(v string) error {
	label, text, ok := strings.Cut(v, "=")
	if !ok || label == "" || text == "" {
		return fmt.Errorf("want label=function-text, got %q", v)
	}
	*s = append(*s, site{label, text})
	return nil
}

// defaultSites are the mesh's locks worth watching under load.
var defaultSites = sites{
	{"cache index search", "(*EmbeddedIndex).Search"},
	{"cache index writer", "(*EmbeddedIndex).lockToWrite"},
	{"quota memory store", "memstore.(*Store)"},
	{"cache leases", "cache.(*leases)"},
}

// goroutine is what the reading keeps of one goroutine between its transitions.
type goroutine struct {
	blockedAt trace.Time
	blockedBy string // the site it blocked at, "" if none
	readyAt   trace.Time
	wokeFrom  string     // the site it blocked at before its last wake-up
	runningAt trace.Time // when it last got a CPU
}

func main() {
	var at sites
	flag.Var(&at, "at", "label=text: count goroutines blocked with text in a function name on their stack (repeatable; the mesh's locks by default)")
	long := flag.Duration("long", time.Millisecond, "name who woke the goroutines blocked this long or longer")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: tracewaits [-at label=text ...] trace-file")
		os.Exit(2)
	}
	if len(at) == 0 {
		at = defaultSites
	}
	if err := run(os.Stdout, flag.Arg(0), at, *long); err != nil {
		fmt.Fprintln(os.Stderr, "tracewaits:", err)
		os.Exit(1)
	}
}

func run(out io.Writer, path string, at sites, long time.Duration) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	w, err := read(f, at, long.Seconds()*1e3)
	if err != nil {
		return err
	}
	show(out, "wait for a CPU, every wake-up", w.cpu)
	for _, s := range at {
		show(out, s.label+": blocked", w.blocked[s.label])
		show(out, s.label+": then waited for a CPU", w.cpuAfter[s.label])
		showWakers(out, w.wakers[s.label], long)
	}
	return nil
}

// waits are the durations read, in milliseconds.
type waits struct {
	cpu               []float64
	blocked, cpuAfter map[string][]float64
	// wakers counts, per site, who woke the goroutines blocked there for -long or more:
	// the waker's innermost mantle functions, and how long it had had its CPU.
	wakers map[string]map[string]*waker
}

// waker is one place that woke goroutines after a long block.
type waker struct {
	woke  int
	onCPU []float64 // how long the waker had been running, each time
}

// read reads the trace from r, counting the wakers of blocks at at's sites of long
// milliseconds or more.
func read(r io.Reader, at sites, long float64) (waits, error) {
	tr, err := trace.NewReader(r)
	if err != nil {
		return waits{}, err
	}
	w := waits{blocked: map[string][]float64{}, cpuAfter: map[string][]float64{}, wakers: map[string]map[string]*waker{}}
	gs := map[trace.GoID]*goroutine{}
	ms := func(from, to trace.Time) float64 { return float64(to-from) / 1e6 }
	for {
		ev, err := tr.ReadEvent()
		if errors.Is(err, io.EOF) {
			return w, nil
		}
		if err != nil {
			return waits{}, err
		}
		if ev.Kind() != trace.EventStateTransition {
			continue
		}
		st := ev.StateTransition()
		if st.Resource.Kind != trace.ResourceGoroutine {
			continue
		}
		g := gs[st.Resource.Goroutine()]
		if g == nil {
			g = &goroutine{}
			gs[st.Resource.Goroutine()] = g
		}
		from, to := st.Goroutine()
		if to == trace.GoRunning {
			g.runningAt = ev.Time()
		}
		switch {
		case from == trace.GoRunning && to == trace.GoWaiting:
			g.blockedAt, g.blockedBy = ev.Time(), siteOf(st.Stack, at)
		case from == trace.GoWaiting && to == trace.GoRunnable:
			if g.blockedBy != "" {
				d := ms(g.blockedAt, ev.Time())
				w.blocked[g.blockedBy] = append(w.blocked[g.blockedBy], d)
				if d >= long {
					w.woke(g.blockedBy, ev, gs)
				}
			}
			g.wokeFrom, g.blockedBy, g.readyAt = g.blockedBy, "", ev.Time()
		case to == trace.GoRunnable:
			g.readyAt = ev.Time()
		case from == trace.GoRunnable && to == trace.GoRunning:
			if g.readyAt != 0 {
				d := ms(g.readyAt, ev.Time())
				w.cpu = append(w.cpu, d)
				if g.wokeFrom != "" {
					w.cpuAfter[g.wokeFrom] = append(w.cpuAfter[g.wokeFrom], d)
				}
			}
			g.wokeFrom, g.readyAt = "", 0
		}
	}
}

// woke counts who ended a long block at site: ev is the goroutine's wake-up, emitted by the
// goroutine that woke it.
func (w waits) woke(site string, ev trace.Event, gs map[trace.GoID]*goroutine) {
	where := "(no goroutine: the runtime)"
	if frames := mantleFrames(ev.Stack(), 3); frames != "" {
		where = frames
	}
	if w.wakers[site] == nil {
		w.wakers[site] = map[string]*waker{}
	}
	k := w.wakers[site][where]
	if k == nil {
		k = &waker{}
		w.wakers[site][where] = k
	}
	k.woke++
	if by := gs[ev.Goroutine()]; by != nil && by.runningAt != 0 {
		k.onCPU = append(k.onCPU, float64(ev.Time()-by.runningAt)/1e6)
	}
}

// mantleFrames returns up to n of stack's innermost functions of mantle's own packages,
// innermost first, without their package path.
func mantleFrames(stack trace.Stack, n int) string {
	var out []string
	for fr := range stack.Frames() {
		if len(out) == n {
			break
		}
		if strings.Contains(fr.Func, "mantle-mesh/mantle/") {
			out = append(out, fr.Func[strings.LastIndex(fr.Func, "/")+1:])
		}
	}
	return strings.Join(out, " < ")
}

// siteOf returns the label of the first site whose text is part of a function on stack.
func siteOf(stack trace.Stack, at sites) string {
	for _, s := range at {
		for fr := range stack.Frames() {
			if strings.Contains(fr.Func, s.text) {
				return s.label
			}
		}
	}
	return ""
}

// showWakers lists who ended the long blocks, most first, with how long the waker had had
// its CPU (a waker that ran long held what the blocked goroutines waited for).
func showWakers(out io.Writer, wakers map[string]*waker, long time.Duration) {
	type row struct {
		where string
		*waker
	}
	var rows []row
	for where, k := range wakers {
		rows = append(rows, row{where, k})
	}
	slices.SortFunc(rows, func(a, b row) int { return b.woke - a.woke })
	for _, r := range rows[:min(len(rows), 5)] {
		slices.Sort(r.onCPU)
		median := 0.0
		if len(r.onCPU) > 0 {
			median = r.onCPU[len(r.onCPU)/2]
		}
		fmt.Fprintf(out, "    %d blocks of %v or more ended by %s (it had run %.2fms, median)\n", r.woke, long, r.where, median)
	}
}

func show(out io.Writer, name string, v []float64) {
	if len(v) == 0 {
		fmt.Fprintf(out, "%-45s none\n", name)
		return
	}
	slices.Sort(v)
	var sum float64
	over1, over5 := 0, 0
	for _, x := range v {
		sum += x
		if x >= 1 {
			over1++
		}
		if x >= 5 {
			over5++
		}
	}
	q := func(p float64) float64 { return v[int(p*float64(len(v)-1))] }
	fmt.Fprintf(out, "%-45s n=%d total=%.0fms p50=%.3f p90=%.3f p99=%.3f max=%.1f >=1ms:%d >=5ms:%d\n",
		name, len(v), sum, q(0.5), q(0.9), q(0.99), v[len(v)-1], over1, over5)
}
