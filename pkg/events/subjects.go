// Package events publishes mantle's typed events to NATS and hosts the embedded NATS server
// used by `mantle dev` and tests. Events are protobuf messages from mantle.events.v1 on
// subjects mantle.events.<kind>; a JetStream stream keeps them.
package events

// Subjects, one per event kind.
const (
	SubjectDegradation = "mantle.events.degradation"
	SubjectBreaker     = "mantle.events.breaker"
	SubjectQuota       = "mantle.events.quota"
	// SubjectQuotaNearLimit carries QuotaNearLimitEvent: a bucket passed 80% of its limit.
	SubjectQuotaNearLimit = "mantle.events.quota.near_limit"
	SubjectReview         = "mantle.events.review"
	SubjectQuality        = "mantle.events.quality"
	// SubjectConfigReloaded carries ConfigReloadEvent: a new configuration is live.
	SubjectConfigReloaded = "mantle.events.config.reloaded"
	// SubjectConfigRejected carries ConfigReloadEvent: a reload was refused and the running
	// configuration kept.
	SubjectConfigRejected = "mantle.events.config.rejected"
	// SubjectSession carries SessionEvent: an agent session degraded, has a step pending
	// confirmation, or ended.
	SubjectSession = "mantle.events.session"
	// SubjectToolBreaker carries ToolBreakerEvent: a tool's breaker changed state.
	SubjectToolBreaker = "mantle.events.tool.breaker"
)
