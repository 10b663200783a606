package agent

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
)

func TestParseArguments(t *testing.T) {
	t.Parallel()
	l := argLimits{bytes: 200, depth: 3, nodes: 12}
	tests := []struct {
		name, args string
		want       string // canonical form, or the error's reason
		ok         bool
	}{
		{"empty is {}", "  ", "{}", true},
		{"canonical: keys sorted", `{"b":1, "a":[true,null]}`, `{"a":[true,null],"b":1}`, true},
		{"too large", `{"a":"` + strings.Repeat("x", 200) + `"}`, "more than the 200 allowed", false},
		{"too deep", `{"a":{"b":{"c":{}}}}`, "nested deeper than 3 levels", false},
		{"too many values", `{"a":[1,2,3,4,5,6,7,8,9,10,11]}`, "more than 12 values", false},
		{"not JSON", `{"a":`, "not valid JSON", false},
		{"not an object", `[1,2]`, "must be a JSON object", false},
		{"two values", `{} {}`, "more than one JSON value", false},
		{"bad UTF-8", "{\"a\":\"\xff\"}", "not valid UTF-8", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, canonical, err := parseArguments(tc.args, l)
			if tc.ok {
				if err != nil || string(canonical) != tc.want {
					t.Fatalf("parseArguments = %s, %v; want %s", canonical, err, tc.want)
				}
				return
			}
			var ae *argError
			if !errors.As(err, &ae) || !strings.Contains(ae.Reason, tc.want) {
				t.Fatalf("parseArguments = %v, want an argError with %q", err, tc.want)
			}
		})
	}
}

// TestMalformedCallsNeverReachTheBackend: arguments that fail the bounds or the tool's
// input schema are refused before any backend call, for every kind.
func TestMalformedCallsNeverReachTheBackend(t *testing.T) {
	t.Parallel()
	schema := map[string]any{
		"type":                 "object",
		"properties":           map[string]any{"city": map[string]any{"type": "string"}, "days": map[string]any{"type": "integer", "maximum": 7}},
		"required":             []any{"city"},
		"additionalProperties": false,
	}
	q, a := query("weather"), action("order")
	q.InputSchema, a.InputSchema = schema, schema
	h := newHarness(t, q, a)
	for _, tc := range []struct{ args, path string }{
		{`{"days":3}`, "city"},
		{`{"city":"Oslo","days":30}`, "/days"},
		{`{"city":"Oslo","extra":1}`, "extra"},
		{`{"city":7}`, "/city"},
		{`"Oslo"`, ""},
		{`{"city":"` + strings.Repeat("x", 70<<10) + `"}`, ""},
	} {
		for _, name := range []string{"weather", "order"} {
			_, err := h.tools.Call(context.Background(), CallRequest{Tenant: "acme", Name: name, Arguments: tc.args, IdempotencyKey: "k"})
			var ae *argError
			if !errors.As(err, &ae) {
				t.Errorf("%s(%.40s) = %v, want invalid arguments", name, tc.args, err)
				continue
			}
			if !strings.Contains(ae.Error(), tc.path) {
				t.Errorf("%s(%.40s): %v does not name %q", name, tc.args, ae, tc.path)
			}
		}
	}
	for name, b := range h.backends {
		if b.count() != 0 {
			t.Errorf("%s backend called %d times for malformed calls", name, b.count())
		}
	}
	if _, err := h.tools.Call(context.Background(), CallRequest{Tenant: "acme", Name: "weather", Arguments: `{"city":"Oslo","days":3}`}); err != nil {
		t.Errorf("a valid call: %v", err)
	}
}

func FuzzParseArguments(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":[1,{"b":null}]}`, `[`, `{"a":"\u0000"}`, strings.Repeat("[", 100)} {
		f.Add(s)
	}
	l := argLimits{bytes: 4096, depth: 8, nodes: 256}
	f.Fuzz(func(t *testing.T, s string) {
		obj, canonical, err := parseArguments(s, l)
		if err != nil {
			var ae *argError
			if !errors.As(err, &ae) {
				t.Fatalf("error %v is not an argError", err)
			}
			return
		}
		if obj == nil || len(canonical) == 0 {
			t.Fatalf("accepted %q without an object", s)
		}
		// The canonical form is a fixed point.
		_, again, err := parseArguments(string(canonical), argLimits{bytes: 1 << 20, depth: 8, nodes: 1 << 20})
		if err != nil || !bytes.Equal(again, canonical) {
			t.Fatalf("canonical %s is not stable: %s, %v", canonical, again, err)
		}
	})
}
