package verifier

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// testTenantHeader stands in for the API key the real auth interceptor (pkg/rpc)
// authenticates: the test interceptor below copies it into the context with rpc.WithTenant.
const testTenantHeader = "x-test-tenant"

var testNow = time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC)

func authForTest(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get(testTenantHeader); len(v) > 0 {
			ctx = rpc.WithTenant(ctx, v[0])
		}
	}
	return handler(ctx, req)
}

// startVerifier serves the verifier module over bufconn and returns a real generated client.
func startVerifier(t *testing.T, cfg Config) verifierv1.VerifierServiceClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.UnaryInterceptor(authForTest))
	runnable, err := Module(cfg).New(context.Background(), app.Env{
		GRPC:    srv,
		Log:     slog.New(slog.DiscardHandler),
		Metrics: prometheus.NewRegistry(),
		Clock:   clockwork.NewFakeClockAt(testNow),
	})
	if err != nil {
		t.Fatalf("Module.New: %v", err)
	}
	if runnable != nil {
		t.Fatalf("Module.New returned a Runnable; the verifier has no background work")
	}
	// The serving goroutine is owned by the test and exits when Stop closes the listener.
	serveDone := make(chan error, 1)
	go func() { serveDone <- srv.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("grpc.NewClient: %v", err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		if err := <-serveDone; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return verifierv1.NewVerifierServiceClient(conn)
}

func asTenant(tenant string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), testTenantHeader, tenant)
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
			RiskScore: 0.1,
			Quality: &mantlev1.QualityContext{
				RequestId: "req-1",
				Tenant:    "acme",
				Verification: &mantlev1.Verification{
					L1Passed:     true,
					FailureClass: mantlev1.ErrorClass_ERROR_CLASS_NONE,
				},
				QualityGrade: mantlev1.QualityGrade_QUALITY_GRADE_MEDIUM,
				RiskScore:    0.1,
				Audit: []*mantlev1.AuditStep{routerStep, {
					At: timestamppb.New(testNow), Service: "verifier", Step: "verify",
					Detail:   "model=gpt-4o l1 passed with warnings: markdown_fence",
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
		if len(audit) != 1 || audit[0].GetDetail() != "l1 failed: truncated,json_parse (truncated)" {
			t.Errorf("quality.audit = %v, want one step with detail %q", audit, "l1 failed: truncated,json_parse (truncated)")
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
		{name: "unknown", err: errors.New("disk on fire"), wantCode: codes.Internal, wantReason: rpc.ReasonInternal, wantLogged: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var logs bytes.Buffer
			s := NewServer(nil, slog.New(slog.NewTextHandler(&logs, nil)))
			got := s.toStatus(tt.err)
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
		if _, err := m.New(context.Background(), app.Env{GRPC: srv, Clock: clockwork.NewFakeClock()}); err != nil {
			t.Fatalf("New: %v", err)
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
