package formatcheck

import (
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestSchemaFindings(t *testing.T) {
	t.Parallel()
	c := newTestChecker(t, func() Config { c := DefaultConfig(); c.MaxSchemaFindings = 3; return c }())
	list := Format{Type: FormatJSONSchema, JSONSchema: `{"type": "array", "items": {"type": "object", "required": ["sku"],
		"properties": {"sku": {"type": "string", "pattern": "^SKU-"}, "a/b": {"type": "integer"}}}}`}
	tests := []struct {
		name    string
		content string
		want    []wantFinding
		wantMsg string
	}{
		{name: "valid", content: `[{"sku": "SKU-1"}]`},
		{name: "nested paths are JSON pointers", content: `[{"sku": "SKU-1"}, {"sku": "X-2", "a/b": 1.5}]`,
			want:    []wantFinding{{Code: CodeSchema, Path: "/1/a~1b", Blocking: true}, {Code: CodeSchema, Path: "/1/sku", Blocking: true}},
			wantMsg: "at /1/sku:"},
		{name: "missing property is reported at its object", content: `[{}]`,
			want: []wantFinding{{Code: CodeSchema, Path: "/0", Blocking: true}}, wantMsg: "missing property 'sku'"},
		{name: "findings are capped", content: `[{}, {}, {}, {}, {}]`,
			want:    []wantFinding{{Code: CodeSchema, Path: "/0", Blocking: true}, {Code: CodeSchema, Path: "/1", Blocking: true}, {Code: CodeSchema, Blocking: true}},
			wantMsg: "and 3 more schema violations"},
		{name: "wrong top level", content: `{"sku": "SKU-1"}`, want: []wantFinding{{Code: CodeSchema, Blocking: true}}, wantMsg: "at the top level"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := c.Check(Answer{Content: tt.content, Format: list})
			keys := findingKeys(got.Findings)
			less := func(a, b wantFinding) bool { return a.Path < b.Path }
			if len(tt.want) == 3 { // the cap keeps order: two violations, then the summary
				less = nil
			}
			opts := []cmp.Option{cmpopts.EquateEmpty()}
			if less != nil {
				opts = append(opts, cmpopts.SortSlices(less))
			}
			if diff := cmp.Diff(tt.want, keys, opts...); diff != "" {
				t.Errorf("findings (-want +got):\n%s\n%q", diff, messages(got.Findings))
			}
			if tt.wantMsg != "" && !strings.Contains(strings.Join(messages(got.Findings), "\n"), tt.wantMsg) {
				t.Errorf("messages %q do not mention %q", messages(got.Findings), tt.wantMsg)
			}
			if got.Passed != (len(tt.want) == 0) || (len(tt.want) > 0 && got.Class != malformed) {
				t.Errorf("passed %v class %v", got.Passed, got.Class)
			}
		})
	}
}

func TestCompileSchemaRejectsExternalReferences(t *testing.T) {
	t.Parallel()
	c := newTestChecker(t, DefaultConfig())
	for _, ref := range []string{"file:///etc/passwd", "http://169.254.169.254/latest/meta-data", "other.json"} {
		doc := `{"$ref": "` + ref + `"}`
		if err := c.CompileSchema(doc); err == nil || !strings.Contains(err.Error(), "not a valid JSON Schema") {
			t.Errorf("schema referring to %s: err = %v, want it rejected", ref, err)
		}
		// Check does not apply a schema that does not compile: it is the request's fault.
		if got := c.Check(Answer{Content: `{}`, Format: Format{Type: FormatJSONSchema, JSONSchema: doc}}); !got.Passed {
			t.Errorf("Check under an uncompilable schema: findings %q, want none", messages(got.Findings))
		}
	}
	if err := c.CompileSchema(`{type: object`); err == nil || !strings.Contains(err.Error(), "is not valid JSON") {
		t.Errorf("CompileSchema(not JSON) = %v", err)
	}
}

func TestSchemaCache(t *testing.T) {
	t.Parallel()
	c := newTestChecker(t, DefaultConfig())
	// A schema with an internal reference is fine, and is compiled once.
	doc := `{"$defs": {"id": {"type": "string"}}, "type": "object", "properties": {"id": {"$ref": "#/$defs/id"}}}`
	if err := c.CompileSchema(doc); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			if got := c.Check(Answer{Content: `{"id": 7}`, Format: Format{Type: FormatJSONSchema, JSONSchema: doc}}); got.Passed {
				t.Error("Check passed; want a schema failure")
			}
		})
	}
	wg.Wait()
	if n := c.schemas.order.Len(); n != 1 {
		t.Errorf("schema cache holds %d entries, want 1", n)
	}
	small := newSchemaCache(2)
	for _, d := range []string{`{"type":"string"}`, `{"type":"number"}`, `{"type":"object"}`} {
		if _, err := small.get(d); err != nil {
			t.Fatal(err)
		}
	}
	if small.order.Len() != 2 {
		t.Errorf("a cache of 2 holds %d schemas", small.order.Len())
	}
}
