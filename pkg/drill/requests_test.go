package drill

import (
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/provider/openai"
	"github.com/mantle-mesh/mantle/pkg/sim"
)

// The drill's ground truth is the simulator's deterministic answer; this keeps the two in
// step, for plain and JSON answers, whole and streamed, and for long prompts the simulator
// shortens.
func TestExpectedAnswerMatchesSimulator(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(sim.NewServer(sim.ServerConfig{})) // instant, never fails
	t.Cleanup(srv.Close)
	client := openai.New(openai.Config{BaseURL: srv.URL + "/v1", HTTPClient: srv.Client()})
	s := &Scenario{Seed: 7, Load: Load{PromptWords: 12}}
	long := request{index: 1, prompt: strings.Repeat("a rather long prompt ", 20)}
	for _, r := range []request{requestFor(s, 0), requestFor(s, 1), long} {
		for _, asJSON := range []bool{false, true} {
			for _, stream := range []bool{false, true} {
				r.json, r.stream = asJSON, stream
				got := simAnswer(t, client, r)
				if want := expectedAnswer(r); got != want {
					t.Errorf("json=%t stream=%t: simulator answered\n%q\nwant\n%q", asJSON, stream, got, want)
				}
			}
		}
	}
}

func simAnswer(t *testing.T, p provider.Provider, r request) string {
	t.Helper()
	req := provider.Request{Model: "m", Messages: []provider.Message{{Role: "user", Content: r.prompt}}, JSON: r.json}
	if !r.stream {
		res, err := p.Complete(context.Background(), req)
		if err != nil {
			t.Fatalf("Complete: %v", err)
		}
		return res.Content
	}
	st, err := p.Stream(context.Background(), req)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	defer st.Close()
	var b strings.Builder
	for {
		ch, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return b.String()
		}
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		b.WriteString(ch.Content)
	}
}
