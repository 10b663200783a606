package main

import (
	"bytes"
	"runtime"
	rtrace "runtime/trace"
	"strings"
	"testing"
	"time"
)

// waitHere blocks on ch: the function name the test's site looks for.
func waitHere(ch chan struct{}) { <-ch }

func TestReadCountsBlockedGoroutines(t *testing.T) {
	var buf bytes.Buffer
	if err := rtrace.Start(&buf); err != nil {
		t.Fatalf("trace: %v", err)
	}
	const blocked = 3
	ch := make(chan struct{})
	done := make(chan struct{})
	for range blocked {
		go func() { waitHere(ch); done <- struct{}{} }()
	}
	// Released once every one of them is parked in waitHere, as their stacks say.
	deadline := time.Now().Add(10 * time.Second)
	for parkedIn(t, "tracewaits.waitHere") < blocked {
		if time.Now().After(deadline) {
			rtrace.Stop()
			t.Fatal("the goroutines never blocked")
		}
		runtime.Gosched()
	}
	close(ch)
	for range blocked {
		<-done
	}
	rtrace.Stop()

	at := sites{{"here", "tracewaits.waitHere"}, {"nowhere", "tracewaits.noSuchFunction"}}
	w, err := read(&buf, at, 0) // every block's waker counted
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if got := len(w.blocked["here"]); got != blocked {
		t.Errorf("blocked in waitHere: %d, want %d", got, blocked)
	}
	if got := len(w.cpuAfter["here"]); got != blocked {
		t.Errorf("waits for a CPU after waitHere: %d, want %d", got, blocked)
	}
	if got := len(w.blocked["nowhere"]); got != 0 {
		t.Errorf("blocked in a function nobody ran: %d", got)
	}
	if len(w.cpu) == 0 {
		t.Error("no wait for a CPU read at all")
	}
	// The test goroutine woke them all, closing ch: one waker, three wake-ups.
	if k := w.wakers["here"]; len(k) != 1 {
		t.Errorf("wakers of waitHere: %v, want one", k)
	} else {
		for where, by := range k {
			if by.woke != blocked || !strings.Contains(where, "TestReadCountsBlockedGoroutines") {
				t.Errorf("waker %q woke %d, want the test, %d", where, by.woke, blocked)
			}
		}
	}
	var out bytes.Buffer
	show(&out, "here", w.blocked["here"])
	show(&out, "nowhere", w.blocked["nowhere"])
	for _, want := range []string{"n=3 ", "nowhere", "none"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report %q lacks %q", out.String(), want)
		}
	}
}

// parkedIn counts the goroutines whose stack shows them blocked in fn.
func parkedIn(t *testing.T, fn string) int {
	t.Helper()
	b := make([]byte, 1<<20)
	b = b[:runtime.Stack(b, true)]
	n := 0
	for _, g := range strings.Split(string(b), "\n\n") {
		if strings.Contains(g, "[chan receive") && strings.Contains(g, fn+"(") {
			n++
		}
	}
	return n
}

func TestSitesFlag(t *testing.T) {
	for _, tc := range []struct {
		in  string
		ok  bool
		out site
	}{
		{"index=(*EmbeddedIndex).Search", true, site{"index", "(*EmbeddedIndex).Search"}},
		{"a=b=c", true, site{"a", "b=c"}},
		{"no-equals", false, site{}},
		{"=text", false, site{}},
		{"label=", false, site{}},
	} {
		var s sites
		err := s.Set(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("Set(%q): err %v, want ok=%v", tc.in, err, tc.ok)
			continue
		}
		if tc.ok && (len(s) != 1 || s[0] != tc.out) {
			t.Errorf("Set(%q) = %v, want %v", tc.in, s, tc.out)
		}
	}
}
