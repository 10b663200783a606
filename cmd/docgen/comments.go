package main

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
)

// commentSource reads the doc comments of struct fields from the module's source, one
// package at a time, and collects the fields that have none.
type commentSource struct {
	root, module string
	// docs maps package path → type name → field name → comment text.
	docs    map[string]map[string]map[string]string
	missing []string
	seen    map[string]bool // fields reported missing, once each however often they occur
	errs    []error
}

func newCommentSource(root, module string) *commentSource {
	return &commentSource{root: root, module: module, docs: map[string]map[string]map[string]string{}, seen: map[string]bool{}}
}

// doc returns the description of f, found under key: its doc comment (or line comment) as
// one line, with a leading Go field name replaced by the YAML key it stands for.
func (c *commentSource) doc(f yamlField, key string) string {
	where := fmt.Sprintf("%s.%s (%s)", f.owner, f.goName, key)
	if f.owner.Name() == "" {
		c.errs = append(c.errs, fmt.Errorf("%s: an anonymous struct's fields cannot be documented; give it a named type", key))
		return ""
	}
	types, err := c.load(f.owner.PkgPath())
	if err != nil {
		c.errs = append(c.errs, fmt.Errorf("%s: %w", where, err))
		return ""
	}
	fields, ok := types[f.owner.Name()]
	if !ok {
		c.errs = append(c.errs, fmt.Errorf("%s: struct type %s not found in the source", where, f.owner.Name()))
		return ""
	}
	text := strings.Join(strings.Fields(fields[f.goName]), " ")
	if text == "" {
		if id := f.owner.String() + "." + f.goName; !c.seen[id] {
			c.seen[id] = true
			c.missing = append(c.missing, fmt.Sprintf("field %s has no doc comment", where))
		}
		return ""
	}
	return describe(text, f.goName)
}

// describe turns a Go doc comment into a description: "Timeout is how long …" and
// "MinInFlight: with fewer …" become "how long …" and "with fewer …", as the key stands
// beside it.
func describe(text, goName string) string {
	rest, ok := strings.CutPrefix(text, goName)
	if !ok || rest != "" && rest[0] != ' ' && rest[0] != ':' {
		return text
	}
	rest, colon := strings.CutPrefix(rest, ":")
	rest = strings.TrimSpace(rest)
	next, _, _ := strings.Cut(rest, " ")
	if rest == "" || !colon && notVerb[next] {
		return text // "Ratio of calls sampled" names the key as a noun
	}
	for _, verb := range []string{"is ", "are "} {
		rest = strings.TrimPrefix(rest, verb)
	}
	return rest
}

// notVerb are words that, after a field's name, show that the name is not the subject of
// the sentence.
var notVerb = map[string]bool{
	"a": true, "after": true, "an": true, "and": true, "at": true, "before": true, "by": true,
	"for": true, "from": true, "in": true, "of": true, "on": true, "or": true, "per": true,
	"the": true, "to": true, "with": true,
}

// err reports the fields without a comment, and anything that kept comments from being read.
func (c *commentSource) err() error {
	errs := c.errs
	if len(c.missing) > 0 {
		errs = append(errs, fmt.Errorf("every configuration field needs a doc comment, its key's description in docs/configuration.md:\n  %s",
			strings.Join(c.missing, "\n  ")))
	}
	return errors.Join(errs...)
}

// load parses the package's source directory (test files included, so that tests can
// document types of their own) and indexes the comments of every struct type's fields.
func (c *commentSource) load(pkg string) (map[string]map[string]string, error) {
	if types, ok := c.docs[pkg]; ok {
		return types, nil
	}
	rel, ok := strings.CutPrefix(pkg, c.module)
	if !ok || rel != "" && rel[0] != '/' {
		return nil, fmt.Errorf("package %s is outside module %s", pkg, c.module)
	}
	dir := filepath.Join(c.root, filepath.FromSlash(rel))
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	types := map[string]map[string]string{}
	fset := token.NewFileSet()
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") {
			continue
		}
		file, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		ast.Inspect(file, func(n ast.Node) bool {
			spec, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			if st, ok := spec.Type.(*ast.StructType); ok {
				types[spec.Name.Name] = fieldComments(st)
			}
			return false
		})
	}
	c.docs[pkg] = types
	return types, nil
}

func fieldComments(st *ast.StructType) map[string]string {
	out := map[string]string{}
	for _, f := range st.Fields.List {
		text := f.Doc.Text()
		if text == "" {
			text = f.Comment.Text()
		}
		for _, name := range f.Names {
			out[name.Name] = text
		}
		if len(f.Names) == 0 { // embedded: named by its type
			out[embeddedName(f.Type)] = text
		}
	}
	return out
}

func embeddedName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return embeddedName(t.X)
	case *ast.SelectorExpr:
		return t.Sel.Name
	case *ast.Ident:
		return t.Name
	}
	return ""
}
