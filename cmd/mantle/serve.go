package main

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/mantle-mesh/mantle/pkg/mesh"
)

func serve(ctx context.Context, args []string, env cmdEnv) error {
	stdout, stderr := env.stdout, env.stderr
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	flags := mesh.RegisterFlags(fs)
	reloadEvery := fs.Duration("config.reload-interval", 10*time.Second, "how often the config file is checked for changes (0: only on SIGHUP)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := mesh.Load(flags)
	if err != nil {
		return err
	}
	if flags.PrintConfig {
		out, err := cfg.YAML()
		if err != nil {
			return err
		}
		_, err = stdout.Write(out)
		return err
	}
	p, err := mesh.Start(ctx, cfg, mesh.Options{LogOutput: stderr, TuneRuntime: true, RouteLibraryLogs: true, Getenv: env.getenv})
	if err != nil {
		return err
	}
	if flags.File != "" {
		// Routing tables, ladders, thresholds and rules reload without a restart: on SIGHUP,
		// and when the file changes.
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		watchCtx, stopWatch := context.WithCancel(ctx)
		var watching sync.WaitGroup
		watching.Go(func() {
			p.WatchConfig(watchCtx, func() (mesh.Config, error) { return mesh.Load(flags) }, *reloadEvery, hup)
		})
		// The watcher ends before serve returns: it reloads into the process being stopped.
		defer watching.Wait()
		defer stopWatch()
	}
	return p.Run(ctx)
}
