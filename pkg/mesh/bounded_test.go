package mesh_test

import (
	"encoding/json"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"

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
