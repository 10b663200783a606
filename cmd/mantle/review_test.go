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
	if err := review(context.Background(), args, &stdout, &stderr); err != nil {
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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stderr bytes.Buffer
			// An address nothing listens on: these must fail before any call is made.
			err := review(context.Background(), append(tt.args, "--addr", "127.0.0.1:1", "--timeout", "1s"), io.Discard, &stderr)
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
