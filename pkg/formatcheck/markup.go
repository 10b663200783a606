package formatcheck

import (
	"strings"
)

// htmlTags are the elements a model leaks into answers when its training text or a tool
// result was HTML. Unknown names ("<T>" in a generic type, "<5%") are left alone.
var htmlTags = map[string]bool{
	"a": true, "b": true, "br": true, "body": true, "code": true, "div": true, "em": true,
	"font": true, "h1": true, "h2": true, "h3": true, "h4": true, "h5": true, "h6": true,
	"head": true, "hr": true, "html": true, "i": true, "iframe": true, "img": true, "li": true,
	"ol": true, "p": true, "pre": true, "script": true, "span": true, "strong": true,
	"style": true, "table": true, "tbody": true, "td": true, "th": true, "thead": true,
	"tr": true, "u": true, "ul": true,
}

// findHTMLTag returns the first HTML tag of a known element in s ("<div class=x>",
// "</p>", "<br/>"), or false.
func findHTMLTag(s string) (string, bool) {
	for i := 0; i < len(s); i++ {
		j := strings.IndexByte(s[i:], '<')
		if j < 0 {
			return "", false
		}
		i += j
		k := i + 1
		if k < len(s) && s[k] == '/' {
			k++
		}
		start := k
		for k < len(s) && (isASCIILetter(s[k]) || (k > start && s[k] >= '0' && s[k] <= '9')) {
			k++
		}
		if k == start || k >= len(s) || !htmlTags[strings.ToLower(s[start:k])] {
			continue
		}
		switch s[k] {
		case '>', ' ', '/', '\t', '\n':
			end := strings.IndexByte(s[k:], '>')
			if end < 0 {
				continue
			}
			return s[i : k+end+1], true
		}
	}
	return "", false
}

func isASCIILetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// unclosedFence reports whether a text answer opens a markdown code fence it never
// closes: everything after it renders as code, usually because the model was cut off or
// lost track of its own markup.
func unclosedFence(s string) bool {
	open := false
	for line := range strings.Lines(s) {
		if strings.HasPrefix(strings.TrimLeft(line, " "), "```") {
			open = !open
		}
	}
	return open
}
