package procusage

import (
	"syscall"
	"time"
	"unsafe"
)

// ThreadCPU returns the CPU time the calling OS thread has used (CLOCK_THREAD_CPUTIME_ID).
// With the goroutine locked to its thread (runtime.LockOSThread), the difference across
// a call is the CPU the call took, without the time the thread waited for a CPU.
func ThreadCPU() (time.Duration, bool) {
	const clockThreadCPUTimeID = 3
	var ts syscall.Timespec
	if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTimeID, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
