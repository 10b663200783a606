package cache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	cachev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/cache/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// errorDomain is the ErrorInfo domain of every status this service returns.
const errorDomain = "cache.mantle"

// serviceName names the service in audit steps.
const serviceName = "cache"

// ErrTenantMismatch is returned when the request's QualityContext names another tenant
// than the one the call authenticated as.
var ErrTenantMismatch = errors.New("quality.tenant does not match the authenticated tenant")

// server adapts Service to the generated CacheServiceServer.
type server struct {
	cachev1.UnimplementedCacheServiceServer
	svc   *Service
	clock clockwork.Clock
	log   *slog.Logger
}

func newServer(svc *Service, clock clockwork.Clock, log *slog.Logger) *server {
	return &server{svc: svc, clock: clock, log: log}
}

// HandsOverResponse implements app.ResponseHandOver for Lookup and Store: their answers
// are made for the call (a hit's entry is converted from the index's, not shared with it)
// around the call's own copy of the request's QualityContext, and nothing of them is kept.
func (s *server) HandsOverResponse(method string) bool {
	return method == cachev1.CacheService_Lookup_FullMethodName || method == cachev1.CacheService_Store_FullMethodName
}

// TakesOverRequest implements app.RequestTakeOver for Lookup and Store: they write
// nothing of their request but its QualityContext, which Lookup extends and answers with,
// and keep only what they converted from it (a lease's prompt, the stored entry), whose
// strings and slices they only read.
func (s *server) TakesOverRequest(method string) bool {
	return method == cachev1.CacheService_Lookup_FullMethodName || method == cachev1.CacheService_Store_FullMethodName
}

// Lookup implements cachev1.CacheServiceServer.
func (s *server) Lookup(ctx context.Context, req *cachev1.LookupRequest) (*cachev1.LookupResponse, error) {
	start := s.clock.Now()
	quality := req.GetQuality()
	tenant, err := tenantOf(ctx, quality)
	if err != nil {
		return nil, s.toStatus(err)
	}
	prompt, err := promptFromProto(req.GetPrompt(), quality)
	if err != nil {
		return nil, s.toStatus(err)
	}
	mode, err := modeFromProto(req.GetMode())
	if err != nil {
		return nil, s.toStatus(err)
	}
	lookup := LookupRequest{Prompt: prompt, Mode: mode, Coalesce: req.GetCoalesce(), MaxWait: req.GetMaxWait().AsDuration()}
	if lookup.MaxWait < 0 {
		return nil, s.toStatus(rpc.Invalid("max_wait", "must not be negative, got %s", lookup.MaxWait))
	}
	if d := quality.GetDeadline(); d != nil {
		lookup.Deadline = d.AsTime()
	}
	res, err := s.svc.Lookup(ctx, tenant, lookup)
	if err != nil {
		return nil, s.toStatus(fmt.Errorf("lookup for request %q: %w", quality.GetRequestId(), err))
	}

	// The request is this handler's own copy, so its QualityContext can be extended and
	// returned rather than cloned.
	if quality == nil {
		quality = &mantlev1.QualityContext{}
	}
	resp := &cachev1.LookupResponse{
		Hit:           res.Hit,
		Quality:       quality,
		Match:         matchToProto(res.Match),
		Stale:         res.Stale,
		Approximate:   res.Approximate,
		MissReason:    res.MissReason,
		Namespace:     res.Namespace,
		StoreDeclined: res.StoreDeclined,
	}
	if r := res.Rejected; r != nil {
		resp.Rejected = &cachev1.Rejection{EntryId: r.EntryID, Similarity: r.Similarity, Reason: r.Reason, Detail: r.Detail}
	}
	if l := res.Lease; l != nil {
		resp.Lease = &cachev1.Lease{Id: l.ID, ExpiresAt: timestamppb.New(l.ExpiresAt)}
	}
	if res.Waited > 0 {
		resp.Waited = durationpb.New(res.Waited)
	}
	detail := "miss"
	switch {
	case res.Hit:
		resp.Entry = entryToProto(res.Entry)
		resp.Similarity = res.Similarity
		resp.Age = durationpb.New(res.Age)
		quality.CacheHit = true
		quality.CacheSimilarity = res.Similarity
		detail = fmt.Sprintf("%s hit %.3f, entry %s from %s, age %s", res.Match, res.Similarity, res.Entry.ID, res.Entry.SourceModel, res.Age)
		if res.Stale {
			detail += ", stale"
		}
		if res.Approximate {
			detail += ", approximate"
		}
	case res.Lease != nil:
		detail = "miss, lease " + res.Lease.ID
	case res.MissReason != "":
		detail = "miss: " + res.MissReason
	}
	if r := res.Rejected; r != nil {
		detail += fmt.Sprintf("; rejected %s at %.3f: %s (%s)", r.EntryID, r.Similarity, r.Reason, r.Detail)
	}
	quality.Audit = append(quality.Audit, &mantlev1.AuditStep{
		At:       timestamppb.New(s.clock.Now()),
		Service:  serviceName,
		Step:     "lookup",
		Detail:   detail,
		Duration: durationpb.New(s.clock.Since(start)),
	})
	return resp, nil
}

// Store implements cachev1.CacheServiceServer.
func (s *server) Store(ctx context.Context, req *cachev1.StoreRequest) (*cachev1.StoreResponse, error) {
	quality := req.GetQuality()
	tenant, err := tenantOf(ctx, quality)
	if err != nil {
		return nil, s.toStatus(err)
	}
	prompt, err := promptFromProto(req.GetPrompt(), quality)
	if err != nil {
		return nil, s.toStatus(err)
	}
	level := quality.GetFallbackLevel()
	result, err := s.svc.Store(ctx, tenant, StoreRequest{
		Prompt:       prompt,
		Content:      req.GetContent(),
		SourceModel:  req.GetSourceModel(),
		FinishReason: req.GetFinishReason(),
		ToolCalls:    toolCallsFromProto(req.GetToolCalls()),
		Usage:        usageFromProto(req.GetUsage()),
		TTL:          req.GetTtl().AsDuration(),
		// Only an answer the verifier passed is cached; one that was never checked is not
		// known to be good.
		Verified:  quality.GetVerification().GetL1Passed(),
		Degraded:  level == mantlev1.FallbackLevel_FALLBACK_LEVEL_CACHED_APPROXIMATE || level == mantlev1.FallbackLevel_FALLBACK_LEVEL_TEMPLATE,
		FromCache: quality.GetCacheHit(),
		LeaseID:   req.GetLeaseId(),
	})
	if err != nil {
		return nil, s.toStatus(fmt.Errorf("store for request %q: %w", quality.GetRequestId(), err))
	}
	return &cachev1.StoreResponse{Stored: result.Stored, EntryId: result.EntryID, SkippedReason: string(result.SkippedReason)}, nil
}

// Release implements cachev1.CacheServiceServer.
func (s *server) Release(ctx context.Context, req *cachev1.ReleaseRequest) (*cachev1.ReleaseResponse, error) {
	tenant, err := tenantOf(ctx, req.GetQuality())
	if err != nil {
		return nil, s.toStatus(err)
	}
	released, err := s.svc.Release(ctx, tenant, req.GetLeaseId())
	if err != nil {
		return nil, s.toStatus(fmt.Errorf("release: %w", err))
	}
	return &cachev1.ReleaseResponse{Released: released}, nil
}

// DescribeStats implements cachev1.CacheServiceServer. The totals are aggregates over
// every tenant and name no entry, so any authenticated caller may read them.
func (s *server) DescribeStats(context.Context, *cachev1.DescribeStatsRequest) (*cachev1.DescribeStatsResponse, error) {
	st := s.svc.Stats()
	resp := &cachev1.DescribeStatsResponse{Since: timestamppb.New(st.Since), Lookups: st.Lookups, Hits: st.Hits}
	for _, sc := range st.Scenarios {
		resp.Scenarios = append(resp.Scenarios, &cachev1.ScenarioStats{Scenario: sc.Scenario, Lookups: sc.Lookups, Hits: sc.Hits})
	}
	return resp, nil
}

// Invalidate implements cachev1.CacheServiceServer. The request carries no QualityContext:
// the tenant comes only from the call's credentials, so with authentication disabled there
// is no tenant to invalidate and the call fails with UNAUTHENTICATED.
func (s *server) Invalidate(ctx context.Context, req *cachev1.InvalidateRequest) (*cachev1.InvalidateResponse, error) {
	removed, err := s.svc.Invalidate(ctx, InvalidateRequest{
		Tenant:    rpc.Tenant(ctx),
		Scenario:  req.GetScenario(),
		EntryID:   req.GetEntryId(),
		Namespace: req.GetNamespace(),
		All:       req.GetAll(),
	})
	if err != nil {
		return nil, s.toStatus(fmt.Errorf("invalidate: %w", err))
	}
	return &cachev1.InvalidateResponse{Removed: int64(removed)}, nil
}

// toStatus maps a domain error to the gRPC status the client sees. It is the only place
// errors become statuses.
func (s *server) toStatus(err error) error {
	var invalid *rpc.ValidationError
	switch {
	case errors.As(err, &invalid):
		return rpc.InvalidArgument(errorDomain, invalid)
	case errors.Is(err, ErrTenantMismatch):
		return rpc.Status(codes.PermissionDenied, errorDomain, rpc.ReasonPermissionDenied, ErrTenantMismatch.Error())
	case errors.Is(err, ErrNoTenant):
		return rpc.Status(codes.Unauthenticated, errorDomain, rpc.ReasonUnauthenticated, "the call is not authenticated as a tenant")
	case rpc.ContextStatus(err) != nil:
		return rpc.ContextStatus(err)
	default:
		s.log.Error("cache: internal error", "err", err)
		return rpc.Status(codes.Internal, errorDomain, rpc.ReasonInternal, "internal error")
	}
}

// tenantOf returns the tenant a Lookup or Store acts for: the authenticated tenant when
// there is one (a different quality.tenant is refused), otherwise quality.tenant, which is
// then required.
func tenantOf(ctx context.Context, quality *mantlev1.QualityContext) (string, error) {
	authenticated, claimed := rpc.Tenant(ctx), quality.GetTenant()
	switch {
	case authenticated != "" && claimed != "" && claimed != authenticated:
		return "", ErrTenantMismatch
	case authenticated != "":
		return authenticated, nil
	case claimed != "":
		return claimed, nil
	default:
		return "", rpc.Invalid("quality.tenant", "required when the call is not authenticated")
	}
}

// promptFromProto converts the request's prompt. Its scenario falls back to the
// QualityContext's, so callers need not repeat it.
func promptFromProto(p *cachev1.Prompt, quality *mantlev1.QualityContext) (Prompt, error) {
	if p == nil {
		return Prompt{}, rpc.Invalid("prompt", "required")
	}
	scenario := p.GetScenario()
	if scenario == "" {
		scenario = quality.GetScenario()
	}
	messages := make([]Message, len(p.GetMessages()))
	invalid := &rpc.ValidationError{}
	for i, m := range p.GetMessages() {
		// The keys hash text turns only; anything else would be dropped from the scope in
		// silence, so it is refused: callers hash it into context_fingerprint.
		field := fmt.Sprintf("prompt.messages[%d]", i)
		switch {
		case len(m.GetParts()) > 0:
			invalid.Add(field+".parts", "the cache keys text only: put content parts in context_fingerprint")
		case len(m.GetToolCalls()) > 0:
			invalid.Add(field+".tool_calls", "the cache keys text only: put tool calls in context_fingerprint")
		case m.GetToolCallId() != "":
			invalid.Add(field+".tool_call_id", "the cache keys text only: put tool turns in context_fingerprint")
		case m.GetRefusal() != "":
			invalid.Add(field+".refusal", "the cache keys text only: put refusals in context_fingerprint")
		}
		messages[i] = Message{Role: m.GetRole(), Name: m.GetName(), Content: m.GetContent()}
	}
	if err := invalid.OrNil(); err != nil {
		return Prompt{}, err
	}
	rf := p.GetResponseFormat()
	return Prompt{
		Scenario:           scenario,
		Model:              p.GetModel(),
		ModelFamily:        p.GetModelFamily(),
		ContextFingerprint: p.GetContextFingerprint(),
		EndUser:            p.GetEndUser(),
		Messages:           messages,
		Temperature:        p.Temperature,
		MaxTokens:          p.GetMaxTokens(),
		ResponseFormat: ResponseFormat{
			Type:           formatTypeFromProto(rf.GetType()),
			JSONSchema:     rf.GetJsonSchema(),
			RequiredFields: rf.GetRequiredFields(),
		},
	}, nil
}

// formatTypeFromProto maps an unset type to text, like providers do. A type this code does
// not know yet keeps its own name, so it never shares entries with text.
func formatTypeFromProto(t mantlev1.ResponseFormat_Type) FormatType {
	switch t {
	case mantlev1.ResponseFormat_TYPE_UNSPECIFIED, mantlev1.ResponseFormat_TYPE_TEXT:
		return FormatText
	case mantlev1.ResponseFormat_TYPE_JSON_OBJECT:
		return FormatJSONObject
	case mantlev1.ResponseFormat_TYPE_JSON_SCHEMA:
		return FormatJSONSchema
	default:
		return FormatType(t.String())
	}
}

// modeFromProto maps the lookup mode; an unknown mode is refused rather than treated as
// normal, since a caller asking for something new expects something different.
func modeFromProto(m cachev1.LookupMode) (Mode, error) {
	switch m {
	case cachev1.LookupMode_LOOKUP_MODE_UNSPECIFIED:
		return ModeNormal, nil
	case cachev1.LookupMode_LOOKUP_MODE_CACHE_ONLY:
		return ModeCacheOnly, nil
	case cachev1.LookupMode_LOOKUP_MODE_APPROXIMATE:
		return ModeApproximate, nil
	default:
		return 0, rpc.Invalid("mode", "unknown lookup mode %d", int32(m))
	}
}

func matchToProto(m MatchKind) cachev1.MatchKind {
	switch m {
	case MatchExact:
		return cachev1.MatchKind_MATCH_KIND_EXACT
	case MatchSemantic:
		return cachev1.MatchKind_MATCH_KIND_SEMANTIC
	case MatchCoalesced:
		return cachev1.MatchKind_MATCH_KIND_COALESCED
	default:
		return cachev1.MatchKind_MATCH_KIND_UNSPECIFIED
	}
}

func usageFromProto(u *mantlev1.Usage) Usage {
	return Usage{InputTokens: u.GetInputTokens(), OutputTokens: u.GetOutputTokens(), TotalTokens: u.GetTotalTokens()}
}

func entryToProto(e Entry) *cachev1.Entry {
	return &cachev1.Entry{
		Id:           e.ID,
		Content:      e.Content,
		SourceModel:  e.SourceModel,
		Usage:        &mantlev1.Usage{InputTokens: e.Usage.InputTokens, OutputTokens: e.Usage.OutputTokens, TotalTokens: e.Usage.TotalTokens},
		CreatedAt:    timestamppb.New(e.CreatedAt),
		ExpiresAt:    timestamppb.New(e.ExpiresAt),
		FinishReason: e.FinishReason,
		ToolCalls:    toolCallsToProto(e.ToolCalls),
		Namespace:    e.Namespace,
		StaleUntil:   timestamppb.New(e.StaleUntil),
	}
}

func toolCallsFromProto(tcs []*mantlev1.ToolCall) []ToolCall {
	if len(tcs) == 0 {
		return nil
	}
	out := make([]ToolCall, len(tcs))
	for i, tc := range tcs {
		out[i] = ToolCall{ID: tc.GetId(), Type: tc.GetType(), Name: tc.GetName(), Arguments: tc.GetArguments()}
	}
	return out
}

func toolCallsToProto(tcs []ToolCall) []*mantlev1.ToolCall {
	if len(tcs) == 0 {
		return nil
	}
	out := make([]*mantlev1.ToolCall, len(tcs))
	for i, tc := range tcs {
		out[i] = &mantlev1.ToolCall{Id: tc.ID, Type: tc.Type, Name: tc.Name, Arguments: tc.Arguments}
	}
	return out
}
