package mesh_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/agent"
	"github.com/mantle-mesh/mantle/services/router"
)

// Tenants of the session tests.
const (
	sessionKey  = "sk-sessions-acme"
	intruderKey = "sk-sessions-mallory"
)

// sessionConfig is a mesh whose one route asks upstream (an OpenAI-compatible server),
// with two tenants and sessions kept in JetStream KV, as replicas share them.
func sessionConfig(t *testing.T, upstream string) mesh.Config {
	t.Helper()
	t.Setenv("MANTLE_SESSIONS_UPSTREAM_KEY", "sk-upstream")
	cfg := mesh.Default()
	cfg.Auth.Tenants = []rpc.TenantKey{{ID: "acme", KeySHA256: rpc.HashKey(sessionKey)}, {ID: "mallory", KeySHA256: rpc.HashKey(intruderKey)}}
	cfg.Router.DefaultBudget = 10 * time.Second
	cfg.Router.Providers = []router.ProviderConfig{{Name: "up", Type: router.ProviderOpenAI, BaseURL: upstream + "/v1",
		Timeout: 5 * time.Second, Keys: []router.KeyConfig{{ID: "k1", Env: "MANTLE_SESSIONS_UPSTREAM_KEY"}}}}
	cfg.Router.Models = []router.ModelConfig{{Name: "gpt", Provider: "up"}}
	cfg.Router.Routes = []router.RouteConfig{{Name: "agent", Candidates: []string{"gpt"}}}
	cfg.Agent.Sessions.Backend = "jetstream"
	return cfg
}

// stepResult is what the HTTP door answered a session step.
type stepResult struct {
	status   int
	replayed string
	content  string
	code     string // the error's code
}

// postStep sends step of session as the tenant of key, asking question.
func postStep(t *testing.T, ctx context.Context, base, key, sessionID, step, question string) stepResult {
	t.Helper()
	body := `{"model":"agent","messages":[{"role":"user","content":"` + question + `"}]}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(router.HeaderSession, sessionID)
	req.Header.Set(router.HeaderStep, step)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("step %s: %v in %s", step, err, raw)
	}
	r := stepResult{status: resp.StatusCode, replayed: resp.Header.Get(router.HeaderReplayed), code: out.Error.Code}
	if len(out.Choices) > 0 {
		r.content = out.Choices[0].Message.Content
	}
	return r
}

// sessionView is GET /v1/sessions/{id}'s answer, as far as the tests read it.
type sessionView struct {
	State     string `json:"state"`
	EndReason string `json:"end_reason"`
	Steps     []struct {
		ID     string          `json:"id"`
		Status string          `json:"status"`
		Tokens int64           `json:"tokens"`
		Result json.RawMessage `json:"result"`
	} `json:"steps"`
	Error struct {
		Code string `json:"code"`
	} `json:"error"`
}

// sessionCall calls one of the session endpoints (path after /v1/sessions/) as key.
func sessionCall(t *testing.T, base, method, key, path string) (int, sessionView) {
	t.Helper()
	req, _ := http.NewRequest(method, base+"/v1/sessions/"+path, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v sessionView
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("%s %s: %v in %s", method, path, err, raw)
	}
	return resp.StatusCode, v
}

// toolBackends answers every tool call with {"ok":true} and counts the calls per path.
type toolBackends struct {
	calls sync.Map // path -> *atomic.Int32
}

func (b *toolBackends) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	n, _ := b.calls.LoadOrStore(r.URL.Path, new(atomic.Int32))
	n.(*atomic.Int32).Add(1)
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"ok":true}`)
}

func (b *toolBackends) count(path string) int32 {
	n, ok := b.calls.Load(path)
	if !ok {
		return 0
	}
	return n.(*atomic.Int32).Load()
}

// withTools adds a query tool (lookup) and an action tool (book) on backends at url.
func withTools(cfg *mesh.Config, url string) {
	object := map[string]any{"type": "object"}
	cfg.Agent.Tools = []agent.ToolConfig{
		{Name: "lookup", Kind: agent.KindQuery, InputSchema: object, Backend: agent.BackendConfig{Type: agent.BackendHTTP, URL: url + "/lookup"}},
		{Name: "book", Kind: agent.KindAction, InputSchema: object, Backend: agent.BackendConfig{Type: agent.BackendHTTP, URL: url + "/book"}},
	}
}

// postToolStep calls tool as step of session through the HTTP door and returns the
// call's status (ok, replayed, ...), or the error's code.
func postToolStep(t *testing.T, base, key, sessionID, step, tool string) (int, string) {
	t.Helper()
	body := `{"arguments":{"what":"` + step + `"},"session_id":"` + sessionID + `","step_id":"` + step + `"}`
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/tools/"+tool+"/call", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Status string `json:"status"`
		Error  struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("tool step %s: %v in %s", step, err, raw)
	}
	if out.Status == "" {
		return resp.StatusCode, out.Error.Code
	}
	return resp.StatusCode, out.Status
}

// routerConfigOf is the configuration of another router replica of split mesh m.
func routerConfigOf(m *meshtest.Mesh, cfg mesh.Config) mesh.Config {
	cfg.Target = "router"
	cfg.Server.GRPCListenAddress, cfg.Server.HTTPListenAddress = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Events = mesh.EventsConfig{NATSURL: m.NATSURL}
	cfg.Log.Level = "error"
	cfg.Router.QuotaAddress = m.Processes["quota"].App.GRPCAddr()
	cfg.Router.CacheAddress = m.Processes["cache"].App.GRPCAddr()
	cfg.Router.VerifierAddress = m.Processes["verifier"].App.GRPCAddr()
	cfg.Router.AgentAddress = m.Processes["agent"].App.GRPCAddr()
	return cfg
}

// TestSessionResumesAfterRouterRestart: an agent runs two model steps and two tool steps
// (a query and an action) through one router, the router goes away, and the agent resumes
// through a fresh router process: the recorded steps answer from the session's record
// (x-mantle-replayed: true, status replayed) without a call to the upstream or to a tool
// backend, and the next step runs.
func TestSessionResumesAfterRouterRestart(t *testing.T) {
	up := &meshtest.RecordingUpstream{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	backends := &toolBackends{}
	toolSrv := httptest.NewServer(backends)
	t.Cleanup(toolSrv.Close)
	cfg := sessionConfig(t, srv.URL)
	withTools(&cfg, toolSrv.URL)
	m := meshtest.Start(t, cfg, meshtest.Split)
	ctx := t.Context()

	a, stopA := meshtest.RunStoppable(t, routerConfigOf(m, cfg), mesh.Options{LogOutput: io.Discard})
	baseA := "http://" + a.App.HTTPAddr()
	for i, step := range []string{"plan", "search"} {
		r := postStep(t, ctx, baseA, sessionKey, "trip-1", step, "step "+step+" of the trip")
		if r.status != http.StatusOK || r.replayed != "" {
			t.Fatalf("step %s: HTTP %d replayed %q, want 200 and a fresh answer", step, r.status, r.replayed)
		}
		if up.Count() != i+1 {
			t.Fatalf("after step %s the upstream was called %d times, want %d", step, up.Count(), i+1)
		}
	}
	for _, c := range []struct{ step, tool string }{{"find", "lookup"}, {"reserve", "book"}} {
		if code, st := postToolStep(t, baseA, sessionKey, "trip-1", c.step, c.tool); code != http.StatusOK || st != "ok" {
			t.Fatalf("tool step %s: HTTP %d %s, want 200 ok", c.step, code, st)
		}
	}
	stopA() // the router dies mid-session

	b := meshtest.Run(t, routerConfigOf(m, cfg), mesh.Options{LogOutput: io.Discard})
	baseB := "http://" + b.App.HTTPAddr()
	for _, step := range []string{"plan", "search"} {
		r := postStep(t, ctx, baseB, sessionKey, "trip-1", step, "step "+step+" of the trip")
		if r.status != http.StatusOK || r.replayed != "true" || r.content != "ok" {
			t.Fatalf("resumed step %s: HTTP %d replayed %q content %q, want 200, true, ok", step, r.status, r.replayed, r.content)
		}
	}
	if up.Count() != 2 {
		t.Fatalf("the resumed steps called the upstream: %d calls, want 2", up.Count())
	}
	for _, c := range []struct{ step, tool string }{{"find", "lookup"}, {"reserve", "book"}} {
		if code, st := postToolStep(t, baseB, sessionKey, "trip-1", c.step, c.tool); code != http.StatusOK || st != "replayed" {
			t.Fatalf("resumed tool step %s: HTTP %d %s, want 200 replayed", c.step, code, st)
		}
		if n := backends.count("/" + c.tool); n != 1 {
			t.Fatalf("tool %s ran %d times, want once", c.tool, n)
		}
	}
	if r := postStep(t, ctx, baseB, sessionKey, "trip-1", "book", "step book of the trip"); r.status != http.StatusOK || r.replayed != "" || up.Count() != 3 {
		t.Fatalf("the first new step: HTTP %d replayed %q, %d upstream calls; want 200, fresh, 3", r.status, r.replayed, up.Count())
	}
	code, v := sessionCall(t, baseB, http.MethodGet, sessionKey, "trip-1")
	if code != http.StatusOK || v.State != "active" || len(v.Steps) != 5 {
		t.Fatalf("GET: HTTP %d %+v, want the active session with 5 steps", code, v)
	}
	for _, st := range v.Steps {
		tokens := int64(8)
		if st.ID == "find" || st.ID == "reserve" {
			tokens = 0
		}
		if st.Status != "done" || st.Tokens != tokens || len(st.Result) == 0 {
			t.Fatalf("step %+v, want done, %d tokens, with its answer", st, tokens)
		}
	}
}

// hangingUpstream answers nothing until the request's context ends, and counts the calls
// that were cancelled.
type hangingUpstream struct {
	started   chan struct{}
	cancelled atomic.Int32
}

func (u *hangingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The server notices that the client went away only once the body is read.
	_, _ = io.Copy(io.Discard, r.Body)
	u.started <- struct{}{}
	<-r.Context().Done()
	u.cancelled.Add(1)
}

// TestSessionCancelInterruptsModelStep: a cancel through the HTTP door ends a model step
// that is waiting on its model, in whichever process the router runs, and the step is
// recorded cancelled.
func TestSessionCancelInterruptsModelStep(t *testing.T) {
	for _, mode := range []meshtest.Mode{meshtest.All, meshtest.Split} {
		t.Run(string(mode), func(t *testing.T) {
			up := &hangingUpstream{started: make(chan struct{}, 4)}
			srv := httptest.NewServer(up)
			t.Cleanup(srv.Close)
			cfg := sessionConfig(t, srv.URL)
			cfg.Router.DefaultBudget = time.Minute
			cfg.Router.Providers[0].Timeout = time.Minute
			m := meshtest.Start(t, cfg, mode)
			base := "http://" + m.HTTPAddr
			got := make(chan stepResult, 1)
			go func() { got <- postStep(t, context.Background(), base, sessionKey, "s-cancel", "think", "think long") }()
			select {
			case <-up.started:
			case <-time.After(10 * time.Second):
				t.Fatal("the step never reached the upstream")
			}
			if code, v := sessionCall(t, base, http.MethodPost, sessionKey, "s-cancel/cancel"); code != http.StatusOK || v.State != "cancelled" {
				t.Fatalf("cancel: HTTP %d %+v, want the session cancelled", code, v)
			}
			select {
			case r := <-got:
				if r.status != http.StatusBadRequest || r.code != "session_ended" {
					t.Fatalf("the interrupted step: HTTP %d code %q, want 400 session_ended", r.status, r.code)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the cancel did not interrupt the step")
			}
			_, v := sessionCall(t, base, http.MethodGet, sessionKey, "s-cancel")
			if len(v.Steps) != 1 || v.Steps[0].Status != "cancelled" {
				t.Fatalf("steps %+v, want the one step cancelled", v.Steps)
			}
			if r := postStep(t, context.Background(), base, sessionKey, "s-cancel", "again", "more"); r.status != http.StatusBadRequest || r.code != "session_ended" {
				t.Fatalf("a step after the cancel: HTTP %d code %q, want 400 session_ended", r.status, r.code)
			}
			// The provider call was cancelled with the step (the server learns it
			// asynchronously: srv.Close waits for its handler).
			srv.Close()
			if n := up.cancelled.Load(); n != 1 {
				t.Fatalf("%d upstream calls ended by the cancel, want 1", n)
			}
		})
	}
}

// TestSessionTenants: a tenant cannot read, cancel or complete another tenant's session,
// and the same session id is another session for another tenant.
func TestSessionTenants(t *testing.T) {
	up := &meshtest.RecordingUpstream{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	m := meshtest.Start(t, sessionConfig(t, srv.URL), meshtest.All)
	base := "http://" + m.HTTPAddr
	ctx := t.Context()
	if r := postStep(t, ctx, base, sessionKey, "shared-id", "one", "hello"); r.status != http.StatusOK {
		t.Fatalf("acme's step: HTTP %d", r.status)
	}
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, "shared-id"}, {http.MethodPost, "shared-id/cancel"}, {http.MethodPost, "shared-id/complete"},
	} {
		if code, v := sessionCall(t, base, c.method, intruderKey, c.path); code != http.StatusNotFound || v.Error.Code != "session_not_found" {
			t.Fatalf("mallory %s %s: HTTP %d %q, want 404 session_not_found", c.method, c.path, code, v.Error.Code)
		}
	}
	if r := postStep(t, ctx, base, intruderKey, "shared-id", "one", "hello"); r.status != http.StatusOK || r.replayed != "" {
		t.Fatalf("mallory's step of the same id: HTTP %d replayed %q, want its own fresh answer", r.status, r.replayed)
	}
	if code, v := sessionCall(t, base, http.MethodGet, sessionKey, "shared-id"); code != http.StatusOK || v.State != "active" || len(v.Steps) != 1 {
		t.Fatalf("acme's session after mallory tried: HTTP %d %+v, want active with its one step", code, v)
	}
	if code, _ := sessionCall(t, base, http.MethodGet, "sk-nobody", "shared-id"); code != http.StatusUnauthorized {
		t.Fatalf("an unknown key: HTTP %d, want 401", code)
	}
}

// TestSessionBudgetEndsWithPartialResult: a session whose token budget runs out ends
// (ended_partial, tokens) with its steps readable; its next step is refused.
func TestSessionBudgetEndsWithPartialResult(t *testing.T) {
	up := &meshtest.RecordingUpstream{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	cfg := sessionConfig(t, srv.URL)
	cfg.Agent.Sessions.DefaultBudget.MaxTokens = 12 // the upstream spends 8 a step
	m := meshtest.Start(t, cfg, meshtest.All)
	base := "http://" + m.HTTPAddr
	ctx := t.Context()
	for _, step := range []string{"one", "two"} {
		if r := postStep(t, ctx, base, sessionKey, "budget", step, "go on"); r.status != http.StatusOK {
			t.Fatalf("step %s: HTTP %d", step, r.status)
		}
	}
	if r := postStep(t, ctx, base, sessionKey, "budget", "three", "go on"); r.status != http.StatusBadRequest || r.code != "session_ended" {
		t.Fatalf("a step past the budget: HTTP %d %q, want 400 session_ended", r.status, r.code)
	}
	if up.Count() != 2 {
		t.Fatalf("%d upstream calls, want 2", up.Count())
	}
	_, v := sessionCall(t, base, http.MethodGet, sessionKey, "budget")
	if v.State != "ended_partial" || v.EndReason != "tokens" || len(v.Steps) != 2 || v.Steps[1].Status != "done" || len(v.Steps[1].Result) == 0 {
		t.Fatalf("session %+v, want ended_partial (tokens) with both steps and their answers", v)
	}
}
