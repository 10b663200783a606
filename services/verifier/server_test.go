package verifier

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/verifier/internal/review"
	"github.com/mantle-mesh/mantle/services/verifier/internal/semantic"
)

// startVerifier serves the verifier module in memory mode and returns a real generated client.
func startVerifier(t *testing.T, cfg Config) verifierv1.VerifierServiceClient {
	t.Helper()
	return startServer(t, cfg, serverOptions{}).client
}

func TestServerVerifyReturnsVerdictAndQuality(t *testing.T) {
	t.Parallel()
	client := startVerifier(t, DefaultConfig())
	routerStep := &mantlev1.AuditStep{At: timestamppb.New(testNow.Add(-time.Second)), Service: "router", Step: "attempt"}

	t.Run("fenced JSON passes with a warning", func(t *testing.T) {
		t.Parallel()
		resp, err := client.Verify(asTenant("acme"), &verifierv1.VerifyRequest{
			Quality:        &mantlev1.QualityContext{RequestId: "req-1", Tenant: "acme", Audit: []*mantlev1.AuditStep{routerStep}},
			Content:        "```json\n" + validJSON + "\n```",
			FinishReason:   "stop",
			ResponseFormat: &mantlev1.ResponseFormat{Type: mantlev1.ResponseFormat_TYPE_JSON_OBJECT, RequiredFields: []string{"answer"}},
			Model:          "gpt-4o",
		})
		if err != nil {
			t.Fatalf("Verify: %v", err)
		}
		want := &verifierv1.VerifyResponse{
			Passed:       true,
			FailureClass: mantlev1.ErrorClass_ERROR_CLASS_NONE,
			Findings: []*verifierv1.Finding{{
				Layer: LayerL1, Code: CodeMarkdownFence, Blocking: false,
				Message: "the JSON was wrapped in a markdown code fence; the fence was removed",
			}},
			Content:   validJSON,
			Grade:     mantlev1.QualityGrade_QUALITY_GRADE_MEDIUM,
			RiskScore: 0.15,
			L3Pending: true,
			Risk: &verifierv1.RiskBreakdown{
				Output: 0.3, Signals: []string{SignalFormatWarning}, Threshold: 0.75,
			},
			Quality: &mantlev1.QualityContext{
				RequestId: "req-1",
				Tenant:    "acme",
				Verification: &mantlev1.Verification{
					L1Passed:     true,
					L3Pending:    true,
					FailureClass: mantlev1.ErrorClass_ERROR_CLASS_NONE,
				},
				QualityGrade: mantlev1.QualityGrade_QUALITY_GRADE_MEDIUM,
				RiskScore:    0.15,
				Audit: []*mantlev1.AuditStep{routerStep, {
					At: timestamppb.New(testNow), Service: "verifier", Step: "verify",
					Detail:   "model=gpt-4o passed with findings: markdown_fence risk=0.15",
					Duration: durationpb.New(0),
				}},
			},
		}
		if diff := cmp.Diff(want, resp, protocmp.Transform()); diff != "" {
			t.Errorf("Verify response mismatch (-want +got):\n%s", diff)
		}
	})

	t.Run("broken JSON fails at l1 without auth", func(t *testing.T) {
		t.Parallel()
		resp, err := client.Verify(context.Background(), &verifierv1.VerifyRequest{
			Quality:        &mantlev1.QualityContext{RequestId: "req-2", Tenant: "acme"},
			Content:        `{"answer": "Your order`,
			FinishReason:   "length",
			ResponseFormat: &mantlev1.ResponseFormat{Type: mantlev1.ResponseFormat_TYPE_JSON_OBJECT},
		})
		if err != nil {
			t.Fatalf("Verify: %v", err)
		}
		if resp.GetPassed() || resp.GetFailedLayer() != "l1" ||
			resp.GetFailureClass() != mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED ||
			resp.GetGrade() != mantlev1.QualityGrade_QUALITY_GRADE_LOW {
			t.Errorf("verdict = passed %v, layer %q, class %v, grade %v; want failed, l1, TRUNCATED, LOW",
				resp.GetPassed(), resp.GetFailedLayer(), resp.GetFailureClass(), resp.GetGrade())
		}
		wantVerification := &mantlev1.Verification{
			L1Passed:     false,
			L1Failures:   []string{CodeTruncated, CodeJSONParse},
			FailureClass: mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED,
		}
		if diff := cmp.Diff(wantVerification, resp.GetQuality().GetVerification(), protocmp.Transform()); diff != "" {
			t.Errorf("quality.verification mismatch (-want +got):\n%s", diff)
		}
		if got := resp.GetQuality().GetQualityGrade(); got != mantlev1.QualityGrade_QUALITY_GRADE_LOW {
			t.Errorf("quality.quality_grade = %v, want LOW", got)
		}
		audit := resp.GetQuality().GetAudit()
		if want := "l1 failed: truncated,json_parse (truncated) risk=0.50"; len(audit) != 1 || audit[0].GetDetail() != want {
			t.Errorf("quality.audit = %v, want one step with detail %q", audit, want)
		}
		if resp.GetL3Pending() || resp.GetReviewId() != "" {
			t.Errorf("a failed answer got l3_pending %v, review %q; want neither", resp.GetL3Pending(), resp.GetReviewId())
		}
	})

	t.Run("authenticated call without a QualityContext", func(t *testing.T) {
		t.Parallel()
		resp, err := client.Verify(asTenant("acme"), &verifierv1.VerifyRequest{Content: "抱歉，我不能回答这个问题。"})
		if err != nil {
			t.Fatalf("Verify: %v", err)
		}
		if resp.GetFailureClass() != mantlev1.ErrorClass_ERROR_CLASS_REFUSAL {
			t.Errorf("failure_class = %v, want REFUSAL", resp.GetFailureClass())
		}
		if got := resp.GetQuality().GetTenant(); got != "acme" {
			t.Errorf("quality.tenant = %q, want the authenticated tenant %q", got, "acme")
		}
		if n := len(resp.GetQuality().GetAudit()); n != 1 {
			t.Errorf("quality.audit has %d steps, want 1", n)
		}
	})
}

func TestServerVerifyErrors(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.MaxContentBytes = 1024
	client := startVerifier(t, cfg)
	acme := &mantlev1.QualityContext{Tenant: "acme"}

	tests := []struct {
		name       string
		ctx        context.Context
		req        *verifierv1.VerifyRequest
		wantCode   codes.Code
		wantReason string
		wantFields []string
	}{
		{
			name:       "tenant mismatch",
			ctx:        asTenant("acme"),
			req:        &verifierv1.VerifyRequest{Quality: &mantlev1.QualityContext{Tenant: "globex"}, Content: "hi there"},
			wantCode:   codes.PermissionDenied,
			wantReason: rpc.ReasonPermissionDenied,
		},
		{
			name:       "no tenant without auth",
			ctx:        context.Background(),
			req:        &verifierv1.VerifyRequest{Content: "hi there"},
			wantCode:   codes.InvalidArgument,
			wantReason: rpc.ReasonInvalidRequest,
			wantFields: []string{"quality.tenant"},
		},
		{
			name:       "oversized content",
			ctx:        asTenant("acme"),
			req:        &verifierv1.VerifyRequest{Quality: acme, Content: strings.Repeat("x", 1025)},
			wantCode:   codes.InvalidArgument,
			wantReason: rpc.ReasonInvalidRequest,
			wantFields: []string{"content"},
		},
		{
			name: "unparseable JSON schema",
			ctx:  context.Background(),
			req: &verifierv1.VerifyRequest{Quality: acme, Content: "{}", ResponseFormat: &mantlev1.ResponseFormat{
				Type: mantlev1.ResponseFormat_TYPE_JSON_SCHEMA, JsonSchema: `{"type": "object"`,
			}},
			wantCode:   codes.InvalidArgument,
			wantReason: rpc.ReasonInvalidRequest,
			wantFields: []string{"response_format.json_schema"},
		},
		{
			name: "tool parameters that are not a schema",
			ctx:  context.Background(),
			req: &verifierv1.VerifyRequest{Quality: acme, ToolCalls: []*mantlev1.ToolCall{{Name: "f", Arguments: "{}"}},
				Tools: []*mantlev1.Tool{{Type: "function", Name: "f", Parameters: `{"type": 12}`}}},
			wantCode:   codes.InvalidArgument,
			wantReason: rpc.ReasonInvalidRequest,
			wantFields: []string{"tools[0].parameters"},
		},
		{
			name:       "oversized tool call arguments",
			ctx:        context.Background(),
			req:        &verifierv1.VerifyRequest{Quality: acme, ToolCalls: []*mantlev1.ToolCall{{Name: "f", Arguments: `{"a":"` + strings.Repeat("x", 1024) + `"}`}}},
			wantCode:   codes.InvalidArgument,
			wantReason: rpc.ReasonInvalidRequest,
			wantFields: []string{"tool_calls"},
		},
		{
			name:       "unknown tool_choice",
			ctx:        context.Background(),
			req:        &verifierv1.VerifyRequest{Quality: acme, Content: "hi", ToolChoice: "sometimes"},
			wantCode:   codes.InvalidArgument,
			wantReason: rpc.ReasonInvalidRequest,
			wantFields: []string{"tool_choice"},
		},
		{
			name:       "unknown response format type",
			ctx:        context.Background(),
			req:        &verifierv1.VerifyRequest{Quality: acme, Content: "{}", ResponseFormat: &mantlev1.ResponseFormat{Type: 42}},
			wantCode:   codes.InvalidArgument,
			wantReason: rpc.ReasonInvalidRequest,
			wantFields: []string{"response_format.type"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			resp, err := client.Verify(tt.ctx, tt.req)
			if code := status.Code(err); code != tt.wantCode {
				t.Fatalf("Verify: code %v (err %v, resp %v), want %v", code, err, resp, tt.wantCode)
			}
			info := rpc.ErrorInfo(err)
			if info.GetReason() != tt.wantReason || info.GetDomain() != errorDomain {
				t.Errorf("ErrorInfo = %v, want reason %q domain %q", info, tt.wantReason, errorDomain)
			}
			if diff := cmp.Diff(tt.wantFields, rpc.BadRequestFields(err)); diff != "" {
				t.Errorf("BadRequest fields mismatch (-want +got):\n%s", diff)
			}
			if delay, ok := rpc.RetryDelay(err); ok {
				t.Errorf("RetryInfo present (%v); retrying cannot fix this request", delay)
			}
		})
	}
}

func TestToStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		err        error
		wantCode   codes.Code
		wantReason string // "" when the status carries no ErrorInfo
		wantLogged bool
	}{
		{name: "nil", err: nil, wantCode: codes.OK},
		{name: "validation", err: fmt.Errorf("request %q: %w", "r1", rpc.Invalid("content", "too big")), wantCode: codes.InvalidArgument, wantReason: rpc.ReasonInvalidRequest},
		{name: "tenant mismatch", err: errTenantMismatch, wantCode: codes.PermissionDenied, wantReason: rpc.ReasonPermissionDenied},
		{name: "canceled", err: fmt.Errorf("verify: %w", context.Canceled), wantCode: codes.Canceled},
		{name: "deadline", err: fmt.Errorf("verify: %w", context.DeadlineExceeded), wantCode: codes.DeadlineExceeded},
		{name: "review not found", err: fmt.Errorf("get: %w", review.ErrNotFound), wantCode: codes.NotFound, wantReason: ReasonNotFound},
		{name: "review conflict", err: &review.ConflictError{Reason: "claimed by bob"}, wantCode: codes.FailedPrecondition, wantReason: ReasonReviewConflict},
		{name: "draft rule rejected", err: &review.RulesRejectedError{Err: errors.New("x")}, wantCode: codes.FailedPrecondition, wantReason: ReasonRulesRejected},
		{name: "rule set rejected", err: fmt.Errorf("%w: bad", ErrRulesRejected), wantCode: codes.FailedPrecondition, wantReason: ReasonRulesRejected},
		{name: "store unavailable", err: fmt.Errorf("%w: nats down", review.ErrUnavailable), wantCode: codes.Unavailable, wantReason: ReasonUnavailable},
		{name: "unknown", err: errors.New("disk on fire"), wantCode: codes.Internal, wantReason: rpc.ReasonInternal, wantLogged: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var logs bytes.Buffer
			s := NewServer(nil, nil, slog.New(slog.NewTextHandler(&logs, nil)))
			got := s.toStatus(context.Background(), tt.err)
			if code := status.Code(got); code != tt.wantCode {
				t.Errorf("code = %v, want %v", code, tt.wantCode)
			}
			if reason := rpc.ErrorInfo(got).GetReason(); reason != tt.wantReason {
				t.Errorf("ErrorInfo reason = %q, want %q", reason, tt.wantReason)
			}
			if n := strings.Count(logs.String(), "disk on fire"); n != map[bool]int{true: 1}[tt.wantLogged] {
				t.Errorf("cause logged %d times (logs %q), want logged once: %v", n, logs.String(), tt.wantLogged)
			}
			if tt.wantCode == codes.Internal && strings.Contains(status.Convert(got).Message(), "disk on fire") {
				t.Errorf("Internal message %q leaks the cause", status.Convert(got).Message())
			}
		})
	}
}

func TestModule(t *testing.T) {
	t.Parallel()
	t.Run("registers the service", func(t *testing.T) {
		t.Parallel()
		m := Module(DefaultConfig())
		if m.Name != "verifier" || len(m.Deps) != 0 {
			t.Errorf("Module = {Name: %q, Deps: %q}, want verifier with no deps", m.Name, m.Deps)
		}
		srv := grpc.NewServer()
		runnable, err := m.New(context.Background(), app.Env{GRPC: srv, Clock: clockwork.NewFakeClock()})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		// The background work stops when its context is done, even if it never started.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := runnable.Run(ctx); err != nil {
			t.Errorf("Run after cancel = %v, want nil", err)
		}
		if _, ok := srv.GetServiceInfo()[verifierv1.VerifierService_ServiceDesc.ServiceName]; !ok {
			t.Errorf("services = %v, want %s registered", srv.GetServiceInfo(), verifierv1.VerifierService_ServiceDesc.ServiceName)
		}
	})
	t.Run("rejects an invalid config", func(t *testing.T) {
		t.Parallel()
		cfg := DefaultConfig()
		cfg.RepetitionThreshold = 1
		_, err := Module(cfg).New(context.Background(), app.Env{GRPC: grpc.NewServer(), Metrics: prometheus.NewRegistry()})
		if err == nil || !strings.Contains(err.Error(), "repetition_threshold") {
			t.Errorf("New with repetition_threshold 1: err = %v, want one naming repetition_threshold", err)
		}
	})
}

// TestQualityWithVerdict: the QualityContext a verdict goes back in is the request's,
// extended in place (app.RequestTakeOver), with the verification and an audit step
// added, the step's times as timestamppb.New and durationpb.New make them; a new one when
// the request sent none.
func TestQualityWithVerdict(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 4, 17, 0, 0, 123456789, time.UTC)
	for _, tt := range []struct {
		name string
		in   *mantlev1.QualityContext
		v    Verdict
	}{
		{"none sent", nil, Verdict{Passed: true, StartedAt: at, Duration: 1500 * time.Millisecond}},
		{"a request's", &mantlev1.QualityContext{
			RequestId: "req_1", Tenant: "sent", UserNotice: "earlier",
			Deadline: timestamppb.New(at.Add(time.Minute)), Usage: &mantlev1.Usage{InputTokens: 3},
			Audit: []*mantlev1.AuditStep{{Service: "quota", Step: "reserve", At: timestamppb.New(at)}},
		}, Verdict{
			FailedLayer: LayerL1, FailureClass: ClassMalformedOutput, UserNotice: "checked",
			Findings:  []Finding{{Layer: LayerL1, Code: "json_parse", Blocking: true}},
			RiskScore: 0.5, StartedAt: at, Duration: -time.Nanosecond,
		}},
		// Absent sub-messages stay absent.
		{"a request's without deadline or usage", &mantlev1.QualityContext{RequestId: "req_2", Tenant: "sent"},
			Verdict{Passed: true, StartedAt: at, Duration: time.Millisecond}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			want := &mantlev1.QualityContext{}
			if tt.in != nil {
				want = proto.CloneOf(tt.in)
			}
			want.Tenant = "t1"
			want.Verification = &mantlev1.Verification{L1Passed: tt.v.L1Passed(), L1Failures: tt.v.FailedCodes(),
				L2RulesApplied: tt.v.RulesApplied(), FailureClass: classToProto(tt.v.FailureClass)}
			want.QualityGrade, want.RiskScore = gradeToProto(tt.v.Grade), tt.v.RiskScore
			if tt.v.UserNotice != "" {
				want.UserNotice = strings.TrimSpace(want.UserNotice + " " + tt.v.UserNotice)
			}
			want.Audit = append(want.Audit, &mantlev1.AuditStep{At: timestamppb.New(at), Service: ServiceName, Step: "verify",
				Detail: auditDetail("m", tt.v), Duration: durationpb.New(tt.v.Duration)})

			got := qualityWithVerdict(tt.in, "t1", "m", tt.v)
			if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
				t.Errorf("qualityWithVerdict (-want +got):\n%s", diff)
			}
			if tt.in != nil && got != tt.in {
				t.Error("the answer's QualityContext is a copy; want the request's, extended")
			}
		})
	}
}

// TestL3DetailMatchesFmt: a follow-up's detail, appended number by number, reads as the
// fmt.Sprintf it replaced.
func TestL3DetailMatchesFmt(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		res  semantic.Result
		risk float64
	}{
		{semantic.Result{Relevance: 0.8, Consistency: 0.125, Divergence: 0.005, JudgeScore: 1}, 0.115},
		{semantic.Result{}, 0},
		{semantic.Result{Relevance: math.NaN(), Divergence: math.Inf(1)}, math.Inf(-1)},
	} {
		want := fmt.Sprintf("relevance=%.2f consistency=%.2f divergence=%.2f judge=%.2f risk=%.2f",
			tt.res.Relevance, tt.res.Consistency, tt.res.Divergence, tt.res.JudgeScore, tt.risk)
		if got := l3Detail(tt.res, tt.risk); got != want {
			t.Errorf("l3Detail = %q, want %q", got, want)
		}
	}
}
