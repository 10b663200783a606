//go:build unix

package benchload

import (
	"syscall"
	"time"
)

// usage returns the process's CPU time so far and its peak resident set.
func usage() rusage {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return rusage{}
	}
	return rusage{
		cpu: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
		// Linux reports ru_maxrss in KiB (macOS in bytes; the figures are documented for
		// Linux).
		maxRSSMiB: float64(ru.Maxrss) / 1024,
	}
}
