// Package ledger holds what the quota service and its stores share: the charges,
// grants and levels a store works with, the token-bucket arithmetic they agree on, and
// the refusals a store returns.
package ledger

import (
	"time"
)

// Kind says how Settle corrects a bucket.
type Kind uint8

const (
	// KindRequests buckets count requests: the charge stands at Settle (the request was
	// made) and is returned only on release.
	KindRequests Kind = iota
	// KindTokens buckets count tokens: Settle replaces the estimate by the actual usage.
	KindTokens
)

// BucketSpec is one bucket a request charges.
type BucketSpec struct {
	// Group is the owner of the bucket: "tenant:<id>" or "key:<id>". A Redis Store keeps
	// a group's buckets together (one hash in one cluster slot).
	Group string
	// Field names the bucket within its group: "rpm", "tpm", "model:<model>:tpm".
	Field  string
	Kind   Kind
	Cost   int64
	Limit  int64
	Shadow bool
	// name caches Group:Field; specs made by newSpec carry it.
	name string
}

// NewSpec builds a spec with its name computed once.
func NewSpec(group, field string, kind Kind, cost, limit int64, shadow bool) BucketSpec {
	return BucketSpec{Group: group, Field: field, Kind: kind, Cost: cost, Limit: limit, Shadow: shadow, name: group + ":" + field}
}

// Name is the bucket's full name, as errors, events and QuotaFailure show it.
func (b BucketSpec) Name() string {
	if b.name != "" {
		return b.name
	}
	return b.Group + ":" + b.Field
}

// BudgetCharge is the money part of a reservation, in nano-dollars.
type BudgetCharge struct {
	// Group is the tenant's group; the budget lives with its buckets.
	Group  string
	Cost   int64
	Limit  int64
	Shadow bool
	// DayOffset moves the day boundary from 00:00 UTC.
	DayOffset time.Duration
	// Price is kept with the reservation so that Settle can price the actual usage.
	Price NanoPrice
}

// NanoPrice is a price in nano-dollars per token, rounded up.
type NanoPrice struct {
	Input, Output int64
}

// Charge is everything one Reserve takes.
type Charge struct {
	ID     string
	Tenant string
	TTL    time.Duration
	// Tokens is what the reservation holds against its token buckets; Settle corrects it.
	Tokens int64
	// Buckets are the tenant's buckets first, then the upstream key's.
	Buckets []BucketSpec
	// Budget is nil when the tenant has no money budget.
	Budget *BudgetCharge
	// Meta is kept with the reservation and handed back by Settle.
	Meta ReservationMeta
}

// ReservationMeta is what the Service needs back at Settle time.
type ReservationMeta struct {
	Model string
	// EstimatedInput is the service's own raw estimate of the input tokens (before any
	// learned correction); 0 when the caller supplied input_tokens or the count was exact.
	EstimatedInput int64
	// UpstreamKey is the key the reservation charged, if any.
	UpstreamKey string
}

// Grant is a successful Reserve.
type Grant struct {
	// At is the store's time of the decision.
	At        time.Time
	ExpiresAt time.Time
	// Levels parallels Charge.Buckets.
	Levels []BucketLevel
	Budget *BudgetLevel
}

// BucketLevel is the state of one bucket, in the shape of rate-limit response headers.
type BucketLevel struct {
	// Name is Group:Field.
	Name         string
	Group, Field string
	Limit        int64
	// Remaining is what can be taken now; 0 while the bucket is overdrawn.
	Remaining int64
	// Reset is how long until the bucket is full again.
	Reset  time.Duration
	Shadow bool
	// ShadowRefused: a shadow bucket that could not cover the cost and was not charged.
	ShadowRefused bool
}

// BudgetLevel is the state of a money budget, in nano-dollars.
type BudgetLevel struct {
	Limit, Spent int64
	// Reset is how long until the next day boundary.
	Reset         time.Duration
	Shadow        bool
	ShadowRefused bool
}

// Actual is the usage a provider reported.
type Actual struct {
	// Tokens is the total the token buckets are corrected to.
	Tokens        int64
	Input, Output int64
}

// Settlement is the outcome of Store.Settle.
type Settlement struct {
	At time.Time
	// Reserved is the reservation's tokens; Refunded is Reserved minus the actual tokens
	// (negative for an overrun), or Reserved on release.
	Reserved, Refunded int64
	// Levels are the corrected buckets, in charge order; shadow-refused buckets, which
	// were never charged, are left out.
	Levels []BucketLevel
	Budget *BudgetLevel
	// CostNano is the actual usage at the reservation's price; 0 without a budget.
	CostNano int64
	Meta     ReservationMeta
}

// Observation is what a provider's rate-limit headers said about one bucket.
type Observation struct {
	Bucket BucketSpec // Cost is unused
	// Remaining is the provider's count; -1 when unknown (the bucket is left alone).
	Remaining int64
	// Reset is how long until the provider's limit is fully replenished.
	Reset time.Duration
}

// RetryAsk asks for one retry.
type RetryAsk struct {
	// Key is the upstream key; empty checks the overall budget only.
	Key string
	// Tenant is the tenant the retry is for; when set, the retry also needs room in that
	// tenant's share of the budget (Budget.TenantShare), counted where the budget is.
	Tenant string
	Format bool
	Budget RetryBudget
}

// RetryDecision answers a RetryAsk.
type RetryDecision struct {
	Granted bool
	// Budget is the refusing budget ("retry:overall", "retry:key:<id>" or
	// "retry:tenant:<id>"), or "retry:overall" when granted.
	Budget            string
	Requests, Retries float64
}

// Retry budget names, as AcquireRetryResponse.budget shows them.
const RetryOverall = "retry:overall"

func RetryKeyBudget(key string) string { return "retry:key:" + key }

// RetryBudget is the retry budget a RetryAsk is decided against; it has the fields of
// quota's RetryBudgetConfig, which converts to it.
type RetryBudget struct {
	Ratio           float64
	Floor           int
	Window          time.Duration
	FormatOnlyAbove float64
	FlushInterval   time.Duration
	TenantShare     float64
}

// RetryTenantBudget names a tenant's share of the retry budget.
func RetryTenantBudget(tenant string) string { return "retry:tenant:" + tenant }

// SettleDelta is what Settle takes from a bucket the reservation charged: the overrun
// (or, negative, the refund) for token buckets; nothing for request buckets, whose
// request was made. Release returns the whole charge.
func SettleDelta(spec BucketSpec, actualTokens int64, release bool) int64 {
	switch {
	case release:
		return -spec.Cost
	case spec.Kind == KindTokens:
		return actualTokens - spec.Cost
	default:
		return 0
	}
}

// Bucket fields and groups. settle.lua reads a tenant's rpm and tpm fields with the
// reservation's record, in one HMGET, by these names.
const (
	FieldRPM = "rpm"
	FieldTPM = "tpm"
)

// TenantGroup is a tenant's bucket group.
func TenantGroup(tenant string) string { return "tenant:" + tenant }

// KeyGroup is an upstream key's bucket group.
func KeyGroup(key string) string { return "key:" + key }
