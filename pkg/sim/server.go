package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mantle-mesh/mantle/pkg/httpbody"
)

// ServerConfig configures a Server.
type ServerConfig struct {
	// Models maps model names to their profiles. Any other model name is accepted too and
	// behaves like Default; GET /v1/models lists only these names.
	Models map[string]Profile
	// Default is the profile for model names not in Models. The zero Profile answers
	// instantly and never fails.
	Default Profile
	// Clock drives latencies and phases; nil means the real clock. Phases are measured
	// from NewServer's call on this clock.
	Clock clockwork.Clock
	// Seed seeds the random outcomes of every model whose profile has no Seed of its own.
	// Each model name gets its own generator (seeded from Seed and the name), so one
	// model's sequence does not depend on traffic to the others. The same seed gives the
	// same run; pass a varying seed for varied runs.
	Seed int64
	// Log receives one debug record per call; nil discards them.
	Log *slog.Logger
}

// Server is the simulated provider. It implements http.Handler and serves
// POST /v1/chat/completions and GET /v1/models. It is safe for concurrent use.
type Server struct {
	clock    clockwork.Clock
	start    time.Time
	seed     int64
	log      *slog.Logger
	profiles map[string]Profile
	fallback Profile
	seq      atomic.Uint64

	mu          sync.Mutex
	models      map[string]*model
	badRequests int64

	// onPlan, when set (by tests, before serving), is called once a call's outcome is
	// decided and before the call waits, so a test knows the handler reached its fault.
	onPlan func(model string, o Outcome)
}

var _ http.Handler = (*Server)(nil)

// NewServer returns a Server for cfg. Profiles are used as given; validate ones that come
// from users (LoadProfile and Builtin already do).
func NewServer(cfg ServerConfig) *Server {
	clock := cfg.Clock
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{
		clock:    clock,
		start:    clock.Now(),
		seed:     cfg.Seed,
		log:      log,
		profiles: maps.Clone(cfg.Models),
		fallback: cfg.Default,
		models:   make(map[string]*model),
	}
}

// Stats is a snapshot of what a Server has answered.
type Stats struct {
	// Models is keyed by the model name clients asked for.
	Models map[string]ModelStats
	// BadRequests counts chat requests rejected with 400 before reaching a model.
	BadRequests int64
}

// ModelStats counts the calls to one model name.
type ModelStats struct {
	// Calls is every chat completion call, whatever its outcome: the number of upstream
	// calls a drill made.
	Calls int64
	// Streams is how many of Calls asked for a stream.
	Streams int64
	// InFlight is how many calls are still being handled.
	InFlight int64
	// Outcomes counts Calls by outcome.
	Outcomes map[Outcome]int64
	// Billed counts calls a real provider would charge for: those that generated tokens
	// (normal answers, refusals, truncated, malformed and cut or stalled streams).
	Billed int64
	// DuplicateBilled counts billed calls whose Idempotency-Key had already been billed on
	// this model: the money lost to retries without idempotency (the reference incident's bill was 3.2x
	// normal). Calls without the header are not tracked.
	DuplicateBilled int64
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	st := Stats{Models: make(map[string]ModelStats, len(s.models)), BadRequests: s.badRequests}
	models := maps.Clone(s.models)
	s.mu.Unlock()
	for name, m := range models {
		m.mu.Lock()
		ms := m.stats
		ms.Outcomes = maps.Clone(m.stats.Outcomes)
		m.mu.Unlock()
		st.Models[name] = ms
	}
	return st
}

// ServeHTTP routes the OpenAI endpoints the simulator implements.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := fmt.Sprintf("req_sim_%08d", s.seq.Add(1))
	w.Header().Set("x-request-id", id)
	switch r.URL.Path {
	case "/v1/chat/completions":
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeJSON(w, http.StatusMethodNotAllowed, newError("use POST", "invalid_request_error", "method_not_allowed"))
			return
		}
		s.chat(w, r, id)
	case "/v1/models":
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			writeJSON(w, http.StatusMethodNotAllowed, newError("use GET", "invalid_request_error", "method_not_allowed"))
			return
		}
		s.listModels(w)
	default:
		writeJSON(w, http.StatusNotFound, newError("unknown URL "+r.URL.Path, "invalid_request_error", "unknown_url"))
	}
}

func (s *Server) listModels(w http.ResponseWriter) {
	list := modelList{Object: "list", Data: []modelInfo{}}
	created := s.start.Unix()
	for _, name := range slices.Sorted(maps.Keys(s.profiles)) {
		list.Data = append(list.Data, modelInfo{ID: name, Object: "model", Created: created, OwnedBy: "mantle-sim"})
	}
	writeJSON(w, http.StatusOK, list)
}

// maxBody bounds what a request may send; real prompts are far smaller.
const maxBody = 8 << 20

func (s *Server) decode(w http.ResponseWriter, r *http.Request) (*chatRequest, error) {
	// Reading to EOF matters beyond decoding: net/http only starts watching the connection
	// for a client that goes away (cancelling r.Context()) once the body is consumed.
	body, err := httpbody.Request(w, r, maxBody)
	if err != nil {
		return nil, fmt.Errorf("reading body: %w", err)
	}
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, fmt.Errorf("body is not a chat completion request: %w", err)
	}
	if req.Model == "" {
		return nil, errors.New("you must provide a model parameter")
	}
	if len(req.Messages) == 0 {
		return nil, errors.New("messages must not be empty")
	}
	return &req, nil
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request, id string) {
	req, err := s.decode(w, r)
	if err != nil {
		s.mu.Lock()
		s.badRequests++
		s.mu.Unlock()
		writeJSON(w, http.StatusBadRequest, newError(err.Error(), "invalid_request_error", ""))
		return
	}
	m := s.model(req.Model)
	c := m.plan(s.clock.Now(), s.clock.Since(s.start), req, r.Header.Get("Idempotency-Key"))
	defer m.done()
	s.log.Debug("sim call", "model", req.Model, "profile", m.profile.Name, "phase", c.phase,
		"outcome", c.outcome, "stream", req.Stream, "request_id", id)
	if s.onPlan != nil {
		s.onPlan(req.Model, c.outcome)
	}
	x := &exchange{s: s, w: w, r: r, req: req, call: c, id: id}
	x.run()
}

// model returns the state of a model name, creating it on first use.
func (s *Server) model(name string) *model {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m, ok := s.models[name]; ok {
		return m
	}
	p, ok := s.profiles[name]
	if !ok {
		p = s.fallback
	}
	seed := s.seed
	if p.Seed != 0 {
		seed = p.Seed
	}
	h := fnv.New64a()
	h.Write([]byte(name))
	m := &model{
		profile: p,
		rng:     rand.New(rand.NewPCG(uint64(seed), h.Sum64())),
		stats:   ModelStats{Outcomes: make(map[Outcome]int64)},
	}
	s.models[name] = m
	return m
}

// model is the mutable state behind one model name. Handlers run concurrently, and
// math/rand generators are not safe for concurrent use, so everything here is guarded by mu.
type model struct {
	profile Profile

	mu     sync.Mutex
	rng    *rand.Rand
	window rateWindow
	stats  ModelStats
	billed keySet
}

// call is everything decided about one call when it arrives. Deciding it all at once,
// under the lock and with a fixed number of draws, is what makes a seeded run reproducible
// whatever the request asks for and however long earlier calls take.
type call struct {
	outcome    Outcome
	phase      string
	profile    string
	latency    time.Duration
	ttft       time.Duration
	tokenDelay time.Duration
	retryAfter time.Duration
	limits     limitHeaders
	created    int64
}

func (m *model) plan(now time.Time, elapsed time.Duration, req *chatRequest, idemKey string) call {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.profile
	set := p.settingsAt(elapsed)
	uOutcome, uLatency, uTTFT := m.rng.Float64(), m.rng.Float64(), m.rng.Float64()

	outcome := set.errors.pick(uOutcome)
	if n := m.stats.Calls; n < int64(len(p.Script)) {
		outcome = p.Script[n]
	}
	c := call{
		outcome:    outcome,
		phase:      set.phase,
		profile:    p.Name,
		latency:    p.scaled(set.latency.Quantile(uLatency)),
		ttft:       p.scaled(set.ttft.Quantile(uTTFT)),
		tokenDelay: p.scaled(set.tokenDelay),
		retryAfter: p.retryAfter(),
		created:    now.Unix(),
	}
	req.opening = p.Opening
	cost := int64(req.promptTokens() + estimateTokens(req.answer()))
	admitted, limits := m.window.admit(now, p.RateLimit, p.scaled(time.Minute), cost, c.outcome)
	c.limits = limits
	if !admitted {
		c.outcome, c.retryAfter = OutcomeRateLimited, limits.reset
	}

	m.stats.Calls++
	if req.Stream {
		m.stats.Streams++
	}
	m.stats.InFlight++
	m.stats.Outcomes[c.outcome]++
	if billed(c.outcome) {
		m.stats.Billed++
		if idemKey != "" && !m.billed.add(idemKey) {
			m.stats.DuplicateBilled++
		}
	}
	return c
}

func (m *model) done() {
	m.mu.Lock()
	m.stats.InFlight--
	m.mu.Unlock()
}

func billed(o Outcome) bool {
	switch o {
	case OutcomeOK, OutcomeRefusal, OutcomeTruncated, OutcomeMalformedJSON, OutcomeStreamCut, OutcomeStreamStall,
		OutcomeContentFilterFinish, OutcomeStreamNoDone:
		return true
	}
	return false
}

// rateWindow counts one fixed window of a simulated per-minute limit.
type rateWindow struct {
	start    time.Time
	requests int64
	tokens   int64
}

// limitHeaders is what the x-ratelimit-* headers of one answer say.
type limitHeaders struct {
	known                              bool
	limitRequests, limitTokens         int64
	remainingRequests, remainingTokens int64
	reset                              time.Duration
}

// admit counts a call against the window and reports whether it fits. Calls the error mix
// already rejects with a 429 are not counted: a provider does not charge capacity for
// requests it turned away.
func (w *rateWindow) admit(now time.Time, rl RateLimit, length time.Duration, cost int64, o Outcome) (bool, limitHeaders) {
	if rl.RequestsPerMinute == 0 && rl.TokensPerMinute == 0 {
		return true, limitHeaders{}
	}
	if w.start.IsZero() || now.Sub(w.start) >= length {
		*w = rateWindow{start: now}
	}
	reqLimit, tokLimit := rl.RequestsPerMinute, rl.TokensPerMinute
	fits := (reqLimit == 0 || w.requests+1 <= reqLimit) && (tokLimit == 0 || w.tokens+cost <= tokLimit)
	if fits && o != OutcomeRateLimited && o != OutcomeRateLimitedNoHint {
		w.requests++
		w.tokens += cost
	}
	h := limitHeaders{
		known:             true,
		limitRequests:     reqLimit,
		limitTokens:       tokLimit,
		remainingRequests: max(0, reqLimit-w.requests),
		remainingTokens:   max(0, tokLimit-w.tokens),
		reset:             length - now.Sub(w.start),
	}
	if !fits {
		h.remainingRequests, h.remainingTokens = 0, 0
	}
	return fits, h
}

// keySet remembers recently billed idempotency keys, bounded so a long-running simulator
// does not grow without limit; the oldest keys are forgotten first.
type keySet struct {
	seen  map[string]struct{}
	order []string
}

const keySetCap = 1 << 16

// add records key and reports whether it was new.
func (k *keySet) add(key string) bool {
	if k.seen == nil {
		k.seen = make(map[string]struct{})
	}
	if _, ok := k.seen[key]; ok {
		return false
	}
	if len(k.order) == keySetCap {
		delete(k.seen, k.order[0])
		k.order = k.order[1:]
	}
	k.seen[key] = struct{}{}
	k.order = append(k.order, key)
	return true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Only the package's own wire types are written; they always marshal.
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
