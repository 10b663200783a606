package review

import (
	"context"
	"errors"
	"fmt"
	"github.com/mantle-mesh/mantle/pkg/natsembed"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/verifier/internal/rules"
)

var t0 = time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC)

// memPublisher records events and lets a test wait for them.
type memPublisher struct {
	mu     sync.Mutex
	events map[string][]proto.Message
	notify chan struct{} // closed and replaced on every publish
}

func (p *memPublisher) Publish(_ context.Context, subject string, msg proto.Message) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.events == nil {
		p.events = map[string][]proto.Message{}
	}
	p.events[subject] = append(p.events[subject], proto.Clone(msg))
	if p.notify != nil {
		close(p.notify)
	}
	p.notify = make(chan struct{})
}

// wait returns the n-th event on subject, waiting up to a failure deadline for it.
func (p *memPublisher) wait(t *testing.T, subject string, n int) proto.Message {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		p.mu.Lock()
		if evs := p.events[subject]; len(evs) >= n {
			p.mu.Unlock()
			return evs[n-1]
		}
		if p.notify == nil {
			p.notify = make(chan struct{})
		}
		notify := p.notify
		p.mu.Unlock()
		select {
		case <-notify:
		case <-deadline:
			t.Fatalf("no event #%d on %s", n, subject)
		}
	}
}

func (p *memPublisher) on(subject string) []proto.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.events[subject]
}

// sink is a RuleSink with a real engine.
type sink struct {
	engine *rules.Engine
	mu     sync.Mutex
	live   []rules.Rule
}

func newSink(t testing.TB) *sink {
	e, err := rules.NewEngine(0)
	if err != nil {
		t.Fatal(err)
	}
	return &sink{engine: e}
}

func (s *sink) Check(r rules.Rule) error { _, err := s.engine.Compile([]rules.Rule{r}); return err }

func (s *sink) Approve(_ context.Context, r rules.Rule) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.engine.Load(append(append([]rules.Rule(nil), s.live...), r)); err != nil {
		return err
	}
	s.live = append(s.live, r)
	return nil
}

// stores runs a test against the in-memory KV and a JetStream KV on an embedded server.
func stores(t *testing.T, test func(t *testing.T, kv KV)) {
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		test(t, NewMemoryKV())
	})
	t.Run("jetstream", func(t *testing.T) {
		t.Parallel()
		srv, err := natsembed.Start()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Shutdown)
		nc, err := nats.Connect(srv.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		test(t, NewLazyJetStreamKV(js, jetstream.KeyValueConfig{Bucket: "reviews_test", History: 1}))
	})
}

type fixture struct {
	svc   *Service
	clock *clockwork.FakeClock
	pub   *memPublisher
	sink  *sink
}

func newFixture(t *testing.T, kv KV) *fixture {
	f := &fixture{clock: clockwork.NewFakeClockAt(t0), pub: &memPublisher{}, sink: newSink(t)}
	f.svc = NewService(Config{Lease: 5 * time.Minute, MaxLease: time.Hour}, NewStore(kv, nil), f.clock, f.pub, f.sink, slog.New(slog.DiscardHandler))
	return f
}

func (f *fixture) open(t *testing.T, requestID, tenant, scenario string) Review {
	t.Helper()
	r, created, err := f.svc.Open(context.Background(), Review{
		ID: ID(tenant, requestID), RequestID: requestID, Tenant: tenant, Scenario: scenario,
		Reason: "risk", RiskScore: 0.8, Question: "工伤认定要做鉴定吗", Content: "无需鉴定。",
		CreatedAt: f.clock.Now(), DueAt: f.clock.Now().Add(15 * time.Minute),
		Default: DefaultAction{Type: DefaultReplace, Text: "请拨打12333咨询"},
	})
	if err != nil || !created {
		t.Fatalf("Open = %v, created %v", err, created)
	}
	return r
}

func conflict(err error) bool {
	var c *ConflictError
	return errors.As(err, &c)
}

func TestOpenIsIdempotent(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, kv KV) {
		f := newFixture(t, kv)
		first := f.open(t, "req-1", "acme", "legal")
		again, created, err := f.svc.Open(context.Background(), Review{ID: first.ID, RequestID: "req-1", Tenant: "acme", Reason: "l3"})
		if err != nil || created || again.Reason != "risk" {
			t.Fatalf("second Open = %+v, created %v, %v; want the first review", again, created, err)
		}
		if n := len(f.pub.on(SubjectOpened)); n != 1 {
			t.Errorf("%d opened events, want 1", n)
		}
		ev := f.pub.on(SubjectOpened)[0].(*eventsv1.ReviewRequestEvent)
		if ev.GetReviewId() != first.ID || ev.GetDefaultAction() != "replace" {
			t.Errorf("opened event = %v", ev)
		}
	})
}

func TestClaimLeases(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, kv KV) {
		f := newFixture(t, kv)
		ctx := context.Background()
		r := f.open(t, "req-1", "acme", "legal")

		got, err := f.svc.Claim(ctx, ClaimRequest{ID: r.ID, Reviewer: "alice"})
		if err != nil || got.State != StateClaimed || got.ClaimedBy != "alice" || !got.LeaseUntil.Equal(t0.Add(5*time.Minute)) {
			t.Fatalf("Claim = %+v, %v", got, err)
		}
		if _, err := f.svc.Claim(ctx, ClaimRequest{ID: r.ID, Reviewer: "bob"}); !conflict(err) || !strings.Contains(err.Error(), "claimed by alice") {
			t.Errorf("bob's claim = %v, want a conflict naming alice", err)
		}
		// alice renews for longer.
		f.clock.Advance(time.Minute)
		if got, err := f.svc.Claim(ctx, ClaimRequest{ID: r.ID, Reviewer: "alice", Lease: 10 * time.Minute}); err != nil || !got.LeaseUntil.Equal(t0.Add(11*time.Minute)) {
			t.Errorf("renewal = %+v, %v", got, err)
		}
		// Her lease runs out: the review is pending again and bob may take it.
		f.clock.Advance(10 * time.Minute)
		if v, _ := f.svc.Get(ctx, "", r.ID); v.State != StatePending || v.ClaimedBy != "" {
			t.Errorf("after the lease: %s by %q, want pending", v.State, v.ClaimedBy)
		}
		if got, err := f.svc.Claim(ctx, ClaimRequest{ID: r.ID, Reviewer: "bob"}); err != nil || got.ClaimedBy != "bob" {
			t.Errorf("bob after the lease = %+v, %v", got, err)
		}
		trail, _, err := f.svc.Audit(ctx, AuditFilter{ReviewID: r.ID}, Page{})
		if err != nil {
			t.Fatal(err)
		}
		var details []string
		for _, e := range trail {
			details = append(details, e.Actor+" "+e.Action)
		}
		if diff := cmp.Diff([]string{"verifier created", "alice claimed", "alice claimed", "bob claimed"}, details); diff != "" {
			t.Errorf("audit (-want +got):\n%s", diff)
		}
		if !strings.Contains(trail[2].Detail, "renewed") || !strings.Contains(trail[3].Detail, "lease of alice had expired") {
			t.Errorf("audit details = %q, %q", trail[2].Detail, trail[3].Detail)
		}
	})
}

func TestClaimNextTakesTheNearestDeadline(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, kv KV) {
		f := newFixture(t, kv)
		ctx := context.Background()
		late := f.open(t, "req-late", "acme", "legal")
		f.clock.Advance(-time.Minute) // an earlier review, so an earlier deadline
		early := f.open(t, "req-early", "acme", "legal")
		other := f.open(t, "req-medical", "acme", "medical")
		_ = other

		first, err := f.svc.Claim(ctx, ClaimRequest{Reviewer: "alice", Scenario: "legal"})
		if err != nil || first.ID != early.ID {
			t.Fatalf("first claim = %s, %v; want %s", first.ID, err, early.ID)
		}
		second, err := f.svc.Claim(ctx, ClaimRequest{Reviewer: "bob", Scenario: "legal"})
		if err != nil || second.ID != late.ID {
			t.Fatalf("second claim = %s, %v; want %s", second.ID, err, late.ID)
		}
		if _, err := f.svc.Claim(ctx, ClaimRequest{Reviewer: "carol", Scenario: "legal"}); !errors.Is(err, ErrNotFound) {
			t.Errorf("third claim = %v, want ErrNotFound (nothing pending)", err)
		}
	})
}

func TestConcurrentClaimsHaveOneWinner(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, kv KV) {
		f := newFixture(t, kv)
		r := f.open(t, "req-1", "acme", "legal")
		var wg sync.WaitGroup
		results := make(chan error, 8)
		for i := range 8 {
			wg.Go(func() {
				_, err := f.svc.Claim(context.Background(), ClaimRequest{ID: r.ID, Reviewer: fmt.Sprintf("reviewer-%d", i)})
				results <- err
			})
		}
		wg.Wait()
		close(results)
		wins := 0
		for err := range results {
			switch {
			case err == nil:
				wins++
			case !conflict(err):
				t.Errorf("claim error %v, want a conflict", err)
			}
		}
		if wins != 1 {
			t.Errorf("%d claims won, want exactly 1", wins)
		}
	})
}

func TestDecide(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, kv KV) {
		f := newFixture(t, kv)
		ctx := context.Background()
		acker := &recordingAcker{}
		f.svc.SetAcker(acker)
		r := f.open(t, "req-1", "acme", "legal")
		decide := DecideRequest{ID: r.ID, Reviewer: "alice", Verdict: VerdictCorrect, RootCause: CauseKnowledgeCutoff,
			CorrectiveAction: ActionAppendKnowledge, CorrectedContent: "需要鉴定：依据《工伤保险条例》……", Note: "旧法规"}

		if _, _, err := f.svc.Decide(ctx, decide); !conflict(err) || !strings.Contains(err.Error(), "claim it first") {
			t.Fatalf("Decide without a claim = %v, want a conflict", err)
		}
		if _, err := f.svc.Claim(ctx, ClaimRequest{ID: r.ID, Reviewer: "alice"}); err != nil {
			t.Fatal(err)
		}
		wrong := decide
		wrong.Reviewer = "bob"
		if _, _, err := f.svc.Decide(ctx, wrong); !conflict(err) {
			t.Errorf("bob deciding alice's claim = %v, want a conflict", err)
		}

		withDraft := decide
		withDraft.Draft = &rules.Hint{QuestionTerms: []string{"工伤认定"}, AnswerTerms: []string{"无需鉴定"}, Knowledge: "《工伤保险条例》第二十条规定…"}
		f.clock.Advance(3 * time.Minute)
		got, draft, err := f.svc.Decide(ctx, withDraft)
		if err != nil {
			t.Fatalf("Decide: %v", err)
		}
		if got.State != StateDecided || got.Decision.RootCause != CauseKnowledgeCutoff || got.Decision.DraftRuleID != draft.ID {
			t.Errorf("decided review = %+v", got)
		}
		if draft.State != DraftProposed || draft.Rule.Action.Type != rules.ActionNotice ||
			draft.Rule.Condition != `tenant == "acme" && question.contains("工伤认定") && text.contains("无需鉴定")` || draft.Rule.Scenarios[0] != "legal" {
			t.Errorf("draft = %+v", draft)
		}
		ev, ok := f.pub.on(SubjectDecision)[0].(*eventsv1.ReviewDecisionEvent)
		if !ok || ev.GetVerdict() != "correct" || ev.GetRootCause() != "knowledge_cutoff" ||
			ev.GetCorrectiveAction() != "append_knowledge" || ev.GetDecidedAfter().AsDuration() != 3*time.Minute || ev.GetDraftRuleId() != draft.ID {
			t.Errorf("decision event = %v", ev)
		}
		if diff := cmp.Diff([]string{r.ID}, acker.acked()); diff != "" {
			t.Errorf("acknowledged (-want +got):\n%s", diff)
		}
		if _, _, err := f.svc.Decide(ctx, decide); !conflict(err) || !strings.Contains(err.Error(), "already decided") {
			t.Errorf("second decision = %v, want a conflict", err)
		}

		// Approving the draft makes it live; approving again is a conflict.
		approved, err := f.svc.DecideDraft(ctx, "", DraftDecision{ID: draft.ID, Reviewer: "lead", Approve: true})
		if err != nil || approved.State != DraftApproved || approved.DecidedBy != "lead" {
			t.Fatalf("DecideDraft = %+v, %v", approved, err)
		}
		if len(f.sink.live) != 1 || f.sink.engine.Live().Len() != 1 {
			t.Errorf("live rules = %d, want the approved draft", f.sink.engine.Live().Len())
		}
		if _, err := f.svc.DecideDraft(ctx, "", DraftDecision{ID: draft.ID, Reviewer: "lead"}); !conflict(err) {
			t.Errorf("second DecideDraft = %v, want a conflict", err)
		}
		live, err := f.svc.ApprovedRules(ctx)
		if err != nil || len(live) != 1 || live[0].ID != draft.ID {
			t.Errorf("ApprovedRules = %v, %v", live, err)
		}

		trail, _, err := f.svc.Audit(ctx, AuditFilter{ReviewID: r.ID}, Page{})
		if err != nil {
			t.Fatal(err)
		}
		var actions []string
		for _, e := range trail {
			actions = append(actions, e.Action)
		}
		if diff := cmp.Diff([]string{AuditCreated, AuditClaimed, AuditDecided, AuditDraftCreated, AuditDraftApproved}, actions); diff != "" {
			t.Errorf("audit (-want +got):\n%s", diff)
		}
		byLead, _, _ := f.svc.Audit(ctx, AuditFilter{Actor: "lead"}, Page{})
		if len(byLead) != 1 || byLead[0].DraftRuleID != draft.ID {
			t.Errorf("lead's audit = %+v", byLead)
		}
	})
}

func TestDecideValidation(t *testing.T) {
	t.Parallel()
	f := newFixture(t, NewMemoryKV())
	r := f.open(t, "req-1", "acme", "legal")
	if _, err := f.svc.Claim(context.Background(), ClaimRequest{ID: r.ID, Reviewer: "alice"}); err != nil {
		t.Fatal(err)
	}
	ok := DecideRequest{ID: r.ID, Reviewer: "alice", Verdict: VerdictReject, RootCause: CauseHallucination, CorrectiveAction: ActionNone}
	tests := []struct {
		name       string
		change     func(*DecideRequest)
		wantFields []string
	}{
		{"no reviewer", func(d *DecideRequest) { d.Reviewer = "" }, []string{"reviewer"}},
		{"unknown verdict", func(d *DecideRequest) { d.Verdict = "unspecified" }, []string{"verdict"}},
		{"unknown root cause", func(d *DecideRequest) { d.RootCause = "bad luck" }, []string{"root_cause"}},
		{"unknown action", func(d *DecideRequest) { d.CorrectiveAction = "pray" }, []string{"corrective_action"}},
		{"correct without content", func(d *DecideRequest) { d.Verdict = VerdictCorrect }, []string{"corrected_content"}},
		{"draft from no action", func(d *DecideRequest) { d.Draft = &rules.Hint{QuestionTerms: []string{"x"}} }, []string{"draft_rule"}},
		{"draft without terms", func(d *DecideRequest) {
			d.CorrectiveAction, d.Draft = ActionAddRule, &rules.Hint{}
		}, []string{"draft_rule"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := ok
			tt.change(&req)
			_, _, err := f.svc.Decide(context.Background(), req)
			var verr *rpc.ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("Decide = %v, want a validation error", err)
			}
			var fields []string
			for _, v := range verr.Violations {
				fields = append(fields, v.Field)
			}
			if diff := cmp.Diff(tt.wantFields, fields); diff != "" {
				t.Errorf("fields (-want +got):\n%s", diff)
			}
		})
	}
	// None of the rejected calls decided anything.
	if got, _ := f.svc.Get(context.Background(), "", r.ID); got.State != StateClaimed {
		t.Errorf("state = %s, want still claimed", got.State)
	}
}

type recordingAcker struct {
	mu  sync.Mutex
	ids []string
}

func (a *recordingAcker) Ack(_ context.Context, id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ids = append(a.ids, id)
}

func (a *recordingAcker) acked() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.ids...)
}

func TestSweepTimesOutOverdueReviews(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, kv KV) {
		f := newFixture(t, kv)
		ctx := context.Background()
		acker := &recordingAcker{}
		f.svc.SetAcker(acker)
		claimed := f.open(t, "req-claimed", "acme", "legal")
		pending := f.open(t, "req-pending", "acme", "legal")
		f.clock.Advance(time.Minute)
		later := f.open(t, "req-later", "acme", "legal")
		if _, err := f.svc.Claim(ctx, ClaimRequest{ID: claimed.ID, Reviewer: "alice", Lease: time.Hour}); err != nil {
			t.Fatal(err)
		}

		f.clock.Advance(14 * time.Minute) // the first two are due now, the third in a minute
		if _, err := f.svc.Claim(ctx, ClaimRequest{ID: pending.ID, Reviewer: "bob"}); !conflict(err) {
			t.Errorf("claim after the deadline = %v, want a conflict", err)
		}
		n, err := f.svc.Sweep(ctx)
		if err != nil || n != 2 {
			t.Fatalf("Sweep = %d, %v; want 2", n, err)
		}
		for _, id := range []string{claimed.ID, pending.ID} {
			r, _ := f.svc.Get(ctx, "", id)
			if r.State != StateTimedOut || !r.TimedOutAt.Equal(t0.Add(15*time.Minute)) {
				t.Errorf("%s: %s at %v, want timed out", id, r.State, r.TimedOutAt)
			}
		}
		if r, _ := f.svc.Get(ctx, "", later.ID); r.State != StatePending {
			t.Errorf("the review not yet due is %s, want pending", r.State)
		}
		timeouts := f.pub.on(SubjectTimeout)
		if len(timeouts) != 2 {
			t.Fatalf("%d timeout events, want 2", len(timeouts))
		}
		var holders []string
		for _, m := range timeouts {
			ev := m.(*eventsv1.ReviewTimeoutEvent)
			if ev.GetDefaultAction() != "replace" || ev.GetDefaultActionText() != "请拨打12333咨询" {
				t.Errorf("timeout event = %v", ev)
			}
			holders = append(holders, ev.GetClaimedBy())
		}
		if !(holders[0] == "alice" || holders[1] == "alice") {
			t.Errorf("claimed_by = %v, want alice on the claimed review", holders)
		}
		if len(acker.acked()) != 2 {
			t.Errorf("acknowledged %v, want both timed-out reviews", acker.acked())
		}
		// A decision after the deadline is refused; the default action stands.
		_, _, err = f.svc.Decide(ctx, DecideRequest{ID: claimed.ID, Reviewer: "alice", Verdict: VerdictApprove, RootCause: CauseNone, CorrectiveAction: ActionNone})
		if !conflict(err) {
			t.Errorf("late decision = %v, want a conflict", err)
		}
		// Sweeping again changes nothing.
		if n, err := f.svc.Sweep(ctx); n != 0 || err != nil {
			t.Errorf("second Sweep = %d, %v; want 0", n, err)
		}
		trail, _, _ := f.svc.Audit(ctx, AuditFilter{ReviewID: claimed.ID}, Page{})
		if last := trail[len(trail)-1]; last.Action != AuditTimedOut || !strings.Contains(last.Detail, "claimed by alice") {
			t.Errorf("last audit entry = %+v", last)
		}
	})
}

func TestTenantScope(t *testing.T) {
	t.Parallel()
	f := newFixture(t, NewMemoryKV())
	ctx := context.Background()
	acme := f.open(t, "req-1", "acme", "legal")
	f.open(t, "req-2", "globex", "legal")
	list, _, err := f.svc.List(ctx, Filter{Scope: "acme"}, Page{})
	if err != nil || len(list) != 1 || list[0].ID != acme.ID {
		t.Errorf("acme's list = %v, %v", list, err)
	}
	if all, _, _ := f.svc.List(ctx, Filter{}, Page{}); len(all) != 2 {
		t.Errorf("operator list has %d reviews, want 2", len(all))
	}
	if _, err := f.svc.Get(ctx, "globex", acme.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("globex reading acme's review = %v, want ErrNotFound", err)
	}
	if _, err := f.svc.Claim(ctx, ClaimRequest{Scope: "globex", ID: acme.ID, Reviewer: "eve"}); !errors.Is(err, ErrNotFound) {
		t.Errorf("globex claiming acme's review = %v, want ErrNotFound", err)
	}
	if entries, _, _ := f.svc.Audit(ctx, AuditFilter{Scope: "globex"}, Page{}); len(entries) != 1 {
		t.Errorf("globex sees %d audit entries, want only its own review's", len(entries))
	}
}

func TestPaging(t *testing.T) {
	t.Parallel()
	f := newFixture(t, NewMemoryKV())
	for i := range 5 {
		f.open(t, fmt.Sprintf("req-%d", i), "acme", "legal")
		f.clock.Advance(time.Second)
	}
	var ids []string
	token := ""
	for pages := 0; ; pages++ {
		page, next, err := f.svc.List(context.Background(), Filter{}, Page{Size: 2, Token: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page {
			ids = append(ids, r.RequestID)
		}
		if next == "" {
			break
		}
		token = next
	}
	if diff := cmp.Diff([]string{"req-0", "req-1", "req-2", "req-3", "req-4"}, ids); diff != "" {
		t.Errorf("paged ids (-want +got):\n%s", diff)
	}
	for _, p := range []Page{{Size: 501}, {Token: "abc"}, {Token: "-1"}} {
		var verr *rpc.ValidationError
		if _, _, err := f.svc.List(context.Background(), Filter{}, p); !errors.As(err, &verr) {
			t.Errorf("List(%+v) = %v, want a validation error", p, err)
		}
	}
}

func TestEventRoundTrip(t *testing.T) {
	t.Parallel()
	r := Review{
		ID: "rv_1", RequestID: "req-1", Tenant: "acme", Scenario: "legal", SessionID: "s1", Model: "m",
		State: StatePending, Reason: "risk", Signals: []string{"sensitive_term"}, RiskScore: 0.8,
		InputRisk: 1, OutputRisk: 0.5, ContextRisk: 1, Question: "q", Content: "a",
		CreatedAt: t0, DueAt: t0.Add(time.Minute), Default: DefaultAction{Type: DefaultKeep},
	}
	if diff := cmp.Diff(r, FromEvent(ToEvent(r))); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	// A request without a review id gets the deterministic one.
	ev := ToEvent(r)
	ev.ReviewId = ""
	if got := FromEvent(ev).ID; got != ID("acme", "req-1") {
		t.Errorf("id = %s, want ID(tenant, request)", got)
	}
}
