package quota

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/quota/internal/admission"
	"github.com/mantle-mesh/mantle/services/quota/internal/ledger"
)

// Reasons of quota events (QuotaRejectionEvent, QuotaNearLimitEvent); quota.proto lists
// them.
const (
	eventQuotaExhausted    = rpc.ReasonQuotaExhausted
	eventBudgetExhausted   = "BUDGET_EXHAUSTED"
	eventQueueFull         = "QUEUE_FULL"
	eventShed              = "SHED"
	eventDeadline          = "DEADLINE"
	eventRequestTooLarge   = reasonRequestTooLarge
	eventPriceUnknown      = reasonPriceUnknown
	eventBudgetUnavailable = reasonBudgetUnavailable
	eventShadowPrefix      = "SHADOW_"
	eventNearLimit         = "NEAR_LIMIT"
)

// subjectNearLimit carries QuotaNearLimitEvents. Every subject carries one message type
// so that consumers can decode what they receive.
const subjectNearLimit = events.SubjectQuotaNearLimit

// signals rate-limits near-limit events: at most one per bucket per window (a minute)
// and replica, so a tenant running at 90% for an hour raises sixty, not millions.
type signals struct {
	ratio float64
	mu    sync.Mutex
	last  map[string]time.Time
}

func newSignals(ratio float64) *signals {
	return &signals{ratio: ratio, last: make(map[string]time.Time)}
}

// due reports whether bucket may signal at now, and records that it did.
func (s *signals) due(bucket string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if last, ok := s.last[bucket]; ok && now.Sub(last) < ledger.Window {
		return false
	}
	s.last[bucket] = now
	return true
}

func (s *signals) prune(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for b, last := range s.last {
		if now.Sub(last) >= ledger.Window {
			delete(s.last, b)
		}
	}
}

// bucketKind is a bounded label for a bucket name: tenant_rpm, model_tpm, key_rpm,
// budget, ...
func bucketKind(name string) string {
	switch {
	case strings.HasSuffix(name, ":budget"):
		return "budget"
	case strings.HasPrefix(name, "key:"):
		return "key_" + name[strings.LastIndexByte(name, ':')+1:]
	case strings.Contains(name, ":model:"):
		return "model_" + name[strings.LastIndexByte(name, ':')+1:]
	default:
		return "tenant_" + name[strings.LastIndexByte(name, ':')+1:]
	}
}

// signalLevels publishes what a decision's levels say: shadow rules that would have
// refused, and buckets past the near-limit ratio.
func (s *service) signalLevels(ctx context.Context, at time.Time, requestID, tenant, model, key string, priority mantlev1.Priority, levels []ledger.BucketLevel, budget *ledger.BudgetLevel, bc *ledger.BudgetCharge) {
	for _, l := range levels {
		if l.ShadowRefused {
			s.metrics.shadowRefusals.WithLabelValues(bucketKind(l.Name)).Inc()
			s.events.Publish(ctx, events.SubjectQuota, &eventsv1.QuotaRejectionEvent{
				At: timestamppb.New(at), RequestId: requestID, Tenant: tenant, Model: model, Priority: priority,
				Bucket: l.Name, Reason: eventShadowPrefix + eventQuotaExhausted,
			})
			continue
		}
		if l.Limit <= 0 {
			continue
		}
		// The debt is the share in use: a full bucket owes nothing, an empty one a
		// whole window, an overdrawn one more.
		use := float64(l.Reset) / float64(ledger.Window)
		if use >= s.signals.ratio && s.signals.due(l.Name, at) {
			s.nearLimit(ctx, at, requestID, tenant, model, key, l.Name, l.Limit, l.Remaining, use, l.Shadow)
		}
	}
	if budget != nil && bc != nil {
		name := bc.Group + ":budget"
		if budget.ShadowRefused {
			s.metrics.shadowRefusals.WithLabelValues("budget").Inc()
			s.events.Publish(ctx, events.SubjectQuota, &eventsv1.QuotaRejectionEvent{
				At: timestamppb.New(at), RequestId: requestID, Tenant: tenant, Model: model, Priority: priority,
				Bucket: name, Reason: eventShadowPrefix + eventBudgetExhausted, RetryAfter: durationpb.New(budget.Reset),
			})
		} else if budget.Limit > 0 {
			use := float64(budget.Spent) / float64(budget.Limit)
			if use >= s.signals.ratio && s.signals.due(name, at) {
				s.nearLimit(ctx, at, requestID, tenant, model, "", name, budget.Limit, max(budget.Limit-budget.Spent, 0), use, budget.Shadow)
			}
		}
	}
}

func (s *service) nearLimit(ctx context.Context, at time.Time, requestID, tenant, model, key, bucket string, limit, remaining int64, use float64, shadow bool) {
	reason := eventNearLimit
	if shadow {
		reason = eventShadowPrefix + eventNearLimit
	}
	s.metrics.nearLimit.WithLabelValues(bucketKind(bucket)).Inc()
	s.events.Publish(ctx, subjectNearLimit, &eventsv1.QuotaNearLimitEvent{
		At: timestamppb.New(at), RequestId: requestID, Tenant: tenant, Model: model, Bucket: bucket,
		Limit: limit, Remaining: remaining, Utilization: use, Reason: reason, UpstreamKeyId: key,
	})
}

// refused records and publishes a refusal. Publishing never blocks (app.Publisher).
// Errors that are not refusals (validation, a canceled caller) publish nothing.
func (s *service) refused(ctx context.Context, start time.Time, req reserveRequest, err error) {
	var (
		exhausted *ledger.ExhaustedError
		tooLarge  *tooLargeError
		unknown   *priceUnknownError
		decision  string
		reason    string
		bucket    string
		retry     time.Duration
	)
	switch {
	case errors.As(err, &exhausted):
		bucket, retry = exhausted.Bucket, exhausted.RetryAfter
		switch exhausted.EffectiveCause() {
		case ledger.CauseBudget:
			decision, reason = decisionExhausted, eventBudgetExhausted
		case ledger.CauseQueueFull:
			decision, reason = decisionQueueFull, eventQueueFull
		case ledger.CauseShed:
			decision, reason = decisionShed, eventShed
		case ledger.CauseDeadline:
			decision, reason = decisionDeadline, eventDeadline
		default:
			decision, reason = decisionExhausted, eventQuotaExhausted
		}
	case errors.As(err, &tooLarge):
		decision, reason, bucket = decisionTooLarge, eventRequestTooLarge, tooLarge.Bucket
	case errors.As(err, &unknown):
		decision, reason, bucket = decisionPrice, eventPriceUnknown, ledger.TenantGroup(req.Tenant)+":budget"
	case errors.Is(err, errBudgetUnavailable):
		decision, reason, bucket = decisionUnavailable, eventBudgetUnavailable, ledger.TenantGroup(req.Tenant)+":budget"
	default:
		return
	}
	s.metrics.decisions.WithLabelValues(decision, admission.ClassName(admission.ClassOf(req.Priority)), s.metrics.tenant(req.Tenant)).Inc()
	s.metrics.decisionSeconds.WithLabelValues(decision).Observe(s.clock.Since(start).Seconds())
	ev := &eventsv1.QuotaRejectionEvent{
		At:        timestamppb.New(s.clock.Now()),
		RequestId: req.RequestID,
		Tenant:    req.Tenant,
		Model:     req.Model,
		Priority:  req.Priority,
		Bucket:    bucket,
		Reason:    reason,
	}
	if retry > 0 {
		ev.RetryAfter = durationpb.New(retry)
	}
	s.events.Publish(ctx, events.SubjectQuota, ev)
}
