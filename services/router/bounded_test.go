package router

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// TestVerifierRefusalIsNotAnOutage: a verifier that answers INVALID_ARGUMENT refused to
// judge that answer. The router must not treat it as down (which sent the answer out
// unverified, rules and review skipped): the answer counts as failed verification and the
// next candidate is asked.
func TestVerifierRefusalIsNotAnOutage(t *testing.T) {
	t.Parallel()
	h := &harness{providers: map[string]*fakeProvider{
		"a": newFakeProvider(reply("an answer the verifier will not judge", 10, 5)),
		"b": newFakeProvider(reply("A breaker stops calls.", 10, 5)),
	}}
	h.verifier = &fakeVerifier{verdict: func(in *verifierv1.VerifyRequest) (*verifierv1.VerifyResponse, error) {
		if in.GetModel() == "a" {
			return nil, rpc.InvalidArgument("verifier.mantle", rpc.Invalid("content", "is 2000000 bytes; the limit is 1048576"))
		}
		return pass(in), nil
	}}
	h = newHarness(t, testConfig(), h)
	resp, err := h.router.Complete(context.Background(), ask("chat"))
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	q := resp.GetQuality()
	if resp.GetModel() != "b" || q.GetQualityGrade() != mantlev1.QualityGrade_QUALITY_GRADE_HIGH {
		t.Errorf("answered by %s with grade %v, want b, verified", resp.GetModel(), q.GetQualityGrade())
	}
	if diff := cmp.Diff([]string{"a:verification_failed", "b:none"}, attemptsOf(q)); diff != "" {
		t.Errorf("attempts (-want +got):\n%s", diff)
	}
	for _, s := range q.GetAudit() {
		if strings.Contains(s.GetDetail(), "verifier unavailable") {
			t.Errorf("audit step %q: a refusal is not an outage", s.GetDetail())
		}
	}
}

// TestInvalidSchemaIsRefusedBeforeAnyProviderCall over the router's gRPC surface (the HTTP
// front door's test is in pkg/mesh): "notaschema" used to reach the verifier, whose
// INVALID_ARGUMENT the router took for an outage.
func TestInvalidSchemaIsRefusedBeforeAnyProviderCall(t *testing.T) {
	t.Parallel()
	for _, schema := range []string{`"notaschema"`, `{"type":"notatype"}`, strings.Repeat(`{"items":`, 40) + `{}` + strings.Repeat(`}`, 40)} {
		h := newHarness(t, testConfig(), nil)
		req := ask("chat")
		req.ResponseFormat = &mantlev1.ResponseFormat{Type: mantlev1.ResponseFormat_TYPE_JSON_SCHEMA, JsonSchema: schema}
		_, err := h.router.Complete(context.Background(), req)
		if status.Code(toStatus(err)) != codes.InvalidArgument || !strings.Contains(strings.Join(rpc.BadRequestFields(toStatus(err)), ","), "request.response_format.json_schema") {
			t.Errorf("schema %.40s: %v, want INVALID_ARGUMENT on request.response_format.json_schema", schema, err)
		}
		if n := h.calls("a") + h.calls("b") + h.calls("c"); n != 0 {
			t.Errorf("schema %.40s: %d provider calls, want none", schema, n)
		}
	}
}

// TestCallerScenariosKeyNoBreakers: the scenario is caller-chosen, and a breaker per
// distinct value grew memory without bound. Only configured scenarios key breakers.
func TestCallerScenariosKeyNoBreakers(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Routes = append(cfg.Routes, RouteConfig{Name: "legal", Scenario: "legal", Candidates: []string{"a"}})
	h := newHarness(t, cfg, nil)
	scenarios := []string{"", "support", "legal"}
	for i := range 50 {
		scenarios = append(scenarios, fmt.Sprintf("made-up-%d", i))
	}
	for _, s := range scenarios {
		req := ask("chat")
		req.Scenario = s
		if _, err := h.router.Complete(context.Background(), req); err != nil {
			t.Fatalf("scenario %q: %v", s, err)
		}
	}
	key := h.router.upstreams["a"].keys[0]
	key.mu.Lock()
	defer key.mu.Unlock()
	var got []string
	for s := range key.breakers {
		got = append(got, s)
	}
	if diff := cmp.Diff([]string{"legal", "support"}, got, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Errorf("breakers of model a by scenario (-want +got):\n%s", diff)
	}
}
