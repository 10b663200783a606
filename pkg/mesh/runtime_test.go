package mesh

import (
	"bytes"
	"errors"
	"log/slog"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

func TestTuneRuntime(t *testing.T) {
	// The memory limit library reads these two from the process environment itself.
	for _, name := range []string{"GOMEMLIMIT", "AUTOMEMLIMIT"} {
		t.Setenv(name, "")
		if err := os.Unsetenv(name); err != nil {
			t.Fatal(err)
		}
	}
	const mib = 1 << 20
	limitOf := memlimit.Limit
	failing := func() (uint64, error) { return 0, errors.New("no cgroup here") }
	noLimit := func() (uint64, error) { return 0, memlimit.ErrNoLimit }

	for _, tc := range []struct {
		name      string
		cfg       RuntimeConfig
		env       map[string]string // AUTOMEMLIMIT also goes to the process's environment
		limit     memlimit.Provider
		wantGC    int   // 0: left as it was (77)
		wantLimit int64 // 0: left as it was (math.MaxInt64)
		wantLog   string
		wantFloor uint64 // bytes; 0: no heap floor
		services  int    // services the process runs; 0: all four
	}{
		{name: "defaults under a cgroup limit", cfg: DefaultRuntimeConfig(), limit: limitOf(1000 * mib),
			wantGC: 100, wantLimit: 900 * mib, wantLog: "gc_min_heap_mib=32", wantFloor: 32 * mib},
		{name: "the default floor for the router alone", cfg: DefaultRuntimeConfig(), limit: limitOf(1000 * mib), services: 1,
			wantGC: 100, wantLimit: 900 * mib, wantLog: "gc_min_heap_mib=16", wantFloor: 16 * mib},
		{name: "a floor set for the router alone", cfg: RuntimeConfig{GCPercent: 100, GCMinHeapMiB: 48}, limit: noLimit, services: 1,
			wantGC: 100, wantLog: "gc_min_heap_mib=48", wantFloor: 48 * mib},
		{name: "GOGC wins, over the floor too", cfg: RuntimeConfig{GCPercent: 300, GCMinHeapMiB: 64}, env: map[string]string{"GOGC": "77"},
			wantLog: "gc_percent_from=\"GOGC environment variable\""},
		{name: "GOMEMLIMIT wins", cfg: RuntimeConfig{GCPercent: 150, MemoryLimitRatio: 0.5}, env: map[string]string{"GOMEMLIMIT": "1GiB"},
			limit:  func() (uint64, error) { t.Error("the limit was read although GOMEMLIMIT is set"); return 0, nil },
			wantGC: 150, wantLog: "memory_limit_from=\"GOMEMLIMIT environment variable\""},
		{name: "ratio 0 leaves the limit", cfg: RuntimeConfig{GCPercent: 200}, limit: limitOf(1000 * mib),
			wantGC: 200, wantLog: "runtime.memory_limit_ratio: 0"},
		{name: "a floor of its own", cfg: RuntimeConfig{GCPercent: 150, GCMinHeapMiB: 256}, limit: noLimit,
			wantGC: 150, wantLog: "gc_min_heap_mib=256", wantFloor: 256 * mib},
		{name: "a floor held under half the memory limit", cfg: RuntimeConfig{GCPercent: 100, GCMinHeapMiB: 256, MemoryLimitRatio: 0.9}, limit: limitOf(200 * mib),
			wantGC: 100, wantLimit: 180 * mib, wantLog: "gc_min_heap_mib=90", wantFloor: 90 * mib},
		{name: "no cgroup", cfg: RuntimeConfig{GCPercent: 200, MemoryLimitRatio: 0.9}, limit: failing,
			wantGC: 200, wantLog: "no cgroup here"},
		{name: "AUTOMEMLIMIT overrides the ratio", cfg: DefaultRuntimeConfig(), env: map[string]string{"AUTOMEMLIMIT": "0.5"}, limit: limitOf(1000 * mib),
			wantGC: 100, wantLimit: 500 * mib, wantLog: "0.5 of the cgroup memory limit (AUTOMEMLIMIT)", wantFloor: 32 * mib},
		{name: "AUTOMEMLIMIT off", cfg: DefaultRuntimeConfig(), env: map[string]string{"AUTOMEMLIMIT": "off"}, limit: limitOf(1000 * mib),
			wantGC: 100, wantLog: "off (AUTOMEMLIMIT=off)", wantFloor: 32 * mib},
		{name: "AUTOMEMLIMIT that is no ratio", cfg: DefaultRuntimeConfig(), env: map[string]string{"AUTOMEMLIMIT": "lots"}, limit: limitOf(1000 * mib),
			wantGC: 100, wantLog: `AUTOMEMLIMIT=\"lots\" is neither`, wantFloor: 32 * mib},
		{name: "a cgroup without a limit", cfg: RuntimeConfig{GCPercent: 200, MemoryLimitRatio: 0.9}, limit: noLimit,
			wantGC: 200, wantLog: "memory_limit_from=\"no memory limit found\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer debug.SetGCPercent(debug.SetGCPercent(77))
			defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
			if a, ok := tc.env["AUTOMEMLIMIT"]; ok {
				t.Setenv("AUTOMEMLIMIT", a) // memlimit.Set reads it from the process
			}
			var logs bytes.Buffer
			getenv := func(k string) string { return tc.env[k] }
			services := tc.services
			if services == 0 {
				services = 4
			}
			floor := tuneRuntime(tc.cfg, services, getenv, tc.limit, slog.New(slog.NewTextHandler(&logs, nil)))
			switch {
			case tc.wantFloor == 0 && floor != nil:
				t.Errorf("heap floor of %d MiB, want none", floor.floor/mib)
			case tc.wantFloor != 0 && floor == nil:
				t.Errorf("no heap floor, want %d MiB", tc.wantFloor/mib)
			case floor != nil && (floor.floor != tc.wantFloor || floor.base != tc.cfg.GCPercent || floor.current != tc.cfg.GCPercent):
				t.Errorf("heap floor %d MiB over GOGC %d (now %d), want %d MiB over %d", floor.floor/mib, floor.base, floor.current, tc.wantFloor/mib, tc.cfg.GCPercent)
			}

			wantGC := tc.wantGC
			if wantGC == 0 {
				wantGC = 77
			}
			if got := gcPercent(); got != wantGC {
				t.Errorf("GC percent = %d, want %d", got, wantGC)
			}
			wantLimit := tc.wantLimit
			if wantLimit == 0 {
				wantLimit = math.MaxInt64
			}
			if got := debug.SetMemoryLimit(-1); got != wantLimit {
				t.Errorf("memory limit = %d MiB, want %d MiB", got/mib, wantLimit/mib)
			}
			if !strings.Contains(logs.String(), tc.wantLog) {
				t.Errorf("log %q does not say %q", logs.String(), tc.wantLog)
			}
		})
	}
}

func TestRuntimeConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  RuntimeConfig
		want string // "" for valid
	}{
		{cfg: DefaultRuntimeConfig()},
		{cfg: RuntimeConfig{GCPercent: 100, MemoryLimitRatio: 1}},
		{cfg: RuntimeConfig{GCPercent: 0, MemoryLimitRatio: 0.9}, want: "gc_percent: must be positive"},
		{cfg: RuntimeConfig{GCPercent: 100, GCMinHeapMiB: HeapFloorAuto}},
		{cfg: RuntimeConfig{GCPercent: 100, GCMinHeapMiB: -2}, want: "gc_min_heap_mib: want -1 (by the services the process runs), 0 (off) or up to 1048576, got -2"},
		{cfg: RuntimeConfig{GCPercent: 100, GCMinHeapMiB: maxMinHeapMiB + 1}, want: "gc_min_heap_mib"},
		{cfg: RuntimeConfig{GCPercent: 200, MemoryLimitRatio: 1.5}, want: "memory_limit_ratio: want 0 (off) or a share in (0, 1]"},
		{cfg: RuntimeConfig{GCPercent: 200, MemoryLimitRatio: -0.1}, want: "memory_limit_ratio"},
		{cfg: RuntimeConfig{GCPercent: 200, MemoryLimitRatio: math.NaN()}, want: "memory_limit_ratio"},
	} {
		err := tc.cfg.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.cfg, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: error %v, want one saying %q", tc.cfg, err, tc.want)
		}
	}
}

func TestGCPercentFor(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name       string
		heap       heapShape
		floor      uint64
		base, want int
	}{
		{name: "the mesh at 2000/s", heap: heapShape{live: 13 * mib}, floor: 64 * mib, base: 100, want: 400},
		{name: "stacks and globals count", heap: heapShape{live: 13 * mib, roots: 3 * mib}, floor: 64 * mib, base: 100, want: 325},
		{name: "an exact step stays", heap: heapShape{live: 8 * mib}, floor: 64 * mib, base: 100, want: 700},
		{name: "live heap over the floor", heap: heapShape{live: 500 * mib}, floor: 64 * mib, base: 100, want: 100},
		{name: "live heap at the floor", heap: heapShape{live: 64 * mib}, floor: 64 * mib, base: 100, want: 100},
		{name: "configured GOGC already reaches the floor", heap: heapShape{live: 30 * mib}, floor: 64 * mib, base: 300, want: 300},
		{name: "tiny live heap: Go's minimum heap reaches it first", heap: heapShape{live: 1 * mib}, floor: 64 * mib, base: 100, want: 1600},
		{name: "nothing read yet", floor: 64 * mib, base: 100, want: 1600},
		{name: "huge floor", heap: heapShape{live: 4 * mib}, floor: maxMinHeapMiB * mib, base: 100, want: 26214300},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := gcPercentFor(tc.heap, tc.floor, tc.base)
			if got != tc.want {
				t.Fatalf("gcPercentFor(%+v, %d MiB, %d) = %d, want %d", tc.heap, tc.floor/mib, tc.base, got, tc.want)
			}
			// The goal as the runtime computes it (mgcpacer.go's commit) reaches the
			// floor, unless GOGC is the configured one.
			g := uint64(got)
			goal := max(tc.heap.live+(tc.heap.live+tc.heap.roots)*g/100, minHeapPer100*g/100)
			if goal < tc.floor && got != tc.base {
				t.Errorf("goal %d MiB under the floor", goal/mib)
			}
			// And a GOGC a step lower would not have.
			if lower := g - 25; got != tc.base && lower > uint64(tc.base) {
				if goal := max(tc.heap.live+(tc.heap.live+tc.heap.roots)*lower/100, minHeapPer100*lower/100); goal >= tc.floor {
					t.Errorf("GOGC %d already reaches the floor (goal %d MiB); %d is more than needed", lower, goal/mib, got)
				}
			}
		})
	}
}

// TestHeapFloorFollowsTheLiveHeap runs the floor over collections that find a live heap
// growing past the floor and shrinking again: GOGC rises, falls to the configured value
// and rises again, is set only when it changes, each time after a new collection, and is
// restored when the process stops.
func TestHeapFloorFollowsTheLiveHeap(t *testing.T) {
	const mib = 1 << 20
	lives := []uint64{13 * mib, 13 * mib, 200 * mib, 8 * mib}
	read := make(chan uint64)       // each reading of the heap, handed over by the test
	finished := make(chan struct{}) // after the last: collections the runtime starts itself
	last := lives[len(lives)-1]     // read this, which changes nothing
	var sets []int
	var cycles []uint64 // the collection each reading followed
	f := &heapFloor{floor: 64 * mib, base: 100, current: 100,
		read: func() heapShape {
			select {
			case l := <-read:
				cycles = append(cycles, gcCycles())
				return heapShape{live: l}
			case <-finished:
				return heapShape{live: last}
			}
		},
		set: func(p int) int { sets = append(sets, p); return 0 }}
	started := make(chan func(), 1) // start returns once it has taken the first reading
	go func() { started <- f.start() }()
	for i, live := range lives {
		if i > 0 {
			// The reading before was taken after the floor had marked this collection.
			runtime.GC()
		}
		select {
		case read <- live:
		case <-time.After(time.Minute): // a guard, not a wait: the handover is immediate when it works
			t.Fatalf("reading %d was never taken: the floor did not run after collection %d", i, gcCycles())
		}
	}
	close(finished)
	(<-started)()
	f.mu.Lock()
	defer f.mu.Unlock()
	// 13 MiB: 400 (once, not again for the second reading); 200 MiB: back to 100; 8 MiB:
	// 700; stopping: 100.
	if want := []int{400, 100, 700, 100}; !slices.Equal(sets, want) {
		t.Fatalf("GOGC set to %v, want %v", sets, want)
	}
	for i := 1; i < len(cycles); i++ {
		if cycles[i] <= cycles[i-1] {
			t.Errorf("readings %d and %d both followed collection %d: want one reading per collection", i-1, i, cycles[i])
		}
	}
}

func gcCycles() uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// The automatic heap floor counts the request-path services a process runs.
func TestRequestServices(t *testing.T) {
	for _, tc := range []struct {
		target string
		want   int
	}{
		{"all", 4},
		{"router", 1},
		{"cache,quota", 2},
		{"router,cache,quota,verifier", 4},
		{"agent", 0},
	} {
		if got := (Config{Target: tc.target}).requestServices(); got != tc.want {
			t.Errorf("target %q: %d request services, want %d", tc.target, got, tc.want)
		}
	}
}

// TestHeapFloorFollowsTheServices: the automatic floor is the router's 16 MiB for one
// service and twice that for all four, whose requests allocate about twice as much; a
// configured floor is taken as it is.
func TestHeapFloorFollowsTheServices(t *testing.T) {
	for services, want := range map[int]int{0: 16, 1: 16, 2: 21, 3: 26, 4: 32} {
		if got := DefaultRuntimeConfig().heapFloorMiB(services); got != want {
			t.Errorf("%d services: floor %d MiB, want %d", services, got, want)
		}
	}
	if got := (RuntimeConfig{GCMinHeapMiB: 100}).heapFloorMiB(4); got != 100 {
		t.Errorf("a configured floor of 100 MiB became %d", got)
	}
}
