package router

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// FuzzFrontDoorRequest: any body and mantle headers are decoded and validated as the front
// door does before the router runs, into a request or a clear error, never a panic; what is
// accepted is UTF-8 with a bounded scenario and budget.
func FuzzFrontDoorRequest(f *testing.F) {
	for _, seed := range []string{
		`{"model":"chat","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"chat","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"}]}],"max_completion_tokens":5,"temperature":0.2,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"chat","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object","properties":{"a":{"$ref":"#/$defs/x"}},"$defs":{"x":{"type":"string"}}}}}}`,
		`{"model":"chat","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"schema":"notaschema"}}}`,
		`{"model":"chat","messages":[]} trailing`, "{\"model\":\"\xff\"}", `{"model":`, ``,
	} {
		f.Add([]byte(seed), "support", "1500", "high")
	}
	f.Add([]byte(`{"model":"chat","messages":[{"role":"user","content":"hi"}]}`), strings.Repeat("s", 100), "9223372036854775807", "urgent")
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		f.Fatal(err)
	}
	r, err := New(testConfig(), Deps{Clock: clockwork.NewFakeClock(), Log: slog.New(slog.DiscardHandler), Metrics: m},
		func(ProviderConfig, ModelConfig, string) (provider.Provider, error) { return newFakeProvider(), nil })
	if err != nil {
		f.Fatal(err)
	}
	fd := &frontDoor{router: r}
	f.Fuzz(func(t *testing.T, body []byte, scenario, budget, priority string) {
		h := http.Header{}
		h.Set(HeaderScenario, scenario)
		h.Set(HeaderBudget, budget)
		h.Set(HeaderPriority, priority)
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(string(body)))
		cr, ok := fd.decodeChat(httptest.NewRecorder(), req, 1<<20)
		if !ok {
			return
		}
		if _, err := headerBudget(h); err != nil && rpc.BadRequestFields(toStatus(err)) == nil {
			t.Fatalf("budget %q: %v without a field", budget, err)
		}
		p, err := headerPriority(h)
		if err != nil {
			return
		}
		rreq, err := chatToProto(cr.Request, h, p)
		if err != nil {
			return
		}
		if _, err := r.validate(t.Context(), rreq); err != nil {
			return
		}
		if len(rreq.Scenario) > maxLabelBytes {
			t.Fatalf("accepted a scenario of %d bytes", len(rreq.Scenario))
		}
	})
}
