//go:build !nolab

package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/sim"
)

func simCommand(ctx context.Context, args []string, env cmdEnv) error {
	stdout, stderr := env.stdout, env.stderr
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8081", "listen address")
	profile := fs.String("profile", "healthy", "built-in profile: "+strings.Join(sim.ProfileNames(), ", "))
	profileFile := fs.String("profile-file", "", "YAML profile file (overrides --profile)")
	seed := fs.Int64("seed", 1, "random seed; the same seed replays the same run")
	models := fs.String("models", "sim-primary,sim-backup,sim-small", "comma list of model names GET /v1/models lists (any name is accepted)")
	timeScale := fs.Float64("time-scale", 0, "multiply latencies and phase times by this factor (0 keeps the profile's)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	prof, ok := sim.Builtin(*profile)
	if *profileFile != "" {
		f, err := os.Open(*profileFile)
		if err != nil {
			return fmt.Errorf("--profile-file: %w", err)
		}
		defer f.Close()
		if prof, err = sim.LoadProfile(f); err != nil {
			return fmt.Errorf("--profile-file %s: %w", *profileFile, err)
		}
	} else if !ok {
		return fmt.Errorf("--profile: unknown profile %q (have %s)", *profile, strings.Join(sim.ProfileNames(), ", "))
	}
	if *timeScale < 0 {
		return fmt.Errorf("--time-scale: must not be negative, got %g", *timeScale)
	}
	if *timeScale > 0 {
		prof.TimeScale = *timeScale
	}
	log := mesh.NewLogger(mesh.LogConfig{Level: "info", Format: "text"}, stderr)
	listed := map[string]sim.Profile{}
	for _, name := range strings.Split(*models, ",") {
		if name = strings.TrimSpace(name); name != "" {
			listed[name] = prof
		}
	}
	srv := sim.NewServer(sim.ServerConfig{Models: listed, Default: prof, Seed: *seed, Log: log})
	bound, wait, err := sim.Start(ctx, *addr, srv, log)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "sim provider (profile %s) listening on http://%s/v1\n", prof.Name, bound)
	return wait()
}
