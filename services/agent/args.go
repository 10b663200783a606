package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// argLimits bound a call's arguments before they are decoded.
type argLimits struct {
	bytes, depth, nodes int
}

// argError is arguments that cannot be sent to the tool: the field that failed (a JSON
// pointer into the arguments, "" for the whole) and why.
type argError struct {
	Path   string
	Reason string
}

func (e *argError) Error() string {
	if e.Path == "" {
		return "arguments: " + e.Reason
	}
	return "arguments" + e.Path + ": " + e.Reason
}

// parseArguments checks a call's arguments against the limits (size, then depth and node
// count in one streaming pass, so a hostile document costs at most its bounded size) and
// decodes them. They must be one JSON object; empty means {}. It returns the decoded
// object and its canonical encoding (keys sorted), which keys the stale store and the
// action fingerprint.
func parseArguments(text string, l argLimits) (map[string]any, []byte, error) {
	if strings.TrimSpace(text) == "" {
		text = "{}"
	}
	if len(text) > l.bytes {
		return nil, nil, &argError{Reason: fmt.Sprintf("%d bytes, more than the %d allowed", len(text), l.bytes)}
	}
	if !utf8.ValidString(text) {
		return nil, nil, &argError{Reason: "not valid UTF-8"}
	}
	if err := scanBounds(text, l); err != nil {
		return nil, nil, err
	}
	var value any
	dec := json.NewDecoder(strings.NewReader(text))
	if err := dec.Decode(&value); err != nil {
		return nil, nil, &argError{Reason: "not valid JSON: " + err.Error()}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, nil, &argError{Reason: "more than one JSON value"}
	}
	obj, ok := value.(map[string]any)
	if !ok {
		return nil, nil, &argError{Reason: "must be a JSON object"}
	}
	canonical, err := json.Marshal(obj) // map keys sorted: one text per value
	if err != nil {
		return nil, nil, &argError{Reason: "cannot be encoded: " + err.Error()}
	}
	return obj, canonical, nil
}

// scanBounds walks the tokens of text, refusing it at the first value past the depth or
// node limit, before anything is built from it.
func scanBounds(text string, l argLimits) error {
	dec := json.NewDecoder(strings.NewReader(text))
	depth, nodes := 0, 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return &argError{Reason: "not valid JSON: " + err.Error()}
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
			nodes++
			if depth > l.depth {
				return &argError{Reason: fmt.Sprintf("nested deeper than %d levels", l.depth)}
			}
		case json.Delim('}'), json.Delim(']'):
			depth--
		default:
			nodes++ // object keys count too: they are what a wide object is made of
		}
		if nodes > l.nodes {
			return &argError{Reason: fmt.Sprintf("more than %d values", l.nodes)}
		}
	}
}

// digest is a short, stable digest of parts, separated so that ("ab", "c") and ("a",
// "bc") differ.
func digest(parts ...[]byte) string {
	h := sha256.New()
	for _, p := range parts {
		var n [8]byte
		for i, l := 0, len(p); i < 8; i, l = i+1, l>>8 {
			n[i] = byte(l)
		}
		h.Write(n[:])
		h.Write(p)
	}
	return hex.EncodeToString(h.Sum(nil))
}
