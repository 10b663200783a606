// Command mantle is the one binary of the mantle mesh.
//
//	mantle serve --target=all|router|cache|quota|verifier|agent[,...] [--config.file mantle.yaml]
//	mantle dev                  all services in one process with embedded NATS and sim models
//	mantle sim --addr :8081     a standalone simulated OpenAI-compatible provider
//	mantle chat "question"      ask the router over gRPC and print the QualityContext summary
//	mantle review list|claim|decide   work the human review queue
//	mantle drill --scenario seed-incident   fault drill, mantle vs a naive client
//	mantle bench-load           added latency at fixed request rates
//	mantle version              the build's module version, commit and Go version
//	mantle certs --out certs    a throwaway CA and a certificate per service (TLS)
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
	code := run(ctx, os.Args[1:], cmdEnv{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv})
	stop() // os.Exit runs no deferred calls
	os.Exit(code)
}

type command struct {
	summary string
	run     func(ctx context.Context, args []string, env cmdEnv) error
}

// cmdEnv is what a command takes from its process: its output streams and its
// environment. Commands read the environment through getenv only; main hands them
// os.Getenv, tests an environment of their own.
type cmdEnv struct {
	stdout, stderr io.Writer
	getenv         func(string) string
}

// varOr is the environment variable name, or def when it is unset or empty.
func (e cmdEnv) varOr(name, def string) string {
	if v := e.getenv(name); v != "" {
		return v
	}
	return def
}

// commands are the serving and operating commands, and the lab commands (dev, sim, drill,
// bench-load) unless the binary is built with -tags nolab (see lab.go).
var commands = withLab(map[string]command{
	"serve":   {"run any subset of the services", serve},
	"chat":    {"send one question to the router and print the answer", chat},
	"review":  {"work the human review queue: list, show, claim, decide, audit", review},
	"version": {"print the module version, commit and Go version of this build", version},
	"certs":   {"write a throwaway CA and a certificate per service (TLS in development)", certs},
})

// The keys mantle dev configures; chat and review use them when no key is given.
const (
	devKey         = "sk-mantle-dev"
	devOperatorKey = "sk-mantle-dev-operator"
)

// errUsage reports a command line that is wrong (exit 2), unlike flag.ErrHelp, which
// answers a request for help (exit 0). The command has already printed why.
var errUsage = errors.New("usage")

func run(ctx context.Context, args []string, env cmdEnv) int {
	stdout, stderr := env.stdout, env.stderr
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "mantle: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	if err := cmd.run(ctx, args[1:], env); err != nil {
		switch {
		case errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, errUsage):
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
	for _, name := range []string{"serve", "dev", "sim", "chat", "review", "drill", "bench-load", "certs", "version"} {
		if c, ok := commands[name]; ok {
			fmt.Fprintf(w, "  %-10s %s\n", name, c.summary)
		}
	}
	fmt.Fprintln(w, "\nRun mantle <command> -h for its flags.")
}

// parseFlags parses args with fs (which prints its own complaint and usage on a bad flag)
// and marks a bad command line errUsage, so that it exits 2 without a second message.
func parseFlags(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return err
	}
	return fmt.Errorf("%w: %w", errUsage, err)
}
