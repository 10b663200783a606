package mesh

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"sync"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// RuntimeConfig tunes the Go runtime of a process that serves mantle (mantle serve and
// mantle dev; tests and tools that start a mesh inside another program leave their
// process alone). Both settings yield to the environment: GOGC, GOMEMLIMIT and
// AUTOMEMLIMIT, when set, win.
type RuntimeConfig struct {
	// GCPercent is the garbage collector's GOGC for mantle serve and mantle dev: how far,
	// in percent of the live heap, the heap grows before the next collection. The GOGC
	// environment variable wins (and then gc_min_heap_mib is off too).
	GCPercent int `yaml:"gc_percent"`
	// GCMinHeapMiB is a floor under the collector's heap goal: GOGC is raised after every
	// collection while the live heap is small, so that the heap may reach about this many
	// MiB before the next one (held under half the memory limit when there is one). A
	// request allocates about 30 KB in the router and 50 to 60 KB through the whole mesh,
	// so gc_percent alone collects about ten times a second at 2000 requests/s, each
	// collection stopping the world twice and taking CPU from the requests; with a floor of
	// 16 MiB per 32 KB a request allocates, it collects about twice a second, for about as
	// much more resident memory as the floor (docs/performance.md). A process with more live
	// data than the floor is paced by gc_percent alone, so the floor never multiplies a
	// large heap. go_gc_gogc_percent on /metrics shows the GOGC in effect. 0 turns it off.
	// -1 (the default) sets it by what the process runs: 16 MiB for one of router, cache,
	// quota and verifier, and a third of that more for each other one, so 32 MiB with
	// target all, which keeps the whole mesh under 100 MiB resident while its cache is small.
	GCMinHeapMiB int `yaml:"gc_min_heap_mib"`
	// MemoryLimitRatio sets GOMEMLIMIT to this share of the container's (cgroup) memory
	// limit, so that the collector works harder near the limit instead of the process
	// being killed at it. 0 leaves it unset, as does running outside a cgroup with a
	// limit. GOMEMLIMIT wins, and AUTOMEMLIMIT (a ratio, or off) overrides the share. The
	// process logs "go runtime" at start with what it runs with.
	MemoryLimitRatio float64 `yaml:"memory_limit_ratio"`
}

// DefaultRuntimeConfig is the runtime block's defaults.
func DefaultRuntimeConfig() RuntimeConfig {
	return RuntimeConfig{GCPercent: 100, GCMinHeapMiB: HeapFloorAuto, MemoryLimitRatio: 0.9}
}

// Validate checks the block.
func (c RuntimeConfig) Validate() error {
	var errs []error
	if c.GCPercent <= 0 {
		errs = append(errs, fmt.Errorf("gc_percent: must be positive (Go's default is 100), got %d", c.GCPercent))
	}
	if c.GCMinHeapMiB < HeapFloorAuto || c.GCMinHeapMiB > maxMinHeapMiB {
		errs = append(errs, fmt.Errorf("gc_min_heap_mib: want -1 (by the services the process runs), 0 (off) or up to %d, got %d", maxMinHeapMiB, c.GCMinHeapMiB))
	}
	if !(c.MemoryLimitRatio >= 0 && c.MemoryLimitRatio <= 1) { // NaN too
		errs = append(errs, fmt.Errorf("memory_limit_ratio: want 0 (off) or a share in (0, 1], got %g", c.MemoryLimitRatio))
	}
	return errors.Join(errs...)
}

// maxMinHeapMiB bounds gc_min_heap_mib at 1 TiB, where a typo would start.
const maxMinHeapMiB = 1 << 20

// HeapFloorAuto is gc_min_heap_mib's default: a floor by the services the process runs
// (heapFloorMiB).
const HeapFloorAuto = -1

// heapFloorOneServiceMiB is the automatic floor of a process that runs one service. The
// floor exists to keep collections few where requests allocate a lot against a small live
// heap, so it follows what a request allocates in the process: about 30 KB in the router,
// 50 to 60 KB through all four services, whose floor is therefore twice the router's
// (docs/design/002-heap-floor.md).
const heapFloorOneServiceMiB = 16

// heapFloorMiB is the floor in MiB for a process that runs services of the router, cache,
// quota and verifier (target all runs all four): heapFloorOneServiceMiB, and a third of it
// for each further service.
func (c RuntimeConfig) heapFloorMiB(services int) int {
	if c.GCMinHeapMiB != HeapFloorAuto {
		return c.GCMinHeapMiB
	}
	return heapFloorOneServiceMiB + heapFloorOneServiceMiB*(max(services, 1)-1)/3
}

// tuneRuntime applies c to this process, which runs services of the router, cache, quota
// and verifier, and logs what the runtime now runs with. limit says how much memory the
// process may use; nil reads the cgroup's limit. It returns the heap floor to keep while
// the process runs, nil when there is none (GOGC set, or gc_min_heap_mib 0).
func tuneRuntime(c RuntimeConfig, services int, getenv func(string) string, limit memlimit.Provider, log *slog.Logger) *heapFloor {
	paced := getenv("GOGC") == "" // by the configuration: GOGC in the environment wins
	gogc := "GOGC environment variable"
	if paced {
		debug.SetGCPercent(c.GCPercent)
		gogc = "runtime.gc_percent"
	}
	attrs := []any{"gc_percent", gcPercent(), "gc_percent_from", gogc}

	memory := "GOMEMLIMIT environment variable"
	if getenv("GOMEMLIMIT") == "" {
		memory = c.setMemoryLimit(getenv("AUTOMEMLIMIT"), limit)
	}
	memLimit := debug.SetMemoryLimit(-1)
	limited := memLimit != math.MaxInt64
	var floor *heapFloor
	if floorMiB := c.heapFloorMiB(services); paced && floorMiB > 0 {
		floorBytes := uint64(floorMiB) << 20
		if limited {
			// A floor near the limit would keep the collector running at the limit,
			// returning memory to the system and taking it back, instead of at its pace.
			floorBytes = min(floorBytes, uint64(memLimit)/2)
		}
		floor = &heapFloor{floor: floorBytes, base: c.GCPercent, current: c.GCPercent, read: readHeap, set: debug.SetGCPercent}
		attrs = append(attrs, "gc_min_heap_mib", floorBytes>>20)
	}
	attrs = append(attrs, "memory_limit_from", memory)
	if limited {
		attrs = append(attrs, "memory_limit_mib", memLimit>>20)
	}
	log.Info("go runtime", attrs...)
	return floor
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

// heapFloor keeps the collector's heap goal at or above floor bytes by raising GOGC while
// little of the heap is live. Go has no such setting (a "ballast" allocation was the old
// way to get one); GOGC is the lever. It is set again after every collection, from what
// that collection found live: set less often, a GOGC computed for a small live heap
// would multiply a grown one until the next setting. GOMEMLIMIT, when set, still caps the
// heap.
type heapFloor struct {
	floor uint64           // bytes
	base  int              // the configured GOGC: never go below it
	read  func() heapShape // what the last collection found
	set   func(int) int    // debug.SetGCPercent

	mu      sync.Mutex
	current int  // what GOGC is now
	stopped bool // stop was called: GOGC is the base again
}

// start adjusts GOGC now and then after every collection, until stop, which restores the
// configured GOGC. No goroutine of its own: the runtime's cleanups drive it.
func (f *heapFloor) start() (stop func()) {
	f.afterCollection()
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.stopped = true
		f.setPercent(f.base)
	}
}

// afterCollection adjusts GOGC to the heap and arranges to run again after the next
// collection: it attaches itself as the cleanup of an object nothing references, which
// that collection finds unreachable. The runtime runs cleanups on goroutines of its own
// once the collection's sweep has reached the object, usually within milliseconds; until
// then the goal that collection set uses the GOGC before. The mutex keeps one adjustment
// at a time; once stopped, the chain ends.
func (f *heapFloor) afterCollection() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return
	}
	// Sixteen bytes with a pointer: not a tiny allocation, which may share a block with
	// live objects and never be collected.
	runtime.AddCleanup(&collectionMarker{}, func(f *heapFloor) { f.afterCollection() }, f)
	f.setPercent(gcPercentFor(f.read(), f.floor, f.base))
}

// collectionMarker is the object whose collection says a collection happened.
type collectionMarker struct {
	_ *byte
	_ uint64
}

func (f *heapFloor) setPercent(p int) {
	if p != f.current {
		f.set(p)
		f.current = p
	}
}

// heapShape is what the runtime's pacer sets the next heap goal from.
type heapShape struct {
	live  uint64 // heap bytes the last collection marked
	roots uint64 // stack and global bytes it scanned
}

// minHeapPer100 is Go's minimum heap goal at GOGC=100 (the runtime's defaultHeapMinimum);
// it scales with GOGC.
const minHeapPer100 = 4 << 20

// gcPercentFor is the GOGC that puts the heap goal at floor or above, and never below
// base. The runtime's goal is live + (live + roots) x GOGC/100, and at least
// minHeapPer100 x GOGC/100; the smaller GOGC that reaches the floor either way wins.
// Rounded up to a multiple of 25 so that small movements of the live heap do not change it
// after every collection.
func gcPercentFor(h heapShape, floor uint64, base int) int {
	if floor <= h.live {
		return base
	}
	need := ceilDiv(floor*100, minHeapPer100)
	if scanned := h.live + h.roots; scanned > 0 {
		need = min(need, ceilDiv((floor-h.live)*100, scanned))
	}
	need = (need + 24) / 25 * 25
	return max(base, int(min(need, math.MaxInt32)))
}

func ceilDiv(a, b uint64) uint64 { return (a + b - 1) / b }

// readHeap reads what the last collection found.
func readHeap() heapShape {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"}}
	metrics.Read(s)
	var v [3]uint64
	for i := range s {
		if s[i].Value.Kind() == metrics.KindUint64 {
			v[i] = s[i].Value.Uint64()
		}
	}
	return heapShape{live: v[0], roots: v[1] + v[2]}
}
