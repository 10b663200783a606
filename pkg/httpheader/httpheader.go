// Package httpheader sets the headers of an HTTP message that sets several at once, with
// one allocation for all their values where http.Header.Set makes one for each.
package httpheader

import "net/http"

// Setter sets headers as http.Header.Set would, each later one replacing an earlier of
// the same name. The values share one array, and each header's slice is capped at its own
// value, so that adding to one header (http.Header.Add) never writes into the next.
type Setter struct {
	h      http.Header
	values []string
}

// NewSetter returns a Setter for h with room for n values; more still fit, in another
// array.
func NewSetter(h http.Header, n int) Setter {
	return Setter{h: h, values: make([]string, 0, n)}
}

// Set sets the header named canonical to v. The name must be in canonical form
// (http.CanonicalHeaderKey): Set does not make it so, which would cost a new string for
// every name that is not.
func (s *Setter) Set(canonical, v string) {
	s.values = append(s.values, v)
	n := len(s.values)
	s.h[canonical] = s.values[n-1 : n : n]
}
