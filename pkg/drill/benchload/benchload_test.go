package benchload

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/procusage"
	"github.com/mantle-mesh/mantle/services/router"
)

func TestRunModes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a mesh per mode")
	}
	t.Parallel()
	for _, mode := range Modes() {
		for _, stream := range []bool{false, true} {
			name := string(mode)
			if stream {
				name += "/streamed"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				runModeAndCheck(t, Config{Mode: mode, Stream: stream, Rates: []float64{50, 100}, Duration: 300 * time.Millisecond, Warmup: 100 * time.Millisecond})
			})
		}
	}
}

// runModeAndCheck runs cfg and checks that every figure of its results is consistent.
func runModeAndCheck(t *testing.T, cfg Config) {
	t.Helper()
	mode := cfg.Mode
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(res) != 2 {
		t.Fatalf("%d results, want one per rate", len(res))
	}
	for i, r := range res {
		if r.Mode != mode || r.Rate != cfg.Rates[i] {
			t.Errorf("result %d is %s at %g, want %s at %g", i, r.Mode, r.Rate, mode, cfg.Rates[i])
		}
		want := int(cfg.Rates[i] * cfg.Duration.Seconds())
		if r.Requests != want || r.OK+r.Errors+r.Refused+r.Shed != r.Requests {
			t.Errorf("%g/s: %d requests (%d ok, %d errors, %d refused, %d shed), want %d", r.Rate, r.Requests, r.OK, r.Errors, r.Refused, r.Shed, want)
		}
		if r.Errors != 0 {
			t.Errorf("%g/s: %d errors, first: %s", r.Rate, r.Errors, r.FirstError)
		}
		if r.AnsweredRate <= 0 || r.AnsweredRate > r.AchievedRate*1.0001 {
			t.Errorf("%g/s: answered %v/s, sent %v/s; want answered in (0, sent]", r.Rate, r.AnsweredRate, r.AchievedRate)
		}
		if r.OK > 0 && !(r.P50Ms <= r.P90Ms && r.P90Ms <= r.P99Ms && r.P99Ms <= r.MaxMs) {
			t.Errorf("%g/s: percentiles out of order: %+v", r.Rate, r)
		}
		if r.PeakRSSMB <= 0 || r.CPUPer1000 < 0 {
			t.Errorf("%g/s: RSS %v MiB, CPU %v s per 1000", r.Rate, r.PeakRSSMB, r.CPUPer1000)
		}
		// The mesh says what it spent of each answer; its own time is part of the latency.
		// Streamed answers carry no Server-Timing header: their headers go out before the
		// work is done.
		switch hasMesh := (mode == RouterOnly || mode == All) && !cfg.Stream; {
		case hasMesh && (r.OwnP50Ms <= 0 || r.OwnP50Ms > r.OwnP90Ms || r.OwnP90Ms > r.OwnP99Ms || r.OwnP99Ms > r.MaxMs):
			t.Errorf("%g/s: own time p50 %v, p90 %v, p99 %v ms (latency max %v): want positive, in order, under the latency", r.Rate, r.OwnP50Ms, r.OwnP90Ms, r.OwnP99Ms, r.MaxMs)
		case !hasMesh && r.OwnP99Ms != 0:
			t.Errorf("%g/s: own time p99 %v ms from a mode without a mesh or a stream", r.Rate, r.OwnP99Ms)
		}
		// At these rates no store waits for a worker, and only the whole mesh has a cache.
		if r.StoresShed != 0 {
			t.Errorf("%g/s: %d stores shed, want none", r.Rate, r.StoresShed)
		}
		if r.HopPeakRSSMB != 0 || r.HopCPUPer1000 != 0 {
			t.Errorf("%g/s: hop RSS %v MiB, CPU %v s per 1000; want none: the hop shares this process", r.Rate, r.HopPeakRSSMB, r.HopCPUPer1000)
		}
		// A stream's first event comes before its end; without streaming there is none.
		switch {
		case cfg.Stream && !(r.FirstP50Ms > 0 && r.FirstP50Ms <= r.FirstP99Ms && r.FirstP99Ms <= r.MaxMs):
			t.Errorf("%g/s: first event p50 %v, p99 %v ms (latency max %v): want positive, in order, under the latency", r.Rate, r.FirstP50Ms, r.FirstP99Ms, r.MaxMs)
		case !cfg.Stream && (r.FirstP50Ms != 0 || r.FirstP99Ms != 0):
			t.Errorf("%g/s: first event p50 %v, p99 %v ms without streaming", r.Rate, r.FirstP50Ms, r.FirstP99Ms)
		}
	}
}

// TestSendTellsRefusalsFromErrors: a 503 OVERLOADED answer is the mesh shedding load, which
// the benchmark counts apart from errors; any other failure is an error.
func TestSendTellsRefusalsFromErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		status  int
		body    string
		refused bool
		ok      bool
	}{
		{"answer", http.StatusOK, `{"choices":[]}`, false, true},
		{"stream", http.StatusOK, "data: {\"choices\":[]}\n\ndata: [DONE]\n\n", false, true},
		{"stream cut short", http.StatusOK, "data: {\"choices\":[]}\n\n", false, false},
		{"stream with an error event", http.StatusOK, "data: {\"choices\":[]}\n\ndata: {\"error\":{\"code\":\"upstream_error\"}}\n\ndata: [DONE]\n\n", false, false},
		{"overloaded", http.StatusServiceUnavailable, `{"error":{"code":"overloaded","message":"retry after 1s"}}`, true, false},
		{"no candidate", http.StatusServiceUnavailable, `{"error":{"code":"all_candidates_failed","message":"no"}}`, false, false},
		{"rate limited", http.StatusTooManyRequests, `{"error":{"code":"quota_exhausted","message":"no"}}`, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				if strings.HasPrefix(tc.body, "data:") {
					w.Header().Set("Content-Type", "text/event-stream")
				}
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.body)
			}))
			defer srv.Close()
			_, _, err := send(context.Background(), srv.Client(), srv.URL, []byte(`{}`))
			if (err == nil) != tc.ok || errors.Is(err, errRefused) != tc.refused {
				t.Errorf("send: %v, want ok %v, refused %v", err, tc.ok, tc.refused)
			}
		})
	}
}

func TestServerTiming(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		header string
		want   time.Duration
	}{
		{"mantle;dur=0.412, upstream;dur=12.3", 412 * time.Microsecond},
		{"upstream;dur=12.3, mantle;desc=\"own time\";dur=2", 2 * time.Millisecond},
		{"mantle ; dur=1.5", 1500 * time.Microsecond},
		{"mantlex;dur=1", -1},
		{"upstream;dur=12.3", -1},
		{"mantle", -1},
		{"mantle;dur=fast", -1},
		{"mantle;dur=-1", -1},
		{"mantle;dur=NaN", -1},
		{"mantle;dur=+Inf", -1},
		{"", -1},
	} {
		if got := serverTiming(tc.header, "mantle"); got != tc.want {
			t.Errorf("serverTiming(%q) = %v, want %v", tc.header, got, tc.want)
		}
	}
}

// userConfig is a production-like configuration: remote services, authentication, TLS,
// real providers, routes over them, tenant limits and budgets, the LLM judge, and cache
// and verifier settings of its own.
const userConfig = `
target: router
server: {grpc_listen_address: "0.0.0.0:9090", http_listen_address: "0.0.0.0:8080"}
tls: {cert_file: /etc/mantle/tls.crt, key_file: /etc/mantle/tls.key, ca_file: /etc/mantle/ca.crt}
auth:
  tenants: [{id: acme, key_env: ACME_KEY}]
router:
  cache_address: "cache:9090"
  quota_address: "quota:9090"
  providers:
    - {name: openai, type: openai, base_url: "https://api.openai.com/v1", keys: [{id: k1, env: OPENAI_API_KEY}]}
  models: [{name: gpt-4o, provider: openai}]
  routes: [{name: chat, candidates: [gpt-4o]}]
cache: {max_bytes: 1048576}
quota:
  tenants: {default: {rpm: 1}}
  model_limits: {"*": {gpt-4o: {rpm: 1}}}
  budgets: {tenants: {default: {daily_usd: 0.01}}}
verifier:
  l3: {workers: 3, judge: {enabled: true}}
`

func TestMeshConfig(t *testing.T) {
	t.Parallel()
	user := mesh.Default()
	if err := user.Decode(strings.NewReader(userConfig)); err != nil {
		t.Fatal(err)
	}
	if _, err := MeshConfig(Direct, "http://x/v1", mesh.Default()); err == nil {
		t.Error("the direct mode has no mesh configuration")
	}
	for _, base := range []struct {
		name string
		cfg  mesh.Config
	}{{"defaults", mesh.Default()}, {"a user's file", user}} {
		for _, mode := range []Mode{RouterOnly, All} {
			cfg, err := MeshConfig(mode, "http://upstream/v1", base.cfg)
			if err != nil {
				t.Fatalf("%s, %s: %v", base.name, mode, err)
			}
			if err := cfg.Validate(); err != nil {
				t.Errorf("%s, %s: configuration does not validate: %v", base.name, mode, err)
			}
			r := cfg.Router
			if len(r.Providers) != 1 || r.Providers[0].BaseURL != "http://upstream/v1" || len(r.Models) != 1 || r.Models[0].Name != ModelName || len(r.Routes) != 0 {
				t.Errorf("%s, %s: providers %v, models %v, routes %v; want the upstream's one model", base.name, mode, r.Providers, r.Models, r.Routes)
			}
			if cfg.Server.HTTPListenAddress != "127.0.0.1:0" || len(cfg.Auth.Tenants) != 0 || cfg.TLS.CertFile != "" {
				t.Errorf("%s, %s: listens on %s, %d tenant keys, TLS %q; want a loopback port of its own, no keys, no TLS",
					base.name, mode, cfg.Server.HTTPListenAddress, len(cfg.Auth.Tenants), cfg.TLS.CertFile)
			}
			if q := cfg.Quota; len(q.Tenants) != 0 || len(q.ModelLimits) != 0 || len(q.Budgets.Tenants) != 0 || q.DefaultLimits.RPM < 1_000_000 {
				t.Errorf("%s, %s: quota %+v; want no tenant limit the load could meet", base.name, mode, q)
			}
			if cfg.Verifier.L3.Judge.Enabled {
				t.Errorf("%s, %s: the judge is on with no route to a model", base.name, mode)
			}
			wantTarget, wantCache := "all", ""
			if mode == RouterOnly {
				wantTarget, wantCache = "router", router.Off
			}
			if cfg.Target != wantTarget || r.CacheAddress != wantCache || r.QuotaAddress != wantCache || r.VerifierAddress != wantCache {
				t.Errorf("%s, %s: target %q, quota %q, cache %q, verifier %q; want %q with the others at %q",
					base.name, mode, cfg.Target, r.QuotaAddress, r.CacheAddress, r.VerifierAddress, wantTarget, wantCache)
			}
			if base.name == "a user's file" && (cfg.Cache.MaxBytes != 1<<20 || cfg.Verifier.L3.Workers != 3) {
				t.Errorf("%s, %s: cache.max_bytes %d, l3.workers %d; want the file's", base.name, mode, cfg.Cache.MaxBytes, cfg.Verifier.L3.Workers)
			}
		}
	}
}

// TestReplaced: the settings of a user's file that the benchmark replaces are named, by
// mode; a setting the file leaves at its default, or that the benchmark keeps, is not.
func TestReplaced(t *testing.T) {
	t.Parallel()
	user := mesh.Default()
	if err := user.Decode(strings.NewReader(userConfig)); err != nil {
		t.Fatal(err)
	}
	common := []string{"tls.cert_file", "tls.key_file", "tls.ca_file", "auth.tenants",
		"router.providers", "router.models", "router.routes",
		"quota.tenants", "quota.model_limits", "quota.budgets.tenants", "verifier.l3.judge.enabled"}
	for _, tt := range []struct {
		mode Mode
		want []string
	}{
		{All, append([]string{"target", "router.cache_address", "router.quota_address"}, common...)},
		{RouterOnly, append([]string{"router.cache_address", "router.quota_address"}, common...)},
	} {
		got, err := Replaced(tt.mode, user)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		slices.Sort(tt.want)
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: replaced %q, want %q", tt.mode, got, tt.want)
		}
		if none, _ := Replaced(tt.mode, mesh.Default()); len(none) != 0 {
			t.Errorf("%s: the defaults have %q replaced, want nothing", tt.mode, none)
		}
	}
}

// TestCompareInterleaves: every mode gets a window at every rate in every round, the
// results come back grouped by mode, rate and round, every request of every window is
// answered, and the proxy's windows, only they, are measured in a hop process of their own.
func TestCompareInterleaves(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a hop process")
	}
	t.Parallel()
	cfg := Config{Rates: []float64{40, 80}, Duration: 250 * time.Millisecond, HopCommand: hopCommand}
	res, err := Compare(context.Background(), cfg, []Mode{Direct, Proxy}, 3)
	if err != nil {
		t.Fatalf("Compare: %v", err)
	}
	type window struct {
		mode  Mode
		rate  float64
		round int
	}
	var got, want []window
	for _, mode := range []Mode{Direct, Proxy} {
		for _, rate := range cfg.Rates {
			for round := 1; round <= 3; round++ {
				want = append(want, window{mode, rate, round})
			}
		}
	}
	for _, r := range res {
		got = append(got, window{r.Mode, r.Rate, r.Round})
		if wantOK := int(r.Rate * cfg.Duration.Seconds()); r.OK != wantOK || r.Errors != 0 {
			t.Errorf("%s at %g/s, round %d: %d ok, %d errors (first: %s), want %d ok", r.Mode, r.Rate, r.Round, r.OK, r.Errors, r.FirstError, wantOK)
		}
		if measured := r.HopPeakRSSMB > 0 && r.HopCPUPer1000 > 0; measured != (r.Mode == Proxy) {
			t.Errorf("%s at %g/s, round %d: hop RSS %v MiB, CPU %v s per 1000; want a hop process for the proxy only", r.Mode, r.Rate, r.Round, r.HopPeakRSSMB, r.HopCPUPer1000)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("windows %v, want %v", got, want)
	}
}

// TestTurn: the modes take their windows in order in the first round and in reverse in
// the second, so that the mode after each one changes from round to round.
func TestTurn(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		n, round int
		want     []int
	}{
		{1, 0, []int{0}},
		{1, 1, []int{0}},
		{3, 0, []int{0, 1, 2}},
		{3, 1, []int{2, 1, 0}},
		{3, 2, []int{0, 1, 2}},
		{4, 3, []int{3, 2, 1, 0}},
	} {
		var got []int
		for k := range tt.n {
			got = append(got, turn(k, tt.n, tt.round))
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%d modes, round %d: turns %v, want %v", tt.n, tt.round, got, tt.want)
		}
	}
}

func TestCompareRejectsNoRounds(t *testing.T) {
	t.Parallel()
	cfg := Config{Rates: []float64{40}, Duration: time.Second}
	for _, tt := range []struct {
		modes  []Mode
		rounds int
	}{{[]Mode{Direct}, 0}, {nil, 1}} {
		if _, err := Compare(context.Background(), cfg, tt.modes, tt.rounds); err == nil {
			t.Errorf("Compare(%v, %d rounds) succeeded", tt.modes, tt.rounds)
		}
	}
}

func TestRunRejectsEmptyConfig(t *testing.T) {
	t.Parallel()
	if _, err := Run(context.Background(), Config{Mode: Direct}); err == nil {
		t.Error("Run without rates succeeded")
	}
}

// TestMain lets this test binary stand in for "mantle bench-load --serve-hop" (see
// hopCommand).
func TestMain(m *testing.M) {
	if mode := os.Getenv("BENCHLOAD_HOP_MODE"); mode != "" {
		err := ServeHop(context.Background(), Mode(mode), os.Getenv("BENCHLOAD_HOP_UPSTREAM"), mesh.Default(), os.Stdin, os.Stdout, io.Discard)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// hopCommand runs this test binary as the hop's process (see TestMain).
func hopCommand(ctx context.Context, mode Mode, upstreamAddr string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), "BENCHLOAD_HOP_MODE="+string(mode), "BENCHLOAD_HOP_UPSTREAM="+upstreamAddr)
	cmd.Stderr = os.Stderr
	return cmd
}

func TestRunWithHopProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process per mode")
	}
	t.Parallel()
	for _, mode := range []Mode{Proxy, RouterOnly} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			cfg := Config{Mode: mode, Rates: []float64{100}, Duration: 300 * time.Millisecond, HopCommand: hopCommand}
			res, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if len(res) != 1 {
				t.Fatalf("%d results, want 1", len(res))
			}
			r := res[0]
			if r.OK != 30 || r.Errors != 0 {
				t.Errorf("%d ok, %d errors (first: %s), want 30 ok", r.OK, r.Errors, r.FirstError)
			}
			// The hop's own process served every request: it has a resident set and used
			// CPU, which the total counts.
			if r.HopPeakRSSMB <= 0 || r.HopCPUPer1000 <= 0 || r.CPUPer1000 < r.HopCPUPer1000 {
				t.Errorf("hop RSS %v MiB, hop CPU %v s per 1000, total CPU %v: want the hop's process measured and counted",
					r.HopPeakRSSMB, r.HopCPUPer1000, r.CPUPer1000)
			}
			// Its threads waited for the requests between them: the switches are its own.
			if _, measured := procusage.Switches(); measured && r.HopSwitchesPerRequest <= 0 {
				t.Errorf("hop switches per request %v, want the hop's process's measured", r.HopSwitchesPerRequest)
			}
		})
	}
}

func TestServeHopRefuses(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := ServeHop(context.Background(), Direct, "127.0.0.1:1", mesh.Default(), strings.NewReader(""), &out, io.Discard); err == nil {
		t.Error("ServeHop(Direct) succeeded; the direct mode has no hop")
	}
	err := ServeHop(context.Background(), Proxy, "127.0.0.1:1", mesh.Default(), strings.NewReader("usage\nreboot\n"), &out, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `unknown request "reboot"`) {
		t.Errorf("ServeHop with an unknown request: %v", err)
	}
	// Before failing it said where it serves and answered the usage request.
	dec := json.NewDecoder(&out)
	var ready hopReady
	var u hopUsage
	if err := dec.Decode(&ready); err != nil || !strings.HasPrefix(ready.URL, "http://127.0.0.1:") {
		t.Errorf("ready line %+v, %v", ready, err)
	}
	if err := dec.Decode(&u); err != nil || u.CPUNanos <= 0 {
		t.Errorf("usage line %+v, %v", u, err)
	}
}

// TestCounterValue: the stores-shed figure is the counter's value summed over its series,
// and zero from a registry that has no such counter (the proxy's, a mesh without a router).
func TestCounterValue(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		series map[string]float64 // label value -> count; nil registers nothing
		want   int64
	}{
		{name: "absent", want: 0},
		{name: "one series", series: map[string]float64{"": 7}, want: 7},
		{name: "summed over series", series: map[string]float64{"a": 2, "b": 5}, want: 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			other := prometheus.NewCounter(prometheus.CounterOpts{Name: "mantle_other_total", Help: "not it"})
			other.Add(100)
			reg.MustRegister(other)
			if tc.series != nil {
				vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: storesShedMetric, Help: "stores shed"}, []string{"l"})
				for l, n := range tc.series {
					vec.WithLabelValues(l).Add(n)
				}
				reg.MustRegister(vec)
			}
			got, err := counterValue(reg, storesShedMetric)
			if err != nil || got != tc.want {
				t.Errorf("counterValue = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

// TestProcessHopReadsStoresShed: the hop process's usage line carries the mesh's stores
// shed and its GOMAXPROCS, and the benchmark reads them with the process's usage.
func TestProcessHopReadsStoresShed(t *testing.T) {
	t.Parallel()
	line := `{"cpu_ns":1500000,"max_rss_mib":42,"switches":9,"stores_shed":13,"gomaxprocs":3}` + "\n"
	h := &processHop{stdin: nopWriteCloser{io.Discard}, dec: json.NewDecoder(strings.NewReader(line))}
	got, err := h.usage()
	want := hopReading{rusage: rusage{cpu: 1500 * time.Microsecond, maxRSSMiB: 42, switches: 9}, storesShed: 13, procs: 3}
	if err != nil || got != want {
		t.Errorf("usage = %+v, %v; want %+v", got, err, want)
	}
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
