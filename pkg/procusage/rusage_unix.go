//go:build unix

package procusage

import (
	"runtime"
	"syscall"
	"time"
)

// CPU returns the user and system CPU time the process has used, all its threads: a
// measurement whose work spans goroutines (a background linker, the collector) counts
// it all.
func CPU() (time.Duration, bool) {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		return 0, false
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano()), true
}

// PeakRSS returns the largest resident set the process has had, in bytes.
func PeakRSS() (int64, bool) {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		return 0, false
	}
	// ru_maxrss is in bytes on Apple's systems and in KiB on the others.
	if runtime.GOOS == "darwin" || runtime.GOOS == "ios" {
		return int64(u.Maxrss), true
	}
	return int64(u.Maxrss) * 1024, true
}

// Switches returns how many times the process's threads have given up a CPU, waiting
// (voluntary) or preempted: on an otherwise idle process, about how often it woke.
func Switches() (int64, bool) {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		return 0, false
	}
	return int64(u.Nvcsw + u.Nivcsw), true
}
