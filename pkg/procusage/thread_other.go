//go:build !linux

package procusage

import "time"

// ThreadCPU is measured on Linux only.
func ThreadCPU() (time.Duration, bool) { return 0, false }
