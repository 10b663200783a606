package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The types below are documented the way configuration structs are; the generator reads
// these very comments from this file.

type sample struct {
	// Name is the service name.
	Name string `yaml:"name"`
	// Timeout bounds one call; 0 means none.
	Timeout time.Duration `yaml:"timeout"`
	// Tags label the service.
	Tags []string `yaml:"tags"`
	// Server: where it listens.
	Server sampleServer `yaml:"server"`
	// Ignored is not configuration.
	Ignored string `yaml:"-"`
	hidden  int    //nolint:unused // an unexported field, which docgen must skip
}

type sampleServer struct {
	// Address is host:port.
	Address string `yaml:"address"`
	// Ratio of calls sampled, in [0, 1].
	Ratio float64 `yaml:"ratio"`
	// Backends are tried in order.
	Backends []sampleBackend `yaml:"backends"`
	// Limits per tenant; ModelLimits per tenant and model.
	Limits map[string]*sampleBackend `yaml:"limits"`
	// Profiles are documented with the simulator.
	Profiles map[string]sampleBackend `yaml:"profiles" doc:"leaf"`
	// Limit is an optional override.
	Limit        *int `yaml:"limit,omitempty"`
	sampleInline `yaml:",inline"`
}

type sampleBackend struct {
	// URL is the backend's root.
	URL string `yaml:"url"`
	// Weight shares traffic | proportionally.
	Weight int `yaml:"weight"`
}

type sampleInline struct {
	// Retries after the first attempt.
	Retries uint `yaml:"retries"`
}

type undocumented struct {
	// A is documented.
	A int `yaml:"a"`
	B int `yaml:"b"`
	// C is a block with a hole.
	C struct{ D bool }   `yaml:"c"`
	E []undocumentedItem `yaml:"e"`
}

type undocumentedItem struct {
	F string `yaml:"f"`
}

func TestParse(t *testing.T) {
	five := 5
	tests := []struct {
		name    string
		cfg     any
		want    []block
		wantErr []string // lines the error must contain
	}{{
		name: "keys, types, defaults and descriptions",
		cfg: sample{
			Name: "mantle", Timeout: 90 * time.Second, Tags: []string{"a", "b"},
			Server: sampleServer{
				Ratio:        0.25,
				Limits:       map[string]*sampleBackend{"acme": {}, "beta": {}},
				Limit:        &five,
				sampleInline: sampleInline{Retries: 2},
			},
		},
		want: []block{{
			Fields: []field{
				{Key: "name", Type: "string", Default: "`mantle`", Doc: "the service name."},
				{Key: "timeout", Type: "duration", Default: "`1m30s`", Doc: "bounds one call; 0 means none."},
				{Key: "tags", Type: "list of strings", Default: "`[a, b]`", Doc: "label the service."},
			},
		}, {
			Name: "server", Doc: "where it listens.",
			Fields: []field{
				{Key: "server.address", Type: "string", Default: "`\"\"`", Doc: "host:port."},
				{Key: "server.ratio", Type: "float", Default: "`0.25`", Doc: "Ratio of calls sampled, in [0, 1]."},
				{Key: "server.backends", Type: "list of blocks", Default: "`[]`", Doc: "tried in order."},
				{Key: "server.backends[].url", Type: "string", Doc: "the backend's root."},
				{Key: "server.backends[].weight", Type: "int", Doc: "shares traffic | proportionally."},
				{Key: "server.limits", Type: "map of blocks", Default: "`{acme, beta: …}`", Doc: "Limits per tenant; ModelLimits per tenant and model."},
				{Key: "server.limits.<name>.url", Type: "string", Doc: "the backend's root."},
				{Key: "server.limits.<name>.weight", Type: "int", Doc: "shares traffic | proportionally."},
				{Key: "server.profiles", Type: "map of blocks", Default: "`{}`", Doc: "documented with the simulator."},
				{Key: "server.limit", Type: "int", Default: "`5`", Doc: "an optional override."},
				{Key: "server.retries", Type: "int", Default: "`2`", Doc: "Retries after the first attempt."},
			},
		}},
	}, {
		name: "every undocumented field is named, once, with its key",
		cfg:  undocumented{},
		wantErr: []string{
			"field main.undocumented.B (b) has no doc comment",
			"field main.undocumented.E (e) has no doc comment",
			"field main.undocumentedItem.F (e[].f) has no doc comment",
			"c.d: an anonymous struct's fields cannot be documented; give it a named type",
		},
	}}
	root, module, err := findModule()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			comments := newCommentSource(root, module)
			got := parse(tt.cfg, comments)
			err := comments.err()
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("no error, want one naming %q", tt.wantErr)
				}
				for _, line := range tt.wantErr {
					if !strings.Contains(err.Error(), line) {
						t.Errorf("error %q does not contain %q", err, line)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("parse (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDescribeAndDuration(t *testing.T) {
	for _, tt := range []struct{ text, goName, want string }{
		{"Timeout is how long to wait.", "Timeout", "how long to wait."},
		{"Backends are tried in order.", "Backends", "tried in order."},
		{"MinInFlight: with fewer in flight, nothing is shed.", "MinInFlight", "with fewer in flight, nothing is shed."},
		{"Enabled turns it on.", "Enabled", "turns it on."},
		{"EnabledX turns it on.", "Enabled", "EnabledX turns it on."},
		{"Off unless set.", "Enabled", "Off unless set."},
		{"Ratio of calls sampled.", "Ratio", "Ratio of calls sampled."},
		{"Limits per tenant.", "Limits", "Limits per tenant."},
	} {
		if got := describe(tt.text, tt.goName); got != tt.want {
			t.Errorf("describe(%q, %q) = %q, want %q", tt.text, tt.goName, got, tt.want)
		}
	}
	for d, want := range map[time.Duration]string{
		0: "0s", 1500 * time.Millisecond: "1.5s", time.Minute: "1m", 24 * time.Hour: "24h",
		90 * time.Minute: "1h30m", 90 * time.Second: "1m30s", 200 * time.Millisecond: "200ms",
	} {
		if got := duration(d); got != want {
			t.Errorf("duration(%v) = %q, want %q", d, got, want)
		}
	}
}

// TestWriteMarkdown checks the table shape: one section per block, cells kept in their
// column, comment text that would read as HTML escaped.
func TestWriteMarkdown(t *testing.T) {
	var buf bytes.Buffer
	writeMarkdown(&buf, []block{
		{Fields: []field{{Key: "target", Type: "string", Default: "`all`", Doc: "modules to run."}}},
		{Name: "events", Doc: "where events go: mantle.events.<kind>.", Fields: []field{
			{Key: "events.url", Type: "string", Default: "`\"\"`", Doc: "a | b"},
		}},
	})
	got := buf.String()
	for _, want := range []string{
		"\n## Top level\n\n| key | type | default | description |\n|---|---|---|---|\n| `target` | string | `all` | modules to run. |\n",
		"\n## `events`\n\nWhere events go: mantle.events.&lt;kind&gt;.\n\n| key | type | default | description |\n|---|---|---|---|\n| `events.url` | string | `\"\"` | a \\| b |\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
}

// TestRunWritesOnlyWhenComplete: a failed run leaves the previous file alone, so make docs
// never truncates the reference.
func TestRunWritesOnlyWhenComplete(t *testing.T) {
	out := t.TempDir() + "/configuration.md"
	if err := run(out, nil); err != nil {
		t.Fatalf("run on the real configuration: %v", err)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## `router`", "| `router.retry.max_retries` | int | `2` |", "| `server.graceful_shutdown_timeout` | duration | `15s` |"} {
		if !bytes.Contains(data, []byte(want)) {
			t.Errorf("reference lacks %q", want)
		}
	}
}
