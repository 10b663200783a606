package main

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A block is one section of the reference: a top-level key of the configuration, or the
// top-level scalars (Name "").
type block struct {
	Name   string
	Doc    string
	Fields []field
}

// A field is one row: a key with its type, default and description.
type field struct {
	// Key is the full YAML path: router.retry.max_retries, router.providers[].name,
	// cache.scenarios.<name>.ttl.
	Key  string
	Type string
	// Default is Markdown; empty where the key has no value of its own in the defaults (a
	// field of a list or map entry).
	Default string
	Doc     string
}

var durationType = reflect.TypeFor[time.Duration]()

// parse turns the configuration cfg, a struct holding the defaults, into blocks: one for
// its scalar fields and one per struct field.
func parse(cfg any, comments *commentSource) []block {
	v := reflect.ValueOf(cfg)
	top := block{}
	var blocks []block
	for _, f := range yamlFields(v.Type()) {
		fv := v.FieldByIndex(f.index)
		doc := comments.doc(f, f.name)
		if f.typ.Kind() == reflect.Struct {
			blocks = append(blocks, block{Name: f.name, Doc: doc, Fields: walk(fv, f.typ, f.name, comments)})
			continue
		}
		top.Fields = append(top.Fields, row(f, f.name, fv, doc))
		top.Fields = append(top.Fields, descend(fv, f, f.name, comments)...)
	}
	return append([]block{top}, blocks...)
}

// walk lists the fields of the struct type t under prefix. v holds the defaults, or is the
// zero Value inside list and map entries, which have no defaults of their own.
func walk(v reflect.Value, t reflect.Type, prefix string, comments *commentSource) []field {
	var out []field
	for _, f := range yamlFields(t) {
		key := prefix + "." + f.name
		var fv reflect.Value
		if v.IsValid() {
			fv = v.FieldByIndex(f.index)
		}
		out = append(out, row(f, key, fv, comments.doc(f, key)))
		out = append(out, descend(fv, f, key, comments)...)
	}
	return out
}

// descend lists what is inside a block, a list of blocks or a map of blocks.
func descend(v reflect.Value, f yamlField, key string, comments *commentSource) []field {
	if f.leaf {
		return nil
	}
	t := f.typ
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
		if v.IsValid() {
			v = v.Elem() // the zero Value when nil: no defaults below
		}
	}
	if t.Kind() == reflect.Struct {
		return walk(v, t, key, comments)
	}
	// The entries of lists and maps have no defaults of their own (the list's or map's
	// default is on its own row).
	for {
		switch t.Kind() {
		case reflect.Slice:
			key += "[]"
		case reflect.Map:
			key += ".<name>"
		case reflect.Pointer:
		default:
			if t.Kind() == reflect.Struct {
				return walk(reflect.Value{}, t, key, comments)
			}
			return nil
		}
		t = t.Elem()
	}
}

func row(f yamlField, key string, v reflect.Value, doc string) field {
	return field{Key: key, Type: typeName(f.typ), Default: defaultValue(v), Doc: doc}
}

type yamlField struct {
	name   string // the YAML key
	goName string
	index  []int
	owner  reflect.Type // the struct that declares it (an inlined one for promoted fields)
	typ    reflect.Type
	leaf   bool // tagged doc:"leaf": one row, its fields are documented elsewhere
}

// yamlFields lists the keys of struct type t the way go.yaml.in/yaml reads them: exported
// fields, named by their yaml tag or else their lower-cased name, ",inline" flattened,
// "-" skipped.
func yamlFields(t reflect.Type) []yamlField {
	var out []yamlField
	for _, sf := range reflect.VisibleFields(t) {
		if !sf.IsExported() || len(sf.Index) > 1 && !inlinedPath(t, sf.Index) {
			continue
		}
		name, opts, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if slices.Contains(strings.Split(opts, ","), "inline") {
			continue // its fields are visible fields of t too
		}
		if name == "" {
			name = strings.ToLower(sf.Name)
		}
		owner := t
		for _, i := range sf.Index[:len(sf.Index)-1] {
			owner = owner.Field(i).Type
		}
		out = append(out, yamlField{name: name, goName: sf.Name, index: sf.Index, owner: owner, typ: sf.Type, leaf: sf.Tag.Get("doc") == "leaf"})
	}
	return out
}

// inlinedPath reports whether every struct on the way to a promoted field is inlined, as
// yaml only flattens those.
func inlinedPath(t reflect.Type, index []int) bool {
	for _, i := range index[:len(index)-1] {
		sf := t.Field(i)
		_, opts, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
		if !slices.Contains(strings.Split(opts, ","), "inline") {
			return false
		}
		t = sf.Type
	}
	return true
}

// typeName is the type as the YAML file sees it.
func typeName(t reflect.Type) string {
	if t == durationType {
		return "duration"
	}
	switch t.Kind() {
	case reflect.Pointer:
		return typeName(t.Elem())
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "bool"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "int"
	case reflect.Float32, reflect.Float64:
		return "float"
	case reflect.Struct:
		return "block"
	case reflect.Slice:
		return "list of " + plural(typeName(t.Elem()))
	case reflect.Map:
		return "map of " + plural(typeName(t.Elem()))
	}
	return t.String()
}

// plural makes the first word plural: "block" → "blocks", "list of ints" → "lists of ints".
func plural(s string) string {
	first, rest, _ := strings.Cut(s, " ")
	if rest != "" {
		rest = " " + rest
	}
	return first + "s" + rest
}

// maxInline is the longest default list or map shown in full; longer ones are summarised
// (--print-config prints them).
const maxInline = 60

// defaultValue renders a default as Markdown; "" when there is none.
func defaultValue(v reflect.Value) string {
	if !v.IsValid() {
		return ""
	}
	if v.Type() == durationType {
		return code(duration(time.Duration(v.Int())))
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return ""
		}
		return defaultValue(v.Elem())
	case reflect.String:
		if v.String() == "" {
			return code(`""`)
		}
		return code(v.String())
	case reflect.Bool:
		return code(strconv.FormatBool(v.Bool()))
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return code(strconv.FormatInt(v.Int(), 10))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return code(strconv.FormatUint(v.Uint(), 10))
	case reflect.Float32, reflect.Float64:
		return code(strconv.FormatFloat(v.Float(), 'g', -1, 64))
	case reflect.Slice:
		if v.Len() == 0 {
			return code("[]")
		}
		items := make([]string, v.Len())
		for i := range items {
			items[i] = scalar(v.Index(i))
		}
		return list(items, "[", "]")
	case reflect.Map:
		if v.Len() == 0 {
			return code("{}")
		}
		var keys []string
		for _, k := range v.MapKeys() {
			keys = append(keys, scalar(k))
		}
		slices.Sort(keys)
		return list(keys, "{", ": …}")
	}
	return ""
}

// list shows items in full when they are scalars and short enough.
func list(items []string, open, end string) string {
	s := open + strings.Join(items, ", ") + end
	if slices.Contains(items, "") || len(s) > maxInline {
		return fmt.Sprintf("%d entries (`--print-config` prints them)", len(items))
	}
	return code(s)
}

// scalar renders a list item or map key; "" for anything that is not a plain value.
func scalar(v reflect.Value) string {
	switch v.Kind() {
	case reflect.String:
		return v.String()
	case reflect.Int, reflect.Int64, reflect.Float64, reflect.Bool:
		return fmt.Sprint(v.Interface())
	}
	return ""
}

// duration writes durations the way a configuration file would: 1m, 24h, 1h30m, 1.5s.
func duration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func code(s string) string { return "`" + s + "`" }
