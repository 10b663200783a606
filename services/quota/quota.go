package quota

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"time"

	"github.com/google/uuid"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// Stable ErrorInfo reasons of this service, beyond the shared ones in rpc; quota.proto
// documents them.
const (
	ReasonRequestTooLarge     = "REQUEST_TOO_LARGE"
	ReasonReservationNotFound = "RESERVATION_NOT_FOUND"
)

// tenantKeyPrefix namespaces tenant buckets in the Store, leaving room for the
// per-upstream-key buckets to come ("key:<id>").
const tenantKeyPrefix = "tenant:"

// Deps are what a Service needs besides its Config; the module fills them from app.Env.
type Deps struct {
	Store   Store
	Clock   clockwork.Clock
	Metrics prometheus.Registerer
	Log     *slog.Logger
	// Events receives a QuotaRejectionEvent per refusal; nil publishes nothing.
	Events app.Publisher
}

// Service is the quota domain: it decides admission and keeps reservations honest.
// It knows nothing about gRPC; server.go adapts it. Its Run method is the sweeper.
type Service struct {
	cfg     Config
	store   Store
	clock   clockwork.Clock
	log     *slog.Logger
	events  app.Publisher
	metrics *metrics
}

// NewService validates cfg and builds a Service.
func NewService(cfg Config, deps Deps) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid config: %w", err)
	}
	if deps.Store == nil || deps.Clock == nil || deps.Metrics == nil || deps.Log == nil {
		return nil, errors.New("missing dependency: Store, Clock, Metrics and Log are required")
	}
	m, err := newMetrics(deps.Metrics)
	if err != nil {
		return nil, err
	}
	publisher := deps.Events
	if publisher == nil {
		publisher = discardEvents{}
	}
	// The caller keeps its map; sharing it would let a later write race with readers.
	cfg.Tenants = maps.Clone(cfg.Tenants)
	return &Service{cfg: cfg, store: deps.Store, clock: deps.Clock, log: deps.Log, events: publisher, metrics: m}, nil
}

// ReserveRequest asks to admit one model call.
type ReserveRequest struct {
	Tenant    string
	RequestID string
	Priority  mantlev1.Priority
	Model     string
	// InputTokens is the caller's estimate; 0 means count Messages.
	InputTokens int64
	// MaxOutputTokens caps the answer; 0 means Config.DefaultMaxOutputTokens.
	MaxOutputTokens int64
	Messages        []Message
}

// Reserved is a granted admission.
type Reserved struct {
	ReservationID   string
	InputTokens     int64
	MaxOutputTokens int64
	// ReservedTokens = InputTokens + MaxOutputTokens, charged against TPM.
	ReservedTokens int64
	Levels         Levels
	ExpiresAt      time.Time
}

// Reserve charges one request and the request's estimated tokens against the tenant's
// buckets, all or nothing. Refusals are *ExhaustedError (retry later) or *TooLargeError
// (never retry), and each one is published as a QuotaRejectionEvent.
func (s *Service) Reserve(ctx context.Context, req ReserveRequest) (Reserved, error) {
	if err := validateReserve(req); err != nil {
		return Reserved{}, err
	}
	input := req.InputTokens
	if input == 0 {
		input = estimatorFor(req.Model).countMessages(req.Messages)
	}
	maxOutput := req.MaxOutputTokens
	if maxOutput == 0 {
		maxOutput = s.cfg.DefaultMaxOutputTokens
	}
	cost := Cost{Requests: 1, Tokens: addSaturating(input, maxOutput)}
	key := tenantKeyPrefix + req.Tenant
	limits := s.cfg.limitsFor(req.Tenant)
	now := s.clock.Now()

	// Checked here, not in the Store: a request bigger than the bucket would otherwise
	// be told to retry after a wait that never ends.
	if cost.Tokens > limits.TPM {
		field := "max_output_tokens"
		switch {
		case input > limits.TPM && req.InputTokens == 0:
			field = "messages"
		case input > limits.TPM:
			field = "input_tokens"
		}
		err := &TooLargeError{Bucket: key + ":tpm", Field: field, Cost: cost.Tokens, Limit: limits.TPM}
		s.reject(ctx, now, req, err.Bucket, 0, ReasonRequestTooLarge)
		return Reserved{}, err
	}

	res := Reservation{ID: uuid.NewString(), Cost: cost, ExpiresAt: now.Add(s.cfg.ReservationTTL)}
	levels, err := s.store.Reserve(ctx, now, key, limits, res)
	if exhausted, ok := errors.AsType[*ExhaustedError](err); ok {
		s.reject(ctx, now, req, exhausted.Bucket, exhausted.RetryAfter, rpc.ReasonQuotaExhausted)
		return Reserved{}, err
	}
	if err != nil {
		return Reserved{}, fmt.Errorf("reserve for request %q: %w", req.RequestID, err)
	}
	s.metrics.decisions.WithLabelValues(decisionGranted).Inc()
	s.metrics.reservedTokens.Add(float64(cost.Tokens))
	return Reserved{
		ReservationID:   res.ID,
		InputTokens:     input,
		MaxOutputTokens: maxOutput,
		ReservedTokens:  cost.Tokens,
		Levels:          levels,
		ExpiresAt:       res.ExpiresAt,
	}, nil
}

func validateReserve(req ReserveRequest) error {
	v := &rpc.ValidationError{}
	if req.Tenant == "" {
		v.Add("quality.tenant", "is required when the call is not authenticated")
	}
	if req.Model == "" {
		v.Add("model", "is required")
	}
	if req.InputTokens < 0 {
		v.Add("input_tokens", "must not be negative, got %d", req.InputTokens)
	}
	if req.MaxOutputTokens < 0 {
		v.Add("max_output_tokens", "must not be negative, got %d", req.MaxOutputTokens)
	}
	return v.OrNil()
}

// reject records and publishes a refusal. Publishing never blocks (app.Publisher).
func (s *Service) reject(ctx context.Context, now time.Time, req ReserveRequest, bucket string, retryAfter time.Duration, reason string) {
	decision := decisionExhausted
	if reason == ReasonRequestTooLarge {
		decision = decisionTooLarge
	}
	s.metrics.decisions.WithLabelValues(decision).Inc()
	ev := &eventsv1.QuotaRejectionEvent{
		At:        timestamppb.New(now),
		RequestId: req.RequestID,
		Tenant:    req.Tenant,
		Model:     req.Model,
		Priority:  req.Priority,
		Bucket:    bucket,
		Reason:    reason,
	}
	if retryAfter > 0 {
		ev.RetryAfter = durationpb.New(retryAfter)
	}
	s.events.Publish(ctx, events.SubjectQuota, ev)
}

// SettleRequest reports the real usage of a reservation.
type SettleRequest struct {
	Tenant        string
	RequestID     string
	ReservationID string
	// Usage is required: a missing usage report would otherwise read as "nothing used"
	// and refund the whole estimate.
	Usage *Usage
}

// Usage is what the provider billed. TotalTokens wins when set; otherwise the actual
// cost is InputTokens + OutputTokens.
type Usage struct {
	InputTokens  int64
	OutputTokens int64
	TotalTokens  int64
}

func (u Usage) total() int64 {
	if u.TotalTokens > 0 {
		return u.TotalTokens
	}
	return addSaturating(u.InputTokens, u.OutputTokens)
}

// Settle applies real usage to a reservation: the unused part of the estimate goes back
// to the TPM bucket, an overrun is charged (the balance may go negative). The RPM
// charge stands either way: the request was made.
//
// Settling is once only. A second Settle of the same reservation, or one after it
// expired, returns ErrReservationNotFound; so a retried Settle can never refund twice.
func (s *Service) Settle(ctx context.Context, req SettleRequest) (Settlement, error) {
	if err := validateSettle(req); err != nil {
		return Settlement{}, err
	}
	actual := req.Usage.total()
	settled, err := s.store.Settle(ctx, s.clock.Now(), tenantKeyPrefix+req.Tenant, s.cfg.limitsFor(req.Tenant), req.ReservationID, actual)
	if err != nil {
		return Settlement{}, fmt.Errorf("settle reservation %s for request %q: %w", req.ReservationID, req.RequestID, err)
	}
	s.metrics.settledTokens.Add(float64(actual))
	return settled, nil
}

func validateSettle(req SettleRequest) error {
	v := &rpc.ValidationError{}
	if req.Tenant == "" {
		v.Add("quality.tenant", "is required when the call is not authenticated")
	}
	if req.ReservationID == "" {
		v.Add("reservation_id", "is required")
	}
	if req.Usage == nil {
		v.Add("usage", "is required; send zeros if the call used nothing")
	} else {
		for _, f := range []struct {
			name  string
			value int64
		}{
			{"usage.input_tokens", req.Usage.InputTokens},
			{"usage.output_tokens", req.Usage.OutputTokens},
			{"usage.total_tokens", req.Usage.TotalTokens},
		} {
			if f.value < 0 {
				v.Add(f.name, "must not be negative, got %d", f.value)
			}
		}
	}
	return v.OrNil()
}

// TokenCount is the result of CountTokens.
type TokenCount struct {
	Tokens    int64
	Tokenizer string
	Exact     bool
}

// CountTokens estimates the tokens of either a chat prompt or plain text for model's
// family. An empty model uses the default (cl100k-like) estimator.
func (s *Service) CountTokens(ctx context.Context, model string, messages []Message, text string) (TokenCount, error) {
	switch {
	case len(messages) == 0 && text == "":
		return TokenCount{}, rpc.Invalid("messages", "messages or text is required")
	case len(messages) > 0 && text != "":
		return TokenCount{}, rpc.Invalid("text", "set messages or text, not both")
	}
	est := estimatorFor(model)
	tokens := est.countText(text)
	if len(messages) > 0 {
		tokens = est.countMessages(messages)
	}
	return TokenCount{Tokens: tokens, Tokenizer: est.name, Exact: false}, nil
}

// Run is the sweeper: every SweepInterval on the injected clock it deletes expired
// reservations. It returns nil when ctx is done.
func (s *Service) Run(ctx context.Context) error {
	ticker := s.clock.NewTicker(s.cfg.SweepInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.Chan():
			expired, err := s.store.Sweep(ctx, s.clock.Now())
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				// A failed sweep only delays cleanup; the next tick tries again.
				s.log.WarnContext(ctx, "sweeping expired reservations failed", "err", err)
				continue
			}
			s.metrics.expiredReservations.Add(float64(expired))
		}
	}
}

// addSaturating adds two non-negative counts, stopping at math.MaxInt64 instead of
// wrapping around to a negative (and thus tiny) cost.
func addSaturating(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

type discardEvents struct{}

func (discardEvents) Publish(context.Context, string, proto.Message) {}
