package router

import (
	"context"
	"errors"
	"testing"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
)

// The reason label of mantle_router_degradations_total is bounded: error classes and a few
// fixed words, never the free-text reason the caller sees.
func TestDegradationCause(t *testing.T) {
	t.Parallel()
	failed := func(classes ...mantlev1.ErrorClass) *mantlev1.QualityContext {
		qc := &mantlev1.QualityContext{DegradationReason: "primary failed: timeout"}
		for _, c := range classes {
			qc.Attempts = append(qc.Attempts, &mantlev1.Attempt{ErrorClass: c})
		}
		return qc
	}
	tests := []struct {
		name string
		qc   *mantlev1.QualityContext
		err  error
		want string
	}{
		{"forced by an operator", failed(), &exhaustedError{class: mantlev1.ErrorClass_ERROR_CLASS_BREAKER_OPEN, forced: ForceCache}, causeForced},
		{"retry budget refused", failed(mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED), &exhaustedError{class: mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, retryDenied: true}, causeRetryBudget},
		{"every candidate failed", failed(mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT), &exhaustedError{class: mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT}, "timeout"},
		{"a rule asked to degrade", &mantlev1.QualityContext{DegradationReason: reasonRuleDegrade}, &exhaustedError{class: mantlev1.ErrorClass_ERROR_CLASS_VERIFICATION_FAILED}, causeRule},
		{"another error", failed(), &provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_AUTH}, "auth"},
		{"an error without a class", failed(), errors.New("boom: sk-secret in the text"), "unknown"},
		{"the caller left", failed(), context.Canceled, "canceled"},
		{"backup answered after the primary failed", failed(mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, mantlev1.ErrorClass_ERROR_CLASS_CANCELED, mantlev1.ErrorClass_ERROR_CLASS_NONE), nil, "rate_limited"},
		{"backup answered, the primary was skipped", failed(mantlev1.ErrorClass_ERROR_CLASS_NONE), nil, causeSkipped},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := degradationCause(tt.qc, tt.err); got != tt.want {
				t.Errorf("degradationCause = %q, want %q", got, tt.want)
			}
		})
	}
}
