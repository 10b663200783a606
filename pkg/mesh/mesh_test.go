package mesh_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/quota"
	"github.com/mantle-mesh/mantle/services/router"
)

const (
	acmeKey  = "sk-acme-test"
	tightKey = "sk-tight-test"
)

// testConfig has instant simulated models: "primary" and "backup" answer, "broken" always
// fails with 503, and route "chat" tries broken first so that fallback is exercised.
func testConfig() mesh.Config {
	cfg := mesh.Default()
	cfg.Auth.Tenants = []rpc.TenantKey{
		{ID: "acme", KeySHA256: rpc.HashKey(acmeKey)},
		{ID: "tight", KeySHA256: rpc.HashKey(tightKey)},
	}
	cfg.Auth.Operators = []rpc.TenantKey{{ID: "ops", KeySHA256: rpc.HashKey(meshtest.OperatorKey)}}
	cfg.Quota.Tenants = map[string]quota.RateLimits{"tight": {RPM: 2, TPM: 100000}}
	// Short enough that a request over tight's RPM is refused at once rather than queued
	// until the bucket refills (which takes longer than the budget).
	cfg.Router.DefaultBudget = 10 * time.Second
	cfg.Router.Providers = []router.ProviderConfig{{Name: "sim", Type: router.ProviderSim, Timeout: 5 * time.Second, SimProfile: "fast", SimSeed: 7}}
	cfg.Router.Models = []router.ModelConfig{
		{Name: "primary", Provider: "sim", InputPricePerMillion: 1, OutputPricePerMillion: 2},
		{Name: "backup", Provider: "sim"},
		{Name: "broken", Provider: "sim", SimProfile: "down"},
	}
	cfg.Router.Routes = []router.RouteConfig{{Name: "chat", Scenario: "chat", Candidates: []string{"broken", "backup"}}}
	return cfg
}

func TestMesh(t *testing.T) {
	for _, mode := range []meshtest.Mode{meshtest.All, meshtest.Split} {
		t.Run(string(mode), func(t *testing.T) {
			m := meshtest.Start(t, testConfig(), mode)
			client := routerv1.NewRouterServiceClient(meshtest.Dial(t, m.GRPCAddr))
			t.Run("grpc", func(t *testing.T) { testGRPC(t, m, client) })
			t.Run("http", func(t *testing.T) { testHTTP(t, m) })
			t.Run("bad input", func(t *testing.T) { testBadInput(t, m, client) })
		})
	}
}

func authed(key string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+key)
}

func ask(model, question string) *routerv1.Request {
	return &routerv1.Request{Model: model, Messages: []*mantlev1.ChatMessage{{Role: "user", Content: question}}}
}

func testGRPC(t *testing.T, m *meshtest.Mesh, client routerv1.RouterServiceClient) {
	ctx := authed(acmeKey)

	t.Run("complete passes every service", func(t *testing.T) {
		resp, err := client.Complete(ctx, &routerv1.CompleteRequest{Request: ask("primary", "What is a circuit breaker?")})
		if err != nil {
			t.Fatalf("Complete: %v", err)
		}
		qc := resp.Quality
		if !strings.Contains(resp.Message.Content, "What is a circuit breaker?") {
			t.Errorf("content = %q, want the sim's answer to the question", resp.Message.Content)
		}
		if resp.Model != "primary" || qc.Tenant != "acme" || qc.FallbackLevel != mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY {
			t.Errorf("model=%s tenant=%s level=%s, want primary acme PRIMARY", resp.Model, qc.Tenant, qc.FallbackLevel)
		}
		if !qc.GetVerification().GetL1Passed() || qc.QualityGrade != mantlev1.QualityGrade_QUALITY_GRADE_HIGH {
			t.Errorf("verification = %v grade %s, want passed and HIGH", qc.Verification, qc.QualityGrade)
		}
		if qc.Usage.GetTotalTokens() == 0 || qc.CostUsd <= 0 || resp.RateLimit.GetLimitRequests() == 0 {
			t.Errorf("usage %v cost %v rate limit %v: want all reported", qc.Usage, qc.CostUsd, resp.RateLimit)
		}
		var services []string
		for _, s := range qc.Audit {
			services = append(services, s.Service)
		}
		for _, want := range []string{"router", "quota", "cache", "verifier"} {
			if !slices.Contains(services, want) {
				t.Errorf("audit trail services %v: missing %s", services, want)
			}
		}
	})

	t.Run("repeat is served from cache", func(t *testing.T) {
		q := ask("primary", "How do retries amplify load?")
		// Only low-temperature answers are cached; unset means the provider's default (1).
		q.Temperature = proto.Float64(0)
		first, err := client.Complete(ctx, &routerv1.CompleteRequest{Request: q})
		if err != nil {
			t.Fatalf("first Complete: %v", err)
		}
		resp, err := client.Complete(ctx, &routerv1.CompleteRequest{Request: q})
		if err != nil {
			t.Fatalf("second Complete: %v", err)
		}
		if !resp.Quality.CacheHit || len(resp.Quality.Attempts) != 0 {
			t.Errorf("cache hit %v with %d attempts, want a hit with no provider call\nfirst's audit: %v\nsecond's audit: %v",
				resp.Quality.CacheHit, len(resp.Quality.Attempts), first.Quality.GetAudit(), resp.Quality.GetAudit())
		}
		other, err := client.Complete(authed(tightKey), &routerv1.CompleteRequest{Request: q})
		if err != nil {
			t.Fatalf("other tenant: %v", err)
		}
		if other.Quality.CacheHit {
			t.Error("another tenant got acme's cached answer")
		}
	})

	t.Run("fallback publishes a degradation event", func(t *testing.T) {
		sub := subscribe(t, m.NATSURL, events.SubjectDegradation)
		resp, err := client.Complete(ctx, &routerv1.CompleteRequest{Request: ask("chat", "Is the primary down?")})
		if err != nil {
			t.Fatalf("Complete: %v", err)
		}
		qc := resp.Quality
		if resp.Model != "backup" || qc.FallbackLevel != mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL {
			t.Fatalf("answered by %s at %s, want backup at BACKUP_MODEL", resp.Model, qc.FallbackLevel)
		}
		if len(qc.Attempts) != 2 || qc.Attempts[0].ErrorClass != mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED {
			t.Errorf("attempts = %v, want broken (OVERLOADED) then backup", qc.Attempts)
		}
		var ev eventsv1.DegradationEvent
		for {
			msg, err := sub.NextMsg(10 * time.Second)
			if err != nil {
				t.Fatalf("no degradation event: %v", err)
			}
			if err := proto.Unmarshal(msg.Data, &ev); err != nil {
				t.Fatalf("decode event: %v", err)
			}
			if ev.RequestId == qc.RequestId {
				break
			}
		}
		if ev.AnsweredBy != "backup" || ev.Tenant != "acme" || !slices.Equal(ev.FailedModels, []string{"broken"}) {
			t.Errorf("event = %v, want answered by backup for acme after broken failed", &ev)
		}
	})

	t.Run("stream ends with the quality context", func(t *testing.T) {
		s, err := client.StreamComplete(ctx, &routerv1.StreamCompleteRequest{Request: ask("primary", "Stream me an answer about hedging")})
		if err != nil {
			t.Fatalf("StreamComplete: %v", err)
		}
		var text strings.Builder
		var final *routerv1.CompleteResponse
		for {
			msg, err := s.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("Recv: %v", err)
			}
			text.WriteString(msg.GetDelta().GetContent())
			if f := msg.GetFinal(); f != nil {
				final = f
			}
		}
		if final == nil || final.Quality.GetRequestId() == "" {
			t.Fatalf("no final message with a QualityContext")
		}
		if text.String() == "" || !strings.Contains(text.String(), "hedging") {
			t.Errorf("streamed %q, want the answer", text.String())
		}
		if final.Quality.Attempts[0].GetTtft() == nil {
			t.Error("streamed attempt has no time to first token")
		}
	})

	t.Run("describe routes", func(t *testing.T) {
		resp, err := client.DescribeRoutes(authed(meshtest.OperatorKey), &routerv1.DescribeRoutesRequest{Route: "chat"})
		if err != nil {
			t.Fatalf("DescribeRoutes: %v", err)
		}
		if len(resp.Routes) != 1 || len(resp.Routes[0].Candidates) != 2 || resp.Routes[0].Candidates[0].Keys[0].Calls == 0 {
			t.Errorf("routes = %v, want chat with two candidates and live call counts", resp.Routes)
		}
	})

	t.Run("quota exhaustion", func(t *testing.T) {
		tight := authed(tightKey)
		var err error
		for i := 0; i < 3 && err == nil; i++ {
			_, err = client.Complete(tight, &routerv1.CompleteRequest{Request: ask("primary", "quota question")})
		}
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("third request: %v, want RESOURCE_EXHAUSTED", err)
		}
		if d, ok := rpc.RetryDelay(err); !ok || d <= 0 {
			t.Errorf("retry delay %v %v, want a positive RetryInfo", d, ok)
		}
	})
}

func subscribe(t *testing.T, url, subject string) *nats.Subscription {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("nats: %v", err)
	}
	t.Cleanup(nc.Close)
	sub, err := nc.SubscribeSync(subject)
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	return sub
}

func post(t *testing.T, m *meshtest.Mesh, key string, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+m.HTTPAddr+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

var serverTiming = regexp.MustCompile(`^mantle;dur=\d+\.\d{3}, upstream;dur=\d+\.\d{3}$`)

func testHTTP(t *testing.T, m *meshtest.Mesh) {
	t.Run("chat completion", func(t *testing.T) {
		resp := post(t, m, acmeKey, `{"model":"chat","messages":[{"role":"user","content":"hello over http"}],"max_tokens":64}`)
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		var body struct {
			Model   string `json:"model"`
			Object  string `json:"object"`
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage struct {
				TotalTokens int `json:"total_tokens"`
			} `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatalf("decode: %v", err)
		}
		if body.Object != "chat.completion" || body.Model != "backup" || len(body.Choices) != 1 || body.Usage.TotalTokens == 0 {
			t.Errorf("body = %+v, want one choice from backup with usage", body)
		}
		for header, want := range map[string]string{
			router.HeaderFallbackLevel: "backup_model",
			router.HeaderCache:         "miss",
			router.HeaderQuality:       "high",
		} {
			if got := resp.Header.Get(header); got != want {
				t.Errorf("%s = %q, want %q", header, got, want)
			}
		}
		for _, h := range []string{router.HeaderRequestID, "x-ratelimit-remaining-requests", "x-ratelimit-remaining-tokens"} {
			if resp.Header.Get(h) == "" {
				t.Errorf("missing header %s", h)
			}
		}
		// The primary failed and the backup answered: both took provider time.
		var own, upstream float64
		if st := resp.Header.Get(router.HeaderServerTiming); !serverTiming.MatchString(st) {
			t.Errorf("%s = %q, want mantle;dur=<ms>, upstream;dur=<ms>", router.HeaderServerTiming, st)
		} else if _, err := fmt.Sscanf(st, "mantle;dur=%g, upstream;dur=%g", &own, &upstream); err != nil || own <= 0 || upstream <= 0 {
			t.Errorf("%s = %q: want both durations positive (%v)", router.HeaderServerTiming, st, err)
		}
	})

	t.Run("streaming", func(t *testing.T) {
		resp := post(t, m, acmeKey, `{"model":"primary","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"stream over http"}]}`)
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("status %d content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		var text strings.Builder
		var sawDone, sawUsage, sawMantle bool
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			if data == "[DONE]" {
				sawDone = true
				break
			}
			var chunk struct {
				Choices []struct {
					Delta struct {
						Content string `json:"content"`
					} `json:"delta"`
				} `json:"choices"`
				Usage *struct {
					TotalTokens int `json:"total_tokens"`
				} `json:"usage"`
				Mantle json.RawMessage `json:"mantle"`
			}
			if err := json.Unmarshal([]byte(data), &chunk); err != nil {
				t.Fatalf("chunk %q: %v", data, err)
			}
			for _, c := range chunk.Choices {
				text.WriteString(c.Delta.Content)
			}
			sawUsage = sawUsage || (chunk.Usage != nil && chunk.Usage.TotalTokens > 0)
			if len(chunk.Mantle) > 0 {
				// The stream's timings come with its QualityContext, in the last chunk.
				var qc struct {
					Overhead        string `json:"overhead"`
					UpstreamLatency string `json:"upstream_latency"`
				}
				if err := json.Unmarshal(chunk.Mantle, &qc); err != nil || qc.Overhead == "" || qc.UpstreamLatency == "" {
					t.Errorf("mantle field %s: want overhead and upstream_latency (%v)", chunk.Mantle, err)
				}
				sawMantle = true
			}
		}
		if !sawDone || !sawUsage || !sawMantle || !strings.Contains(text.String(), "stream over http") {
			t.Errorf("done=%v usage=%v mantle=%v text=%q", sawDone, sawUsage, sawMantle, text.String())
		}
	})

	t.Run("streamed cache hit says so", func(t *testing.T) {
		body := `{"model":"primary","temperature":0,"stream":%t,"messages":[{"role":"user","content":"cache me over http"}]}`
		if resp := post(t, m, acmeKey, fmt.Sprintf(body, false)); resp.StatusCode != http.StatusOK || resp.Header.Get(router.HeaderCache) != "miss" {
			t.Fatalf("first request: %d cache %q", resp.StatusCode, resp.Header.Get(router.HeaderCache))
		}
		resp := post(t, m, acmeKey, fmt.Sprintf(body, true))
		raw, _ := io.ReadAll(resp.Body)
		if resp.Header.Get(router.HeaderCache) != "hit" || !strings.Contains(string(raw), "cache me over http") {
			t.Errorf("streamed repeat: cache %q body %q, want a hit with the answer", resp.Header.Get(router.HeaderCache), raw)
		}
	})

	t.Run("spend metrics move", func(t *testing.T) {
		resp, err := http.Get("http://" + m.HTTPAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		for _, want := range []string{
			`mantle_router_tokens_total{direction="input",model="backup",tenant="acme"}`,
			`mantle_router_cost_usd_total{model="primary",tenant="acme"}`,
			`mantle_router_attempts_total{class="overloaded",model="broken"}`,
		} {
			if !strings.Contains(string(body), want) {
				t.Errorf("/metrics has no %s", want)
			}
		}
	})

	t.Run("models", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+m.HTTPAddr+"/v1/models", nil)
		req.Header.Set("Authorization", "Bearer "+acmeKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var list struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, d := range list.Data {
			ids = append(ids, d.ID)
		}
		if !slices.Equal(ids, []string{"primary", "backup", "broken", "chat"}) {
			t.Errorf("models = %v", ids)
		}
	})
}

func testBadInput(t *testing.T, m *meshtest.Mesh, client routerv1.RouterServiceClient) {
	huge := strings.Repeat("x", 10<<20)
	negative := ask("primary", "hi")
	negative.MaxTokens = -5
	grpcCases := []struct {
		name   string
		key    string
		req    *routerv1.Request
		code   codes.Code
		reason string
		field  string
	}{
		{"empty messages", acmeKey, &routerv1.Request{Model: "primary"}, codes.InvalidArgument, rpc.ReasonInvalidRequest, "request.messages"},
		{"unknown model", acmeKey, ask("gpt-99", "hi"), codes.NotFound, router.ReasonUnknownRoute, ""},
		{"missing key", "", ask("primary", "hi"), codes.Unauthenticated, rpc.ReasonUnauthenticated, ""},
		{"wrong key", "sk-wrong", ask("primary", "hi"), codes.Unauthenticated, rpc.ReasonUnauthenticated, ""},
		{"negative max_tokens", acmeKey, negative, codes.InvalidArgument, rpc.ReasonInvalidRequest, "request.max_tokens"},
		{"10 MB prompt", acmeKey, ask("primary", huge), codes.InvalidArgument, rpc.ReasonInvalidRequest, "request.messages"},
	}
	for _, tc := range grpcCases {
		t.Run("grpc "+tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.key != "" {
				ctx = authed(tc.key)
			}
			_, err := client.Complete(ctx, &routerv1.CompleteRequest{Request: tc.req})
			if status.Code(err) != tc.code {
				t.Fatalf("code = %v (%v), want %v", status.Code(err), err, tc.code)
			}
			if info := rpc.ErrorInfo(err); info == nil || info.Reason != tc.reason {
				t.Errorf("ErrorInfo = %v, want reason %s", info, tc.reason)
			}
			if tc.field != "" && !slices.Contains(rpc.BadRequestFields(err), tc.field) {
				t.Errorf("BadRequest fields = %v, want %s", rpc.BadRequestFields(err), tc.field)
			}
		})
	}

	hugeBody, _ := json.Marshal(map[string]any{"model": "primary", "messages": []map[string]string{{"role": "user", "content": huge}}})
	httpCases := []struct {
		name   string
		key    string
		body   string
		status int
		typ    string
		code   string
		param  string
	}{
		{"empty messages", acmeKey, `{"model":"primary","messages":[]}`, 400, "invalid_request_error", "invalid_request", "messages"},
		{"unknown model", acmeKey, `{"model":"gpt-99","messages":[{"role":"user","content":"hi"}]}`, 404, "invalid_request_error", "unknown_route", ""},
		{"invalid json", acmeKey, `{"model":`, 400, "invalid_request_error", "invalid_json", ""},
		{"missing key", "", `{"model":"primary","messages":[{"role":"user","content":"hi"}]}`, 401, "authentication_error", "unauthenticated", ""},
		{"wrong key", "sk-wrong", `{"model":"primary","messages":[{"role":"user","content":"hi"}]}`, 401, "authentication_error", "unauthenticated", ""},
		{"negative max_tokens", acmeKey, `{"model":"primary","max_tokens":-1,"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "invalid_request", "max_tokens"},
		{"10 MB prompt", acmeKey, string(hugeBody), 413, "invalid_request_error", "request_too_large", "messages"},
	}
	for _, tc := range httpCases {
		t.Run("http "+tc.name, func(t *testing.T) {
			resp := post(t, m, tc.key, tc.body)
			var body struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Code    string  `json:"code"`
					Param   *string `json:"param"`
				} `json:"error"`
			}
			raw, _ := io.ReadAll(resp.Body)
			if err := json.Unmarshal(raw, &body); err != nil {
				t.Fatalf("status %d body %q: %v", resp.StatusCode, raw, err)
			}
			e := body.Error
			if resp.StatusCode != tc.status || e.Type != tc.typ || e.Code != tc.code || e.Message == "" {
				t.Errorf("got %d %+v, want %d type %s code %s", resp.StatusCode, e, tc.status, tc.typ, tc.code)
			}
			if tc.param != "" && (e.Param == nil || !strings.HasPrefix(*e.Param, tc.param)) {
				t.Errorf("param = %v, want %s", e.Param, tc.param)
			}
		})
	}

	t.Run("http quota exhaustion sets Retry-After", func(t *testing.T) {
		var resp *http.Response
		for i := 0; i < 3; i++ {
			resp = post(t, m, tightKey, `{"model":"primary","messages":[{"role":"user","content":"quota over http"}]}`)
			if resp.StatusCode == http.StatusTooManyRequests {
				break
			}
		}
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
			t.Errorf("status %d Retry-After %q, want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	})
}
