// Package docs holds mantle's documentation; its test keeps the links between the
// documents true as they move.
package docs

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// link matches a Markdown link's target: [text](target).
var link = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestLinksResolve checks every relative link of the README, docs/ and the services'
// READMEs: the file exists, and a #fragment names a heading of the Markdown file.
func TestLinksResolve(t *testing.T) {
	t.Parallel()
	files := []string{"../README.md"}
	for _, pattern := range []string{"*.md", "design/*.md", "../services/*/README.md"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) < 10 {
		t.Fatalf("found only %v: the test runs from docs/", files)
	}
	anchors := map[string]map[string]bool{}
	for _, f := range files {
		body, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(body), -1) {
			target := m[1]
			if strings.HasPrefix(target, "http:") || strings.HasPrefix(target, "https:") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, fragment, _ := strings.Cut(target, "#")
			resolved := f
			if path != "" {
				resolved = filepath.Join(filepath.Dir(f), path)
			}
			if _, err := os.Stat(resolved); err != nil {
				t.Errorf("%s: link %s: %v", f, target, err)
				continue
			}
			if fragment == "" || !strings.HasSuffix(resolved, ".md") {
				continue
			}
			if anchors[resolved] == nil {
				anchors[resolved] = headingAnchors(t, resolved)
			}
			if !anchors[resolved][fragment] {
				t.Errorf("%s: link %s: %s has no heading #%s", f, target, resolved, fragment)
			}
		}
	}
}

// headingAnchors returns the anchors GitHub gives the headings of a Markdown file (outside
// code blocks): lower case, punctuation dropped, spaces as hyphens.
func headingAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]bool{}
	inCode := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
			continue
		}
		if inCode || !strings.HasPrefix(line, "#") {
			continue
		}
		heading := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		var b strings.Builder
		for _, r := range heading {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r > 127:
				b.WriteRune(r)
			}
		}
		out[b.String()] = true
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
