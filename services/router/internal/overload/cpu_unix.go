//go:build unix

package overload

import (
	"syscall"
	"time"
)

// ProcessCPU is the CPU time, user and system, this process has used so far; 0 when the
// system does not tell.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
