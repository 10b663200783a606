package meshtest

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"runtime"
	"time"
)

// WatchTimeout arranges that, margin before the test binary's -test.timeout, the
// goroutines running the package's tests (those with a _test.go frame) are printed and the
// binary exits. go test's own timeout report names the running tests first and then
// prints every goroutine, often thousands in a mesh test: a log that keeps only its tail
// loses the names. TestMain calls it after flag.Parse; it starts no goroutine until it
// fires, so a leak check does not see it.
func WatchTimeout(margin time.Duration) {
	f := flag.Lookup("test.timeout")
	if f == nil {
		return
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return
	}
	timeout, _ := g.Get().(time.Duration)
	if timeout <= margin {
		return
	}
	time.AfterFunc(timeout-margin, func() {
		fmt.Fprintf(os.Stderr, "\nthe tests are still running %s before the %s timeout; their goroutines:\n\n", margin, timeout)
		os.Stderr.Write(testGoroutines())
		os.Exit(2)
	})
}

// testGoroutines is the stack dump of every goroutine with a frame in a _test.go file.
func testGoroutines() []byte {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out bytes.Buffer
	for g := range bytes.SplitSeq(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("_test.go:")) {
			out.Write(g)
			out.WriteString("\n\n")
		}
	}
	return out.Bytes()
}
