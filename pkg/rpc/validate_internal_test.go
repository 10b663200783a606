package rpc

import (
	"regexp"
	"strings"
	"testing"
)

// tenantIDPattern is what ValidTenantID checks, as the regular expression it replaced.
var tenantIDPattern = regexp.MustCompile(`^[a-z0-9_-]+$`)

func validTenantIDReference(id string) bool {
	return len(id) <= MaxTenantIDLength && tenantIDPattern.MatchString(id)
}

// FuzzValidTenantID: the loop over the bytes agrees with the regular expression on any
// input, invalid UTF-8 and trailing newlines included.
func FuzzValidTenantID(f *testing.F) {
	for _, id := range []string{
		"acme", "acme-eu_2", "", "Acme", "acme/x", "acme.x", "acme:x", "a b", "acme\n", "\nacme",
		"ünï", "\xff", "a\x00", strings.Repeat("a", MaxTenantIDLength), strings.Repeat("a", MaxTenantIDLength+1),
	} {
		f.Add(id)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if got, want := ValidTenantID(id), validTenantIDReference(id); got != want {
			t.Errorf("ValidTenantID(%q) = %v, the regular expression says %v", id, got, want)
		}
	})
}

// validRequestIDReference is ValidRequestID as a loop over runes, as it was written first.
func validRequestIDReference(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, c := range id {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', strings.ContainsRune("-_.:", c):
		default:
			return false
		}
	}
	return true
}

// FuzzValidRequestID: the loop over the bytes agrees with the loop over runes on any
// input, invalid UTF-8 included.
func FuzzValidRequestID(f *testing.F) {
	for _, id := range []string{
		"req_0123abcd", "2f1c-ab.9:x", "", "has space", "new\nline", "日本", "\xff", "a\x00",
		strings.Repeat("a", 128), strings.Repeat("a", 129), "A-Z_a.z:09",
	} {
		f.Add(id)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if got, want := ValidRequestID(id), validRequestIDReference(id); got != want {
			t.Errorf("ValidRequestID(%q) = %v, the rune loop says %v", id, got, want)
		}
	})
}
