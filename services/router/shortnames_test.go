package router

import (
	"fmt"
	"strings"
	"testing"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// TestShortNames: the names made once are the names made per call, for every declared
// value and for one no enum declares.
func TestShortNames(t *testing.T) {
	t.Parallel()
	made := func(name, prefix string) string { return strings.ToLower(strings.TrimPrefix(name, prefix)) }
	for _, tc := range []struct {
		enum     string
		declared map[int32]string
		prefix   string
		short    func(int32) (got, want string)
	}{
		{"ErrorClass", mantlev1.ErrorClass_name, "ERROR_CLASS_", func(n int32) (string, string) {
			return shortClass(mantlev1.ErrorClass(n)), made(mantlev1.ErrorClass(n).String(), "ERROR_CLASS_")
		}},
		{"QualityGrade", mantlev1.QualityGrade_name, "QUALITY_GRADE_", func(n int32) (string, string) {
			return shortGrade(mantlev1.QualityGrade(n)), made(mantlev1.QualityGrade(n).String(), "QUALITY_GRADE_")
		}},
		{"FallbackLevel", mantlev1.FallbackLevel_name, "FALLBACK_LEVEL_", func(n int32) (string, string) {
			return ShortLevel(mantlev1.FallbackLevel(n)), made(mantlev1.FallbackLevel(n).String(), "FALLBACK_LEVEL_")
		}},
		{"Priority", mantlev1.Priority_name, "PRIORITY_", func(n int32) (string, string) {
			return priorityLabel(mantlev1.Priority(n)), made(mantlev1.Priority(n).String(), "PRIORITY_")
		}},
	} {
		t.Run(tc.enum, func(t *testing.T) {
			t.Parallel()
			values := []int32{9999}
			for n := range tc.declared {
				values = append(values, n)
			}
			for _, n := range values {
				got, want := tc.short(n)
				if got != want || strings.HasPrefix(got, strings.ToLower(tc.prefix)) {
					t.Errorf("%s(%d) = %q, want %q", tc.enum, n, got, want)
				}
			}
		})
	}
	if got := shortClass(mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED); got != "rate_limited" {
		t.Errorf("shortClass(RATE_LIMITED) = %q", got)
	}
}

// TestShortNamesDoNotAllocate: a declared value's short name is looked up, not made.
func TestShortNamesDoNotAllocate(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() {
		_ = shortClass(mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED)
		_ = ShortLevel(mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL)
		_ = shortGrade(mantlev1.QualityGrade_QUALITY_GRADE_HIGH)
		_ = priorityLabel(mantlev1.Priority_PRIORITY_HIGH)
	}); n != 0 {
		t.Errorf("%v allocations, want 0", n)
	}
}

// TestAttemptDetail: an attempt's audit line, concatenated, reads as it was formatted.
func TestAttemptDetail(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		provider, model, key string
		class                mantlev1.ErrorClass
		hedged               bool
	}{
		{"openai", "gpt-4o", "k1", mantlev1.ErrorClass_ERROR_CLASS_NONE, false},
		{"anthropic", "claude", "", mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, true},
		{"", "m", "k", mantlev1.ErrorClass(9999), false},
	} {
		want := fmt.Sprintf("%s/%s key=%s class=%s%s", tc.provider, tc.model, tc.key, shortClass(tc.class), hedgeNote(tc.hedged))
		if got := attemptDetail(tc.provider, tc.model, tc.key, tc.class, tc.hedged); got != want {
			t.Errorf("attemptDetail = %q, want %q", got, want)
		}
	}
	if got := attemptDetail("p", "m", "k", mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT, true); got != "p/m key=k class=timeout (hedge)" {
		t.Errorf("attemptDetail = %q", got)
	}
}
