package verifier

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/verifier/internal/review"
)

// riskyRequest is a legal answer the sample rule work-injury-no-appraisal-review sends to
// human review.
func riskyRequest(requestID string) *verifierv1.VerifyRequest {
	return &verifierv1.VerifyRequest{
		Quality:  &mantlev1.QualityContext{RequestId: requestID, Tenant: "acme", Scenario: "legal"},
		Messages: []*mantlev1.ChatMessage{{Role: "user", Content: "工伤认定要做劳动能力鉴定吗？"}},
		Content:  "无需鉴定，直接申请即可。依据《工伤保险条例》。",
		Model:    "m-7b-v1",
	}
}

func wantCode(t *testing.T, err error, code codes.Code, reason string) {
	t.Helper()
	if status.Code(err) != code || rpc.ErrorInfo(err).GetReason() != reason {
		t.Fatalf("err = %v (reason %q), want %v %s", err, rpc.ErrorInfo(err).GetReason(), code, reason)
	}
}

func TestServerReviewWorkflow(t *testing.T) {
	t.Parallel()
	ts := startServer(t, DefaultConfig(), serverOptions{})
	ctx := context.Background()

	resp, err := ts.client.Verify(ctx, riskyRequest("req-1"))
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetPassed() || resp.GetReviewId() == "" {
		t.Fatalf("Verify = passed %v review %q; want a delivered answer sent to review", resp.GetPassed(), resp.GetReviewId())
	}
	id := resp.GetReviewId()
	opened := ts.events.wait(t, review.SubjectOpened, 1).(*eventsv1.ReviewRequestEvent)
	if opened.GetReviewId() != id || opened.GetReason() != "rule:work-injury-no-appraisal-review" {
		t.Errorf("opened event = %v", opened)
	}

	list, err := ts.client.ListReviews(ctx, &verifierv1.ListReviewsRequest{State: verifierv1.ReviewState_REVIEW_STATE_PENDING})
	if err != nil || len(list.GetReviews()) != 1 || list.GetReviews()[0].GetId() != id {
		t.Fatalf("ListReviews = %v, %v", list, err)
	}
	r := list.GetReviews()[0]
	if r.GetQuestion() != "工伤认定要做劳动能力鉴定吗？" || r.GetModel() != "m-7b-v1" || r.GetDefaultAction() != "keep" ||
		r.GetDueAt().AsTime() != testNow.Add(15*time.Minute) || r.GetQuality().GetRequestId() != "req-1" {
		t.Errorf("review = %v", r)
	}

	claimed, err := ts.client.ClaimReview(ctx, &verifierv1.ClaimReviewRequest{Reviewer: "alice", Lease: durationpb.New(10 * time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if c := claimed.GetReview(); c.GetId() != id || c.GetState() != verifierv1.ReviewState_REVIEW_STATE_CLAIMED ||
		c.GetClaimedBy() != "alice" || c.GetLeaseExpiresAt().AsTime() != testNow.Add(10*time.Minute) {
		t.Errorf("claimed = %v", c)
	}
	_, err = ts.client.ClaimReview(ctx, &verifierv1.ClaimReviewRequest{ReviewId: id, Reviewer: "bob"})
	wantCode(t, err, codes.FailedPrecondition, ReasonReviewConflict)
	_, err = ts.client.ClaimReview(ctx, &verifierv1.ClaimReviewRequest{Reviewer: "bob"})
	wantCode(t, err, codes.NotFound, ReasonNotFound)

	decide := &verifierv1.DecideReviewRequest{
		ReviewId: id, Reviewer: "alice", Verdict: verifierv1.ReviewVerdict_REVIEW_VERDICT_CORRECT,
		RootCause: verifierv1.RootCause_ROOT_CAUSE_KNOWLEDGE_CUTOFF, CorrectiveAction: verifierv1.CorrectiveAction_CORRECTIVE_ACTION_APPEND_KNOWLEDGE,
		CorrectedContent: "需要。依据《工伤保险条例》第二十一条，应当进行劳动能力鉴定。", Note: "模型引用了旧规定",
		DraftRule: &verifierv1.DraftRuleHint{QuestionTerms: []string{"工伤认定"}, AnswerTerms: []string{"无需鉴定"},
			Knowledge: "依据《工伤保险条例》第二十一条，职工发生工伤，经治疗伤情相对稳定后存在残疾、影响劳动能力的，应当进行劳动能力鉴定。"},
	}
	_, err = ts.client.DecideReview(ctx, &verifierv1.DecideReviewRequest{ReviewId: id, Reviewer: "alice"})
	wantCode(t, err, codes.InvalidArgument, rpc.ReasonInvalidRequest)
	if diff := cmp.Diff([]string{"verdict", "root_cause", "corrective_action"}, rpc.BadRequestFields(err)); diff != "" {
		t.Errorf("BadRequest fields (-want +got):\n%s", diff)
	}
	bob := proto.CloneOf(decide)
	bob.Reviewer = "bob"
	_, err = ts.client.DecideReview(ctx, bob)
	wantCode(t, err, codes.FailedPrecondition, ReasonReviewConflict)

	decided, err := ts.client.DecideReview(ctx, decide)
	if err != nil {
		t.Fatal(err)
	}
	d := decided.GetReview().GetDecision()
	if decided.GetReview().GetState() != verifierv1.ReviewState_REVIEW_STATE_DECIDED || d.GetReviewer() != "alice" ||
		d.GetRootCause() != verifierv1.RootCause_ROOT_CAUSE_KNOWLEDGE_CUTOFF || d.GetDraftRuleId() != decided.GetDraftRule().GetId() {
		t.Errorf("decided = %v", decided.GetReview())
	}
	event := ts.events.wait(t, review.SubjectDecision, 1).(*eventsv1.ReviewDecisionEvent)
	if event.GetReviewId() != id || event.GetVerdict() != "correct" || event.GetRootCause() != "knowledge_cutoff" ||
		event.GetCorrectedContent() != decide.GetCorrectedContent() {
		t.Errorf("decision event = %v", event)
	}

	// The drafted rule waits for approval; approved, it is live at once.
	drafts, err := ts.client.ListDraftRules(ctx, &verifierv1.ListDraftRulesRequest{State: verifierv1.DraftRuleState_DRAFT_RULE_STATE_PROPOSED})
	if err != nil || len(drafts.GetRules()) != 1 {
		t.Fatalf("ListDraftRules = %v, %v", drafts, err)
	}
	draft := drafts.GetRules()[0]
	if draft.GetRule().GetAction().GetType() != "notice" || draft.GetRule().GetScenarios()[0] != "legal" {
		t.Errorf("draft = %v", draft)
	}
	before, err := ts.client.Verify(ctx, riskyRequest("req-2"))
	if err != nil {
		t.Fatal(err)
	}
	// Approval is the operator's: the tenant whose review drafted the rule cannot.
	_, err = ts.client.DecideDraftRule(asTenant("acme"), &verifierv1.DecideDraftRuleRequest{DraftRuleId: draft.GetId(), Reviewer: "alice", Approve: true})
	wantCode(t, err, codes.PermissionDenied, rpc.ReasonPermissionDenied)
	if _, err := ts.client.DecideDraftRule(asOperator("lead"), &verifierv1.DecideDraftRuleRequest{DraftRuleId: draft.GetId(), Reviewer: "lead", Approve: true}); err != nil {
		t.Fatal(err)
	}
	after, err := ts.client.Verify(ctx, riskyRequest("req-3"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(before.GetContent(), "第二十一条") || !strings.Contains(after.GetContent(), "第二十一条") {
		t.Errorf("content before approval %q, after %q; want the knowledge only after", before.GetContent(), after.GetContent())
	}
	if !contains(after.GetQuality().GetVerification().GetL2RulesApplied(), draft.GetId()) {
		t.Errorf("rules applied = %v, want %s", after.GetQuality().GetVerification().GetL2RulesApplied(), draft.GetId())
	}
	// Drafted from this tenant's review, the rule is this tenant's: another tenant's
	// answers are left alone.
	globex := riskyRequest("req-4")
	globex.Quality.Tenant = "globex"
	other, err := ts.client.Verify(asTenant("globex"), globex)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(other.GetContent(), "第二十一条") || contains(other.GetQuality().GetVerification().GetL2RulesApplied(), draft.GetId()) {
		t.Errorf("another tenant's answer got the drafted rule: %q, rules %v", other.GetContent(), other.GetQuality().GetVerification().GetL2RulesApplied())
	}

	audit, err := ts.client.ListReviewAudit(ctx, &verifierv1.ListReviewAuditRequest{ReviewId: id})
	if err != nil {
		t.Fatal(err)
	}
	var trail []string
	for _, e := range audit.GetEntries() {
		trail = append(trail, e.GetActor()+":"+e.GetAction())
	}
	if diff := cmp.Diff([]string{"verifier:created", "alice:claimed", "alice:decided", "alice:draft_created", "lead:draft_approved"}, trail); diff != "" {
		t.Errorf("audit trail (-want +got):\n%s", diff)
	}
	byAlice, err := ts.client.ListReviewAudit(ctx, &verifierv1.ListReviewAuditRequest{Actor: "alice", PageSize: 2})
	if err != nil || len(byAlice.GetEntries()) != 2 || byAlice.GetNextPageToken() == "" {
		t.Errorf("alice's first page = %v, %v; want 2 entries and a next page", byAlice, err)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func TestServerReviewTimesOut(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.Scenarios = map[string]ScenarioConfig{"legal": {
		ReviewTimeout: 10 * time.Minute,
		DefaultAction: review.DefaultAction{Type: review.DefaultReplace, Text: "请拨打12333咨询人工"},
	}}
	ts := startServer(t, cfg, serverOptions{})
	ctx := context.Background()
	resp, err := ts.client.Verify(ctx, riskyRequest("req-1"))
	if err != nil {
		t.Fatal(err)
	}
	// alice holds the review past its deadline (a lease longer than the time left).
	if _, err := ts.client.ClaimReview(ctx, &verifierv1.ClaimReviewRequest{ReviewId: resp.GetReviewId(), Reviewer: "alice", Lease: durationpb.New(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	// The sweeper's ticker is the fake clock's one waiter; past the deadline it times out.
	if err := ts.clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	ts.clock.Advance(10*time.Minute + cfg.Review.SweepInterval)
	ev := ts.events.wait(t, review.SubjectTimeout, 1).(*eventsv1.ReviewTimeoutEvent)
	if ev.GetReviewId() != resp.GetReviewId() || ev.GetDefaultAction() != "replace" ||
		ev.GetDefaultActionText() != "请拨打12333咨询人工" || ev.GetClaimedBy() != "alice" {
		t.Errorf("timeout event = %v", ev)
	}
	got, err := ts.client.GetReview(ctx, &verifierv1.GetReviewRequest{ReviewId: resp.GetReviewId()})
	if err != nil || got.GetReview().GetState() != verifierv1.ReviewState_REVIEW_STATE_TIMED_OUT {
		t.Fatalf("GetReview = %v, %v; want timed out", got, err)
	}
	_, err = ts.client.DecideReview(ctx, &verifierv1.DecideReviewRequest{ReviewId: resp.GetReviewId(), Reviewer: "alice",
		Verdict: verifierv1.ReviewVerdict_REVIEW_VERDICT_APPROVE, RootCause: verifierv1.RootCause_ROOT_CAUSE_NONE,
		CorrectiveAction: verifierv1.CorrectiveAction_CORRECTIVE_ACTION_NONE})
	wantCode(t, err, codes.FailedPrecondition, ReasonReviewConflict)
	audit, err := ts.client.ListReviewAudit(ctx, &verifierv1.ListReviewAuditRequest{ReviewId: resp.GetReviewId()})
	if err != nil {
		t.Fatal(err)
	}
	last := audit.GetEntries()[len(audit.GetEntries())-1]
	if last.GetAction() != review.AuditTimedOut || last.GetActor() != review.SystemActor {
		t.Errorf("last audit entry = %v, want the timeout", last)
	}
}

func TestServerReviewScopes(t *testing.T) {
	t.Parallel()
	ts := startServer(t, DefaultConfig(), serverOptions{})
	resp, err := ts.client.Verify(asTenant("acme"), riskyRequest("req-1"))
	if err != nil {
		t.Fatal(err)
	}
	for caller, want := range map[string]int{"acme": 1, "globex": 0, "operator": 1} {
		ctx := asTenant(caller)
		if caller == "operator" {
			ctx = asOperator("ops")
		}
		list, err := ts.client.ListReviews(ctx, &verifierv1.ListReviewsRequest{})
		if err != nil || len(list.GetReviews()) != want {
			t.Errorf("%s sees %d reviews (%v), want %d", caller, len(list.GetReviews()), err, want)
		}
	}
	_, err = ts.client.GetReview(asTenant("globex"), &verifierv1.GetReviewRequest{ReviewId: resp.GetReviewId()})
	wantCode(t, err, codes.NotFound, ReasonNotFound)
	_, err = ts.client.ReloadRules(asTenant("acme"), &verifierv1.ReloadRulesRequest{})
	wantCode(t, err, codes.PermissionDenied, rpc.ReasonPermissionDenied)
}

func TestServerFollowUp(t *testing.T) {
	t.Parallel()
	ts := startServer(t, DefaultConfig(), serverOptions{})
	ctx := context.Background()
	req := &verifierv1.VerifyRequest{
		Quality:    &mantlev1.QualityContext{RequestId: "req-l3", Tenant: "acme", Scenario: "support"},
		Messages:   []*mantlev1.ChatMessage{{Role: "user", Content: "退款多久到账？"}},
		Content:    "退款将在五个工作日内原路退回到账。",
		References: []string{"退款审核通过后五个工作日内原路退回"},
	}
	resp, err := ts.client.Verify(ctx, req)
	if err != nil || !resp.GetL3Pending() {
		t.Fatalf("Verify = %v, %v; want l3_pending", resp, err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, waitFor)
	defer cancel()
	got, err := ts.client.GetFollowUp(waitCtx, &verifierv1.GetFollowUpRequest{RequestId: "req-l3", Wait: true})
	if err != nil || !got.GetFound() {
		t.Fatalf("GetFollowUp = %v, %v", got, err)
	}
	f := got.GetFollowUp()
	if f.GetRelevance() < 0.5 || !f.GetHasReferences() || f.GetConsistency() < 0.5 || f.GetL3Confidence() < 0.5 ||
		f.GetGrade() == mantlev1.QualityGrade_QUALITY_GRADE_LOW || f.GetTenant() != "acme" {
		t.Errorf("follow-up = %v", f)
	}
	published := ts.events.wait(t, events.SubjectQuality, 1).(*eventsv1.QualityFollowUpEvent)
	if published.GetRequestId() != "req-l3" {
		t.Errorf("published follow-up = %v", published)
	}
	// Another tenant learns nothing; an unknown request is not found, at once.
	if other, err := ts.client.GetFollowUp(asTenant("globex"), &verifierv1.GetFollowUpRequest{RequestId: "req-l3"}); err != nil || other.GetFound() {
		t.Errorf("globex GetFollowUp = %v, %v; want not found", other, err)
	}
	if unknown, err := ts.client.GetFollowUp(ctx, &verifierv1.GetFollowUpRequest{RequestId: "nope", Wait: true}); err != nil || unknown.GetFound() {
		t.Errorf("unknown GetFollowUp = %v, %v", unknown, err)
	}

	// An off-topic answer scores low, and L3 can still open a review: here the sensitive
	// question (input 1) and the low confidence (output 1) make 0.75.
	offTopic := &verifierv1.VerifyRequest{
		Quality:  &mantlev1.QualityContext{RequestId: "req-off", Tenant: "acme", Scenario: "support"},
		Messages: []*mantlev1.ChatMessage{{Role: "user", Content: "化疗期间癌症病人能吃什么？"}},
		Content:  "我们的门店周日不营业，节假日照常。",
	}
	if resp, err := ts.client.Verify(ctx, offTopic); err != nil || resp.GetReviewId() != "" {
		t.Fatalf("Verify(off topic) = %v, %v; want no review yet", resp, err)
	}
	got, err = ts.client.GetFollowUp(waitCtx, &verifierv1.GetFollowUpRequest{RequestId: "req-off", Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	f = got.GetFollowUp()
	if f.GetGrade() != mantlev1.QualityGrade_QUALITY_GRADE_LOW || f.GetReviewId() == "" || f.GetRiskScore() < 0.75 {
		t.Errorf("off-topic follow-up = %v; want low grade and a review", f)
	}
	opened := ts.events.wait(t, review.SubjectOpened, 1).(*eventsv1.ReviewRequestEvent)
	if opened.GetReason() != "l3" || opened.GetRequestId() != "req-off" {
		t.Errorf("opened = %v, want an l3 review of req-off", opened)
	}
}

func TestServerReportFeedback(t *testing.T) {
	t.Parallel()
	ts := startServer(t, DefaultConfig(), serverOptions{})
	ctx := context.Background()
	req := &verifierv1.VerifyRequest{Quality: &mantlev1.QualityContext{RequestId: "req-1", Tenant: "acme"},
		Content: "周四送达。", SessionId: "chat-42"}
	if _, err := ts.client.Verify(ctx, req); err != nil {
		t.Fatal(err)
	}
	got, err := ts.client.ReportFeedback(ctx, &verifierv1.ReportFeedbackRequest{RequestId: "req-1", Tenant: "acme",
		Feedback: verifierv1.Feedback_FEEDBACK_DISSATISFIED, Comment: "答非所问"})
	if err != nil || got.GetSessionId() != "chat-42" || got.GetContextRisk() != 1 {
		t.Fatalf("ReportFeedback = %v, %v", got, err)
	}
	req.Quality.RequestId = "req-2"
	next, err := ts.client.Verify(ctx, req)
	if err != nil || next.GetRisk().GetContext() != 1 || !contains(next.GetRisk().GetSignals(), SignalUserDissatisfied) {
		t.Errorf("next answer's risk = %v, %v; want the dissatisfaction", next.GetRisk(), err)
	}
	_, err = ts.client.ReportFeedback(ctx, &verifierv1.ReportFeedbackRequest{Tenant: "acme"})
	wantCode(t, err, codes.InvalidArgument, rpc.ReasonInvalidRequest)
	if diff := cmp.Diff([]string{"request_id", "feedback"}, rpc.BadRequestFields(err)); diff != "" {
		t.Errorf("fields (-want +got):\n%s", diff)
	}
}

func TestServerReloadRules(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, path, rulesA)
	cfg := DefaultConfig()
	cfg.RulesFile = path
	ts := startServer(t, cfg, serverOptions{})
	ctx := context.Background()
	writeRules(t, path, rulesB)
	got, err := ts.client.ReloadRules(ctx, &verifierv1.ReloadRulesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !contains(got.GetRuleIds(), "file-b") || contains(got.GetRuleIds(), "file-a") || got.GetRuleCount() != 4 {
		t.Errorf("ReloadRules = %v, want the samples and file-b", got)
	}
	if err := os.WriteFile(path, []byte(rulesX), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = ts.client.ReloadRules(ctx, &verifierv1.ReloadRulesRequest{})
	wantCode(t, err, codes.FailedPrecondition, ReasonRulesRejected)
	if !strings.Contains(status.Convert(err).Message(), "file-x") {
		t.Errorf("message %q does not name the bad rule", status.Convert(err).Message())
	}
	resp, err := ts.client.Verify(ctx, &verifierv1.VerifyRequest{Quality: &mantlev1.QualityContext{Tenant: "acme"}, Content: "退款已处理。"})
	if err != nil || resp.GetUserNotice() != "退款规则B" {
		t.Errorf("after a rejected reload: notice %q, %v; want the last good rule", resp.GetUserNotice(), err)
	}
}

// fakeRouter is a RouterService whose every answer is the judge's verdict.
type fakeRouter struct {
	routerv1.UnimplementedRouterServiceServer
	mu       sync.Mutex
	requests []*routerv1.CompleteRequest
}

func (f *fakeRouter) Complete(_ context.Context, req *routerv1.CompleteRequest) (*routerv1.CompleteResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, req)
	return &routerv1.CompleteResponse{Message: &mantlev1.ChatMessage{Role: "assistant", Content: `{"score": 0.1}`}}, nil
}

func TestServerJudgeThroughTheRouter(t *testing.T) {
	t.Parallel()
	router := &fakeRouter{}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	routerv1.RegisterRouterServiceServer(srv, router)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///router",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })

	cfg := DefaultConfig()
	cfg.L3.Judge.Enabled = true
	ts := startServer(t, cfg, serverOptions{dial: func(module string) (grpc.ClientConnInterface, error) {
		if module != "router" {
			t.Errorf("dialled %s, want the router", module)
		}
		return conn, nil
	}})
	ctx := context.Background()
	if _, err := ts.client.Verify(ctx, &verifierv1.VerifyRequest{
		Quality:  &mantlev1.QualityContext{RequestId: "req-j", Tenant: "acme", Scenario: "support"},
		Messages: []*mantlev1.ChatMessage{{Role: "user", Content: "退款多久到账？"}},
		Content:  "退款将在五个工作日内到账。",
	}); err != nil {
		t.Fatal(err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, waitFor)
	defer cancel()
	got, err := ts.client.GetFollowUp(waitCtx, &verifierv1.GetFollowUpRequest{RequestId: "req-j", Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	f := got.GetFollowUp()
	if !f.GetJudged() || f.GetJudgeScore() != 0.1 || f.GetL3Confidence() > 0.5 {
		t.Errorf("follow-up = %v; want the judge's low score to pull the confidence down", f)
	}
	router.mu.Lock()
	defer router.mu.Unlock()
	if len(router.requests) != 1 || router.requests[0].GetRequest().GetScenario() != "verifier-judge" ||
		!strings.Contains(router.requests[0].GetRequest().GetMessages()[1].GetContent(), "退款将在五个工作日内到账") {
		t.Errorf("router requests = %v", router.requests)
	}

	// The judge's own answers, verified when the router returns them, are not judged.
	resp, err := ts.client.Verify(ctx, &verifierv1.VerifyRequest{
		Quality: &mantlev1.QualityContext{RequestId: "req-judge-call", Tenant: "acme", Scenario: "verifier-judge"},
		Content: `{"score": 0.1}`, ResponseFormat: &mantlev1.ResponseFormat{Type: mantlev1.ResponseFormat_TYPE_JSON_OBJECT},
	})
	if err != nil || resp.GetL3Pending() {
		t.Errorf("judge answer: l3_pending %v, %v; want no L3 (it would loop)", resp.GetL3Pending(), err)
	}
}

// TestCachedAnswerGetsRulesButNoL3: the router verifies every cache hit for the scenario
// asking now. Its rules apply as to a fresh answer; L3, which ran when the answer was first
// given, does not run again.
func TestCachedAnswerGetsRulesButNoL3(t *testing.T) {
	t.Parallel()
	ts := startServer(t, DefaultConfig(), serverOptions{})
	for _, cached := range []bool{false, true} {
		resp, err := ts.client.Verify(context.Background(), &verifierv1.VerifyRequest{
			Quality:  &mantlev1.QualityContext{RequestId: fmt.Sprintf("req-cached-%t", cached), Tenant: "acme", Scenario: "legal", CacheHit: cached},
			Messages: []*mantlev1.ChatMessage{{Role: "user", Content: "工伤认定需要多久？"}},
			Content:  "一般需要两个月。",
		})
		if err != nil {
			t.Fatal(err)
		}
		if !resp.GetPassed() || resp.GetUserNotice() == "" || !slices.Contains(resp.GetQuality().GetVerification().GetL2RulesApplied(), "work-injury-cite-regulation") {
			t.Errorf("cache_hit %t: passed %t notice %q rules %v; want the legal notice rule applied", cached, resp.GetPassed(), resp.GetUserNotice(), resp.GetQuality().GetVerification().GetL2RulesApplied())
		}
		if resp.GetL3Pending() == cached {
			t.Errorf("cache_hit %t: l3_pending %t, want L3 only for the fresh answer", cached, resp.GetL3Pending())
		}
	}
}

// TestSkipL3Levels: degraded.skip_l3_levels names the fallback levels whose answers get no
// L3; every other level's does. Each level is tried with the default list and with a list
// naming only it.
func TestSkipL3Levels(t *testing.T) {
	t.Parallel()
	levels := []struct {
		level mantlev1.FallbackLevel
		name  string
	}{
		{mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY, "primary"},
		{mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL, "backup_model"},
		{mantlev1.FallbackLevel_FALLBACK_LEVEL_CACHED_APPROXIMATE, "cached_approximate"},
		{mantlev1.FallbackLevel_FALLBACK_LEVEL_TEMPLATE, "template"},
	}
	if len(levels) != len(fallbackLevels) {
		t.Fatalf("the test knows %d levels, the configuration %d (%v)", len(levels), len(fallbackLevels), fallbackLevels)
	}
	for _, skip := range [][]string{DefaultConfig().Degraded.SkipL3Levels, {"primary"}, {"backup_model"}, {"cached_approximate"}, {"template"}} {
		cfg := DefaultConfig()
		cfg.Degraded.SkipL3Levels = skip
		ts := startServer(t, cfg, serverOptions{})
		for i, l := range levels {
			resp, err := ts.client.Verify(context.Background(), &verifierv1.VerifyRequest{
				Quality:  &mantlev1.QualityContext{RequestId: fmt.Sprintf("req-skip-%v-%d", skip, i), Tenant: "acme", FallbackLevel: l.level},
				Messages: []*mantlev1.ChatMessage{{Role: "user", Content: "How long does a parcel to Lisbon take?"}},
				Content:  "About three working days.",
			})
			if err != nil {
				t.Fatal(err)
			}
			if want := !slices.Contains(skip, l.name); resp.GetL3Pending() != want {
				t.Errorf("skip_l3_levels %v, level %s: l3_pending %t, want %t", skip, l.name, resp.GetL3Pending(), want)
			}
		}
	}
}

// TestServerWidenDraftRule: a rule drafted from one tenant's review is that tenant's; an
// operator may widen it to every tenant when approving it, which is audited, logged and
// announced. A tenant cannot, nor can a widening come without an approval.
func TestServerWidenDraftRule(t *testing.T) {
	t.Parallel()
	var logs strings.Builder
	var logMu sync.Mutex
	ts := startServer(t, DefaultConfig(), serverOptions{log: slog.New(slog.NewJSONHandler(writerFunc(func(p []byte) (int, error) {
		logMu.Lock()
		defer logMu.Unlock()
		return logs.Write(p)
	}), nil))})
	ctx := context.Background()
	resp, err := ts.client.Verify(ctx, riskyRequest("req-1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ts.client.ClaimReview(ctx, &verifierv1.ClaimReviewRequest{ReviewId: resp.GetReviewId(), Reviewer: "alice"}); err != nil {
		t.Fatal(err)
	}
	decided, err := ts.client.DecideReview(ctx, &verifierv1.DecideReviewRequest{
		ReviewId: resp.GetReviewId(), Reviewer: "alice", Verdict: verifierv1.ReviewVerdict_REVIEW_VERDICT_CORRECT,
		RootCause: verifierv1.RootCause_ROOT_CAUSE_KNOWLEDGE_CUTOFF, CorrectiveAction: verifierv1.CorrectiveAction_CORRECTIVE_ACTION_APPEND_KNOWLEDGE,
		CorrectedContent: "需要鉴定。",
		DraftRule:        &verifierv1.DraftRuleHint{QuestionTerms: []string{"工伤认定"}, AnswerTerms: []string{"无需鉴定"}, Knowledge: "第二十一条：应当进行劳动能力鉴定。"},
	})
	if err != nil {
		t.Fatal(err)
	}
	draft := decided.GetDraftRule()
	if draft.GetTenant() != "acme" || !strings.HasPrefix(draft.GetRule().GetCondition(), `tenant == "acme" && `) {
		t.Fatalf("draft = %v, want acme's rule", draft)
	}
	widen := &verifierv1.DecideDraftRuleRequest{DraftRuleId: draft.GetId(), Reviewer: "lead", Approve: true, Widen: true}
	_, err = ts.client.DecideDraftRule(asTenant("acme"), widen)
	wantCode(t, err, codes.PermissionDenied, rpc.ReasonPermissionDenied)
	_, err = ts.client.DecideDraftRule(asOperator("ops"), &verifierv1.DecideDraftRuleRequest{DraftRuleId: draft.GetId(), Reviewer: "lead", Widen: true})
	wantCode(t, err, codes.InvalidArgument, rpc.ReasonInvalidRequest)

	got, err := ts.client.DecideDraftRule(asOperator("ops"), widen)
	if err != nil {
		t.Fatal(err)
	}
	if r := got.GetRule(); !r.GetWidened() || r.GetTenant() != "acme" || r.GetState() != verifierv1.DraftRuleState_DRAFT_RULE_STATE_APPROVED ||
		r.GetRule().GetCondition() != `question.contains("工伤认定") && text.contains("无需鉴定")` {
		t.Fatalf("widened draft = %v", r)
	}
	// Another tenant's answers now get the rule too.
	globex := riskyRequest("req-2")
	globex.Quality.Tenant = "globex"
	other, err := ts.client.Verify(asTenant("globex"), globex)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(other.GetContent(), "第二十一条") || !contains(other.GetQuality().GetVerification().GetL2RulesApplied(), draft.GetId()) {
		t.Errorf("another tenant's answer after the widening: %q, rules %v; want the rule applied", other.GetContent(), other.GetQuality().GetVerification().GetL2RulesApplied())
	}

	ev := ts.events.wait(t, review.SubjectDraftRule, 1).(*eventsv1.DraftRuleDecisionEvent)
	if !ev.GetApproved() || !ev.GetWidened() || ev.GetOperator() != "ops" || ev.GetReviewer() != "lead" || ev.GetTenant() != "acme" || ev.GetDraftRuleId() != draft.GetId() {
		t.Errorf("draft rule event = %v", ev)
	}
	audit, err := ts.client.ListReviewAudit(ctx, &verifierv1.ListReviewAuditRequest{ReviewId: resp.GetReviewId()})
	if err != nil {
		t.Fatal(err)
	}
	last := audit.GetEntries()[len(audit.GetEntries())-1]
	if last.GetAction() != "draft_approved" || last.GetDetail() != "widened to every tenant (drafted for tenant acme); operator ops" {
		t.Errorf("last audit entry = %v", last)
	}
	logMu.Lock()
	out := logs.String()
	logMu.Unlock()
	if !strings.Contains(out, `"msg":"draft rule widened beyond its tenant: it now applies to every tenant's answers"`) || !strings.Contains(out, `"operator":"ops"`) {
		t.Errorf("no widening line naming the operator in the log:\n%.2000s", out)
	}
	// Decided once, the draft cannot be decided (or widened) again.
	_, err = ts.client.DecideDraftRule(asOperator("ops"), widen)
	wantCode(t, err, codes.FailedPrecondition, ReasonReviewConflict)
}

// writerFunc adapts a function to io.Writer.
type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
