package verifier

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// errorDomain is the ErrorInfo domain of every status this service returns.
const errorDomain = "verifier.mantle"

// errTenantMismatch: the request claims a tenant other than the one that authenticated.
var errTenantMismatch = errors.New("quality.tenant differs from the authenticated tenant")

// Server adapts a Verifier to mantle.verifier.v1.VerifierService.
type Server struct {
	verifierv1.UnimplementedVerifierServiceServer
	verifier *Verifier
	log      *slog.Logger
}

// NewServer returns the gRPC adapter for v.
func NewServer(v *Verifier, log *slog.Logger) *Server {
	return &Server{verifier: v, log: log}
}

// Verify checks one answer and returns the verdict with the updated QualityContext.
func (s *Server) Verify(ctx context.Context, req *verifierv1.VerifyRequest) (*verifierv1.VerifyResponse, error) {
	tenant, err := callTenant(ctx, req.GetQuality())
	if err != nil {
		return nil, s.toStatus(err)
	}
	answer, err := answerFromProto(req)
	if err != nil {
		return nil, s.toStatus(err)
	}
	verdict, err := s.verifier.Verify(ctx, answer)
	if err != nil {
		return nil, s.toStatus(fmt.Errorf("request %q: %w", req.GetQuality().GetRequestId(), err))
	}
	if !verdict.Passed && s.log.Enabled(ctx, slog.LevelDebug) {
		s.log.DebugContext(ctx, "answer failed verification",
			"request_id", req.GetQuality().GetRequestId(), "tenant", tenant, "model", req.GetModel(),
			"failure_class", verdict.FailureClass, "codes", verdict.FailedCodes())
	}

	quality := qualityWithVerdict(req.GetQuality(), tenant, req.GetModel(), verdict)
	return &verifierv1.VerifyResponse{
		Passed:       verdict.Passed,
		FailedLayer:  verdict.FailedLayer,
		FailureClass: classToProto(verdict.FailureClass),
		Findings:     findingsToProto(verdict.Findings),
		Content:      verdict.Content,
		Grade:        gradeToProto(verdict.Grade),
		RiskScore:    verdict.RiskScore,
		Quality:      quality,
	}, nil
}

// toStatus maps every error Verify can meet to a gRPC status. It is the only place that does.
func (s *Server) toStatus(err error) error {
	var invalid *rpc.ValidationError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &invalid):
		return rpc.InvalidArgument(errorDomain, invalid)
	case errors.Is(err, errTenantMismatch):
		return rpc.Status(codes.PermissionDenied, errorDomain, rpc.ReasonPermissionDenied,
			"quality.tenant does not match the authenticated tenant")
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	default:
		// The caller gets a generic message; the cause is for operators, logged once here.
		s.log.Error("verify failed", "err", err)
		return rpc.Status(codes.Internal, errorDomain, rpc.ReasonInternal, "internal error")
	}
}

// callTenant returns the tenant the call acts for: the authenticated one when auth is on
// (a different claimed tenant is refused), the claimed one otherwise, which is then required.
func callTenant(ctx context.Context, quality *mantlev1.QualityContext) (string, error) {
	authenticated, claimed := rpc.Tenant(ctx), quality.GetTenant()
	switch {
	case authenticated != "" && claimed != "" && claimed != authenticated:
		return "", errTenantMismatch
	case authenticated != "":
		return authenticated, nil
	case claimed != "":
		return claimed, nil
	default:
		return "", rpc.Invalid("quality.tenant", "is required when the call is not authenticated")
	}
}

func answerFromProto(req *verifierv1.VerifyRequest) (Answer, error) {
	rf := req.GetResponseFormat()
	var formatType FormatType
	switch rf.GetType() {
	case mantlev1.ResponseFormat_TYPE_UNSPECIFIED, mantlev1.ResponseFormat_TYPE_TEXT:
		formatType = FormatText
	case mantlev1.ResponseFormat_TYPE_JSON_OBJECT:
		formatType = FormatJSONObject
	case mantlev1.ResponseFormat_TYPE_JSON_SCHEMA:
		formatType = FormatJSONSchema
	default:
		return Answer{}, rpc.Invalid("response_format.type", "unknown type %d", int32(rf.GetType()))
	}
	return Answer{
		Content:      req.GetContent(),
		FinishReason: req.GetFinishReason(),
		Format: Format{
			Type:           formatType,
			JSONSchema:     rf.GetJsonSchema(),
			RequiredFields: rf.GetRequiredFields(),
		},
	}, nil
}

// qualityWithVerdict returns a copy of the request's QualityContext (a new one when the
// caller sent none) with the verdict recorded and an audit step appended. The verification
// is replaced, not merged: it describes this answer, not an earlier attempt's.
func qualityWithVerdict(in *mantlev1.QualityContext, tenant, model string, v Verdict) *mantlev1.QualityContext {
	quality := &mantlev1.QualityContext{}
	if in != nil {
		quality = proto.CloneOf(in)
	}
	quality.Tenant = tenant
	quality.Verification = &mantlev1.Verification{
		L1Passed:     v.Passed,
		L1Failures:   v.FailedCodes(),
		FailureClass: classToProto(v.FailureClass),
	}
	quality.QualityGrade = gradeToProto(v.Grade)
	quality.RiskScore = v.RiskScore
	quality.Audit = append(quality.Audit, &mantlev1.AuditStep{
		At:       timestamppb.New(v.StartedAt),
		Service:  ServiceName,
		Step:     "verify",
		Detail:   auditDetail(model, v),
		Duration: durationpb.New(v.Duration),
	})
	return quality
}

// auditDetail says what happened in a line an operator can read, e.g.
// "model=gpt-4o l1 failed: json_parse (malformed_output)".
func auditDetail(model string, v Verdict) string {
	var b strings.Builder
	if model != "" {
		fmt.Fprintf(&b, "model=%s ", model)
	}
	switch {
	case !v.Passed:
		fmt.Fprintf(&b, "l1 failed: %s (%s)", strings.Join(v.FailedCodes(), ","), v.FailureClass)
	case len(v.Findings) > 0:
		codes := make([]string, 0, len(v.Findings))
		for _, f := range v.Findings {
			codes = append(codes, f.Code)
		}
		fmt.Fprintf(&b, "l1 passed with warnings: %s", strings.Join(codes, ","))
	default:
		b.WriteString("l1 passed")
	}
	return b.String()
}

func findingsToProto(findings []Finding) []*verifierv1.Finding {
	out := make([]*verifierv1.Finding, 0, len(findings))
	for _, f := range findings {
		out = append(out, &verifierv1.Finding{
			Layer: f.Layer, Code: f.Code, Path: f.Path, Message: f.Message, Blocking: f.Blocking,
		})
	}
	return out
}

func classToProto(c FailureClass) mantlev1.ErrorClass {
	switch c {
	case ClassNone:
		return mantlev1.ErrorClass_ERROR_CLASS_NONE
	case ClassMalformedOutput:
		return mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT
	case ClassRefusal:
		return mantlev1.ErrorClass_ERROR_CLASS_REFUSAL
	case ClassTruncated:
		return mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED
	case ClassVerificationFailed:
		return mantlev1.ErrorClass_ERROR_CLASS_VERIFICATION_FAILED
	}
	return mantlev1.ErrorClass_ERROR_CLASS_UNKNOWN
}

func gradeToProto(g Grade) mantlev1.QualityGrade {
	switch g {
	case GradeHigh:
		return mantlev1.QualityGrade_QUALITY_GRADE_HIGH
	case GradeMedium:
		return mantlev1.QualityGrade_QUALITY_GRADE_MEDIUM
	case GradeLow:
		return mantlev1.QualityGrade_QUALITY_GRADE_LOW
	}
	return mantlev1.QualityGrade_QUALITY_GRADE_UNSPECIFIED
}
