package main

import (
	"context"
	"flag"
	"fmt"
	"runtime/debug"
	"strings"
)

// version is `mantle version`: what this binary was built from, read from the build info
// the Go toolchain embeds (module version, VCS commit and time, Go version), so that it
// needs no linker flags and cannot disagree with the binary.
func version(_ context.Context, args []string, env cmdEnv) error {
	stdout, stderr := env.stdout, env.stderr
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "usage: mantle version\n")
		return errUsage
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return fmt.Errorf("this binary carries no build info")
	}
	fmt.Fprint(stdout, describeBuild(info))
	return nil
}

// describeBuild renders build info as `mantle <version>` and one line per known fact.
func describeBuild(info *debug.BuildInfo) string {
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	var b strings.Builder
	fmt.Fprintf(&b, "mantle %s\n", info.Main.Version)
	fmt.Fprintf(&b, "  module  %s\n", info.Main.Path)
	if rev := settings["vcs.revision"]; rev != "" {
		if settings["vcs.modified"] == "true" {
			rev += " (modified)"
		}
		fmt.Fprintf(&b, "  commit  %s\n", rev)
	}
	if t := settings["vcs.time"]; t != "" {
		fmt.Fprintf(&b, "  built   %s\n", t)
	}
	fmt.Fprintf(&b, "  go      %s\n", info.GoVersion)
	return b.String()
}

// printFlags prints fs's flags like fs.PrintDefaults, leaving out the ones whose usage
// starts with "internal:" (flags a command passes to its own child processes).
func printFlags(fs *flag.FlagSet) {
	shown := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
	shown.SetOutput(fs.Output())
	fs.VisitAll(func(f *flag.Flag) {
		if !strings.HasPrefix(f.Usage, "internal:") {
			shown.Var(f.Value, f.Name, f.Usage)
		}
	})
	shown.PrintDefaults()
}
