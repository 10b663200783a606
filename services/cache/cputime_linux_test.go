package cache

import (
	"syscall"
	"time"
	"unsafe"
)

// threadCPUTime returns the CPU time the calling OS thread has used (CLOCK_THREAD_CPUTIME_ID).
// With the goroutine locked to its thread, the difference across a call is the CPU the call
// took, without the time the thread waited for a CPU: on a shared machine the wall-clock
// tail measures the neighbours as much as the code.
func threadCPUTime() (time.Duration, bool) {
	const clockThreadCPUTimeID = 3
	var ts syscall.Timespec
	if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTimeID, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}

// processCPU returns the CPU time the whole process has used, user and system: a
// benchmark whose work spans goroutines (the index's linker, the collector) counts it all.
func processCPU() (time.Duration, bool) {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		return 0, false
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano()), true
}
