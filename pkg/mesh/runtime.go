package mesh

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"runtime/metrics"
	"strconv"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// RuntimeConfig tunes the Go runtime of a process that serves mantle (mantle serve and
// mantle dev; tests and tools that start a mesh inside another program leave their
// process alone). Both settings yield to the environment: GOGC, GOMEMLIMIT and
// AUTOMEMLIMIT, when set, win.
type RuntimeConfig struct {
	// GCPercent is GOGC: how far, in percent of the live heap, the heap grows before the
	// next collection. Go's 100 by default: 200 collects half as often for tens of MiB
	// more, and did not move the mesh's latency at 2000 requests/s beyond the noise of
	// this project's 2-core machines (docs/performance.md, "Sixth session").
	GCPercent int `yaml:"gc_percent"`
	// MemoryLimitRatio sets GOMEMLIMIT to this share of the container's memory limit
	// (cgroups), so that a heap allowed to grow by GCPercent is collected harder as it
	// nears the limit instead of being killed at it. 0 leaves GOMEMLIMIT unset; without a
	// cgroup limit it stays unset too.
	MemoryLimitRatio float64 `yaml:"memory_limit_ratio"`
}

// DefaultRuntimeConfig is the runtime block's defaults.
func DefaultRuntimeConfig() RuntimeConfig {
	return RuntimeConfig{GCPercent: 100, MemoryLimitRatio: 0.9}
}

// Validate checks the block.
func (c RuntimeConfig) Validate() error {
	var errs []error
	if c.GCPercent <= 0 {
		errs = append(errs, fmt.Errorf("gc_percent: must be positive (Go's default is 100), got %d", c.GCPercent))
	}
	if !(c.MemoryLimitRatio >= 0 && c.MemoryLimitRatio <= 1) { // NaN too
		errs = append(errs, fmt.Errorf("memory_limit_ratio: want 0 (off) or a share in (0, 1], got %g", c.MemoryLimitRatio))
	}
	return errors.Join(errs...)
}

// tuneRuntime applies c to this process and logs what the runtime now runs with. limit
// says how much memory the process may use; nil reads the cgroup's limit.
func tuneRuntime(c RuntimeConfig, getenv func(string) string, limit memlimit.Provider, log *slog.Logger) {
	gogc := "GOGC environment variable"
	if getenv("GOGC") == "" {
		debug.SetGCPercent(c.GCPercent)
		gogc = "runtime.gc_percent"
	}
	percent := gcPercent()

	memory := "GOMEMLIMIT environment variable"
	if getenv("GOMEMLIMIT") == "" {
		memory = c.setMemoryLimit(getenv("AUTOMEMLIMIT"), limit)
	}
	attrs := []any{"gc_percent", percent, "gc_percent_from", gogc, "memory_limit_from", memory}
	if l := debug.SetMemoryLimit(-1); l != math.MaxInt64 {
		attrs = append(attrs, "memory_limit_mib", l>>20)
	}
	log.Info("go runtime", attrs...)
}

// setMemoryLimit sets GOMEMLIMIT to a share of the cgroup's memory limit and says where
// it came from. auto is AUTOMEMLIMIT, which memlimit.Set also reads: a ratio that
// overrides the configured one, or off.
func (c RuntimeConfig) setMemoryLimit(auto string, limit memlimit.Provider) string {
	ratio, from := c.MemoryLimitRatio, "runtime.memory_limit_ratio"
	switch {
	case auto == "off":
		return "off (AUTOMEMLIMIT=off)"
	case auto != "":
		r, err := strconv.ParseFloat(auto, 64)
		if err != nil || !(r > 0 && r <= 1) {
			return fmt.Sprintf("unset: AUTOMEMLIMIT=%q is neither a ratio in (0, 1] nor off", auto)
		}
		ratio, from = r, "AUTOMEMLIMIT"
	case ratio == 0:
		return "off (runtime.memory_limit_ratio: 0)"
	}
	if limit == nil {
		limit = memlimit.FromCgroup
	}
	switch l, err := memlimit.Set(memlimit.WithRatio(ratio), memlimit.WithProvider(limit)); {
	case err != nil:
		// Not in a cgroup (or not on Linux): nothing to keep under.
		return "no memory limit found: " + err.Error()
	case l == math.MaxInt64:
		return "no memory limit found"
	}
	return fmt.Sprintf("%g of the cgroup memory limit (%s)", ratio, from)
}

// gcPercent reads GOGC as the runtime has it, without debug.SetGCPercent(-1), which
// would turn the collector off for a moment and wait for a running cycle.
func gcPercent() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int(s[0].Value.Uint64())
}
