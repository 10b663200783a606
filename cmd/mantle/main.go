// Command mantle is the one binary of the mantle mesh.
//
//	mantle serve --target=all|router|cache|quota|verifier[,...] [--config.file mantle.yaml]
//	mantle dev                  all services in one process with embedded NATS and sim models
//	mantle sim --addr :8081     a standalone simulated OpenAI-compatible provider
//	mantle chat "question"      ask the router over gRPC and print the QualityContext summary
//	mantle review list|claim|decide   work the human review queue
//	mantle drill --scenario seed-incident   fault drill, mantle vs a naive client
//	mantle bench-load           added latency at fixed request rates
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = map[string]command{
	"serve":      {"run any subset of the services", serve},
	"dev":        {"run the whole mesh locally with embedded NATS and simulated models", dev},
	"sim":        {"run the simulated OpenAI-compatible provider", simCommand},
	"chat":       {"send one question to the router and print the answer", chat},
	"review":     {"work the human review queue: list, show, claim, decide, audit", review},
	"drill":      {"run a fault drill through mantle and a naive client, side by side", drill},
	"bench-load": {"measure the latency mantle adds at fixed request rates", benchLoad},
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		return 2
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "mantle: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	if err := cmd.run(ctx, args[1:], stdout, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 2
		}
		fmt.Fprintf(stderr, "mantle %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: mantle <command> [flags]")
	fmt.Fprintln(w)
	for _, name := range []string{"serve", "dev", "sim", "chat", "review", "drill", "bench-load"} {
		fmt.Fprintf(w, "  %-10s %s\n", name, commands[name].summary)
	}
	fmt.Fprintln(w, "\nRun mantle <command> -h for its flags.")
}
