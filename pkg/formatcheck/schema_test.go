package formatcheck

import (
	"context"
	"errors"
	"fmt"
	"runtime"
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
		if err := c.CompileSchema(t.Context(), doc); err == nil || !strings.Contains(err.Error(), "only references within the schema") {
			t.Errorf("schema referring to %s: err = %v, want it rejected", ref, err)
		}
		// Check does not apply a schema that does not compile: it is the request's fault.
		if got := c.Check(Answer{Content: `{}`, Format: Format{Type: FormatJSONSchema, JSONSchema: doc}}); !got.Passed {
			t.Errorf("Check under an uncompilable schema: findings %q, want none", messages(got.Findings))
		}
	}
	if err := c.CompileSchema(t.Context(), `{type: object`); err == nil || !strings.Contains(err.Error(), "is not valid JSON") {
		t.Errorf("CompileSchema(not JSON) = %v", err)
	}
}

func TestSchemaCache(t *testing.T) {
	t.Parallel()
	c := newTestChecker(t, DefaultConfig())
	// A schema with an internal reference is fine, and is compiled once.
	doc := `{"$defs": {"id": {"type": "string"}}, "type": "object", "properties": {"id": {"$ref": "#/$defs/id"}}}`
	if err := c.CompileSchema(t.Context(), doc); err != nil {
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
	small := newSchemaCache(2, schemaLimits{bytes: 1 << 10, depth: 8, nodes: 16})
	for _, d := range []string{`{"type":"string"}`, `{"type":"number"}`, `{"type":"object"}`} {
		if _, err := small.get(t.Context(), d); err != nil {
			t.Fatal(err)
		}
	}
	if small.order.Len() != 2 {
		t.Errorf("a cache of 2 holds %d schemas", small.order.Len())
	}
}

// nested repeats open n times around leaf, closed by close.
func nested(open, leaf, close string, n int) string {
	return strings.Repeat(open, n) + leaf + strings.Repeat(close, n)
}

// refChain is a schema whose every level is anyOf two references to the next: n levels,
// 2^n subschemas expanded, about 65 bytes a level.
func refChain(n int) string {
	var b strings.Builder
	b.WriteString(`{"$ref":"#/$defs/a0","$defs":{`)
	for i := range n {
		fmt.Fprintf(&b, `"a%d":{"anyOf":[{"$ref":"#/$defs/a%d"},{"$ref":"#/$defs/a%d"}]},`, i, i+1, i+1)
	}
	fmt.Fprintf(&b, `"a%d":{"type":"number"}}}`, n)
	return b.String()
}

func TestCompileSchemaLimits(t *testing.T) {
	t.Parallel()
	c := newTestChecker(t, DefaultConfig())
	wide := func(n int) string {
		var b strings.Builder
		b.WriteString(`{"type":"object","properties":{`)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"p%d":{"type":"string"}`, i)
		}
		b.WriteString(`}}`)
		return b.String()
	}
	tests := []struct {
		name, doc, wantErr string // wantErr "" means the schema compiles
	}{
		{"nested 5000 deep", nested(`{"properties":{"a":`, `{}`, `}}`, 2500), "nests deeper than 32 levels (max_schema_depth)"},
		{"nested items 33 deep", nested(`{"items":`, `{}`, `}`, 33), "nests deeper than 32 levels"},
		{"nested at the limit", nested(`{"items":`, `{}`, `}`, 31), ""},
		{"brackets inside strings do not nest", `{"description":"` + strings.Repeat("{[", 100) + `\"{"}`, ""},
		{"over the byte limit", `{"description":"` + strings.Repeat("x", 64<<10) + `"}`, "bytes; the limit is 65536 (max_schema_bytes)"},
		{"too many subschemas", wide(2001), "has more than 2000 subschemas"},
		{"at the subschema limit", wide(1999), ""},
		{"reference fan-out", refChain(22), "expands to more than 2000 subschemas"},
		{"small reference fan-out", refChain(7), ""},
		{"recursion counts once", `{"$defs":{"n":{"type":"object","properties":{"next":{"$ref":"#/$defs/n"}}}},"$ref":"#/$defs/n"}`, ""},
		{"reference to the root", `{"type":"array","items":{"$ref":"#"}}`, ""},
		{"anchor", `{"$defs":{"a":{"$anchor":"x"}}}`, "$anchor is not supported"},
		{"anchor fragment", `{"$ref":"#x"}`, "anchors are not supported"},
		{"dynamic reference", `{"$dynamicRef":"#/$defs/a"}`, "$dynamicRef is not supported"},
		{"nested $id", `{"$defs":{"a":{"$id":"http://x/a.json"}}}`, "$id is only allowed at the top level"},
		{"a property named like a keyword", `{"properties":{"$anchor":{"type":"string"},"$id":{}}}`, ""},
		{"enum data is not walked", `{"enum":[{"$dynamicRef":"x"}]}`, ""},
		{"not a schema", `"notaschema"`, "is not a valid JSON Schema"},
		{"unresolvable reference", `{"$ref":"#/$defs/missing"}`, "is not a valid JSON Schema"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := c.CompileSchema(t.Context(), tt.doc)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("CompileSchema = %v, want it compiled", err)
				}
				return
			}
			var serr *SchemaError
			if !errors.As(err, &serr) || !strings.Contains(serr.Problem, tt.wantErr) {
				t.Fatalf("CompileSchema = %v, want a SchemaError containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestSchemaBombIsCheap: the schema that took a gigabyte is refused with a few kilobytes of
// work, the same on every request (nothing about it is cached).
func TestSchemaBombIsCheap(t *testing.T) {
	c := newTestChecker(t, DefaultConfig())
	bombs := map[string]string{
		"deep":    nested(`{"properties":{"a":`, `{}`, `}}`, 2500), // 50 KB, 5000 levels
		"fan-out": refChain(40),
	}
	for name, doc := range bombs {
		var err error
		allocs := testing.AllocsPerRun(5, func() { err = c.CompileSchema(t.Context(), doc) })
		if err == nil {
			t.Fatalf("%s: compiled", name)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_ = c.CompileSchema(t.Context(), doc)
		runtime.ReadMemStats(&after)
		bytes := after.TotalAlloc - before.TotalAlloc
		t.Logf("%s (%d bytes): %v allocations, %d bytes allocated", name, len(doc), allocs, bytes)
		// Refusal must stay far below the 10 MB the whole request may cost.
		if allocs > 5000 || bytes > 1<<20 {
			t.Errorf("%s: refusing it took %v allocations and %d bytes", name, allocs, bytes)
		}
	}
}

func TestCompileSchemaHonoursContext(t *testing.T) {
	t.Parallel()
	c := newTestChecker(t, DefaultConfig())
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := c.CompileSchema(ctx, `{"type":"string"}`); !errors.Is(err, context.Canceled) {
		t.Fatalf("CompileSchema(cancelled) = %v, want context.Canceled", err)
	}
}
