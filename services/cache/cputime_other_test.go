//go:build !linux

package cache

import "time"

// threadCPUTime is not measured outside Linux; the benchmarks then report wall time only.
func threadCPUTime() (time.Duration, bool) { return 0, false }

// processCPU is not measured outside Linux either.
func processCPU() (time.Duration, bool) { return 0, false }
