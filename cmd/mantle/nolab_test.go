package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestServingBuildLeavesLabGearOut: the serving build (-tags nolab, the container image's)
// links neither the embedded NATS server nor the drills, has no lab commands, and its serve
// refuses events.embedded by name instead of keeping JetStream data in a temp directory.
func TestServingBuildLeavesLabGearOut(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	out, err := exec.Command("go", "list", "-deps", "-tags", "nolab", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range []string{"github.com/nats-io/nats-server/v2/server", "github.com/mantle-mesh/mantle/pkg/natsembed", "github.com/mantle-mesh/mantle/pkg/drill"} {
		if bytes.Contains(out, []byte(pkg+"\n")) {
			t.Errorf("the serving build links %s", pkg)
		}
	}
	bin := filepath.Join(t.TempDir(), "mantle")
	if out, err := exec.Command("go", "build", "-tags", "nolab", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build -tags nolab: %v\n%s", err, out)
	}
	usage, _ := exec.Command(bin, "help").CombinedOutput()
	for _, lab := range []string{"dev ", "sim ", "drill ", "bench-load "} {
		if strings.Contains(string(usage), "  "+lab) {
			t.Errorf("the serving build lists %q:\n%s", lab, usage)
		}
	}
	if !strings.Contains(string(usage), "  serve ") {
		t.Errorf("the serving build has no serve:\n%s", usage)
	}
	if out, err := exec.Command(bin, "dev").CombinedOutput(); err == nil || !strings.Contains(string(out), `unknown command "dev"`) {
		t.Errorf("mantle dev in the serving build: %v\n%s", err, out)
	}
	config := filepath.Join(t.TempDir(), "mantle.yaml")
	if err := os.WriteFile(config, []byte(`target: all
auth: {disabled: true}
events: {embedded: true}
server: {grpc_listen_address: 127.0.0.1:0, http_listen_address: 127.0.0.1:0}
router:
  providers: [{name: sim, type: sim, timeout: 5s}]
  models: [{name: m, provider: sim}]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(context.Background(), bin, "serve", "--config.file", config)
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "events.embedded") || !strings.Contains(string(out), "events.nats_url") {
		t.Errorf("serve with events.embedded: %v\n%s", err, out)
	}
}
