package jsonwrite

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"

	"pgregory.net/rapid"
)

// TestMatchesEncodingJSON holds both appenders to json.Marshal, byte for byte.
func TestMatchesEncodingJSON(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		f := rapid.OneOf(rapid.Float64(), rapid.SampledFrom([]float64{0, math.Copysign(0, -1), 1e-6, 9.99e-7, 1e20, 1e21, -1e-300, 5e-324, math.MaxFloat64, 0.1, 1.5})).Draw(t, "f")
		if want, err := json.Marshal(f); err == nil {
			if got := Float(nil, f); !bytes.Equal(got, want) {
				t.Fatalf("Float(%v) = %s, json.Marshal %s", f, got, want)
			}
		}
		s := rapid.OneOf(rapid.String(), rapid.StringOf(rapid.SampledFrom([]rune("a<>&\"\\\b\f\t\n\r\x00\x1f\x7f\u2028\u2029é中\uFFFD"))),
			rapid.Custom(func(t *rapid.T) string { return string(rapid.SliceOf(rapid.Byte()).Draw(t, "bytes")) })).Draw(t, "s")
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatalf("json.Marshal(%q): %v", s, err)
		}
		if got := String(nil, s); !bytes.Equal(got, want) {
			t.Fatalf("String(%q) = %s, json.Marshal %s", s, got, want)
		}
	})
}
