package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"github.com/mantle-mesh/mantle/pkg/natsembed"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/services/verifier"
)

// startVerifierApp runs the verifier module alone, as `mantle serve --target=verifier`
// would, on 127.0.0.1:0 with an embedded NATS server: review state in JetStream KV,
// requests through the work queue, events published to NATS. It returns the gRPC address
// and a NATS connection for the test to watch events with.
func startVerifierApp(t *testing.T) (string, *nats.Conn) {
	t.Helper()
	srv, err := natsembed.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	reg := prometheus.NewRegistry()
	pub, err := events.Connect(ctx, srv.URL(), log, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	cfg := verifier.DefaultConfig()
	cfg.Review.SpoolDir = t.TempDir()
	a, err := app.New(ctx, app.Config{
		Targets: []string{"verifier"}, GRPCListenAddress: "127.0.0.1:0", HTTPListenAddress: "127.0.0.1:0",
		GracefulShutdownTimeout: 5 * time.Second,
	}, []app.Module{verifier.Module(cfg)}, app.Deps{Log: log, Metrics: reg, Events: pub, Clock: clockwork.NewRealClock(), NATS: pub.Conn()})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("app.Run: %v", err)
		}
	})
	watcher, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(watcher.Close)
	return a.GRPCAddr(), watcher
}

// subscribe delivers the events on subject, decoded into new messages like proto.
func subscribe[M proto.Message](t *testing.T, nc *nats.Conn, subject string, newMsg func() M) <-chan M {
	t.Helper()
	ch := make(chan M, 8)
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		msg := newMsg()
		if err := proto.Unmarshal(m.Data, msg); err != nil {
			t.Errorf("event on %s: %v", subject, err)
			return
		}
		ch <- msg
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil { // the subscription is registered before the test goes on
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return ch
}

func receive[M any](t *testing.T, ch <-chan M) M {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(20 * time.Second):
		t.Fatal("no event within 20s")
		var zero M
		return zero
	}
}

// runReview runs `mantle review args...` against addr and returns stdout.
func runReview(t *testing.T, addr string, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	args = append(args, "--addr", addr, "--key", "")
	if err := review(context.Background(), args, testEnv(&stdout, &stderr)); err != nil {
		t.Fatalf("mantle review %s: %v\nstderr: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

func TestReviewCLIEndToEnd(t *testing.T) {
	t.Parallel()
	addr, watcher := startVerifierApp(t)
	opened := subscribe(t, watcher, "mantle.events.review", func() *eventsv1.ReviewRequestEvent { return &eventsv1.ReviewRequestEvent{} })
	decided := subscribe(t, watcher, "mantle.events.review.decision", func() *eventsv1.ReviewDecisionEvent { return &eventsv1.ReviewDecisionEvent{} })

	// A model's risky answer: a 工伤认定 question answered "no appraisal needed" (a sample
	// rule sends it to review).
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	resp, err := verifierv1.NewVerifierServiceClient(conn).Verify(context.Background(), &verifierv1.VerifyRequest{
		Quality:  &mantlev1.QualityContext{RequestId: "req-cli-1", Tenant: "acme", Scenario: "legal"},
		Messages: []*mantlev1.ChatMessage{{Role: "user", Content: "工伤认定需要做劳动能力鉴定吗？"}},
		Content:  "无需鉴定，直接去社保局申请即可。", Model: "m-7b-v1",
	})
	if err != nil || resp.GetReviewId() == "" {
		t.Fatalf("Verify = %v, %v; want a review", resp, err)
	}
	id := resp.GetReviewId()
	// The request went through the JetStream work queue into the review store.
	if got := receive(t, opened); got.GetReviewId() != id {
		t.Fatalf("opened %s, want %s", got.GetReviewId(), id)
	}

	list := runReview(t, addr, "list", "--state", "pending")
	if !strings.Contains(list, id) || !strings.Contains(list, "rule:work-injury-no-appraisal-review") {
		t.Errorf("list output:\n%s\nwant the review", list)
	}
	claim := runReview(t, addr, "claim", "--reviewer", "alice", "--lease", "10m")
	if !regexp.MustCompile(`claimed `+id+` until \S+Z`).MatchString(claim) || !strings.Contains(claim, "无需鉴定") {
		t.Errorf("claim output:\n%s", claim)
	}
	decide := runReview(t, addr, "decide", id, "--reviewer", "alice", "--verdict", "correct",
		"--root-cause", "knowledge-cutoff", "--action", "append_knowledge",
		"--corrected", "需要。伤情稳定后存在残疾、影响劳动能力的，应当进行劳动能力鉴定。",
		"--draft-question-terms", "工伤认定", "--draft-answer-terms", "无需鉴定",
		"--draft-knowledge", "依据《工伤保险条例》第二十一条，应当进行劳动能力鉴定。")
	if !strings.Contains(decide, "decided "+id+": correct (root cause knowledge_cutoff, corrective action append_knowledge)") ||
		!strings.Contains(decide, `drafted rule draft-rv-`) {
		t.Errorf("decide output:\n%s", decide)
	}
	ev := receive(t, decided)
	if ev.GetReviewId() != id || ev.GetReviewer() != "alice" || ev.GetVerdict() != "correct" || ev.GetDraftRuleId() == "" {
		t.Errorf("decision event = %v", ev)
	}
	audit := runReview(t, addr, "audit", id)
	for _, want := range []string{"verifier  created", "alice     claimed", "alice     decided", "draft_created"} {
		if !strings.Contains(audit, want) {
			t.Errorf("audit output does not contain %q:\n%s", want, audit)
		}
	}
	show := runReview(t, addr, "show", id, "--json")
	var shown struct {
		Review struct {
			State    string `json:"state"`
			Decision struct {
				RootCause string `json:"rootCause"`
			} `json:"decision"`
		} `json:"review"`
	}
	if err := json.Unmarshal([]byte(show), &shown); err != nil || shown.Review.State != "REVIEW_STATE_DECIDED" ||
		shown.Review.Decision.RootCause != "ROOT_CAUSE_KNOWLEDGE_CUTOFF" {
		t.Errorf("show --json (%v):\n%s", err, show)
	}
}

// TestReviewCLIConfirmations: an action's unknown outcome, opened as the agent opens it,
// is listed by mantle review --confirmations and decided with --happened / --not-happened.
func TestReviewCLIConfirmations(t *testing.T) {
	t.Parallel()
	addr, _ := startVerifierApp(t)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := verifierv1.NewVerifierServiceClient(conn)
	var ids []string
	for _, key := range []string{"pay-1", "pay-2"} {
		resp, err := client.OpenConfirmation(context.Background(), &verifierv1.OpenConfirmationRequest{
			Tenant: "acme", Tool: "pay", IdempotencyKey: key, Attempt: "1", Arguments: `{"invoice":"i-7"}`, Reason: "HTTP 504 Gateway Timeout",
		})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, resp.GetConfirmation().GetId())
	}

	list := runReview(t, addr, "--confirmations")
	for _, want := range []string{ids[0], ids[1], "pending", "acme", "pay-1", "HTTP 504 Gateway Timeout", `{"invoice":"i-7"}`} {
		if !strings.Contains(list, want) {
			t.Errorf("mantle review --confirmations does not show %q:\n%s", want, list)
		}
	}
	out := runReview(t, addr, "decide", ids[0], "--happened", "--result", "paid, bank ref 7781", "--reviewer", "anna")
	if !strings.Contains(out, "decided "+ids[0]+": happened (tenant acme, tool pay, key pay-1)") {
		t.Errorf("decide --happened output:\n%s", out)
	}
	out = runReview(t, addr, "decide", ids[1], "--not-happened", "--reviewer", "anna")
	if !strings.Contains(out, "decided "+ids[1]+": not_happened") || !strings.Contains(out, "the next call with the key runs the action") {
		t.Errorf("decide --not-happened output:\n%s", out)
	}
	if list := runReview(t, addr, "list", "--confirmations"); !strings.Contains(list, "no confirmations") {
		t.Errorf("pending confirmations after both decisions:\n%s", list)
	}
	all := runReview(t, addr, "list", "--confirmations", "--state", "all", "--json")
	var listed struct {
		Confirmations []struct {
			ID     string `json:"id"`
			State  string `json:"state"`
			Result string `json:"result"`
		} `json:"confirmations"`
	}
	if err := json.Unmarshal([]byte(all), &listed); err != nil || len(listed.Confirmations) != 2 ||
		listed.Confirmations[0].State != "CONFIRMATION_STATE_HAPPENED" || listed.Confirmations[0].Result != "paid, bank ref 7781" {
		t.Errorf("list --confirmations --state all --json (%v):\n%s", err, all)
	}
	if audit := runReview(t, addr, "audit", ids[0]); !strings.Contains(audit, "anna      decided") || !strings.Contains(audit, "confirm outcome: happened") {
		t.Errorf("audit of the confirmation:\n%s", audit)
	}
	var stderr bytes.Buffer
	err = review(context.Background(), []string{"decide", ids[0], "--not-happened", "--reviewer", "bob", "--addr", addr, "--key", ""}, testEnv(io.Discard, &stderr))
	if err == nil || !strings.Contains(err.Error(), "already decided") {
		t.Errorf("a second decision = %v, want refused as already decided", err)
	}
}

func TestReviewCLIErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		wantErr string
		// usage is the error of a call that prints the usage: errUsage for a wrong
		// command line, flag.ErrHelp for a request for help.
		usage error
	}{
		{name: "no command", args: nil, usage: errUsage},
		{name: "unknown command", args: []string{"approve"}, usage: errUsage},
		{name: "help", args: []string{"help"}, usage: flag.ErrHelp},
		{name: "decide without an id", args: []string{"decide", "--verdict", "approve"}, wantErr: "a review id is required"},
		{name: "bad enums are all reported", args: []string{"decide", "rv_1", "--verdict", "ok", "--root-cause", "x", "--action", "none"},
			wantErr: "--verdict: want one of approve, correct, reject, got \"ok\"\n--root-cause: want one of context_truncation,"},
		{name: "bad state", args: []string{"list", "--state", "open"}, wantErr: "--state: want one of claimed, decided, pending, timed_out"},
		{name: "two ids", args: []string{"show", "rv_1", "rv_2"}, wantErr: "want one review id"},
		{name: "unknown flag", args: []string{"list", "--colour"}, wantErr: "flag provided but not defined"},
		{name: "confirmation without a decision", args: []string{"decide", "cf_1"}, wantErr: "a confirmation needs --happened or --not-happened"},
		{name: "both decisions", args: []string{"decide", "cf_1", "--happened", "--not-happened"}, wantErr: "give one"},
		{name: "result without happened", args: []string{"decide", "cf_1", "--not-happened", "--result", "x"}, wantErr: "--result: only with --happened"},
		{name: "verdict on a confirmation", args: []string{"decide", "cf_1", "--happened", "--verdict", "approve"}, wantErr: "--verdict: a confirmation takes"},
		{name: "bad confirmation state", args: []string{"--confirmations", "--state", "done"}, wantErr: "--state: want one of happened, not_happened, pending"},
		{name: "scenario of confirmations", args: []string{"list", "--confirmations", "--scenario", "legal"}, wantErr: "--scenario: confirmations have no scenario"},
		{name: "tenant of reviews", args: []string{"list", "--tenant", "acme"}, wantErr: "--tenant: only with --confirmations"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stderr bytes.Buffer
			// An address nothing listens on: these must fail before any call is made.
			err := review(context.Background(), append(tt.args, "--addr", "127.0.0.1:1", "--timeout", "1s"), testEnv(io.Discard, &stderr))
			if tt.usage != nil {
				if !errors.Is(err, tt.usage) || !strings.Contains(stderr.String(), "usage: mantle review") {
					t.Errorf("err = %v, stderr %q; want %v and the usage", err, stderr.String(), tt.usage)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("err = %v, want %q", err, tt.wantErr)
			}
		})
	}
}
