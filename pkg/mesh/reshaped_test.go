package mesh_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/router"
)

// The reshaping rungs of the router (the fast answer, context compression) through the
// shape they ship in: a whole mesh, its HTTP doors with a tenant's key and the router's
// per-request headers, and upstreams that record what they were sent.

const (
	reshapeKey    = "sk-reshape-test"
	fastPrompt    = "Answer in one sentence."
	callerSystem  = "You are the support assistant. Follow the forty-page policy manual below."
	keptTurns     = 3
	summaryTokens = 200
)

// reshapeMesh is a mesh whose routes reshape prompts, and the upstreams behind them.
type reshapeMesh struct {
	base string
	m    *meshtest.Mesh
	// quick answers the fast-answer rung (and route direct); main is the model of the
	// long-conversation routes, sum their summariser; hang never answers.
	quick, main, sum *meshtest.RecordingUpstream
	hang             *hangingUpstream
}

// startReshape runs the whole mesh in one process with routes:
//   - direct: the quick model itself, as the control of what is cached;
//   - agent: two simulated models that are down, a smaller one that is down too, and the
//     fast-answer rung on quick;
//   - long: main (a window of 1000 tokens), its conversation compressed by sum;
//   - long-slow: the same with a summariser that never answers;
//   - long-plain: main without compression.
func startReshape(t *testing.T) *reshapeMesh {
	t.Helper()
	r := &reshapeMesh{
		quick: &meshtest.RecordingUpstream{}, main: &meshtest.RecordingUpstream{}, sum: &meshtest.RecordingUpstream{},
		hang: &hangingUpstream{started: make(chan struct{}, 8)},
	}
	serve := func(h http.Handler) string {
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		return srv.URL + "/v1"
	}
	t.Setenv("MANTLE_RESHAPE_UPSTREAM_KEY", "sk-upstream")
	keys := []router.KeyConfig{{ID: "k1", Env: "MANTLE_RESHAPE_UPSTREAM_KEY"}}
	cfg := mesh.Default()
	cfg.Auth.Tenants = []rpc.TenantKey{{ID: "reshape", KeySHA256: rpc.HashKey(reshapeKey)}}
	cfg.Router.DefaultBudget = 20 * time.Second
	// Longer than any test waits: a call that hangs is ended by the caller's budget, or the
	// test fails on its client's timeout.
	timeout := time.Minute
	cfg.Router.Providers = []router.ProviderConfig{
		{Name: "sim", Type: router.ProviderSim, Timeout: timeout, SimProfile: "down", SimSeed: 7},
		{Name: "quick-up", Type: router.ProviderOpenAI, BaseURL: serve(r.quick), Timeout: timeout, Keys: keys},
		{Name: "main-up", Type: router.ProviderOpenAI, BaseURL: serve(r.main), Timeout: timeout, Keys: keys},
		{Name: "sum-up", Type: router.ProviderOpenAI, BaseURL: serve(r.sum), Timeout: timeout, Keys: keys},
		{Name: "hang-up", Type: router.ProviderOpenAI, BaseURL: serve(r.hang), Timeout: timeout, Keys: keys},
	}
	cfg.Router.Models = []router.ModelConfig{
		{Name: "thorough", Provider: "sim"},
		{Name: "fallback", Provider: "sim"},
		{Name: "smaller", Provider: "sim"},
		{Name: "quick", Provider: "quick-up"},
		{Name: "main", Provider: "main-up", ContextWindow: 1000},
		{Name: "sum", Provider: "sum-up", ContextWindow: 16000},
		{Name: "sum-hang", Provider: "hang-up", ContextWindow: 16000},
	}
	compress := func(model string) router.ContextCompressionConfig {
		return router.ContextCompressionConfig{Model: model, KeepRecent: keptTurns, MaxSummaryTokens: summaryTokens}
	}
	cfg.Router.Routes = []router.RouteConfig{
		{Name: "direct", Candidates: []string{"quick"}},
		{Name: "agent", Candidates: []string{"thorough", "fallback"}, Ladder: router.LadderConfig{
			Smaller: []string{"smaller"}, FastAnswer: router.FastAnswerConfig{Model: "quick", Prompt: fastPrompt, MaxTokens: 64}}},
		{Name: "long", Candidates: []string{"main"}, ContextCompression: compress("sum")},
		{Name: "long-slow", Candidates: []string{"main"}, ContextCompression: compress("sum-hang")},
		{Name: "long-plain", Candidates: []string{"main"}},
	}
	r.m = meshtest.Start(t, cfg, meshtest.All)
	r.base = "http://" + r.m.HTTPAddr
	return r
}

// doorAnswer is what a door answered: status, headers, body, and the QualityContext of
// its mantle member (an answer's or a failed request's).
type doorAnswer struct {
	status  int
	header  http.Header
	body    []byte
	quality *mantlev1.QualityContext
}

// callDoor posts body to path (/v1/chat/completions or /v1/messages) with the tenant's
// key as that door's SDK sends it and the extra headers. The client gives up after 15 s,
// well before any upstream's timeout: a request that hangs fails the test.
func callDoor(t *testing.T, base, path, body string, header map[string]string) doorAnswer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if path == "/v1/messages" {
		req.Header.Set("x-api-key", reshapeKey)
		req.Header.Set("anthropic-version", "2023-06-01")
	} else {
		req.Header.Set("Authorization", "Bearer "+reshapeKey)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	client := &http.Client{Timeout: 15 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read the answer: %v", err)
	}
	out := doorAnswer{status: resp.StatusCode, header: resp.Header, body: b}
	var withMantle struct {
		Mantle json.RawMessage `json:"mantle"`
	}
	if json.Unmarshal(b, &withMantle) == nil && len(withMantle.Mantle) > 0 {
		out.quality = &mantlev1.QualityContext{}
		if err := protojson.Unmarshal(withMantle.Mantle, out.quality); err != nil {
			t.Fatalf("the answer's mantle member: %v\n%s", err, withMantle.Mantle)
		}
	}
	return out
}

// sentMessages are the messages an upstream received, as role and text.
func sentMessages(t *testing.T, body map[string]json.RawMessage) []struct{ Role, Content string } {
	t.Helper()
	var msgs []struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	if err := json.Unmarshal(body["messages"], &msgs); err != nil {
		t.Fatalf("messages the upstream received: %v\n%s", err, body["messages"])
	}
	out := make([]struct{ Role, Content string }, len(msgs))
	for i, m := range msgs {
		out[i] = struct{ Role, Content string }{m.Role, m.Content}
	}
	return out
}

// TestFastAnswerThroughTheDoors: when the route's models, fallback and smaller model all
// fail, the fast-answer model is asked with the route's short prompt in place of the
// caller's system message and max_tokens capped, through either door; the answer says
// so, and it is never cached: the same request again asks the model again. The route
// that answers with the same model in full is the control: its answer is cached.
func TestFastAnswerThroughTheDoors(t *testing.T) {
	r := startReshape(t)
	headers := map[string]string{router.HeaderBudget: "15000", router.HeaderPriority: "high"}
	for _, tt := range []struct {
		name, path, route string
		wantSystem        string
		wantMax           string
		wantLevel         mantlev1.FallbackLevel
		simplified        bool
		wantSecondCache   string
		wantCalls         int // of the quick model, over both requests
	}{
		{"chat completions: the route's model answers in full, and is cached", "/v1/chat/completions", "direct",
			callerSystem, "1000", mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY, false, "hit", 1},
		{"chat completions: every model down, the fast answer", "/v1/chat/completions", "agent",
			fastPrompt, "64", mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL, true, "miss", 2},
		{"messages: every model down, the fast answer", "/v1/messages", "agent",
			fastPrompt, "64", mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL, true, "miss", 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			question := "Where is parcel " + tt.name + "?"
			var body string
			if tt.path == "/v1/messages" {
				body = fmt.Sprintf(`{"model":%q,"system":%q,"max_tokens":1000,"temperature":0,"messages":[{"role":"user","content":%q}]}`, tt.route, callerSystem, question)
			} else {
				body = fmt.Sprintf(`{"model":%q,"max_tokens":1000,"temperature":0,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, tt.route, callerSystem, question)
			}
			before := r.quick.Count()
			for i, wantCache := range []string{"miss", tt.wantSecondCache} {
				a := callDoor(t, r.base, tt.path, body, headers)
				if a.status != http.StatusOK {
					t.Fatalf("request %d: status %d: %s", i+1, a.status, a.body)
				}
				if got := a.header.Get(router.HeaderCache); got != wantCache {
					t.Errorf("request %d: %s %q, want %q", i+1, router.HeaderCache, got, wantCache)
				}
				if got, want := a.header.Get(router.HeaderFallbackLevel), router.ShortLevel(tt.wantLevel); got != want {
					t.Errorf("request %d: %s %q, want %q", i+1, router.HeaderFallbackLevel, got, want)
				}
				if a.quality == nil {
					t.Fatalf("request %d: the answer has no mantle member: %s", i+1, a.body)
				}
				if got := a.quality.GetSimplifiedPrompt(); got != tt.simplified {
					t.Errorf("request %d: simplified_prompt %v, want %v", i+1, got, tt.simplified)
				}
				if tt.simplified && !strings.Contains(auditText(a.quality), "fast answer: quick with the route's short prompt (max_tokens 64)") {
					t.Errorf("request %d: the audit does not name the fast answer:\n%s", i+1, auditText(a.quality))
				}
				if i == 0 {
					// The second request of the control is answered from the cache: no call.
					checkFastSent(t, r.quick.Last(t), tt.wantSystem, question, tt.wantMax)
				}
			}
			if got := r.quick.Count() - before; got != tt.wantCalls {
				t.Errorf("the quick model was called %d times for the two requests, want %d", got, tt.wantCalls)
			}
		})
	}
}

// checkFastSent checks what the quick model received: one system message (wantSystem),
// the caller's question, max_tokens and the caller's temperature.
func checkFastSent(t *testing.T, sent map[string]json.RawMessage, wantSystem, question, wantMax string) {
	t.Helper()
	msgs := sentMessages(t, sent)
	if len(msgs) != 2 || msgs[0].Role != "system" || msgs[0].Content != wantSystem || msgs[1].Role != "user" || msgs[1].Content != question {
		t.Errorf("the model received messages %+v; want the system message %q and the question", msgs, wantSystem)
	}
	if got := string(sent["max_tokens"]); got != wantMax {
		t.Errorf("the model received max_tokens %s, want %s", got, wantMax)
	}
	if got := string(sent["temperature"]); got != "0" {
		t.Errorf("the model received temperature %s, want the caller's 0", got)
	}
}

func auditText(qc *mantlev1.QualityContext) string {
	var b strings.Builder
	for _, s := range qc.GetAudit() {
		fmt.Fprintf(&b, "%s/%s: %s\n", s.GetService(), s.GetStep(), s.GetDetail())
	}
	return b.String()
}

// longChat is a chat completions body for route at temperature 0 (cacheable): a system
// message and n turns, the last a user's, of about 100 tokens each.
func longChat(route string, n int) (body string, turns []string) {
	msgs := []map[string]string{{"role": "system", "content": callerSystem}}
	for i := range n {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		turn := fmt.Sprintf("turn %d: %s", i, strings.Repeat("the parcel left the depot on time ", 12))
		turns = append(turns, turn)
		msgs = append(msgs, map[string]string{"role": role, "content": turn})
	}
	b, _ := json.Marshal(map[string]any{"model": route, "messages": msgs, "max_tokens": 100, "temperature": 0})
	return string(b), turns
}

// TestContextCompressionThroughTheDoor: a conversation longer than every window of its
// route is summarised by the route's summariser and the model gets the summary and the
// latest turns; the answer says so, the summary's tokens are billed (quota settles them
// with the answer's) and the answer is not cached. Without compression the request is
// refused before any call, and a caller's budget too short to summarise in ends the
// request with an error in that budget, not a hang.
func TestContextCompressionThroughTheDoor(t *testing.T) {
	r := startReshape(t)
	const n = 31 // system + 31 turns, the last a user's: 28 summarised, 3 kept
	settled := func() float64 { return counterValue(t, r.m.Router, "mantle_quota_settled_tokens_total", nil) }

	t.Run("summarised, marked, billed and not cached", func(t *testing.T) {
		body, turns := longChat("long", n)
		for i, wantCache := range []string{"miss", "miss"} {
			sums, mains, tokens := r.sum.Count(), r.main.Count(), settled()
			a := callDoor(t, r.base, "/v1/chat/completions", body, map[string]string{router.HeaderBudget: "15000"})
			if a.status != http.StatusOK || a.quality == nil {
				t.Fatalf("request %d: status %d: %s", i+1, a.status, a.body)
			}
			if got := a.header.Get(router.HeaderCache); got != wantCache {
				t.Errorf("request %d: %s %q, want %q (an answer to a compressed conversation is never stored)", i+1, router.HeaderCache, got, wantCache)
			}
			if r.sum.Count()-sums != 1 || r.main.Count()-mains != 1 {
				t.Fatalf("request %d: the summariser was called %d times and the model %d; want once each", i+1, r.sum.Count()-sums, r.main.Count()-mains)
			}
			cc := a.quality.GetContextCompression()
			if cc.GetModel() != "sum" || cc.GetCalls() != 1 || cc.GetMessagesSummarized() != n-keptTurns {
				t.Errorf("request %d: context_compression %v; want sum's one call over %d messages", i+1, cc, n-keptTurns)
			}
			if cc.GetPromptTokensBefore() <= 1000 || cc.GetPromptTokensAfter() <= 0 || cc.GetPromptTokensAfter() >= 1000 {
				t.Errorf("request %d: prompt tokens %d before, %d after; want more than main's window of 1000 before, less after", i+1, cc.GetPromptTokensBefore(), cc.GetPromptTokensAfter())
			}
			// Each recording upstream bills 5 input and 3 output tokens a call.
			if u := cc.GetUsage(); u.GetInputTokens() != 5 || u.GetOutputTokens() != 3 {
				t.Errorf("request %d: the summary's usage %v, want 5 in and 3 out", i+1, u)
			}
			if u := a.quality.GetUsage(); u.GetInputTokens() != 10 || u.GetOutputTokens() != 6 {
				t.Errorf("request %d: the request's usage %v, want the answer's and the summary's: 10 in, 6 out", i+1, u)
			}
			if got := settled() - tokens; got != 16 {
				t.Errorf("request %d: quota settled %v tokens, want 16 (the answer's 8 and the summary's 8)", i+1, got)
			}
			if !strings.Contains(auditText(a.quality), fmt.Sprintf("%d older messages summarised by sum in 1 calls", n-keptTurns)) {
				t.Errorf("request %d: the audit does not name the compression:\n%s", i+1, auditText(a.quality))
			}
		}
		// The summariser read exactly the turns before the kept ones, under its token cap.
		sumSent := r.sum.Last(t)
		if got := string(sumSent["max_tokens"]); got != fmt.Sprint(summaryTokens) {
			t.Errorf("the summariser got max_tokens %s, want %d", got, summaryTokens)
		}
		sumMsgs := sentMessages(t, sumSent)
		if len(sumMsgs) != 2 || sumMsgs[0].Role != "system" || sumMsgs[1].Role != "user" {
			t.Fatalf("the summariser got %+v; want its prompt and the transcript", sumMsgs)
		}
		transcript := sumMsgs[1].Content
		if strings.Contains(transcript, callerSystem) || !strings.Contains(transcript, turns[0]) ||
			!strings.Contains(transcript, turns[n-keptTurns-1]) || strings.Contains(transcript, turns[n-keptTurns]) {
			t.Error("the summariser's transcript is not exactly the turns between the system message and the kept ones")
		}
		// The model got the caller's system message, the summary, and the kept turns as sent.
		mainMsgs := sentMessages(t, r.main.Last(t))
		if len(mainMsgs) != 2+keptTurns {
			t.Fatalf("the model got %d messages, want the system message, the summary and %d turns: %+v", len(mainMsgs), keptTurns, mainMsgs)
		}
		if mainMsgs[0].Role != "system" || mainMsgs[0].Content != callerSystem {
			t.Errorf("first message %+v, want the caller's system message", mainMsgs[0])
		}
		// The recording upstream's summary is its answer, "ok".
		if s := mainMsgs[1]; s.Role != "system" || !strings.Contains(s.Content, fmt.Sprintf("Summary of the %d earlier messages", n-keptTurns)) || !strings.HasSuffix(s.Content, "\nok") {
			t.Errorf("second message %+v, want the summary", s)
		}
		for i, turn := range turns[n-keptTurns:] {
			if got := mainMsgs[2+i].Content; got != turn {
				t.Errorf("kept message %d is %.40q, want %.40q", i, got, turn)
			}
		}
	})

	t.Run("no compression configured: refused before any call", func(t *testing.T) {
		body, _ := longChat("long-plain", n)
		mains := r.main.Count()
		a := callDoor(t, r.base, "/v1/chat/completions", body, nil)
		if a.status != http.StatusBadRequest || !strings.Contains(string(a.body), "context_window") {
			t.Errorf("status %d: %s; want 400 naming context_window", a.status, a.body)
		}
		if got := r.main.Count() - mains; got != 0 {
			t.Errorf("the model was called %d times", got)
		}
	})

	t.Run("a budget too short to summarise in: an error in time, not a hang", func(t *testing.T) {
		body, _ := longChat("long-slow", n)
		mains := r.main.Count()
		start := time.Now()
		a := callDoor(t, r.base, "/v1/chat/completions", body, map[string]string{router.HeaderBudget: "1000"})
		elapsed := time.Since(start)
		select {
		case <-r.hang.started:
		default:
			t.Fatal("the summariser was never asked")
		}
		// A deadline, not the refusal of a conversation too long for any request: a longer
		// budget may succeed.
		code, msg, _ := openAIErrorOf(t, &http.Response{StatusCode: a.status, Body: io.NopCloser(strings.NewReader(string(a.body)))})
		if a.status != http.StatusGatewayTimeout || code != "deadline_exceeded" ||
			!strings.Contains(msg, "budget ran out: summarising the conversation") {
			t.Errorf("status %d, code %q, message %q; want 504 deadline_exceeded saying the summary did not finish in the budget", a.status, code, msg)
		}
		// The caller's one second, not the provider's minute nor the route's 20 s.
		if elapsed > 10*time.Second {
			t.Errorf("the error took %s", elapsed)
		}
		if got := r.main.Count() - mains; got != 0 {
			t.Errorf("the model was called %d times on the uncompressed conversation", got)
		}
		if a.quality == nil || a.quality.GetContextCompression().GetCalls() != 1 {
			t.Errorf("the failed request's mantle member does not record the summarising call: %s", a.body)
		}
	})
}
