package router

import (
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// invalidUTF8At is the offset of the first byte of b that is not UTF-8.
func invalidUTF8At(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return len(b)
}

// maxBudget bounds x-mantle-budget-ms: a route's own budget caps the request anyway, and a
// larger number would overflow a Duration into the past.
const maxBudget = 24 * time.Hour

// headerBudget reads x-mantle-budget-ms; 0 means the header is absent.
func headerBudget(h http.Header) (time.Duration, error) {
	v := h.Get(canonicalBudget)
	if v == "" {
		return 0, nil
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms <= 0 || ms > maxBudget.Milliseconds() {
		return 0, rpc.Invalid(HeaderBudget, "want a whole number of milliseconds from 1 to %d, got %q", maxBudget.Milliseconds(), abbreviateHeader(v))
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// abbreviateHeader keeps an echoed header value short: it may be as long as the header
// limit.
func abbreviateHeader(v string) string {
	if len(v) > 64 {
		return v[:64] + "..."
	}
	return v
}
