// Command docgen writes docs/configuration.md, the configuration reference, from the code:
// keys, types and defaults by reflection over mesh.Default() (the configuration
// `mantle serve --print-config` starts from), descriptions from the doc comments of the
// struct fields. A field without a doc comment is an error, so the comment stays the one
// place a key is described. It is a command of its own so that the serving binary does not
// carry it.
//
//	go run ./cmd/docgen -out docs/configuration.md
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/mantle-mesh/mantle/pkg/mesh"
)

func main() {
	out := flag.String("out", "", "file to write (default: standard output)")
	flag.Parse()
	if err := run(*out, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "docgen:", err)
		os.Exit(1)
	}
}

func run(out string, stdout io.Writer) error {
	root, module, err := findModule()
	if err != nil {
		return err
	}
	comments := newCommentSource(root, module)
	blocks := parse(mesh.Default(), comments)
	if err := comments.err(); err != nil {
		return err
	}
	var buf bytes.Buffer
	writeMarkdown(&buf, blocks)
	if out == "" {
		_, err := stdout.Write(buf.Bytes())
		return err
	}
	return os.WriteFile(out, buf.Bytes(), 0o644)
}

// findModule walks up from the working directory to go.mod and returns its directory and
// module path, which together map a Go package path to its source directory.
func findModule() (dir, module string, err error) {
	dir, err = os.Getwd()
	if err != nil {
		return "", "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil {
			for _, line := range strings.Split(string(data), "\n") {
				if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
					return dir, strings.Trim(strings.TrimSpace(rest), `"`), nil
				}
			}
			return "", "", fmt.Errorf("%s/go.mod: no module line", dir)
		}
		if !errors.Is(err, os.ErrNotExist) {
			return "", "", err
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}
