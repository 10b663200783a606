package procusage

import (
	"os"
	"runtime"
	"testing"
	"time"
)

// sink keeps burn's result, so that its loop is work the compiler cannot drop.
var sink uint64

// burn spends some milliseconds of CPU on the calling goroutine.
func burn() {
	x := uint64(1)
	for range 20_000_000 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
	}
	sink += x
}

// measured fails the test if a reading was not measured on Linux, where every reading
// is, and skips it elsewhere.
func measured(t *testing.T, ok bool) {
	t.Helper()
	switch {
	case !ok && runtime.GOOS == "linux":
		t.Fatal("not measured on linux")
	case !ok:
		t.Skipf("not measured on %s", runtime.GOOS)
	}
}

func TestCPUGrowsWithWork(t *testing.T) {
	for _, tt := range []struct {
		name string
		read func() (time.Duration, bool)
	}{
		{name: "process", read: CPU},
		{name: "thread", read: ThreadCPU},
	} {
		t.Run(tt.name, func(t *testing.T) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			before, ok := tt.read()
			measured(t, ok)
			burn()
			after, ok := tt.read()
			measured(t, ok)
			if after <= before {
				t.Errorf("CPU time %v after burning CPU, %v before", after, before)
			}
		})
	}
}

// The thread's clock counts only its own thread: CPU burnt on another thread while it
// waits shows in the process's time, not in the thread's.
func TestThreadCPUOmitsOtherThreads(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	threadBefore, ok := ThreadCPU()
	measured(t, ok)
	processBefore, ok := CPU()
	measured(t, ok)
	done := make(chan struct{})
	go func() {
		defer close(done)
		burn()
	}()
	<-done
	processAfter, _ := CPU()
	threadAfter, _ := ThreadCPU()
	thread, process := threadAfter-threadBefore, processAfter-processBefore
	if thread >= process/2 {
		t.Errorf("thread's CPU %v while another thread burnt it, process's %v", thread, process)
	}
}

func TestPeakRSSCountsTouchedMemory(t *testing.T) {
	const size = 32 << 20
	buf := make([]byte, size)
	for i := 0; i < len(buf); i += 4096 { // a page is resident once written
		buf[i] = 1
	}
	peak, ok := PeakRSS()
	measured(t, ok)
	runtime.KeepAlive(buf)
	if peak < size {
		t.Errorf("peak resident set %d bytes after touching %d", peak, size)
	}
}

// A goroutine locked to its thread that waits parks the thread too: each wait is a switch.
func TestSwitchesCountWaits(t *testing.T) {
	before, ok := Switches()
	measured(t, ok)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for range 20 {
		// The read parks this goroutine, and its locked thread sleeps until the write.
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		go func() { _, _ = w.Write([]byte{1}); _ = w.Close() }()
		var b [1]byte
		if _, err := r.Read(b[:]); err != nil {
			t.Fatal(err)
		}
		_ = r.Close()
	}
	after, ok := Switches()
	measured(t, ok)
	if after <= before {
		t.Errorf("switches %d after 20 blocking reads, %d before", after, before)
	}
}
