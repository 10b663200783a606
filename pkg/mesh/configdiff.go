package mesh

import (
	"cmp"
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// configChange is one leaf of the configuration that differs between two versions.
type configChange struct {
	// Path is the dotted YAML path: router.routes.chat.hedge.enabled,
	// quota.tenants.acme.tpm. List items with a name (routes, models, providers, keys,
	// tenants) are named by it, so reordering a list is not a change of every item.
	Path string
	// Old and New are the values as text ("(none)" when absent); secret-looking fields
	// are redacted (see secretPath).
	Old, New string
}

// String is the change as a log line shows it.
func (c configChange) String() string { return c.Path + ": " + c.Old + " -> " + c.New }

// diffConfig lists what changed from old to new, in path order.
func diffConfig(old, new Config) []configChange {
	var out []configChange
	diffValue("", reflect.ValueOf(old), reflect.ValueOf(new), &out)
	slices.SortFunc(out, func(a, b configChange) int { return cmp.Compare(a.Path, b.Path) })
	return out
}

// absent marks a side where a map entry or a named list item does not exist.
const absent = "(none)"

func diffValue(path string, a, b reflect.Value, out *[]configChange) {
	if !a.IsValid() || !b.IsValid() {
		if a.IsValid() != b.IsValid() {
			*out = append(*out, change(path, a, b))
		}
		return
	}
	switch a.Kind() {
	case reflect.Struct:
		t := a.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "-" {
				continue
			}
			if name == "" {
				name = strings.ToLower(f.Name)
			}
			p := join(path, name)
			if strings.Contains(opts, "inline") {
				p = path
			}
			diffValue(p, a.Field(i), b.Field(i), out)
		}
	case reflect.Map:
		keys := map[string]reflect.Value{}
		for _, m := range []reflect.Value{a, b} {
			for _, k := range m.MapKeys() {
				keys[fmt.Sprint(k.Interface())] = k
			}
		}
		for _, name := range slices.Sorted(func(yield func(string) bool) {
			for k := range keys {
				if !yield(k) {
					return
				}
			}
		}) {
			k := keys[name]
			diffValue(join(path, name), a.MapIndex(k), b.MapIndex(k), out)
		}
	case reflect.Slice, reflect.Array:
		if named, ok := byName(a); ok {
			other, _ := byName(b)
			for _, name := range unionKeys(named, other) {
				diffValue(join(path, name), lookup(named, name), lookup(other, name), out)
			}
			return
		}
		if !reflect.DeepEqual(a.Interface(), b.Interface()) {
			*out = append(*out, change(path, a, b))
		}
	case reflect.Pointer, reflect.Interface:
		if a.IsNil() || b.IsNil() {
			if a.IsNil() != b.IsNil() {
				*out = append(*out, change(path, a, b))
			}
			return
		}
		diffValue(path, a.Elem(), b.Elem(), out)
	default:
		if !reflect.DeepEqual(a.Interface(), b.Interface()) {
			*out = append(*out, change(path, a, b))
		}
	}
}

// byName indexes a list of structs by their Name (or ID) field; false for other lists.
func byName(v reflect.Value) (map[string]reflect.Value, bool) {
	elem := v.Type().Elem()
	if elem.Kind() != reflect.Struct {
		return nil, false
	}
	field := ""
	for _, f := range []string{"Name", "ID", "Tenant"} {
		if sf, ok := elem.FieldByName(f); ok && sf.Type.Kind() == reflect.String {
			field = f
			break
		}
	}
	if field == "" {
		return nil, false
	}
	out := map[string]reflect.Value{}
	for i := range v.Len() {
		name := v.Index(i).FieldByName(field).String()
		if _, dup := out[name]; dup {
			return nil, false // not a real key: compare the list whole
		}
		out[name] = v.Index(i)
	}
	return out, true
}

func unionKeys(a, b map[string]reflect.Value) []string {
	var out []string
	for k := range a {
		out = append(out, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

func lookup(m map[string]reflect.Value, k string) reflect.Value {
	if v, ok := m[k]; ok {
		return v
	}
	return reflect.Value{}
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func change(path string, a, b reflect.Value) configChange {
	c := configChange{Path: path, Old: text(a), New: text(b)}
	if secretPath(path) {
		if c.Old != absent {
			c.Old = "[REDACTED]"
		}
		if c.New != absent {
			c.New = "[REDACTED]"
		}
	}
	return c
}

func text(v reflect.Value) string {
	if !v.IsValid() {
		return absent
	}
	switch v.Kind() {
	case reflect.Struct, reflect.Map:
		return "{...}" // an added or removed item: its own fields are the item's business
	}
	s := fmt.Sprint(v.Interface())
	if v.Kind() == reflect.String {
		s = fmt.Sprintf("%q", s)
	}
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}

// secretPath reports whether a path names a secret or a hash of one (auth.tenants' key
// hashes): its values never reach a log line or an event. The configuration holds no
// plain secrets (keys come from the environment), but hashes and future fields might.
func secretPath(path string) bool {
	if strings.HasPrefix(path, "auth.") {
		return true
	}
	// Whole words of the last key: max_tokens is a number, api_key_env names a variable.
	words := strings.Split(path[strings.LastIndex(path, ".")+1:], "_")
	if last := words[len(words)-1]; last == "env" || last == "id" {
		return false
	}
	for _, w := range words {
		switch w {
		case "key", "hash", "secret", "password", "token", "credential", "apikey":
			return true
		}
	}
	return false
}
