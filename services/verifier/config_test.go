package verifier

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr []string // substrings; nil means valid
	}{
		{name: "defaults", mutate: func(*Config) {}},
		{name: "no refusal phrases", mutate: func(c *Config) { c.RefusalPhrases = nil }},
		{name: "threshold 0 and 1 are allowed", mutate: func(c *Config) { c.ConfidenceThreshold = 1 }},
		{name: "negative threshold", mutate: func(c *Config) { c.ConfidenceThreshold = -0.1 },
			wantErr: []string{"confidence_threshold: must be between 0 and 1, got -0.1"}},
		{name: "threshold above 1", mutate: func(c *Config) { c.ConfidenceThreshold = 30 },
			wantErr: []string{"confidence_threshold: must be between 0 and 1, got 30"}},
		{name: "punctuation-only phrase", mutate: func(c *Config) { c.RefusalPhrases = []string{"I cannot", "!!!"} },
			wantErr: []string{`refusal_phrases[1]: must contain a letter or digit, got "!!!"`}},
		{name: "repetition threshold 1", mutate: func(c *Config) { c.RepetitionThreshold = 1 },
			wantErr: []string{"repetition_threshold: must be at least 2, got 1"}},
		{name: "zero max content", mutate: func(c *Config) { c.MaxContentBytes = 0 },
			wantErr: []string{"max_content_bytes: must be positive, got 0"}},
		{
			name: "every problem is reported",
			mutate: func(c *Config) {
				c.ConfidenceThreshold, c.RepetitionThreshold, c.MaxContentBytes = 2, 0, -1
			},
			wantErr: []string{"confidence_threshold:", "repetition_threshold:", "max_content_bytes: must be positive, got -1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := DefaultConfig()
			tt.mutate(&cfg)
			err := cfg.Validate()
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want errors containing %q", tt.wantErr)
			}
			for _, want := range tt.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Validate() = %q, want it to contain %q", err, want)
				}
			}
		})
	}
}

// TestConfigYAML decodes the block the way the lead's strict loader does: defaults first,
// then the file, unknown keys rejected.
func TestConfigYAML(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		yaml    string
		want    func() Config
		wantErr string
	}{
		{
			name: "every key",
			yaml: "confidence_threshold: 0.5\nrefusal_phrases: [\"no can do\"]\nrepetition_threshold: 6\nmax_content_bytes: 4096\n",
			want: func() Config {
				return Config{ConfidenceThreshold: 0.5, RefusalPhrases: []string{"no can do"}, RepetitionThreshold: 6, MaxContentBytes: 4096}
			},
		},
		{
			name: "absent refusal_phrases keeps the defaults",
			yaml: "confidence_threshold: 0.4\n",
			want: func() Config { c := DefaultConfig(); c.ConfidenceThreshold = 0.4; return c },
		},
		{
			name: "an empty list turns refusal detection off",
			yaml: "refusal_phrases: []\n",
			want: func() Config { c := DefaultConfig(); c.RefusalPhrases = []string{}; return c },
		},
		{name: "unknown key", yaml: "confidence: 0.3\n", wantErr: "field confidence not found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := DefaultConfig()
			dec := yaml.NewDecoder(bytes.NewBufferString(tt.yaml))
			dec.KnownFields(true)
			err := dec.Decode(&cfg)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Decode: err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if diff := cmp.Diff(tt.want(), cfg); diff != "" {
				t.Errorf("decoded config mismatch (-want +got):\n%s", diff)
			}
			if err := cfg.Validate(); err != nil {
				t.Errorf("Validate() = %v, want nil", err)
			}
		})
	}
}

func TestDefaultRefusalPhrasesAreFresh(t *testing.T) {
	t.Parallel()
	a := DefaultRefusalPhrases()
	a[0] = "changed"
	if b := DefaultRefusalPhrases(); b[0] == "changed" {
		t.Error("DefaultRefusalPhrases returned a shared slice; a caller's edit leaked into the defaults")
	}
	// Every default must be able to match an answer that is exactly that phrase.
	v := newTestVerifier(t, DefaultConfig())
	for _, phrase := range DefaultRefusalPhrases() {
		got, err := v.Verify(context.Background(), Answer{Content: phrase + "."})
		if err != nil || got.FailureClass != ClassRefusal {
			t.Errorf("Verify(%q) = class %v, err %v; want refusal", phrase, got.FailureClass, err)
		}
	}
}
