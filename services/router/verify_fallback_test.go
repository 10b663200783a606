package router

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/formatcheck"
)

// TestVerifierUnavailableRunsL1Locally: issue 3, "verifier unreachable -> the router runs
// L1 locally from the shared library and marks quality unverified". The fake verifier is
// down for the whole request; the router's own formatcheck.Checker decides whether each
// candidate's answer may go out.
func TestVerifierUnavailableRunsL1Locally(t *testing.T) {
	t.Parallel()
	jsonObject := &mantlev1.ResponseFormat{Type: mantlev1.ResponseFormat_TYPE_JSON_OBJECT}
	tests := []struct {
		name    string
		format  *mantlev1.ResponseFormat
		results map[string][]result
		// noChecker builds the router without a local checker (Deps.Checker nil).
		noChecker bool
		// verifierOff builds the router without a verifier (router.verifier_address: off).
		verifierOff  bool
		wantModel    string
		wantContent  string
		wantAttempts []string // model:class of every attempt
		// wantAudit are substrings of the router's verify steps, in order.
		wantAudit []string
	}{
		{
			name:   "malformed JSON from the first candidate fails over to the second",
			format: jsonObject,
			results: map[string][]result{
				"a": {reply(`{"answer": "A breaker stops calls.",`, 10, 5)},
				"b": {reply(`{"answer": "A breaker stops calls."}`, 20, 7)},
			},
			wantModel:    "b",
			wantContent:  `{"answer": "A breaker stops calls."}`,
			wantAttempts: []string{"a:malformed_output", "b:none"},
			wantAudit: []string{"verifier unavailable (Unavailable); local L1 failed: json_parse (malformed_output)",
				"verifier unavailable (Unavailable); local L1 passed"},
		},
		{
			name:         "a valid answer passes and is marked unverified",
			results:      map[string][]result{"a": {reply("A breaker stops calls to a failing service.", 10, 5)}},
			wantModel:    "a",
			wantContent:  "A breaker stops calls to a failing service.",
			wantAttempts: []string{"a:none"},
			wantAudit:    []string{"verifier unavailable (Unavailable); local L1 passed"},
		},
		{
			name:         "fenced JSON goes out unwrapped, as the verifier would deliver it",
			format:       jsonObject,
			results:      map[string][]result{"a": {reply("```json\n{\"answer\": \"yes\"}\n```", 10, 5)}},
			wantModel:    "a",
			wantContent:  `{"answer": "yes"}`,
			wantAttempts: []string{"a:none"},
			wantAudit:    []string{"verifier unavailable (Unavailable); local L1 passed"},
		},
		{
			name: "a refusal fails over with its class",
			results: map[string][]result{
				"a": {reply("I'm sorry, but I can't help with that request.", 10, 5)},
				"b": {reply("A breaker stops calls to a failing service.", 20, 7)},
			},
			wantModel:    "b",
			wantContent:  "A breaker stops calls to a failing service.",
			wantAttempts: []string{"a:refusal", "b:none"},
			wantAudit:    []string{"local L1 failed: refusal (refusal)", "local L1 passed"},
		},
		{
			name:      "without a checker the answer goes out unchecked",
			format:    jsonObject,
			noChecker: true,
			results: map[string][]result{
				"a": {reply(`{"answer": "A breaker stops calls.",`, 10, 5)},
			},
			wantModel:    "a",
			wantContent:  `{"answer": "A breaker stops calls.",`,
			wantAttempts: []string{"a:none"},
			wantAudit:    []string{"verifier unavailable (Unavailable); not checked"},
		},
		{
			name:        "with the verifier off, malformed JSON still fails over and nothing is asked of it",
			format:      jsonObject,
			verifierOff: true,
			results: map[string][]result{
				"a": {reply(`{"answer": "A breaker stops calls.",`, 10, 5)},
				"b": {reply("```json\n{\"answer\": \"yes\"}\n```", 20, 7)},
			},
			wantModel:    "b",
			wantContent:  `{"answer": "yes"}`,
			wantAttempts: []string{"a:malformed_output", "b:none"},
			wantAudit:    []string{"verifier off; local L1 failed: json_parse (malformed_output)", "verifier off; local L1 passed"},
		},
		{
			name:         "with the verifier off and no checker the answer goes out unchecked",
			verifierOff:  true,
			noChecker:    true,
			results:      map[string][]result{"a": {reply("A breaker stops calls to a failing service.", 10, 5)}},
			wantModel:    "a",
			wantContent:  "A breaker stops calls to a failing service.",
			wantAttempts: []string{"a:none"},
			wantAudit:    []string{"verifier off; not checked"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := &harness{providers: map[string]*fakeProvider{}}
			for model, rs := range tt.results {
				h.providers[model] = newFakeProvider(rs...)
			}
			verifierCalls := 0
			h.verifier = &fakeVerifier{verdict: func(*verifierv1.VerifyRequest) (*verifierv1.VerifyResponse, error) {
				verifierCalls++ // attempts run one at a time here (no hedging)
				return nil, status.Error(codes.Unavailable, "connection refused")
			}}
			h = newHarness(t, testConfig(), h)
			if !tt.noChecker {
				checker, err := formatcheck.New(formatcheck.DefaultConfig())
				if err != nil {
					t.Fatal(err)
				}
				h.router.deps.Checker = checker // as newModule builds it; set before any request
			}
			if tt.verifierOff {
				h.router.deps.Verifier = nil // as newModule leaves it for an address of "off"
			}
			req := ask("chat")
			req.ResponseFormat = tt.format

			resp, err := h.router.Complete(context.Background(), req)
			if err != nil {
				t.Fatalf("Complete: %v", err)
			}
			if resp.GetModel() != tt.wantModel || resp.GetMessage().GetContent() != tt.wantContent {
				t.Errorf("answered by %s with %q, want %s with %q", resp.GetModel(), resp.GetMessage().GetContent(), tt.wantModel, tt.wantContent)
			}
			q := resp.GetQuality()
			if diff := cmp.Diff(tt.wantAttempts, attemptsOf(q)); diff != "" {
				t.Errorf("attempts (-want +got):\n%s", diff)
			}
			wantCalls := len(tt.wantAttempts) // once per answer
			if tt.verifierOff {
				wantCalls = 0
			}
			if verifierCalls != wantCalls {
				t.Errorf("verifier called %d times, want %d", verifierCalls, wantCalls)
			}
			// Unverified: no verdict, no grade, "verify" skipped, and nothing cached.
			if q.GetVerification() != nil || q.GetQualityGrade() != mantlev1.QualityGrade_QUALITY_GRADE_UNSPECIFIED {
				t.Errorf("verification %v grade %v, want none: the verifier did not check the answer", q.GetVerification(), q.GetQualityGrade())
			}
			if !slices.Contains(q.GetSkippedSteps(), "verify") {
				t.Errorf("skipped steps %v, want verify among them", q.GetSkippedSteps())
			}
			if n := h.cache.stored(); n != 0 {
				t.Errorf("%d answers stored in the cache, want none: unverified answers are not cached", n)
			}
			var verifySteps []string
			for _, s := range q.GetAudit() {
				if s.GetService() == "router" && s.GetStep() == "verify" {
					verifySteps = append(verifySteps, s.GetDetail())
				}
			}
			if len(verifySteps) != len(tt.wantAudit) {
				t.Fatalf("router verify steps %q, want %d like %q", verifySteps, len(tt.wantAudit), tt.wantAudit)
			}
			for i, want := range tt.wantAudit {
				if !strings.Contains(verifySteps[i], want) {
					t.Errorf("verify step %d = %q, want it to contain %q", i, verifySteps[i], want)
				}
			}
		})
	}
}

// TestQuotaAndCacheOff runs a request through failures and the ladder with quota and cache
// off (their addresses "off", so Deps leaves them nil): nothing is reserved or settled, the
// retries are decided by the local budgets alone, the ladder's cache level says it is off,
// and the template answers. The fakes stay reachable by the test only, to show they were
// never asked.
func TestQuotaAndCacheOff(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Routes[0].Ladder = LadderConfig{Cache: true, Template: "We will get back to you."}
	h := &harness{providers: map[string]*fakeProvider{
		"a": newFakeProvider(failure(mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, "busy")),
		"b": newFakeProvider(failure(mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, "slow down")),
		"c": newFakeProvider(failure(mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT, "502")),
	}}
	h = newHarness(t, cfg, h)
	h.router.deps.Quota, h.router.deps.Cache = nil, nil

	resp, err := h.router.Complete(context.Background(), ask("chat"))
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	q := resp.GetQuality()
	if q.GetFallbackLevel() != mantlev1.FallbackLevel_FALLBACK_LEVEL_TEMPLATE || resp.GetMessage().GetContent() != "We will get back to you." {
		t.Errorf("answer %q at %v, want the template", resp.GetMessage().GetContent(), q.GetFallbackLevel())
	}
	if n := h.providers["c"].calls(); n != 3 {
		t.Errorf("c called %d times, want 3: its transient failure is retried on the local budget", n)
	}
	if len(h.quota.reserves)+len(h.quota.settles)+len(h.quota.retries) != 0 || len(h.cache.lookups)+len(h.cache.stores) != 0 {
		t.Errorf("quota asked %d/%d/%d times, cache %d/%d, want never: both are off",
			len(h.quota.reserves), len(h.quota.settles), len(h.quota.retries), len(h.cache.lookups), len(h.cache.stores))
	}
	if got := q.GetSkippedSteps(); slices.Contains(got, "quota") || slices.Contains(got, "cache") {
		t.Errorf("skipped steps %v: a service that is off did not fail", got)
	}
	var ladder []string
	for _, s := range q.GetAudit() {
		if s.GetStep() == "ladder" {
			ladder = append(ladder, s.GetDetail())
		}
	}
	if !slices.Contains(ladder, "L2 cache: off") {
		t.Errorf("ladder steps %q, want the cache level reported off", ladder)
	}
}
