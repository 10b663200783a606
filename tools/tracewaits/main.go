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
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

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
	wokeFrom  string // the site it blocked at before its last wake-up
}

func main() {
	var at sites
	flag.Var(&at, "at", "label=text: count goroutines blocked with text in a function name on their stack (repeatable; the mesh's locks by default)")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: tracewaits [-at label=text ...] trace-file")
		os.Exit(2)
	}
	if len(at) == 0 {
		at = defaultSites
	}
	if err := run(os.Stdout, flag.Arg(0), at); err != nil {
		fmt.Fprintln(os.Stderr, "tracewaits:", err)
		os.Exit(1)
	}
}

func run(out io.Writer, path string, at sites) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	w, err := read(f, at)
	if err != nil {
		return err
	}
	show(out, "wait for a CPU, every wake-up", w.cpu)
	for _, s := range at {
		show(out, s.label+": blocked", w.blocked[s.label])
		show(out, s.label+": then waited for a CPU", w.cpuAfter[s.label])
	}
	return nil
}

// waits are the durations read, in milliseconds.
type waits struct {
	cpu               []float64
	blocked, cpuAfter map[string][]float64
}

func read(r io.Reader, at sites) (waits, error) {
	tr, err := trace.NewReader(r)
	if err != nil {
		return waits{}, err
	}
	w := waits{blocked: map[string][]float64{}, cpuAfter: map[string][]float64{}}
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
		switch {
		case from == trace.GoRunning && to == trace.GoWaiting:
			g.blockedAt, g.blockedBy = ev.Time(), siteOf(st.Stack, at)
		case from == trace.GoWaiting && to == trace.GoRunnable:
			if g.blockedBy != "" {
				w.blocked[g.blockedBy] = append(w.blocked[g.blockedBy], ms(g.blockedAt, ev.Time()))
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
