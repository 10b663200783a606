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
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/proto"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/quota/internal/admission"
	"github.com/mantle-mesh/mantle/services/quota/internal/ledger"
	"github.com/mantle-mesh/mantle/services/quota/internal/tokencount"
)

// Stable ErrorInfo reasons of this service, beyond the shared ones in rpc; quota.proto
// documents them.
const (
	reasonRequestTooLarge     = "REQUEST_TOO_LARGE"
	reasonReservationNotFound = "RESERVATION_NOT_FOUND"
	reasonPriceUnknown        = "PRICE_UNKNOWN"
	reasonBudgetUnavailable   = "BUDGET_UNAVAILABLE"
	reasonUnavailable         = "UNAVAILABLE"
)

// serviceDeps are what a Service needs besides its Config; the module fills them from app.Env.
type serviceDeps struct {
	Store   stateStore
	Clock   clockwork.Clock
	Metrics prometheus.Registerer
	Log     *slog.Logger
	// Events receives rejection and near-limit events; nil publishes nothing.
	Events app.Publisher
}

// service is the quota domain: it decides admission and keeps reservations honest.
// It knows nothing about gRPC; server.go adapts it. Its Run method runs the sweeper,
// the queue's dispatcher and the store's background work.
type service struct {
	cfg     Config
	store   stateStore
	clock   clockwork.Clock
	log     *slog.Logger
	events  app.Publisher
	metrics *metrics
	queue   *admission.Queue
	tokens  *tokencount.Counter
	signals *signals
	// seen are the tenants this replica admitted, for DescribeUsage.
	seen seenTenants
}

// newService validates cfg and builds a Service.
func newService(cfg Config, deps serviceDeps) (*service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid config: %w", err)
	}
	if deps.Store == nil || deps.Clock == nil || deps.Metrics == nil || deps.Log == nil {
		return nil, errors.New("missing dependency: Store, Clock, Metrics and Log are required")
	}
	m, err := newMetrics(deps.Metrics, configuredTenants(cfg))
	if err != nil {
		return nil, err
	}
	publisher := deps.Events
	if publisher == nil {
		publisher = discardEvents{}
	}
	// The caller keeps its maps; sharing them would let a later write race with readers.
	cfg.Tenants = maps.Clone(cfg.Tenants)
	cfg.ModelLimits = maps.Clone(cfg.ModelLimits)
	cfg.UpstreamKeys = maps.Clone(cfg.UpstreamKeys)
	cfg.Budgets.Tenants = maps.Clone(cfg.Budgets.Tenants)
	cfg.Budgets.Prices = maps.Clone(cfg.Budgets.Prices)
	cfg.Queue.Weights = maps.Clone(cfg.Queue.Weights)
	s := &service{
		cfg: cfg, store: deps.Store, clock: deps.Clock, log: deps.Log, events: publisher, metrics: m,
		tokens:  tokencount.NewCounter(tokencount.Config(cfg.Tokens)),
		signals: newSignals(cfg.NearLimitRatio),
	}
	s.queue = admission.New(admission.Config{
		Size: cfg.Queue.Size, MaxWait: cfg.Queue.MaxWait, DeadlineMargin: cfg.Queue.DeadlineMargin, Weights: cfg.Queue.Weights,
	}, deps.Store, deps.Clock, admission.Metrics{Length: m.queueLength, Wait: m.queueWait, Shed: m.queueShed}, s.release)
	if a, ok := deps.Store.(interface{ attach(*metrics) }); ok {
		a.attach(m)
	}
	return s, nil
}

// reserveRequest asks to admit one model call.
type reserveRequest struct {
	Tenant    string
	RequestID string
	Priority  mantlev1.Priority
	Model     string
	// InputTokens is the caller's estimate; 0 means count Messages.
	InputTokens int64
	// MaxOutputTokens caps the answer; 0 means Config.DefaultMaxOutputTokens.
	MaxOutputTokens int64
	Messages        []tokencount.Message
	// Tools are the tools the request offers: counted with Messages.
	Tools []*mantlev1.Tool
	// UpstreamKey is the provider key the call will use; its buckets are charged when
	// it is configured.
	UpstreamKey string
	// KeyOnly charges only the upstream key's buckets (a further attempt of a request
	// that already holds a reservation).
	KeyOnly bool
}

// reserveOutcome is a granted admission.
type reserveOutcome struct {
	ReservationID   string
	InputTokens     int64
	MaxOutputTokens int64
	// ReservedTokens = InputTokens + MaxOutputTokens, charged against the token buckets.
	ReservedTokens int64
	// Levels are the tenant's RPM and TPM (the key's, for KeyOnly).
	Levels levelPair
	// Buckets are every bucket the decision looked at, in charge order.
	Buckets   []ledger.BucketLevel
	Budget    *ledger.BudgetLevel
	ExpiresAt time.Time
	Waited    time.Duration
}

// levelPair are a pair of request and token buckets.
type levelPair struct {
	Requests ledger.BucketLevel
	Tokens   ledger.BucketLevel
}

// Reserve charges the request's estimated tokens against every applicable bucket, all
// or nothing, waiting in the priority queue when a bucket is short and the caller's
// deadline allows. Refusals are *ExhaustedError (retry later), *TooLargeError (never
// retry), *PriceUnknownError or ErrBudgetUnavailable; each one is published as a
// QuotaRejectionEvent.
func (s *service) Reserve(ctx context.Context, req reserveRequest) (reserveOutcome, error) {
	start := s.clock.Now()
	if err := validateReserve(req); err != nil {
		return reserveOutcome{}, err
	}
	input, meta := req.InputTokens, ledger.ReservationMeta{Model: req.Model, UpstreamKey: req.UpstreamKey}
	if input == 0 {
		count := s.tokens.Count(req.Model, req.Messages, req.Tools, "", true)
		input = count.Tokens
		if count.Estimated() {
			meta.EstimatedInput = count.Raw
		}
	}
	maxOutput := req.MaxOutputTokens
	if maxOutput == 0 {
		maxOutput = s.cfg.DefaultMaxOutputTokens
	}
	tokens := addSaturating(input, maxOutput)
	class := admission.ClassOf(req.Priority)

	charge, err := s.chargeFor(req, input, maxOutput, tokens)
	if err == nil {
		err = s.checkSize(req, charge, input)
	}
	if err != nil {
		s.refused(ctx, start, req, err)
		return reserveOutcome{}, err
	}
	charge.Meta = meta
	adm := &admission.Request{Tenant: req.Tenant, Class: class, Tokens: tokens, Charge: charge}
	for _, b := range charge.Buckets {
		if !b.Shadow {
			adm.Buckets = append(adm.Buckets, b.Name())
		}
	}
	if bc := charge.Budget; bc != nil && !bc.Shadow {
		adm.Buckets = append(adm.Buckets, bc.Group+":budget")
	}

	g, waited, err := s.queue.Admit(ctx, adm)
	if err != nil {
		if e, ok := errors.AsType[*ledger.ExhaustedError](err); ok && waited > 0 {
			refusal := *e // the caller learns the wait was deliberate, not quota's slowness
			refusal.Waited = waited
			err = &refusal
		}
		s.refused(ctx, start, req, err)
		if errors.Is(err, ledger.ErrExhausted) || errors.Is(err, errBudgetUnavailable) || errors.Is(err, errShuttingDown) || ctx.Err() != nil {
			return reserveOutcome{}, err
		}
		return reserveOutcome{}, fmt.Errorf("reserve for request %q: %w", req.RequestID, err)
	}

	s.metrics.grantedCounter(req.Tenant, class).Inc()
	s.metrics.grantedSeconds.Observe(s.clock.Since(start).Seconds())
	s.metrics.reservedTokens.Add(float64(tokens))
	if !req.KeyOnly {
		s.seen.add(req.Tenant, g.At)
	}
	s.store.CountRequest(ctx, req.UpstreamKey, !req.KeyOnly, s.cfg.RetryBudget.Window)
	s.signalLevels(ctx, g.At, req.RequestID, req.Tenant, req.Model, req.UpstreamKey, req.Priority, g.Levels, g.Budget, charge.Budget)

	out := reserveOutcome{
		ReservationID:   charge.ID,
		InputTokens:     input,
		MaxOutputTokens: maxOutput,
		ReservedTokens:  tokens,
		Buckets:         g.Levels,
		Budget:          g.Budget,
		ExpiresAt:       g.ExpiresAt,
		Waited:          waited,
	}
	out.Levels = pairOf(g.Levels)
	return out, nil
}

// pairOf picks the RPM and TPM levels for the response's Limits: the first group's,
// which is the tenant's unless only an upstream key was charged.
func pairOf(levels []ledger.BucketLevel) levelPair {
	var out levelPair
	if len(levels) == 0 {
		return out
	}
	group := levels[0].Group
	for _, l := range levels {
		if l.Group != group {
			continue
		}
		switch l.Field {
		case ledger.FieldRPM:
			out.Requests = l
		case ledger.FieldTPM:
			out.Tokens = l
		}
	}
	return out
}

// chargeFor resolves the request against the config: which buckets apply, with which
// limits and costs.
func (s *service) chargeFor(req reserveRequest, input, maxOutput, tokens int64) (ledger.Charge, error) {
	c := ledger.Charge{ID: uuid.NewString(), Tenant: req.Tenant, TTL: s.cfg.ReservationTTL, Tokens: tokens, Buckets: make([]ledger.BucketSpec, 0, 4)}
	if !req.KeyOnly {
		group := ledger.TenantGroup(req.Tenant)
		rpm, tpm := s.cfg.tenantLimits(req.Tenant)
		c.Buckets = append(c.Buckets,
			ledger.NewSpec(group, ledger.FieldRPM, ledger.KindRequests, 1, rpm.limit, rpm.shadow),
			ledger.NewSpec(group, ledger.FieldTPM, ledger.KindTokens, tokens, tpm.limit, tpm.shadow),
		)
		if ml, ok := s.cfg.modelLimits(req.Tenant, req.Model); ok {
			m := "model:" + tokencount.NormalizeModel(req.Model) + ":"
			if ml.RPM > 0 {
				c.Buckets = append(c.Buckets, ledger.NewSpec(group, m+ledger.FieldRPM, ledger.KindRequests, 1, ml.RPM, ml.Shadow))
			}
			if ml.TPM > 0 {
				c.Buckets = append(c.Buckets, ledger.NewSpec(group, m+ledger.FieldTPM, ledger.KindTokens, tokens, ml.TPM, ml.Shadow))
			}
		}
		if b, ok := s.cfg.Budgets.Tenants[req.Tenant]; ok {
			price, ok := s.cfg.Budgets.price(req.Model)
			switch {
			case ok:
				p := nanoPriceOf(price)
				c.Budget = &ledger.BudgetCharge{
					Group: group, Limit: dollarsToNano(b.DailyUSD), Shadow: b.Shadow, DayOffset: s.cfg.Budgets.DayOffset, Price: p,
					Cost: ledger.ClampUsage(input)*p.Input + ledger.ClampUsage(maxOutput)*p.Output,
				}
			case !b.Shadow:
				return ledger.Charge{}, &priceUnknownError{Model: req.Model}
			}
		}
	}
	if req.UpstreamKey != "" {
		if kl, ok := s.cfg.UpstreamKeys[req.UpstreamKey]; ok {
			group := ledger.KeyGroup(req.UpstreamKey)
			if kl.RPM > 0 {
				c.Buckets = append(c.Buckets, ledger.NewSpec(group, ledger.FieldRPM, ledger.KindRequests, 1, kl.RPM, kl.Shadow))
			}
			if kl.TPM > 0 {
				c.Buckets = append(c.Buckets, ledger.NewSpec(group, ledger.FieldTPM, ledger.KindTokens, tokens, kl.TPM, kl.Shadow))
			}
		}
	}
	return c, nil
}

// checkSize refuses at once a request that an enforced bucket or budget could never
// cover: it would otherwise be told to retry after a wait that never ends. Shadow rules
// are left to the Store, which reports them as shadow refusals.
func (s *service) checkSize(req reserveRequest, c ledger.Charge, input int64) error {
	for _, b := range c.Buckets {
		if b.Shadow || b.Cost <= b.Limit {
			continue
		}
		field := "max_output_tokens"
		switch {
		case input > b.Limit && req.InputTokens == 0:
			field = "messages"
		case input > b.Limit:
			field = "input_tokens"
		}
		return &tooLargeError{Bucket: b.Name(), Field: field, Cost: b.Cost, Limit: b.Limit}
	}
	if bc := c.Budget; bc != nil && !bc.Shadow && bc.Cost > bc.Limit {
		return &tooLargeError{Bucket: bc.Group + ":budget", Field: "max_output_tokens", Cost: bc.Cost, Limit: bc.Limit}
	}
	return nil
}

func validateReserve(req reserveRequest) error {
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
	if req.KeyOnly && req.UpstreamKey == "" {
		v.Add("upstream_key_id", "is required with scope RESERVE_SCOPE_UPSTREAM_KEY")
	}
	return v.OrNil()
}

// release returns everything a grant took; the queue calls it for grants whose caller
// left. Failing only delays the capacity's return until the reservation expires.
func (s *service) release(c ledger.Charge) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := s.store.Settle(ctx, c.Tenant, c.ID, ledger.Actual{}, true); err != nil {
		s.log.Warn("releasing an unused reservation failed; it will expire", "reservation", c.ID, "err", err)
	}
	s.queue.Poke()
}

// settleRequest reports the real usage of a reservation.
type settleRequest struct {
	Tenant        string
	RequestID     string
	ReservationID string
	// Usage is required: a missing usage report would otherwise read as "nothing used"
	// and refund the whole estimate.
	Usage *tokenUsage
}

// tokenUsage is what the provider billed. TotalTokens wins when set; otherwise the actual
// cost is InputTokens + OutputTokens.
type tokenUsage struct {
	InputTokens  int64
	OutputTokens int64
	TotalTokens  int64
}

func (u tokenUsage) total() int64 {
	if u.TotalTokens > 0 {
		return u.TotalTokens
	}
	return addSaturating(u.InputTokens, u.OutputTokens)
}

// settleResult is the outcome of Settle.
type settleResult struct {
	// Reserved is what the reservation held; Refunded is Reserved minus the actual
	// tokens: positive when tokens went back, negative when the overrun was charged.
	Reserved, Refunded int64
	// Levels are the tenant's RPM and TPM after the correction (the key's, for a
	// key-only reservation).
	Levels  levelPair
	Buckets []ledger.BucketLevel
	CostUSD float64
}

// Settle applies real usage to a reservation: the unused part of the estimate goes back
// to every token bucket it charged, an overrun is charged (balances may go negative).
// Request counts stand either way: the request was made. So for any reservation,
// reserved - refunded = actual usage.
//
// Settling is once only. A second Settle of the same reservation, or one after it
// expired, returns ErrReservationNotFound; so a retried Settle can never refund twice.
func (s *service) Settle(ctx context.Context, req settleRequest) (settleResult, error) {
	if err := validateSettle(req); err != nil {
		return settleResult{}, err
	}
	actual := ledger.Actual{Tokens: req.Usage.total(), Input: req.Usage.InputTokens, Output: req.Usage.OutputTokens}
	st, err := s.store.Settle(ctx, req.Tenant, req.ReservationID, actual, false)
	if err != nil {
		return settleResult{}, fmt.Errorf("settle reservation %s for request %q: %w", req.ReservationID, req.RequestID, err)
	}
	s.metrics.settledTokens.Add(float64(actual.Tokens))
	if st.Refunded > 0 {
		s.metrics.refundedTokens.Add(float64(st.Refunded))
		if s.queue.Waiting() > 0 {
			s.queue.Poke() // capacity came back: waiters may fit now
		}
	} else {
		s.metrics.extraTokens.Add(float64(-st.Refunded))
	}
	if st.Meta.EstimatedInput > 0 && req.Usage.InputTokens > 0 {
		if f, ok := s.tokens.Learn(st.Meta.Model, st.Meta.EstimatedInput, req.Usage.InputTokens); ok {
			s.metrics.correction.WithLabelValues(tokencount.FamilyName(st.Meta.Model)).Set(f)
		}
	}
	s.signalLevels(ctx, st.At, req.RequestID, req.Tenant, st.Meta.Model, st.Meta.UpstreamKey, mantlev1.Priority_PRIORITY_UNSPECIFIED, st.Levels, nil, nil)
	return settleResult{Reserved: st.Reserved, Refunded: st.Refunded, Levels: pairOf(st.Levels), Buckets: st.Levels, CostUSD: nanoToDollars(st.CostNano)}, nil
}

func validateSettle(req settleRequest) error {
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

// CountTokens counts the tokens of either a chat prompt (messages and the tools offered
// with them) or plain text for model's family: exactly for OpenAI encodings, estimated
// (and corrected by what providers reported) for others; images by the provider's rule.
// An empty model uses the generic estimator. Reserve counts a prompt the same way.
func (s *service) CountTokens(_ context.Context, model string, messages []tokencount.Message, tools []*mantlev1.Tool, text string) (tokencount.Count, error) {
	switch {
	case len(messages) == 0 && text == "":
		return tokencount.Count{}, rpc.Invalid("messages", "messages or text is required")
	case len(messages) > 0 && text != "":
		return tokencount.Count{}, rpc.Invalid("text", "set messages or text, not both")
	case len(tools) > 0 && text != "":
		return tokencount.Count{}, rpc.Invalid("tools", "tools are counted with messages, not with text")
	}
	return s.tokens.Count(model, messages, tools, text, len(messages) > 0), nil
}

// upstreamObservation is what a provider's rate-limit headers said about a key.
type upstreamObservation struct {
	Key string
	// RemainingRequests and RemainingTokens are -1 when unknown.
	RemainingRequests, RemainingTokens int64
	ResetRequests, ResetTokens         time.Duration
}

// ObserveUpstream lowers a configured key's buckets to what the provider reported. It
// reports false for keys without buckets, which are left alone.
func (s *service) ObserveUpstream(ctx context.Context, o upstreamObservation) (bool, levelPair, error) {
	v := &rpc.ValidationError{}
	if o.Key == "" {
		v.Add("upstream_key_id", "is required")
	}
	if o.RemainingRequests < -1 {
		v.Add("remaining_requests", "must be -1 (unknown) or more, got %d", o.RemainingRequests)
	}
	if o.RemainingTokens < -1 {
		v.Add("remaining_tokens", "must be -1 (unknown) or more, got %d", o.RemainingTokens)
	}
	if o.ResetRequests < 0 {
		v.Add("reset_requests", "must not be negative, got %s", o.ResetRequests)
	}
	if o.ResetTokens < 0 {
		v.Add("reset_tokens", "must not be negative, got %s", o.ResetTokens)
	}
	if err := v.OrNil(); err != nil {
		return false, levelPair{}, err
	}
	kl, ok := s.cfg.UpstreamKeys[o.Key]
	if !ok {
		s.metrics.observations.WithLabelValues("false").Inc()
		return false, levelPair{}, nil
	}
	group := ledger.KeyGroup(o.Key)
	var obs []ledger.Observation
	implausible := false
	// A reset longer than any provider's window is a broken header or a lie; applied,
	// it would hold the key (and every tenant behind it) for that long.
	plausible := func(reset time.Duration) bool {
		if reset > s.cfg.UpstreamMaxReset {
			implausible = true
			return false
		}
		return true
	}
	if kl.RPM > 0 && plausible(o.ResetRequests) {
		obs = append(obs, ledger.Observation{Bucket: ledger.BucketSpec{Group: group, Field: ledger.FieldRPM, Kind: ledger.KindRequests, Limit: kl.RPM, Shadow: kl.Shadow}, Remaining: o.RemainingRequests, Reset: o.ResetRequests})
	}
	if kl.TPM > 0 && plausible(o.ResetTokens) {
		obs = append(obs, ledger.Observation{Bucket: ledger.BucketSpec{Group: group, Field: ledger.FieldTPM, Kind: ledger.KindTokens, Limit: kl.TPM, Shadow: kl.Shadow}, Remaining: o.RemainingTokens, Reset: o.ResetTokens})
	}
	if implausible {
		s.metrics.observations.WithLabelValues("implausible").Inc()
		s.log.WarnContext(ctx, "upstream observation ignored: reset longer than quota.upstream_max_reset",
			"upstream_key", o.Key, "reset_requests", o.ResetRequests, "reset_tokens", o.ResetTokens, "max", s.cfg.UpstreamMaxReset)
	}
	if len(obs) == 0 {
		return false, levelPair{}, nil
	}
	levels, err := s.store.Observe(ctx, obs)
	if err != nil {
		return false, levelPair{}, fmt.Errorf("observe upstream key %s: %w", o.Key, err)
	}
	s.metrics.observations.WithLabelValues("true").Inc()
	s.signalLevels(ctx, s.clock.Now(), "", "", "", o.Key, mantlev1.Priority_PRIORITY_UNSPECIFIED, levels, nil, nil)
	return true, pairOf(levels), nil
}

// AcquireRetry asks the mesh-wide retry budget for one retry of a request admitted under
// key ("" for the overall budget only). A refusal is an answer, not an error.
//
// A retry made for a tenant (rpc.Tenant) also needs room in that tenant's share
// (retry_budget.tenant_share), which the store counts beside the budget: in Redis, shared
// by every quota replica, with the redis backend.
func (s *service) AcquireRetry(ctx context.Context, key string, format bool) (ledger.RetryDecision, error) {
	tenant := rpc.Tenant(ctx)
	d, err := s.store.AcquireRetry(ctx, ledger.RetryAsk{Key: key, Tenant: tenant, Format: format, Budget: ledger.RetryBudget(s.cfg.RetryBudget)})
	if err != nil {
		return ledger.RetryDecision{}, fmt.Errorf("acquire retry: %w", err)
	}
	result := "granted"
	switch {
	case d.Granted:
	case tenant != "" && d.Budget == ledger.RetryTenantBudget(tenant):
		result = "denied_tenant_share"
	default:
		result = "denied"
	}
	s.metrics.retries.WithLabelValues(result).Inc()
	return d, nil
}

// Run runs the background work until ctx is done: the sweeper (every SweepInterval on
// the injected clock it deletes expired reservations), the queue's dispatcher, and the
// store's own loop when it has one (Redis: flushing request counts, probing after a
// fallback). It returns nil when ctx is done.
func (s *service) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.queue.Run(ctx) })
	g.Go(func() error { return s.sweep(ctx) })
	if r, ok := s.store.(interface{ Run(context.Context) error }); ok {
		g.Go(func() error { return r.Run(ctx) })
	}
	return g.Wait()
}

func (s *service) sweep(ctx context.Context) error {
	ticker := s.clock.NewTicker(s.cfg.SweepInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.Chan():
			expired, err := s.store.Sweep(ctx)
			s.signals.prune(s.clock.Now())
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
