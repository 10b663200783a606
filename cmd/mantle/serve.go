package main

import (
	"context"
	"flag"
	"io"

	"github.com/mantle-mesh/mantle/pkg/mesh"
)

func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	flags := mesh.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
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
	p, err := mesh.Start(ctx, cfg, mesh.Options{LogOutput: stderr})
	if err != nil {
		return err
	}
	return p.Run(ctx)
}
