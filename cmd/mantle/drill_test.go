package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	mdrill "github.com/mantle-mesh/mantle/pkg/drill"
	"github.com/mantle-mesh/mantle/pkg/mesh"
)

func TestDrillList(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	if err := drill(context.Background(), []string{"--list"}, testEnv(&stdout, &stderr)); err != nil {
		t.Fatalf("drill --list: %v\n%s", err, stderr.String())
	}
	for _, name := range mdrill.Names() {
		if !strings.Contains(stdout.String(), name+" ") {
			t.Errorf("--list does not name %s:\n%s", name, stdout.String())
		}
	}
}

func TestDrillPrintScenario(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	if err := drill(context.Background(), []string{"--scenario", "provider-outage", "--print-scenario"}, testEnv(&stdout, &stderr)); err != nil {
		t.Fatalf("drill --print-scenario: %v", err)
	}
	// What it prints is a scenario file a user can edit and run with --scenario-file.
	file := filepath.Join(t.TempDir(), "mine.yaml")
	edited := strings.Replace(stdout.String(), "name: provider-outage", "name: my-outage", 1)
	if err := os.WriteFile(file, []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s, err := mdrill.Parse(f)
	if err != nil {
		t.Fatalf("printed scenario does not parse: %v", err)
	}
	if s.Name != "my-outage" || s.Incident == nil {
		t.Errorf("parsed %q with incident %v", s.Name, s.Incident)
	}
}

func TestDrillPrintConfig(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	if err := drill(context.Background(), []string{"--print-config", "--time-scale", "0.5"}, testEnv(&stdout, &stderr)); err != nil {
		t.Fatalf("drill --print-config: %v", err)
	}
	cfg := mesh.Default()
	if err := cfg.Decode(&stdout); err != nil {
		t.Fatalf("printed configuration does not decode: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("printed configuration does not validate: %v", err)
	}
	if len(cfg.Router.Routes) != 1 || cfg.Router.Routes[0].Budget.Seconds() != 1.5 {
		t.Errorf("routes %+v, want the drill route with the 3 s budget at time scale 0.5", cfg.Router.Routes)
	}
}

func TestDrillRunWritesReports(t *testing.T) {
	t.Parallel()
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	args := []string{"--scenario", "seed-incident", "--time-scale", "0.01", "--rate", "2", "--duration", "1m", "--out", out}
	if err := drill(context.Background(), args, testEnv(&stdout, &stderr)); err != nil {
		t.Fatalf("drill: %v\nstderr:\n%s", err, stderr.String())
	}
	for _, want := range []string{"seed-incident:", "mantle", "naive", "latency P99", "duplicate billed calls", "targets (mantle)"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
		}
	}
	// The progress line names each side as it runs.
	for _, want := range []string{"mantle seed-incident", "naive  seed-incident", "reports: "} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
	data, err := os.ReadFile(filepath.Join(out, "seed-incident.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep mdrill.Report
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatalf("JSON report: %v", err)
	}
	if rep.Requests != 120 || len(rep.Sides) != 2 {
		t.Errorf("JSON report has %d requests and %d sides, want 120 and 2", rep.Requests, len(rep.Sides))
	}
	page, err := os.ReadFile(filepath.Join(out, "seed-incident.html"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(page, []byte("<svg")) || !bytes.Contains(page, []byte("mantle drill: seed-incident")) {
		t.Error("HTML report lacks its charts or title")
	}
}

func TestDrillJSONOnStdout(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	args := []string{"--scenario", "all-down", "--sides", "mantle", "--time-scale", "0.01", "--rate", "1", "--duration", "30s", "--out", "", "--format", "json"}
	if err := drill(context.Background(), args, testEnv(&stdout, &stderr)); err != nil {
		t.Fatalf("drill: %v\n%s", err, stderr.String())
	}
	var rep mdrill.Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("stdout is not a JSON report: %v\n%s", err, stdout.String())
	}
	if len(rep.Sides) != 1 || rep.Sides[0].Name != "mantle" {
		t.Errorf("sides %+v, want mantle only", rep.Sides)
	}
	if strings.Contains(stderr.String(), "reports: ") {
		t.Error("--out '' wrote report files")
	}
}

func TestDrillRejectsBadFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown scenario", []string{"--scenario", "tsunami"}, `unknown scenario "tsunami"`},
		{"format", []string{"--format", "xml"}, "--format: want text or json"},
		{"missing file", []string{"--scenario-file", "/nonexistent/drill.yaml"}, "--scenario-file"},
		{"side", []string{"--sides", "mantle,oracle", "--out", ""}, `unknown side "oracle"`},
		{"arguments", []string{"seed-incident"}, "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			err := drill(context.Background(), tt.args, testEnv(&stdout, &stderr))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("drill %q error = %v, want one containing %q", tt.args, err, tt.want)
			}
		})
	}
}
