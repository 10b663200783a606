package mesh

import (
	"bytes"
	"errors"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"strings"
	"testing"

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
	limitOf := func(bytes uint64) memlimit.Provider { return memlimit.Limit(bytes) }
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
	}{
		{name: "defaults under a cgroup limit", cfg: DefaultRuntimeConfig(), limit: limitOf(1000 * mib),
			wantGC: 100, wantLimit: 900 * mib, wantLog: "memory_limit_mib=900"},
		{name: "GOGC wins", cfg: RuntimeConfig{GCPercent: 300}, env: map[string]string{"GOGC": "77"},
			wantLog: "gc_percent_from=\"GOGC environment variable\""},
		{name: "GOMEMLIMIT wins", cfg: RuntimeConfig{GCPercent: 150, MemoryLimitRatio: 0.5}, env: map[string]string{"GOMEMLIMIT": "1GiB"},
			limit:  func() (uint64, error) { t.Error("the limit was read although GOMEMLIMIT is set"); return 0, nil },
			wantGC: 150, wantLog: "memory_limit_from=\"GOMEMLIMIT environment variable\""},
		{name: "ratio 0 leaves the limit", cfg: RuntimeConfig{GCPercent: 200}, limit: limitOf(1000 * mib),
			wantGC: 200, wantLog: "runtime.memory_limit_ratio: 0"},
		{name: "no cgroup", cfg: RuntimeConfig{GCPercent: 200, MemoryLimitRatio: 0.9}, limit: failing,
			wantGC: 200, wantLog: "no cgroup here"},
		{name: "AUTOMEMLIMIT overrides the ratio", cfg: DefaultRuntimeConfig(), env: map[string]string{"AUTOMEMLIMIT": "0.5"}, limit: limitOf(1000 * mib),
			wantGC: 100, wantLimit: 500 * mib, wantLog: "0.5 of the cgroup memory limit (AUTOMEMLIMIT)"},
		{name: "AUTOMEMLIMIT off", cfg: DefaultRuntimeConfig(), env: map[string]string{"AUTOMEMLIMIT": "off"}, limit: limitOf(1000 * mib),
			wantGC: 100, wantLog: "off (AUTOMEMLIMIT=off)"},
		{name: "AUTOMEMLIMIT that is no ratio", cfg: DefaultRuntimeConfig(), env: map[string]string{"AUTOMEMLIMIT": "lots"}, limit: limitOf(1000 * mib),
			wantGC: 100, wantLog: `AUTOMEMLIMIT=\"lots\" is neither`},
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
			tuneRuntime(tc.cfg, getenv, tc.limit, slog.New(slog.NewTextHandler(&logs, nil)))

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
