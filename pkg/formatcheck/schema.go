package formatcheck

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// schemaCache compiles JSON Schemas once and keeps the most recently used ones: requests
// carry their schema, usually one of a few per application, and compiling costs far more
// than validating. Safe for concurrent use.
type schemaCache struct {
	seed   maphash.Seed
	max    int
	limits schemaLimits

	mu      sync.Mutex
	order   *list.List // of *schemaEntry, most recent first
	entries map[uint64]*list.Element
}

type schemaEntry struct {
	hash   uint64
	text   string // the schema document, to rule out hash collisions
	schema *jsonschema.Schema
}

func newSchemaCache(size int, limits schemaLimits) *schemaCache {
	return &schemaCache{seed: maphash.MakeSeed(), max: size, limits: limits, order: list.New(), entries: map[uint64]*list.Element{}}
}

// get returns the compiled schema for doc, compiling it on a miss. Compile errors are the
// caller's (an invalid schema in the request) and are not cached: the limits checked
// before compiling keep a rejected schema cheap to reject again.
func (c *schemaCache) get(ctx context.Context, doc string) (*jsonschema.Schema, error) {
	h := maphash.String(c.seed, doc)
	c.mu.Lock()
	if el, ok := c.entries[h]; ok && el.Value.(*schemaEntry).text == doc {
		c.order.MoveToFront(el)
		s := el.Value.(*schemaEntry).schema
		c.mu.Unlock()
		return s, nil
	}
	c.mu.Unlock()

	// Compiled outside the lock: a schema must not stall every other request. Two requests
	// racing on the same new schema both compile it; the second insert wins. The library
	// takes no context, so the request's is checked before the work starts; the limits
	// bound what follows.
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s, err := compileSchema(doc, c.limits)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[h]; ok {
		c.order.Remove(el)
	}
	c.entries[h] = c.order.PushFront(&schemaEntry{hash: h, text: doc, schema: s})
	for c.order.Len() > c.max {
		oldest := c.order.Back()
		c.order.Remove(oldest)
		delete(c.entries, oldest.Value.(*schemaEntry).hash)
	}
	return s, nil
}

// noLoader refuses every external reference: a schema from a request must not make the
// checker read files or fetch URLs. The metaschemas are built into the library.
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("external schema references are not allowed (%s)", url)
}

const schemaURL = "mantle://request/schema.json"

// compileSchema checks doc against the limits, cheapest check first, and compiles it. Every
// error is a *SchemaError.
func compileSchema(doc string, limits schemaLimits) (*jsonschema.Schema, error) {
	if err := limits.checkSchemaSize(doc); err != nil {
		return nil, err
	}
	parsed, err := jsonschema.UnmarshalJSON(strings.NewReader(doc))
	if err != nil {
		return nil, schemaErrorf("is not valid JSON: %v", err)
	}
	if err := checkSchemaExpansion(parsed, limits.nodes); err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(noLoader{})
	if err := c.AddResource(schemaURL, parsed); err != nil {
		return nil, schemaErrorf("is not a valid JSON Schema: %v", err)
	}
	s, err := c.Compile(schemaURL)
	if err != nil {
		return nil, schemaErrorf("is not a valid JSON Schema: %v", err)
	}
	return s, nil
}

var schemaPrinter = message.NewPrinter(language.English)

// schemaFindings validates value against s and returns one finding per failing leaf of the
// validation error tree, at most limit of them (the last says how many were left out).
func schemaFindings(s *jsonschema.Schema, value any, limit int) []Finding {
	err := s.Validate(value)
	if err == nil {
		return nil
	}
	var verr *jsonschema.ValidationError
	if !errors.As(err, &verr) {
		return []Finding{blocking(CodeSchema, "", malformed, "the answer could not be validated: "+err.Error())}
	}
	var leaves []*jsonschema.ValidationError
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			leaves = append(leaves, e)
			return
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(verr)
	// The library visits properties in map order; sorted paths make reports reproducible.
	slices.SortStableFunc(leaves, func(a, b *jsonschema.ValidationError) int {
		return strings.Compare(jsonPointer(a.InstanceLocation), jsonPointer(b.InstanceLocation))
	})
	var findings []Finding
	for i, leaf := range leaves {
		if i == limit-1 && len(leaves) > limit {
			findings = append(findings, blocking(CodeSchema, "", malformed,
				fmt.Sprintf("and %d more schema violations", len(leaves)-i)))
			break
		}
		path := jsonPointer(leaf.InstanceLocation)
		findings = append(findings, blocking(CodeSchema, path, malformed,
			fmt.Sprintf("at %s: %s", displayPointer(path), leaf.ErrorKind.LocalizedString(schemaPrinter))))
	}
	return findings
}

// jsonPointer renders an instance location as an RFC 6901 pointer ("" is the whole answer).
func jsonPointer(tokens []string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(t))
	}
	return b.String()
}

func displayPointer(p string) string {
	if p == "" {
		return "the top level"
	}
	return p
}
