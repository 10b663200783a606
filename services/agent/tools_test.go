package agent

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// scripted is a backend that answers from a script, one step per call (the last step
// repeats), and counts its calls: the consumer-side fake of backend.
type scripted struct {
	mu    sync.Mutex
	steps []step
	calls int
	keys  []string
}

// step is one scripted answer: a result, or a failure.
type step struct {
	result  string
	isError bool
	failure failure
	outcome string
	// block waits for the call's context to end (a timeout).
	block bool
}

func answer(result string) step { return step{result: result} }
func fail(f failure, outcome string) step {
	return step{failure: f, outcome: outcome}
}

func (s *scripted) call(ctx context.Context, c backendCall) (backendResult, error) {
	s.mu.Lock()
	st := s.steps[min(s.calls, len(s.steps)-1)]
	s.calls++
	s.keys = append(s.keys, c.idempotencyKey)
	s.mu.Unlock()
	if st.block {
		<-ctx.Done()
		return backendResult{}, &callError{failure: failUnknown, outcome: "timeout", err: ctx.Err()}
	}
	if st.failure != failNone {
		return backendResult{}, &callError{failure: st.failure, outcome: st.outcome, err: errors.New(st.outcome)}
	}
	return backendResult{result: st.result, isError: st.isError, httpStatus: 200}, nil
}

func (s *scripted) close() {}

func (s *scripted) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// harness is a Tools over scripted backends on a fake clock.
type harness struct {
	tools    *Tools
	clock    *clockwork.FakeClock
	backends map[string]*scripted
}

func newHarness(t *testing.T, tools ...ToolConfig) *harness {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Tools = tools
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	h := &harness{clock: clockwork.NewFakeClockAt(time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)), backends: map[string]*scripted{}}
	for _, tc := range tools {
		h.backends[tc.Name] = &scripted{steps: []step{answer(`{"ok":true}`)}}
	}
	var err error
	h.tools, err = NewTools(cfg, ToolsDeps{
		Clock: h.clock, Rand: func() float64 { return 1 }, // the longest backoff: d
		NewBackend: func(tc ToolConfig, _ int) (backend, error) { return h.backends[tc.Name], nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *harness) script(name string, steps ...step) { h.backends[name].steps = steps }

// call runs a call, advancing the fake clock through each backoff it waits for: whenever
// the call waits on a timer, the clock jumps past it.
func (h *harness) call(t *testing.T, req CallRequest) (CallResult, error) {
	t.Helper()
	if req.Tenant == "" {
		req.Tenant = "acme"
	}
	type out struct {
		res CallResult
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := h.tools.Call(context.Background(), req)
		done <- out{res, err}
	}()
	for {
		ctx, cancel := context.WithCancel(context.Background())
		waiting := make(chan error, 1)
		go func() { waiting <- h.clock.BlockUntilContext(ctx, 1) }()
		select {
		case o := <-done:
			cancel()
			<-waiting
			return o.res, o.err
		case err := <-waiting:
			cancel()
			if err == nil {
				h.clock.Advance(5 * time.Second) // past any backoff (max_delay 4s)
			}
		}
	}
}

func query(name string) ToolConfig {
	tc := validTool(name)
	tc.Cache = CacheConfig{MaxStaleness: 30 * time.Minute}
	return tc
}

// TestGears drives each kind × failure through Tools on the fake clock and checks the
// gears it climbed (the attempts), the answer and how many times each backend ran.
func TestGears(t *testing.T) {
	t.Parallel()
	unknown, refused := fail(failUnknown, "timeout"), fail(failRefused, "unavailable")
	withBackup := func() []ToolConfig {
		q, b := query("weather"), query("weather-backup")
		q.Backup = "weather-backup"
		return []ToolConfig{q, b}
	}
	tests := []struct {
		name  string
		tools []ToolConfig
		setup func(h *harness) // before the call: scripts and stored results
		want  Status
		// wantErr is the error the call ends with instead, when not nil.
		wantErr  func(error) bool
		outcomes []string // the attempts' outcomes, in order
		calls    map[string]int
		check    func(t *testing.T, res CallResult)
	}{
		{
			name: "query answers", tools: []ToolConfig{query("weather")},
			want: StatusOK, outcomes: []string{"ok"}, calls: map[string]int{"weather": 1},
		},
		{
			name: "query retries a timeout", tools: []ToolConfig{query("weather")},
			setup: func(h *harness) { h.script("weather", unknown, answer(`{"t":21}`)) },
			want:  StatusOK, outcomes: []string{"timeout", "ok"}, calls: map[string]int{"weather": 2},
		},
		{
			name: "query: retries spent, then the backup", tools: withBackup(),
			setup: func(h *harness) { h.script("weather", refused) },
			want:  StatusBackup, outcomes: []string{"unavailable", "unavailable", "unavailable", "ok"},
			calls: map[string]int{"weather": 3, "weather-backup": 1},
			check: func(t *testing.T, res CallResult) {
				if res.AnsweredBy != "weather-backup" {
					t.Errorf("answered by %q, want the backup", res.AnsweredBy)
				}
			},
		},
		{
			name: "query: everything fails, the last good result marked stale", tools: withBackup(),
			setup: func(h *harness) {
				h.tools.stale.put(staleKey{"acme", "weather", argsDigest(t, "{}")}, `{"t":19}`, h.clock.Now())
				h.clock.Advance(12 * time.Minute)
				h.script("weather", unknown)
				h.script("weather-backup", unknown)
			},
			want: StatusStale, outcomes: []string{"timeout", "timeout", "timeout", "timeout", "timeout", "timeout"},
			calls: map[string]int{"weather": 3, "weather-backup": 3},
			check: func(t *testing.T, res CallResult) {
				if res.Result != `{"t":19}` || res.StaleAge < 12*time.Minute || res.Notice != "may be out of date (12 min old)" {
					t.Errorf("stale answer %q, age %s, notice %q", res.Result, res.StaleAge, res.Notice)
				}
			},
		},
		{
			name: "query: a result past max_staleness is not served", tools: []ToolConfig{query("weather")},
			setup: func(h *harness) {
				h.tools.stale.put(staleKey{"acme", "weather", argsDigest(t, "{}")}, `{"t":19}`, h.clock.Now())
				h.clock.Advance(31 * time.Minute)
				h.script("weather", unknown)
			},
			wantErr:  func(err error) bool { return errors.As(err, new(*UnavailableError)) },
			outcomes: []string{"timeout", "timeout", "timeout"}, calls: map[string]int{"weather": 3},
		},
		{
			name: "query: the tool's error answer is the answer", tools: []ToolConfig{query("weather")},
			setup: func(h *harness) { h.script("weather", step{result: `{"error":"no such city"}`, isError: true}) },
			want:  StatusOK, outcomes: []string{"tool_error"}, calls: map[string]int{"weather": 1},
			check: func(t *testing.T, res CallResult) {
				if !res.IsError {
					t.Error("is_error not set")
				}
			},
		},
		{
			name: "query: fresh within ttl, no backend call",
			tools: func() []ToolConfig {
				q := query("weather")
				q.Cache.TTL = time.Minute
				return []ToolConfig{q}
			}(),
			setup: func(h *harness) {
				h.tools.stale.put(staleKey{"acme", "weather", argsDigest(t, "{}")}, `{"t":20}`, h.clock.Now())
				h.clock.Advance(59 * time.Second)
			},
			want: StatusCached, calls: map[string]int{"weather": 0},
		},
		{
			name: "external: breaker open, backup without spending a retry",
			tools: func() []ToolConfig {
				e, b := query("quotes"), query("quotes-backup")
				e.Kind, e.RateLimit, e.Backup = KindExternal, RateLimitConfig{PerSecond: 100, Burst: 100}, "quotes-backup"
				return []ToolConfig{e, b}
			}(),
			setup: func(h *harness) {
				tl := h.tools.reg.Load().tools["quotes"]
				for range 5 { // consecutive_failures trips it
					p, _ := tl.breaker.Allow()
					p.Done(true, 0)
				}
			},
			want: StatusBackup, outcomes: []string{"breaker_open", "ok"}, calls: map[string]int{"quotes": 0, "quotes-backup": 1},
		},
		{
			name: "external: over its rate limit with nothing else, RATE_LIMITED",
			tools: func() []ToolConfig {
				e := query("quotes")
				e.Kind, e.RateLimit, e.Cache = KindExternal, RateLimitConfig{PerSecond: 1, Burst: 1}, CacheConfig{}
				return []ToolConfig{e}
			}(),
			setup: func(h *harness) {
				if _, err := h.tools.Call(context.Background(), CallRequest{Tenant: "acme", Name: "quotes"}); err != nil {
					panic(err)
				}
			},
			wantErr:  func(err error) bool { return errors.As(err, new(*RateLimitedError)) },
			outcomes: []string{"throttled"}, calls: map[string]int{"quotes": 0},
		},
		{
			name: "action answers once", tools: []ToolConfig{action("order")},
			want: StatusOK, outcomes: []string{"ok"}, calls: map[string]int{"order": 1},
		},
		{
			name: "action timeout: not retried, pending confirmation", tools: []ToolConfig{action("order")},
			setup: func(h *harness) { h.script("order", unknown) },
			want:  StatusPendingConfirmation, outcomes: []string{"timeout"}, calls: map[string]int{"order": 1},
		},
		{
			name: "action refused: not retried, reported as not run", tools: []ToolConfig{action("order")},
			setup:    func(h *harness) { h.script("order", refused) },
			wantErr:  func(err error) bool { var u *UnavailableError; return errors.As(err, &u) && u.NotRun },
			outcomes: []string{"unavailable"}, calls: map[string]int{"order": 1},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, tc.tools...)
			if tc.setup != nil {
				tc.setup(h)
			}
			before := map[string]int{}
			for name, b := range h.backends {
				before[name] = b.count()
			}
			res, err := h.call(t, CallRequest{Name: tc.tools[0].Name, IdempotencyKey: "k-1"})
			var attempts []Attempt
			var ue *UnavailableError
			switch {
			case tc.wantErr != nil:
				if err == nil || !tc.wantErr(err) {
					t.Fatalf("Call = %+v, %v; want the error", res, err)
				}
				if errors.As(err, &ue) {
					attempts = ue.Attempts
				}
			case err != nil:
				t.Fatalf("Call: %v", err)
			default:
				if res.Status != tc.want {
					t.Fatalf("status %s, want %s (%+v)", statusName(res.Status), statusName(tc.want), res)
				}
				attempts = res.Attempts
			}
			if tc.outcomes != nil || tc.wantErr == nil {
				var got []string
				for _, a := range attempts {
					got = append(got, a.Outcome)
				}
				if tc.wantErr == nil || ue != nil {
					if !equal(got, tc.outcomes) {
						t.Errorf("attempts %q, want %q", got, tc.outcomes)
					}
				}
			}
			for name, want := range tc.calls {
				if got := h.backends[name].count() - before[name]; got != want {
					t.Errorf("%s backend called %d times, want %d", name, got, want)
				}
			}
			if tc.check != nil {
				tc.check(t, res)
			}
		})
	}
}

func action(name string) ToolConfig {
	tc := validTool(name)
	tc.Kind = KindAction
	return tc
}

func argsDigest(t *testing.T, args string) string {
	t.Helper()
	_, canonical, err := parseArguments(args, argLimits{bytes: 1 << 20, depth: 10, nodes: 100})
	if err != nil {
		t.Fatal(err)
	}
	return digest(canonical)
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
