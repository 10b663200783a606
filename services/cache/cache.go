package cache

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// ErrNoTenant is returned when a call names no tenant. Entries are always scoped to one,
// so nothing can be looked up, stored or removed without it.
var ErrNoTenant = errors.New("no tenant")

const roleUser = "user"

// Prompt is everything that decides whether two requests may share an answer.
type Prompt struct {
	Scenario       string
	Model          string
	Messages       []Message
	Temperature    *float64 // nil: the provider's default
	MaxTokens      int32    // 0: the provider's default
	ResponseFormat ResponseFormat
}

// Message is one conversation turn.
type Message struct {
	Role    string
	Name    string
	Content string
}

// FormatType is the requested shape of the answer.
type FormatType string

// Format types. The empty FormatType means text.
const (
	FormatText       FormatType = "text"
	FormatJSONObject FormatType = "json_object"
	FormatJSONSchema FormatType = "json_schema"
)

// ResponseFormat asks for structured output.
type ResponseFormat struct {
	Type           FormatType
	JSONSchema     string
	RequiredFields []string
}

// typeOrText treats an unset type as text, which is what providers answer with.
func (f ResponseFormat) typeOrText() FormatType {
	if f.Type == "" {
		return FormatText
	}
	return f.Type
}

// StoreRequest is an answer offered to the cache.
type StoreRequest struct {
	Prompt       Prompt
	Content      string
	SourceModel  string
	FinishReason string
	Usage        Usage
	// TTL shortens the policy's TTL; zero uses it. It cannot lengthen it.
	TTL time.Duration
	// VerificationFailed, Degraded and FromCache describe where the answer came from
	// (the request's QualityContext); each keeps it out of the cache.
	VerificationFailed bool
	Degraded           bool
	FromCache          bool
}

// StoreResult says whether the answer was stored, under which id, or why not.
type StoreResult struct {
	Stored        bool
	EntryID       string
	SkippedReason SkipReason
}

// InvalidateRequest selects the tenant's entries to remove. Scenario and EntryID narrow
// the selection; All must be set to remove the whole tenant, so a request with every
// field forgotten removes nothing.
type InvalidateRequest struct {
	Tenant   string
	Scenario string
	EntryID  string
	All      bool
}

// Service is the exact-match cache: it derives keys, applies the store policy, and keeps
// entries in an Index. It is safe for concurrent use.
type Service struct {
	index         Index
	clock         clockwork.Clock
	defaultPolicy policy
	scenarios     map[string]policy
	metrics       *metrics
}

// NewService returns a Service over index, with metrics registered on reg.
func NewService(cfg Config, index Index, clock clockwork.Clock, reg prometheus.Registerer) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	scenarios := make(map[string]policy, len(cfg.Scenarios))
	for name, override := range cfg.Scenarios {
		scenarios[name] = compilePolicy(cfg.DefaultPolicy.with(override))
	}
	return &Service{
		index:         index,
		clock:         clock,
		defaultPolicy: compilePolicy(cfg.DefaultPolicy),
		scenarios:     scenarios,
		metrics:       m,
	}, nil
}

// Lookup returns the tenant's live entry for p. A miss is (Entry{}, false, nil).
func (s *Service) Lookup(ctx context.Context, tenant string, p Prompt) (Entry, bool, error) {
	if tenant == "" {
		return Entry{}, false, ErrNoTenant
	}
	if err := validatePrompt(p).OrNil(); err != nil {
		return Entry{}, false, err
	}
	key, _ := deriveKey(tenant, p)
	e, hit, err := s.index.Get(ctx, key, s.clock.Now())
	if err != nil {
		return Entry{}, false, fmt.Errorf("get %s: %w", key, err)
	}
	if hit {
		s.metrics.hits.Inc()
	} else {
		s.metrics.misses.Inc()
	}
	return e, hit, nil
}

// Store records req's answer for tenant unless the scenario's policy forbids it; a
// forbidden answer is a StoreResult with a SkippedReason, not an error.
func (s *Service) Store(ctx context.Context, tenant string, req StoreRequest) (StoreResult, error) {
	if tenant == "" {
		return StoreResult{}, ErrNoTenant
	}
	invalid := validatePrompt(req.Prompt)
	if req.Content == "" {
		invalid.Add("content", "required")
	}
	if req.TTL < 0 {
		invalid.Add("ttl", "must not be negative, got %s", req.TTL)
	}
	if err := invalid.OrNil(); err != nil {
		return StoreResult{}, err
	}

	key, lastUser := deriveKey(tenant, req.Prompt)
	pol := s.policyFor(req.Prompt.Scenario)
	if reason := pol.skipReason(req, lastUser); reason != "" {
		s.metrics.stores.WithLabelValues(string(reason)).Inc()
		return StoreResult{SkippedReason: reason}, nil
	}

	ttl := pol.ttl
	if req.TTL > 0 && req.TTL < ttl {
		ttl = req.TTL
	}
	now := s.clock.Now()
	e := Entry{
		ID:           rand.Text(),
		Key:          key,
		Tenant:       tenant,
		Scenario:     req.Prompt.Scenario,
		Content:      req.Content,
		SourceModel:  req.SourceModel,
		FinishReason: req.FinishReason,
		Usage:        req.Usage,
		CreatedAt:    now,
		ExpiresAt:    now.Add(ttl),
	}
	if err := s.index.Put(ctx, e); err != nil {
		return StoreResult{}, fmt.Errorf("put %s: %w", key, err)
	}
	s.metrics.stores.WithLabelValues(outcomeStored).Inc()
	return StoreResult{Stored: true, EntryID: e.ID}, nil
}

// Invalidate removes the entries req selects and returns how many it removed.
func (s *Service) Invalidate(ctx context.Context, req InvalidateRequest) (int, error) {
	if req.Tenant == "" {
		return 0, ErrNoTenant
	}
	if !req.All && req.Scenario == "" && req.EntryID == "" {
		return 0, rpc.Invalid("all", "set scenario, entry_id, or all to remove every entry of the tenant")
	}
	removed, err := s.index.Delete(ctx, Filter{Tenant: req.Tenant, Scenario: req.Scenario, ID: req.EntryID})
	if err != nil {
		return 0, fmt.Errorf("delete: %w", err)
	}
	return removed, nil
}

func (s *Service) policyFor(scenario string) policy {
	if p, ok := s.scenarios[scenario]; ok {
		return p
	}
	return s.defaultPolicy
}

// validatePrompt collects what makes p unusable as a key. Field paths follow the proto
// (prompt.messages[2].role), so callers can point at the offending field.
func validatePrompt(p Prompt) *rpc.ValidationError {
	invalid := &rpc.ValidationError{}
	if len(p.Messages) == 0 {
		invalid.Add("prompt.messages", "must not be empty")
	} else {
		last := len(p.Messages) - 1
		if role := p.Messages[last].Role; role != roleUser {
			invalid.Add(fmt.Sprintf("prompt.messages[%d].role", last), "the last message must be from the user, got %q", role)
		}
		if p.Messages[last].Content == "" {
			invalid.Add(fmt.Sprintf("prompt.messages[%d].content", last), "required")
		}
	}
	if t := p.Temperature; t != nil && (*t < 0 || math.IsNaN(*t) || math.IsInf(*t, 0)) {
		invalid.Add("prompt.temperature", "must be a non-negative number, got %v", *t)
	}
	if p.MaxTokens < 0 {
		invalid.Add("prompt.max_tokens", "must not be negative, got %d", p.MaxTokens)
	}
	return invalid
}
