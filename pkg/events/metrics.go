package events

import (
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// Values of the reason label of mantle_events_dropped_total.
const (
	dropBufferFull = "buffer_full" // NATS unreachable and the client's reconnect buffer full
	dropClosed     = "closed"      // the connection was closed (shutting down)
	dropError      = "error"       // anything else: the message did not encode, a bad subject
	dropSpoolFull  = "spool_full"  // a spool at its limits refused the record
	dropTooLarge   = "too_large"   // a record over the spool's MaxRecordBytes
)

// newDroppedCounter declares mantle_events_dropped_total. The Publisher and a Spool of the
// same process share it (registerShared), so one series family counts every lost event.
func newDroppedCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mantle_events_dropped_total",
		Help: "Events lost, by subject and reason: buffer_full, closed, error, too_large (Publisher) or spool_full, too_large (a durable spool).",
	}, []string{"subject", "reason"})
}

// dropReason is the bounded reason label for a failed publish.
func dropReason(err error) string {
	switch {
	case errors.Is(err, nats.ErrReconnectBufExceeded):
		return dropBufferFull
	case errors.Is(err, nats.ErrConnectionClosed):
		return dropClosed
	case errors.Is(err, nats.ErrMaxPayload):
		return dropTooLarge
	}
	return dropError
}

// registerShared registers c, or returns the equal collector already registered: metrics
// that two components of one process both update (the dropped counter) are declared once
// per registry whichever component comes first.
func registerShared[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(T); ok {
			return existing, nil
		}
	}
	return c, fmt.Errorf("register event metrics: %w", err)
}

// spoolMetrics are a Spool's series. Subjects are the constants of subjects.go and the
// review queue's subject, so the label is bounded.
type spoolMetrics struct {
	spooled      *prometheus.CounterVec
	replayed     *prometheus.CounterVec
	deadLettered *prometheus.CounterVec
	dropped      *prometheus.CounterVec
}

// Instrument exports the spool's metrics on reg: records appended (spooled), published by
// Flush (replayed), refused because the spool was full (dropped, reason spool_full), and a
// gauge of the records waiting. Call it once, before the spool is used; one spool per
// registry.
func (s *Spool) Instrument(reg prometheus.Registerer) error {
	m := &spoolMetrics{
		spooled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_events_spooled_total",
			Help: "Messages written to the durable disk spool to be published when NATS accepts them, by subject.",
		}, []string{"subject"}),
		replayed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_events_replayed_total",
			Help: "Spooled messages published to NATS and removed from the spool, by subject.",
		}, []string{"subject"}),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_events_dead_lettered_total",
			Help: "Spooled messages the server refused for good (too large), moved to the spool's dead/ directory so the others go on, by subject.",
		}, []string{"subject"}),
	}
	waiting := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "mantle_events_spool_records",
		Help: "Messages waiting in the durable disk spool.",
	}, func() float64 { return float64(s.Len()) })
	for _, c := range []prometheus.Collector{m.spooled, m.replayed, m.deadLettered, waiting} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register spool metrics: %w", err)
		}
	}
	dropped, err := registerShared(reg, newDroppedCounter())
	if err != nil {
		return err
	}
	m.dropped = dropped
	s.metrics.Store(m)
	return nil
}
