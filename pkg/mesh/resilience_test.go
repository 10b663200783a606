package mesh_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"github.com/nats-io/nats.go"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/pkg/sim"
	"github.com/mantle-mesh/mantle/services/router"
)

// These tests send requests through the real HTTP front door of a whole mesh to simulated
// providers that fail in one way each, and check what the caller sees and what the router
// recorded. Every fault has probability 1 (or a fixed script) and the sims are seeded, so
// each run takes the same path.

const resilienceKey = "sk-resilience-test"

// faultProfiles are the sim profiles of the faults under test. The zero profile answers at
// once and never fails, so each says only its fault.
func faultProfiles() map[string]sim.Profile {
	fixed := func(d time.Duration) sim.Latency { return sim.Latency{P50: d, P95: d, P99: d} }
	return map[string]sim.Profile{
		"instant":          {},
		"429-once":         {Script: []sim.Outcome{sim.OutcomeRateLimited}, RetryAfter: 100 * time.Millisecond},
		"429-long-hint":    {Errors: sim.ErrorMix{RateLimited: 1}, RetryAfter: 5 * time.Second},
		"429-no-hint":      {Errors: sim.ErrorMix{RateLimitedNoHint: 1}},
		"500-once":         {Script: []sim.Outcome{sim.OutcomeServerError}},
		"503":              {Errors: sim.ErrorMix{Overloaded: 1}},
		"reset":            {Errors: sim.ErrorMix{Reset: 1}},
		"hang":             {Errors: sim.ErrorMix{Hang: 1}},
		"slow-first-token": {TTFT: fixed(10 * time.Second)},
		"stream-cut":       {Errors: sim.ErrorMix{StreamCut: 1}},
		"stream-stall":     {Errors: sim.ErrorMix{StreamStall: 1}},
		"malformed-chunk":  {Errors: sim.ErrorMix{MalformedJSON: 1}},
		"no-done":          {Errors: sim.ErrorMix{StreamNoDone: 1}},
		"context-length":   {Errors: sim.ErrorMix{ContextLengthExceeded: 1}},
		"content-filter":   {Errors: sim.ErrorMix{ContentFilter: 1}},
		"filtered-answer":  {Errors: sim.ErrorMix{ContentFilterFinish: 1}},
		"malformed-json":   {Errors: sim.ErrorMix{MalformedJSON: 1}},
	}
}

// resilienceConfig has one route per fault: "r-<profile>" over a model with that profile,
// then "backup" (healthy, format-stable, a 4k context window), then "large" (healthy, a
// 128k window). Provider calls time out after 300 ms; streams get 200 ms to their first
// token and between chunks. The retry budget is out of the way (its decisions are the
// router package's tests): these tests share one mesh.
func resilienceConfig() mesh.Config {
	cfg := mesh.Default()
	cfg.Auth.Tenants = []rpc.TenantKey{{ID: "acme", KeySHA256: rpc.HashKey(resilienceKey)}}
	r := &cfg.Router
	r.SimProfiles = faultProfiles()
	r.Providers = []router.ProviderConfig{{Name: "sim", Type: router.ProviderSim, Timeout: 300 * time.Millisecond, SimProfile: "instant", SimSeed: 7}}
	r.Retry = router.RetryConfig{MaxRetries: 2, BackoffBase: 10 * time.Millisecond, BackoffCap: 50 * time.Millisecond, MaxRetryAfter: time.Second}
	r.RetryBudget = router.BudgetConfig{Ratio: 1, Floor: 1000, Window: time.Minute, FormatOnlyAbove: 1}
	// Every request here fails over on purpose; the shared budget in quota must allow it too.
	cfg.Quota.RetryBudget.Ratio, cfg.Quota.RetryBudget.Floor, cfg.Quota.RetryBudget.FormatOnlyAbove = 1, 1000, 1
	r.FirstTokenTimeout, r.StallTimeout = 200*time.Millisecond, 200*time.Millisecond
	r.Models = []router.ModelConfig{
		{Name: "backup", Provider: "sim", ContextWindow: 4000, FormatStability: 0.9, InputPricePerMillion: 1, OutputPricePerMillion: 1},
		{Name: "large", Provider: "sim", ContextWindow: 128000},
	}
	for _, name := range slices.Sorted(maps.Keys(r.SimProfiles)) {
		if name == "instant" {
			continue
		}
		r.Models = append(r.Models, router.ModelConfig{Name: name, Provider: "sim", SimProfile: name, ContextWindow: 4000,
			FormatStability: 0.5, InputPricePerMillion: 2, OutputPricePerMillion: 2})
		candidates := []string{name, "backup", "large"}
		if strings.HasPrefix(name, "content-filter") || strings.HasPrefix(name, "filtered") {
			// A fallback of its own, so DescribeRoutes can tell it was never called.
			r.Models = append(r.Models, router.ModelConfig{Name: name + "-fallback", Provider: "sim"})
			candidates = []string{name, name + "-fallback"}
		}
		r.Routes = append(r.Routes, router.RouteConfig{Name: "r-" + name, Scenario: name, Candidates: candidates})
	}
	// A stream cut mid-answer, with a fallback that accepts a prefill behind one that does not.
	r.Models = append(r.Models,
		router.ModelConfig{Name: "cut-mid-answer", Provider: "sim", SimProfile: "stream-cut"},
		router.ModelConfig{Name: "continuer", Provider: "sim", AcceptsPrefill: true})
	r.Routes = append(r.Routes, router.RouteConfig{Name: "r-continued", Scenario: "continued", Candidates: []string{"cut-mid-answer", "backup", "continuer"}})
	// A stream cut mid-answer whose only fallback says something else: no splice.
	r.SimProfiles["other-voice"] = sim.Profile{Opening: "another answer to: "}
	r.Models = append(r.Models, router.ModelConfig{Name: "other-voice", Provider: "sim", SimProfile: "other-voice"})
	r.Routes = append(r.Routes, router.RouteConfig{Name: "r-diverged", Scenario: "diverged", Candidates: []string{"cut-mid-answer", "other-voice"}})
	return cfg
}

// chatResult is what the caller got, unary or streamed.
type chatResult struct {
	status   int
	model    string
	content  string
	finish   []string // finish reasons seen (a stream may carry several chunks)
	usage    *mantlev1.Usage
	quality  *mantlev1.QualityContext
	errCode  string // OpenAI error code, from the body or from a stream's error event
	errMsg   string
	done     bool // a stream ended with [DONE]
	fallback string
}

func (r chatResult) attempts() []string {
	var out []string
	for _, a := range r.quality.GetAttempts() {
		out = append(out, a.Model+":"+strings.ToLower(strings.TrimPrefix(a.ErrorClass.String(), "ERROR_CLASS_")))
	}
	return out
}

func chat(t *testing.T, addr, route, question string, stream, jsonMode bool) chatResult {
	t.Helper()
	return chatRequest(t, addr, route, question, stream, jsonMode, nil)
}

// chatWith is chat for a unary request, passing the answer's headers to onHeader.
func chatWith(t *testing.T, addr, route, question string, onHeader func(http.Header)) chatResult {
	t.Helper()
	return chatRequest(t, addr, route, question, false, false, onHeader)
}

func chatRequest(t *testing.T, addr, route, question string, stream, jsonMode bool, onHeader func(http.Header)) chatResult {
	t.Helper()
	body := map[string]any{"model": route, "messages": []map[string]string{{"role": "user", "content": question}}}
	if stream {
		body["stream"] = true
		body["stream_options"] = map[string]bool{"include_usage": true}
	}
	if jsonMode {
		body["response_format"] = map[string]string{"type": "json_object"}
	}
	b, _ := json.Marshal(body)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a hang fails, not blocks
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+resilienceKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", route, err)
	}
	defer resp.Body.Close()
	if onHeader != nil {
		onHeader(resp.Header)
	}
	out := chatResult{status: resp.StatusCode, fallback: resp.Header.Get(router.HeaderFallbackLevel)}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		readStream(t, resp.Body, &out)
		return out
	}
	var v completionBody
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatalf("%s: decode: %v", route, err)
	}
	v.apply(t, &out)
	return out
}

// completionBody is a chat completion, a stream chunk or an error, as JSON.
type completionBody struct {
	Model   string `json:"model"`
	Choices []struct {
		Message      struct{ Content string } `json:"message"`
		Delta        struct{ Content string } `json:"delta"`
		FinishReason *string                  `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
		TotalTokens      int64 `json:"total_tokens"`
	} `json:"usage"`
	Mantle json.RawMessage `json:"mantle"`
	Error  *struct {
		Message string `json:"message"`
		Code    string `json:"code"`
	} `json:"error"`
}

func (v completionBody) apply(t *testing.T, out *chatResult) {
	t.Helper()
	if v.Model != "" {
		out.model = v.Model
	}
	for _, c := range v.Choices {
		out.content += c.Message.Content + c.Delta.Content
		if c.FinishReason != nil {
			out.finish = append(out.finish, *c.FinishReason)
		}
	}
	if u := v.Usage; u != nil {
		out.usage = &mantlev1.Usage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
	}
	if len(v.Mantle) > 0 {
		out.quality = &mantlev1.QualityContext{}
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(v.Mantle, out.quality); err != nil {
			t.Fatalf("mantle field: %v", err)
		}
	}
	if v.Error != nil {
		out.errCode, out.errMsg = v.Error.Code, v.Error.Message
	}
}

func readStream(t *testing.T, body io.Reader, out *chatResult) {
	t.Helper()
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			out.done = true
			continue
		}
		var v completionBody
		if err := json.Unmarshal([]byte(data), &v); err != nil {
			t.Fatalf("stream chunk %q: %v", data, err)
		}
		v.apply(t, out)
	}
}

// TestResilienceOverHTTP: one fault per route, through the real HTTP path to the sim.
func TestResilienceOverHTTP(t *testing.T) {
	t.Parallel()
	m := meshtest.Start(t, resilienceConfig(), meshtest.All)
	const question = resilienceQuestion

	tests := []struct {
		name     string
		route    string
		stream   bool
		json     bool
		status   int
		model    string   // who answered (empty on errors)
		attempts []string // model:class, from the QualityContext
		errCode  string
		check    func(t *testing.T, r chatResult)
	}{
		{
			name: "429 with Retry-After that fits: wait for it, then the same model", route: "r-429-once",
			status: 200, model: "429-once", attempts: []string{"429-once:rate_limited", "429-once:none"},
			check: func(t *testing.T, r chatResult) {
				a := r.quality.Attempts
				if gap := a[1].StartedAt.AsTime().Sub(a[0].StartedAt.AsTime()); gap < 100*time.Millisecond {
					t.Errorf("retried after %s, before the 100ms Retry-After", gap)
				}
			},
		},
		{
			name: "429 whose Retry-After is too long: fail over", route: "r-429-long-hint",
			status: 200, model: "backup", attempts: []string{"429-long-hint:rate_limited", "backup:none"},
		},
		{
			name: "429 without Retry-After: fail over", route: "r-429-no-hint",
			status: 200, model: "backup", attempts: []string{"429-no-hint:rate_limited", "backup:none"},
		},
		{
			name: "500 once: retried on the same model", route: "r-500-once",
			status: 200, model: "500-once", attempts: []string{"500-once:transient", "500-once:none"},
		},
		{
			name: "503 persistent: fail over at once", route: "r-503",
			status: 200, model: "backup", attempts: []string{"503:overloaded", "backup:none"},
			check: func(t *testing.T, r chatResult) {
				if r.fallback != "backup_model" || r.quality.FallbackLevel != mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL {
					t.Errorf("fallback header %q level %v, want backup_model", r.fallback, r.quality.FallbackLevel)
				}
			},
		},
		{
			name: "reset before headers: retried with backoff, then fail over", route: "r-reset",
			status: 200, model: "backup", attempts: []string{"reset:transient", "reset:transient", "reset:transient", "backup:none"},
		},
		{
			name: "no response: the per-try timeout, then fail over", route: "r-hang",
			status: 200, model: "backup", attempts: []string{"hang:timeout", "backup:none"},
			check: func(t *testing.T, r chatResult) {
				// It waited for the 300ms per-try timeout, and no more: the 30s budget was
				// never at stake.
				if d := r.quality.Attempts[0].Latency.AsDuration(); d < 250*time.Millisecond || d > 10*time.Second {
					t.Errorf("the silent attempt took %s, want about the 300ms per-try timeout", d)
				}
			},
		},
		{
			name: "slow first token: the stream is cancelled and the next model streams", route: "r-slow-first-token", stream: true,
			status: 200, model: "backup", attempts: []string{"slow-first-token:timeout", "backup:none"},
			check: func(t *testing.T, r chatResult) {
				if !r.done || !strings.HasPrefix(r.content, "sim answer to: ") || !strings.Contains(strings.Join(r.finish, ","), "stop") {
					t.Errorf("stream: content %q finish %v done %t, want backup's whole answer", r.content, r.finish, r.done)
				}
			},
		},
		{
			name: "stream cut after the first token: no fallback accepts a prefill, backup restarts and is spliced", route: "r-stream-cut", stream: true,
			status: 200, model: "backup", attempts: []string{"stream-cut:truncated", "backup:none"},
			check: wantSplicedStream,
		},
		{
			name: "stream cut after the first token: a prefill-capable fallback finishes the answer", route: "r-continued", stream: true,
			status: 200, model: "continuer", attempts: []string{"cut-mid-answer:truncated", "continuer:none"},
			check: func(t *testing.T, r chatResult) {
				if r.content != "sim answer to: "+question || strings.Join(r.finish, ",") != "stop" || !r.done {
					t.Errorf("content %q finish %v done %t, want one complete answer", r.content, r.finish, r.done)
				}
			},
		},
		{
			name: "stream stall after the first token: cancelled, backup restarts and is spliced", route: "r-stream-stall", stream: true,
			status: 200, model: "backup", attempts: []string{"stream-stall:timeout", "backup:none"},
			check: wantSplicedStream,
		},
		{
			name: "malformed chunk mid-stream: backup restarts and is spliced", route: "r-malformed-chunk", stream: true,
			status: 200, model: "backup", attempts: []string{"malformed-chunk:malformed_output", "backup:none"},
			check: wantSplicedStream,
		},
		{
			name: "stream cut after the first token, and the only fallback says something else: an error, never a stop", route: "r-diverged", stream: true,
			status: 200, errCode: "all_candidates_failed",
			check: func(t *testing.T, r chatResult) {
				wantCutStream(t, r)
				if !strings.Contains(r.errMsg, "diverged") || strings.Contains(r.content, "another answer") {
					t.Errorf("content %q error %q, want the divergence named and none of the other answer", r.content, r.errMsg)
				}
			},
		},
		{
			name: "stream without [DONE] after its finish reason: a complete answer", route: "r-no-done", stream: true,
			status: 200, model: "no-done", attempts: []string{"no-done:none"},
			check: func(t *testing.T, r chatResult) {
				if !strings.HasPrefix(r.content, "sim answer to: ") || !strings.Contains(strings.Join(r.finish, ","), "stop") || !r.done {
					t.Errorf("content %q finish %v done %t, want the whole answer, ended properly by mantle", r.content, r.finish, r.done)
				}
			},
		},
		{
			name: "context length exceeded: only a larger context window", route: "r-context-length",
			status: 200, model: "large", attempts: []string{"context-length:context_length_exceeded", "large:none"},
		},
		{
			name: "content filter on the prompt: no retry, the provider's reason", route: "r-content-filter",
			status: 400, errCode: "content_filtered",
			check: func(t *testing.T, r chatResult) {
				if r.errMsg != "Your request was rejected as a result of our safety system." {
					t.Errorf("message = %q, want the provider's reason", r.errMsg)
				}
				wantCalls(t, m, "r-content-filter", map[string]int64{"content-filter": 1, "content-filter-fallback": 0})
			},
		},
		{
			name: "content filter on the answer (finish_reason content_filter): no retry", route: "r-filtered-answer",
			status: 400, errCode: "content_filtered",
			check: func(t *testing.T, r chatResult) {
				if !strings.Contains(r.errMsg, "content_filter") {
					t.Errorf("message = %q, want the filter named", r.errMsg)
				}
				wantCalls(t, m, "r-filtered-answer", map[string]int64{"filtered-answer": 1, "filtered-answer-fallback": 0})
			},
		},
		{
			name:  "accounting: the answer's model and usage; the failed attempt listed, not billed as the completion",
			route: "r-malformed-json", json: true,
			status: 200, model: "backup", attempts: []string{"malformed-json:malformed_output", "backup:none"},
			check: func(t *testing.T, r chatResult) {
				a := r.quality.Attempts
				if a[0].Usage.GetOutputTokens() == 0 {
					t.Fatalf("the failed attempt reports no usage; the test needs one that generated tokens")
				}
				if !proto.Equal(r.usage, a[1].Usage) {
					t.Errorf("response usage %v, want the answering attempt's %v (not the failed one's %v)", r.usage, a[1].Usage, a[0].Usage)
				}
				if r.quality.CurrentModel != "backup" || r.quality.Usage.GetTotalTokens() != a[0].Usage.GetTotalTokens()+a[1].Usage.GetTotalTokens() {
					t.Errorf("quality: model %q usage %v, want backup and the tokens of every attempt", r.quality.CurrentModel, r.quality.Usage)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := chat(t, m.HTTPAddr, tt.route, question, tt.stream, tt.json)
			if r.status != tt.status || r.errCode != tt.errCode {
				t.Fatalf("status %d error %q (%s), want %d %q", r.status, r.errCode, r.errMsg, tt.status, tt.errCode)
			}
			if tt.model != "" {
				if r.model != tt.model || r.quality.GetCurrentModel() != tt.model {
					t.Errorf("answered by %q (quality says %q), want %q", r.model, r.quality.GetCurrentModel(), tt.model)
				}
				if got := strings.Join(r.attempts(), " "); got != strings.Join(tt.attempts, " ") {
					t.Errorf("attempts %s, want %s", got, strings.Join(tt.attempts, " "))
				}
			}
			if tt.check != nil {
				tt.check(t, r)
			}
		})
	}
}

const resilienceQuestion = "Explain circuit breakers in one line please"

// wantSplicedStream: the answer broke mid-way and a fallback's restart finished it; the
// caller has the answer once, whole, ended properly.
func wantSplicedStream(t *testing.T, r chatResult) {
	t.Helper()
	if r.content != "sim answer to: "+resilienceQuestion || strings.Join(r.finish, ",") != "stop" || !r.done {
		t.Errorf("content %q finish %v done %t, want one complete answer, nothing repeated", r.content, r.finish, r.done)
	}
	if !strings.Contains(r.quality.GetDegradationReason(), "restarted and finished it") {
		t.Errorf("degradation reason %q, want the restart named", r.quality.GetDegradationReason())
	}
}

// wantCutStream: part of the answer reached the caller, then an error event; no
// finish_reason stop, no [DONE], nothing that looks like a complete answer.
func wantCutStream(t *testing.T, r chatResult) {
	t.Helper()
	if r.content == "" || strings.HasSuffix(r.content, "line please") {
		t.Errorf("content %q, want part of the answer", r.content)
	}
	if len(r.finish) != 0 || r.done || r.quality != nil {
		t.Errorf("finish %v done %t final quality %v: a cut stream must not end like a complete one", r.finish, r.done, r.quality != nil)
	}
}

// wantCalls checks the calls DescribeRoutes counts per candidate of route.
func wantCalls(t *testing.T, m *meshtest.Mesh, route string, want map[string]int64) {
	t.Helper()
	client := routerv1.NewRouterServiceClient(meshtest.Dial(t, m.GRPCAddr))
	ctx := authed(meshtest.OperatorKey)
	resp, err := client.DescribeRoutes(ctx, &routerv1.DescribeRoutesRequest{Route: route})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, c := range resp.Routes[0].Candidates {
		got[c.Model] = c.Keys[0].Calls
	}
	if !maps.Equal(got, want) {
		t.Errorf("calls per candidate of %s = %v, want %v", route, got, want)
	}
}

// TestPrimaryDownThenRecovers: a primary that answers 503 for its first minute. The
// fallback serves meanwhile; the breaker opens and the primary is not called while open; a
// probe after the open period fails while the outage lasts and re-opens it for twice as
// long; a scout (one call per scout interval, here the 30 s open duration), sent beside the
// request that drew it while the backup answers that request, finds the primary back
// before that longer period ends and closes it, and the primary answers again. The sim
// and the router share a fake clock, so the minute passes in no time.
func TestPrimaryDownThenRecovers(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClockAt(time.Now())
	cfg := resilienceConfig()
	r := &cfg.Router
	r.SimProfiles["outage"] = sim.Profile{Phases: []sim.Phase{
		{Name: "down", Start: 0, Duration: time.Minute, Errors: &sim.ErrorMix{Overloaded: 1}},
		{Name: "up", Start: time.Minute},
	}}
	r.Models = append(r.Models, router.ModelConfig{Name: "primary", Provider: "sim", SimProfile: "outage"})
	r.Routes = []router.RouteConfig{{Name: "chat", Scenario: "chat", Candidates: []string{"primary", "backup"}}}
	r.Breaker.ConsecutiveFailures = 2
	r.Breaker.OpenDuration = 30 * time.Second
	r.Breaker.OpenJitter = 0
	r.Breaker.HalfOpenProbes = 1
	m := meshtest.StartWith(t, cfg, meshtest.All, mesh.Options{Clock: clock})
	transitions := subscribe(t, m.NATSURL, events.SubjectBreaker)
	client := routerv1.NewRouterServiceClient(meshtest.Dial(t, m.GRPCAddr))

	steps := []struct {
		name     string
		advance  time.Duration // before the request
		model    string
		attempts string
		state    mantlev1.BreakerState // the primary's breaker after the request
		// scout: a side scout went out; the test waits for its verdict (the breaker
		// closing, on NATS) before it checks the state.
		scout bool
	}{
		{"down: the fallback answers", 0, "backup", "primary:overloaded backup:none", mantlev1.BreakerState_BREAKER_STATE_CLOSED, false},
		{"down again: the breaker opens", 0, "backup", "primary:overloaded backup:none", mantlev1.BreakerState_BREAKER_STATE_OPEN, false},
		{"open: the primary is not called", 0, "backup", "backup:none", mantlev1.BreakerState_BREAKER_STATE_OPEN, false},
		{"after 31s a probe: still down, open again for 60s", 31 * time.Second, "backup", "primary:overloaded backup:none", mantlev1.BreakerState_BREAKER_STATE_OPEN, false},
		{"30s into the 60s the outage is over: a scout beside the request finds the primary back", 31 * time.Second, "backup", "backup:none", mantlev1.BreakerState_BREAKER_STATE_CLOSED, true},
		{"back on the primary", 30 * time.Second, "primary", "primary:none", mantlev1.BreakerState_BREAKER_STATE_CLOSED, false},
		{"and it stays there", 0, "primary", "primary:none", mantlev1.BreakerState_BREAKER_STATE_CLOSED, false},
	}
	want := []string{
		"closed->open (2 consecutive failures)",
		"open->half_open (open period elapsed)",
		"half_open->open (probe failed)",
		"open->half_open (scout succeeded)",
		"half_open->closed (probes succeeded)",
	}
	var got []string // the transitions read so far
	closed := func() bool { return len(got) > 0 && strings.HasPrefix(got[len(got)-1], "half_open->closed") }
	for i, st := range steps {
		clock.Advance(st.advance)
		// A new question each time: a cached answer would not reach the providers.
		res := chat(t, m.HTTPAddr, "chat", fmt.Sprintf("question %d about breakers", i), false, false)
		if res.status != http.StatusOK || res.model != st.model || strings.Join(res.attempts(), " ") != st.attempts {
			t.Errorf("%s: status %d answered by %q after %v, want 200 from %s after %s", st.name, res.status, res.model, res.attempts(), st.model, st.attempts)
		}
		for st.scout && !closed() {
			got = append(got, nextTransition(t, transitions))
		}
		resp, err := client.DescribeRoutes(authed(meshtest.OperatorKey), &routerv1.DescribeRoutesRequest{Route: "chat"})
		if err != nil {
			t.Fatal(err)
		}
		if k := resp.Routes[0].Candidates[0].Keys[0]; k.BreakerState != st.state {
			t.Errorf("%s: primary breaker %v (%s), want %v", st.name, k.BreakerState, k.BreakerReason, st.state)
		}
	}

	for len(got) < len(want) {
		got = append(got, nextTransition(t, transitions))
	}
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Errorf("breaker events:\n got %s\nwant %s", strings.Join(got, "; "), strings.Join(want, "; "))
	}
}

// nextTransition reads the next breaker transition of the primary on chat from sub, as
// "from->to (reason)".
func nextTransition(t *testing.T, sub *nats.Subscription) string {
	t.Helper()
	msg, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("no breaker event: %v", err)
	}
	var ev eventsv1.BreakerTransitionEvent
	if err := proto.Unmarshal(msg.Data, &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Model != "primary" || ev.Scenario != "chat" {
		t.Errorf("event for %s/%s, want primary/chat", ev.Model, ev.Scenario)
	}
	return fmt.Sprintf("%s->%s (%s)", short(ev.From), short(ev.To), ev.Reason)
}

func short(s mantlev1.BreakerState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "BREAKER_STATE_"))
}
