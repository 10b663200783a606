package drill

import (
	"context"
	"encoding/csv"
	"errors"
	"io"
	"math"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

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

// The requests CSV is read by spreadsheets and scripts: one record per request with the
// header's columns, times in scenario time, and fields with commas or quotes (reasons,
// audit trails) quoted so they stay one column.
func TestRequestsCSV(t *testing.T) {
	t.Parallel()
	p := &plan{s: &Scenario{Name: "drill-test"}, scale: 0.1}
	d := sideData{name: "mantle", results: []result{
		{due: 100 * time.Millisecond, latency: 50 * time.Millisecond, answered: true, correct: true, level: 1, verified: true,
			reason: "primary unavailable", trail: `+0s admit route=drill (0s); +1ms attempt sim/primary class=timeout, "slow" (120ms)`},
		{due: 200 * time.Millisecond, latency: 300 * time.Millisecond, level: -1, failure: "deadline exceeded"},
	}}
	var b strings.Builder
	b.WriteString(requestsCSVHeader)
	if err := p.writeRequestsCSV(&b, d); err != nil {
		t.Fatal(err)
	}
	records, err := csv.NewReader(strings.NewReader(b.String())).ReadAll()
	if err != nil {
		t.Fatalf("not CSV: %v\n%s", err, b.String())
	}
	want := [][]string{
		strings.Split(strings.TrimSpace(requestsCSVHeader), ","),
		{"drill-test", "mantle", "0", "1.000", "500.0", "true", "true", "1", "true", "", "primary unavailable", d.results[0].trail},
		{"drill-test", "mantle", "1", "2.000", "3000.0", "false", "false", "-1", "false", "deadline exceeded", "", ""},
	}
	if diff := cmp.Diff(want, records); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
}

// TestScenarioLatency: at a time scale, mantle's own time on an answer is kept at its wall
// value instead of being divided with the scenario's time; nothing else changes.
func TestScenarioLatency(t *testing.T) {
	t.Parallel()
	ms := func(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }
	tests := []struct {
		name  string
		scale float64
		wall  time.Duration
		r     result
		// want is the latency the report shows, in scenario milliseconds
		want float64
	}{
		{"own time 5 ms of 100 ms at 0.1 reads as 5 ms, not 50", 0.1, ms(100), result{timed: true, overhead: ms(5)}, 950 + 5},
		{"no own time reported: all divided", 0.1, ms(100), result{}, 1000},
		{"the naive side reports none", 0.1, ms(100), result{timed: true}, 1000},
		{"real time: unchanged", 1, ms(100), result{timed: true, overhead: ms(5)}, 100},
		{"own time over the wall time (clock skew): all divided", 0.1, ms(4), result{timed: true, overhead: ms(5)}, 40},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := &plan{scale: tt.scale}
			got := float64(p.scenarioLatency(tt.wall, tt.r)) / float64(time.Millisecond) / tt.scale
			if math.Abs(got-tt.want) > 1e-6 {
				t.Errorf("scenario latency = %v ms, want %v", got, tt.want)
			}
		})
	}
}
