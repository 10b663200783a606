package benchload

import (
	"context"
	"testing"
	"time"

	"github.com/mantle-mesh/mantle/services/router"
)

func TestRunModes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a mesh per mode")
	}
	t.Parallel()
	for _, mode := range Modes() {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			cfg := Config{Mode: mode, Rates: []float64{50, 100}, Duration: 300 * time.Millisecond, Warmup: 100 * time.Millisecond}
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
				if r.Requests != want || r.OK+r.Errors+r.Shed != r.Requests {
					t.Errorf("%g/s: %d requests (%d ok, %d errors, %d shed), want %d", r.Rate, r.Requests, r.OK, r.Errors, r.Shed, want)
				}
				if r.Errors != 0 {
					t.Errorf("%g/s: %d errors, first: %s", r.Rate, r.Errors, r.FirstError)
				}
				if r.OK > 0 && !(r.P50Ms <= r.P90Ms && r.P90Ms <= r.P99Ms && r.P99Ms <= r.MaxMs) {
					t.Errorf("%g/s: percentiles out of order: %+v", r.Rate, r)
				}
				if r.PeakRSSMB <= 0 || r.CPUPer1000 < 0 {
					t.Errorf("%g/s: RSS %v MiB, CPU %v s per 1000", r.Rate, r.PeakRSSMB, r.CPUPer1000)
				}
			}
		})
	}
}

func TestMeshConfig(t *testing.T) {
	t.Parallel()
	if _, err := MeshConfig(Direct, "http://x/v1"); err == nil {
		t.Error("the direct mode has no mesh configuration")
	}
	for _, mode := range []Mode{RouterOnly, All} {
		cfg, err := MeshConfig(mode, "http://upstream/v1")
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: configuration does not validate: %v", mode, err)
		}
		if got := cfg.Router.Providers[0].BaseURL; got != "http://upstream/v1" {
			t.Errorf("%s: provider at %q", mode, got)
		}
	}
	cfg, _ := MeshConfig(RouterOnly, "http://upstream/v1")
	if r := cfg.Router; cfg.Target != "router" || r.QuotaAddress != router.Off || r.CacheAddress != router.Off || r.VerifierAddress != router.Off {
		t.Errorf("router-only: target %q, quota %q, cache %q, verifier %q; want the router alone with the others off",
			cfg.Target, r.QuotaAddress, r.CacheAddress, r.VerifierAddress)
	}
}

func TestRunRejectsEmptyConfig(t *testing.T) {
	t.Parallel()
	if _, err := Run(context.Background(), Config{Mode: Direct}); err == nil {
		t.Error("Run without rates succeeded")
	}
}
