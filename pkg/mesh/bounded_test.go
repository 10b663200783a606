package mesh_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
)

// attempts is the number of provider attempts the router has made.
func attempts(t *testing.T, m *meshtest.Mesh) float64 {
	t.Helper()
	families, err := m.Router.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, f := range families {
		if f.GetName() == "mantle_router_attempts_total" {
			for _, metric := range f.GetMetric() {
				total += metric.GetCounter().GetValue()
			}
		}
	}
	return total
}

// openAIErrorOf decodes an OpenAI error answer.
func openAIErrorOf(t *testing.T, resp *http.Response) (code, message string, param *string) {
	t.Helper()
	raw, _ := io.ReadAll(resp.Body)
	var body struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Code    string  `json:"code"`
			Param   *string `json:"param"`
		} `json:"error"`
	}
	if err := json.Unmarshal(raw, &body); err != nil || body.Error.Type == "" {
		t.Fatalf("status %d body %q is not OpenAI error JSON: %v", resp.StatusCode, raw, err)
	}
	return body.Error.Code, body.Error.Message, body.Error.Param
}

// TestHostileInputIsRefusedBeforeAnyProviderCall sends, through the real front door of a
// whole mesh (router, verifier, quota, cache in one process), the inputs that used to cost
// paid provider calls, hang, or grow memory: each is a 400 naming the problem, and no
// provider is called.
func TestHostileInputIsRefusedBeforeAnyProviderCall(t *testing.T) {
	m := meshtest.Start(t, testConfig(), meshtest.All)
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	schemaBomb := strings.Repeat(`{"properties":{"a":`, 2500) + `{}` + strings.Repeat(`}}`, 2500) // 50 KB, 5000 deep
	withSchema := func(schema string) string {
		return `{"model":"chat",` + msgs + `,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":` + schema + `}}}`
	}
	tests := []struct {
		name        string
		body        string
		header      http.Header
		wantStatus  int
		wantMessage string
		wantParam   string
	}{
		{"schema nested 5000 deep", withSchema(schemaBomb), nil, 400, "nests deeper than 32 levels", "response_format.json_schema"},
		{"schema that is not a schema", withSchema(`"notaschema"`), nil, 400, "must be a JSON object or boolean", "response_format.json_schema"},
		{"schema with an invalid keyword", withSchema(`{"type":"notatype"}`), nil, 400, "is not a valid JSON Schema", "response_format.json_schema"},
		{"invalid UTF-8", `{"model":"chat","messages":[{"role":"user","content":"hi ` + "\xff\xfe" + `"}]}`, nil, 400, "not valid UTF-8 (byte offset 57)", ""},
		{"trailing bytes after the JSON", `{"model":"chat",` + msgs + `}{"model":"chat"}`, nil, 400, "after top-level value", ""},
		{"budget that overflows", `{"model":"chat",` + msgs + `}`, http.Header{"X-Mantle-Budget-Ms": {"9223372036854775807"}}, 400, "from 1 to 86400000", "x-mantle-budget-ms"},
		{"scenario of 10 000 characters", `{"model":"chat",` + msgs + `}`, http.Header{"X-Mantle-Scenario": {strings.Repeat("s", 10000)}}, 400, "1 to 64 characters", "scenario"},
		{"scenario with spaces", `{"model":"chat",` + msgs + `}`, http.Header{"X-Mantle-Scenario": {"a b"}}, 400, "1 to 64 characters", "scenario"},
	}
	before := attempts(t, m)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, "http://"+m.HTTPAddr+"/v1/chat/completions", strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+acmeKey)
			for k, v := range tt.header {
				req.Header[k] = v
			}
			var ms0, ms1 runtime.MemStats
			runtime.ReadMemStats(&ms0)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			runtime.ReadMemStats(&ms1)
			code, msg, param := openAIErrorOf(t, resp)
			if resp.StatusCode != tt.wantStatus || !strings.Contains(msg, tt.wantMessage) {
				t.Fatalf("got %d %s %q, want %d with %q", resp.StatusCode, code, msg, tt.wantStatus, tt.wantMessage)
			}
			if tt.wantParam != "" && (param == nil || *param != tt.wantParam) {
				t.Errorf("param = %v, want %s", param, tt.wantParam)
			}
			// The whole exchange (client and server share this process) allocates little:
			// the schema bomb used to take a gigabyte.
			if alloc := ms1.TotalAlloc - ms0.TotalAlloc; alloc > 10<<20 {
				t.Errorf("the request allocated %d bytes, want under 10 MB", alloc)
			}
		})
	}
	if after := attempts(t, m); after != before {
		t.Errorf("provider attempts went from %v to %v; refused requests must not call a provider", before, after)
	}

}

// TestListenerErrorsTakeTheDoorsShape: what the HTTP listener answers by itself (a path
// that does not exist, a method not allowed, headers over server.max_header_bytes) is
// Anthropic's error JSON under the Messages door and OpenAI's everywhere else, through the
// real listener of a whole mesh.
func TestListenerErrorsTakeTheDoorsShape(t *testing.T) {
	m := meshtest.Start(t, testConfig(), meshtest.All)
	bigHeader := "X-Pad: " + strings.Repeat("p", 70<<10) + "\r\n" // over the default 64 KiB
	tests := []struct {
		name, method, path, extra string
		wantStatus                int
		anthropic                 bool
		wantType                  string // Anthropic's error type, or OpenAI's error code
	}{
		{"messages: path under the door", "POST", "/v1/messages/count_tokens", "", 404, true, "not_found_error"},
		{"messages: GET", "GET", "/v1/messages", "", 405, true, "invalid_request_error"},
		{"messages: headers too large", "POST", "/v1/messages", bigHeader, 431, true, "invalid_request_error"},
		{"messages: a path redirected when cleaned", "POST", "/v1/messages/../messages", "", 404, true, "not_found_error"},
		{"chat: GET", "GET", "/v1/chat/completions", "", 405, false, "method_not_allowed"},
		{"chat: headers too large", "POST", "/v1/chat/completions", bigHeader, 431, false, "request_header_fields_too_large"},
		{"a path that only starts like the door", "POST", "/v1/messagesx", "", 404, false, "not_found"},
		{"unknown path", "POST", "/v1/responses", "", 404, false, "not_found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", m.HTTPAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			// Written by hand: net/http's client would clean the path itself.
			fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n%sContent-Length: 2\r\nConnection: close\r\n\r\n{}",
				tt.method, tt.path, acmeKey, tt.extra)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.wantStatus || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("status %d (%s), want %d JSON; body %s", resp.StatusCode, resp.Header.Get("Content-Type"), tt.wantStatus, raw)
			}
			var body struct {
				Type  string `json:"type"`
				Error struct {
					Type, Code, Message string
				} `json:"error"`
			}
			if err := json.Unmarshal(raw, &body); err != nil || body.Error.Message == "" {
				t.Fatalf("body %s: %v", raw, err)
			}
			if tt.anthropic {
				if body.Type != "error" || body.Error.Type != tt.wantType || body.Error.Code != "" {
					t.Fatalf("body %s, want Anthropic's error shape with type %s", raw, tt.wantType)
				}
				return
			}
			if body.Type != "" || body.Error.Code != tt.wantType || body.Error.Type != "invalid_request_error" {
				t.Fatalf("body %s, want OpenAI's error shape with code %s", raw, tt.wantType)
			}
		})
	}
}

// TestSlowAndIdleConnectionsAreCut: through the real front door of a whole mesh, a client
// that sends half a chat request's body and stops holds the connection only until
// server.body_read_timeout, and a keep-alive connection with no next request is closed
// after server.idle_timeout; neither reaches a provider. Nothing sleeps: the client reads
// until the server closes, bounded by a deadline that fails the test.
func TestSlowAndIdleConnectionsAreCut(t *testing.T) {
	cfg := testConfig()
	cfg.Server.BodyReadTimeout, cfg.Server.IdleTimeout = 100*time.Millisecond, 100*time.Millisecond
	m := meshtest.Start(t, cfg, meshtest.All)
	dial := func(t *testing.T) net.Conn {
		t.Helper()
		conn, err := net.Dial("tcp", m.HTTPAddr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		if err := conn.SetDeadline(time.Now().Add(30 * time.Second)); err != nil { // a hang fails, never a pause
			t.Fatal(err)
		}
		return conn
	}
	before := attempts(t, m)
	t.Run("slow body", func(t *testing.T) {
		conn := dial(t)
		body := `{"model":"chat","messages":[{"role":"user","content":"hi"}]}`
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			acmeKey, len(body), body[:10])
		// Whatever the server answers, it then closes the connection.
		if rest, err := io.ReadAll(conn); err != nil {
			t.Fatalf("the slow body's connection was not closed by the server: %v (read %q)", err, rest)
		}
	})
	t.Run("idle keep-alive", func(t *testing.T) {
		conn := dial(t)
		fmt.Fprintf(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
			t.Fatalf("idle keep-alive connection: read %v, want EOF from the server closing it", err)
		}
	})
	if after := attempts(t, m); after != before {
		t.Errorf("provider attempts went from %v to %v", before, after)
	}
}

// TestFrontDoorRefusalsAreLoggedAndCounted: 401s on the HTTP doors, in each door's error
// shape, are logged (reason and route, never the key) and counted in
// mantle_auth_refusals_total, like the gRPC port's refusals.
func TestFrontDoorRefusalsAreLoggedAndCounted(t *testing.T) {
	logs := &syncBuffer{}
	cfg := testConfig()
	cfg.Log.Level = "warn"
	m := meshtest.StartWith(t, cfg, meshtest.All, mesh.Options{LogOutput: logs})
	const wrongKey = "sk-not-a-key-of-anyone"
	body := `{"model":"chat","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`
	for _, tt := range []struct {
		path   string
		header http.Header
		shape  string // "error" for Anthropic's {"type":"error"}, "" for OpenAI's
	}{
		{"/v1/chat/completions", http.Header{"Authorization": {"Bearer " + wrongKey}}, ""},
		{"/v1/chat/completions", nil, ""},
		{"/v1/messages", http.Header{"X-Api-Key": {wrongKey}, "Anthropic-Version": {"2023-06-01"}}, "error"},
	} {
		req, err := http.NewRequest(http.MethodPost, "http://"+m.HTTPAddr+tt.path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range tt.header {
			req.Header[k] = v
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var shape struct {
			Type string `json:"type"`
		}
		if resp.StatusCode != http.StatusUnauthorized || json.Unmarshal(raw, &shape) != nil || shape.Type != tt.shape {
			t.Errorf("POST %s = %d %s, want 401 in the door's shape", tt.path, resp.StatusCode, raw)
		}
	}
	logs.mu.Lock()
	out := logs.buf.String()
	logs.mu.Unlock()
	for _, want := range []string{`"reason":"unknown_key"`, `"reason":"missing_credential"`, `"method":"POST /v1/chat/completions"`, `"method":"POST /v1/messages"`} {
		if !strings.Contains(out, `"msg":"call refused"`) || !strings.Contains(out, want) {
			t.Errorf("no refusal line with %s in the log:\n%.2000s", want, out)
		}
	}
	if strings.Contains(out, wrongKey) {
		t.Error("a log line contains the key")
	}
	if n := counterValue(t, m.Router, "mantle_auth_refusals_total", map[string]string{"reason": "unknown_key", "code": "Unauthenticated"}); n != 2 {
		t.Errorf(`mantle_auth_refusals_total{reason="unknown_key"} = %v, want 2`, n)
	}
}
