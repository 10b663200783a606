package formatcheck

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// SchemaError is a request's JSON Schema that mantle refuses: too large, too deep, too
// expensive to use, or not a valid schema. Problem names what is wrong, for the caller.
type SchemaError struct{ Problem string }

func (e *SchemaError) Error() string { return e.Problem }

func schemaErrorf(format string, args ...any) *SchemaError {
	return &SchemaError{Problem: fmt.Sprintf(format, args...)}
}

// schemaLimits bound the work one request's schema can cause. Compiling grows far faster
// than the document (a schema nested 1000 deep took seconds, 5000 deep gigabytes) and
// validation grows with the schema expanded through its references, so both are checked on
// the raw document before the compiler sees it.
type schemaLimits struct {
	bytes, depth, nodes int
}

// checkSchemaSize rejects a document over the byte or nesting limit with one pass over its
// bytes, without decoding it: this is what keeps a schema bomb cheap to refuse.
func (l schemaLimits) checkSchemaSize(doc string) error {
	if len(doc) > l.bytes {
		return schemaErrorf("is %d bytes; the limit is %d (max_schema_bytes)", len(doc), l.bytes)
	}
	depth, inString, escaped := 0, false, false
	for i := 0; i < len(doc); i++ {
		c := doc[i]
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			if depth++; depth > l.depth {
				return schemaErrorf("nests deeper than %d levels (max_schema_depth)", l.depth)
			}
		case c == '}' || c == ']':
			depth--
		}
	}
	return nil
}

// Keywords whose values are schemas, by shape. Everything else (enum, const, default,
// examples, ...) is data and is not walked as a schema.
var (
	schemaKeywords = map[string]bool{
		"not": true, "if": true, "then": true, "else": true, "items": true, "additionalItems": true,
		"additionalProperties": true, "contains": true, "propertyNames": true,
		"unevaluatedItems": true, "unevaluatedProperties": true, "contentSchema": true,
	}
	schemaListKeywords = map[string]bool{"allOf": true, "anyOf": true, "oneOf": true, "prefixItems": true, "items": true}
	schemaMapKeywords  = map[string]bool{
		"properties": true, "patternProperties": true, "$defs": true, "definitions": true,
		"dependentSchemas": true, "dependencies": true,
	}
	// Keywords that make a reference resolve somewhere the expansion count cannot follow
	// cheaply. Schemas in requests use $defs and "#/..." references; these are refused by
	// name rather than half-supported.
	refusedKeywords = map[string]bool{
		"$anchor": true, "$dynamicAnchor": true, "$dynamicRef": true, "$recursiveRef": true, "$recursiveAnchor": true,
	}
)

// expansion walks a decoded schema and counts its subschemas, twice: as written (what the
// compiler works through) and from the root with every "#/..." reference expanded in place
// (what a validation may visit at one place in the answer). A chain of anyOf branches that
// each refer to the next level doubles the second count per level, which a size limit
// would not see: 22 levels, 1.4 KB, took minutes to validate the string "x".
type expansion struct {
	root   any
	limit  int
	expand bool // follow references, skip $defs
	memo   map[string]int
	active map[string]bool
	err    error
}

// checkSchemaExpansion returns a SchemaError when either count exceeds limit or the schema
// uses a reference form that is not allowed.
func checkSchemaExpansion(root any, limit int) error {
	for _, expand := range []bool{false, true} {
		e := &expansion{root: root, limit: limit, expand: expand, memo: map[string]int{}, active: map[string]bool{}}
		n := e.schema(root, true)
		if e.err != nil {
			return e.err
		}
		if n > limit {
			if expand {
				return schemaErrorf("expands to more than %d subschemas through its references (max_schema_nodes)", limit)
			}
			return schemaErrorf("has more than %d subschemas (max_schema_nodes)", limit)
		}
	}
	return nil
}

// schema returns the size of s, saturated just above the limit.
func (e *expansion) schema(s any, root bool) int {
	obj, ok := s.(map[string]any)
	if !ok || e.err != nil {
		return 1 // true, false, or a shape the compiler will reject
	}
	n := 1
	add := func(k int) { n = min(n+k, e.limit+1) }
	// In key order, so that a schema with two problems is always refused for the same one.
	for _, key := range slices.Sorted(maps.Keys(obj)) {
		v := obj[key]
		if n > e.limit || e.err != nil {
			return n
		}
		switch {
		case refusedKeywords[key]:
			e.err = schemaErrorf("%s is not supported; refer to $defs with \"$ref\": \"#/$defs/...\"", key)
		case key == "$id" && !root:
			e.err = schemaErrorf("$id is only allowed at the top level")
		case key == "$ref":
			ref, _ := v.(string)
			add(e.ref(ref))
		case schemaListKeywords[key]:
			if list, ok := v.([]any); ok {
				for _, item := range list {
					add(e.schema(item, false))
				}
			} else if schemaKeywords[key] {
				add(e.schema(v, false))
			}
		case schemaKeywords[key]:
			add(e.schema(v, false))
		case (key == "$defs" || key == "definitions") && e.expand:
			// Only what is referred to is validated; the references count it.
		case schemaMapKeywords[key]:
			if m, ok := v.(map[string]any); ok {
				for _, item := range m {
					add(e.schema(item, false))
				}
			}
		}
	}
	return n
}

// ref returns the expanded size of a reference's target. A reference back into the
// expansion under way is recursion, bounded by the answer's own depth: it counts once.
func (e *expansion) ref(ref string) int {
	if ref == "" || ref[0] != '#' {
		e.err = schemaErrorf("$ref %q: only references within the schema (\"#/...\") are allowed", abbreviate(ref, 64))
		return 1
	}
	if !e.expand {
		return 1
	}
	if n, ok := e.memo[ref]; ok {
		return n
	}
	if e.active[ref] {
		return 1
	}
	target, ok := e.resolve(ref)
	if !ok {
		return 1 // the compiler names the unresolvable reference
	}
	e.active[ref] = true
	n := e.schema(target, false)
	delete(e.active, ref)
	e.memo[ref] = n
	return n
}

// resolve follows a "#/a/b" JSON pointer (RFC 6901, in a URI fragment) from the root.
func (e *expansion) resolve(ref string) (any, bool) {
	frag, err := url.PathUnescape(ref[1:])
	if err != nil {
		return nil, false
	}
	if frag == "" {
		return e.root, true
	}
	if frag[0] != '/' {
		e.err = schemaErrorf("$ref %q: anchors are not supported; refer to $defs with \"#/$defs/...\"", abbreviate(ref, 64))
		return nil, false
	}
	cur, ok := e.root, false
	for _, tok := range strings.Split(frag[1:], "/") {
		tok = strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)
		switch v := cur.(type) {
		case map[string]any:
			if cur, ok = v[tok]; !ok {
				return nil, false
			}
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(v) {
				return nil, false
			}
			cur = v[i]
		default:
			return nil, false
		}
	}
	return cur, true
}
