//go:build unix

package procusage

import (
	"runtime"
	"syscall"
	"time"
)

// rusage is getrusage's reading of the whole process, all its threads.
func rusage() (syscall.Rusage, bool) {
	var u syscall.Rusage
	err := syscall.Getrusage(syscall.RUSAGE_SELF, &u)
	return u, err == nil
}

// CPU returns the user and system CPU time the process has used, all its threads: a
// measurement whose work spans goroutines (a background linker, the collector) counts
// it all.
func CPU() (time.Duration, bool) {
	u, ok := rusage()
	return time.Duration(u.Utime.Nano() + u.Stime.Nano()), ok
}

// PeakRSS returns the largest resident set the process has had, in bytes.
func PeakRSS() (int64, bool) {
	u, ok := rusage()
	// ru_maxrss is in bytes on Apple's systems and in KiB on the others.
	if runtime.GOOS == "darwin" || runtime.GOOS == "ios" {
		return int64(u.Maxrss), ok
	}
	return int64(u.Maxrss) * 1024, ok
}

// Switches returns how many times the process's threads have given up a CPU, waiting
// (voluntary) or preempted: on an otherwise idle process, about how often it woke.
func Switches() (int64, bool) {
	u, ok := rusage()
	return int64(u.Nvcsw + u.Nivcsw), ok
}
