package main

import (
	"context"
	"flag"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/mantle-mesh/mantle/pkg/mesh"
)

func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
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
	p, err := mesh.Start(ctx, cfg, mesh.Options{LogOutput: stderr, TuneRuntime: true, RouteLibraryLogs: true})
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
		defer stopWatch()
		go p.WatchConfig(watchCtx, func() (mesh.Config, error) { return mesh.Load(flags) }, *reloadEvery, hup)
	}
	return p.Run(ctx)
}
