//go:build !unix

package overload

import "time"

// ProcessCPU is 0 where the process's CPU time is not read: the share then grows by StepUp
// alone.
func ProcessCPU() time.Duration { return 0 }
