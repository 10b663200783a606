//go:build !unix

package procusage

import "time"

// CPU is not measured where getrusage does not exist.
func CPU() (time.Duration, bool) { return 0, false }

// PeakRSS is not measured where getrusage does not exist.
func PeakRSS() (int64, bool) { return 0, false }

// Switches is not measured on this system.
func Switches() (int64, bool) { return 0, false }
