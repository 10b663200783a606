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
