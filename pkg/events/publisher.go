package events

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/protobuf/proto"

	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/pkg/tlsconfig"
)

// StreamName is the JetStream stream that keeps every event.
const StreamName = "MANTLE_EVENTS"

// Publisher sends events to NATS. Publish never blocks the request: core NATS publishes
// are buffered by the client and flushed by its own goroutine; when the buffer is full or
// the connection is closed the event is counted as dropped and logged.
type Publisher struct {
	nc        *nats.Conn
	log       *slog.Logger
	tracer    trace.Tracer
	published *prometheus.CounterVec
	dropped   *prometheus.CounterVec
	// connect holds options for the NATS connection, set by Options before it is made.
	connect []nats.Option
}

// Option configures a Publisher.
type Option func(*Publisher)

// WithTracerProvider makes every publish a producer span, with the trace context in the
// message headers so that a consumer can continue the request's trace.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(p *Publisher) { p.tracer = tp.Tracer("github.com/mantle-mesh/mantle/pkg/events") }
}

// WithTLS secures the connection with the certificate and CA of src; every (re)connection
// reads the current files.
func WithTLS(src *tlsconfig.Source, serverName string) Option {
	return func(p *Publisher) {
		p.connect = append(p.connect, TLSOptions(src, serverName)...)
	}
}

// TLSOptions are the NATS client options of a connection secured by src: the CA, the
// client certificate when src has one, and the name the server's certificate must carry
// (empty: the host of the URL).
func TLSOptions(src *tlsconfig.Source, serverName string) []nats.Option {
	var cert nats.TLSCertHandler
	if src.HasCertificate() {
		cert = src.Certificate
	}
	// Secure first: ClientTLSConfig keeps the tls.Config it finds and adds the callbacks,
	// which NATS calls on every connection.
	return []nats.Option{
		nats.Secure(&tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}),
		nats.ClientTLSConfig(cert, src.RootCAs),
	}
}

// Connect dials NATS at url, makes sure the events stream exists, and returns a Publisher.
func Connect(ctx context.Context, url string, log *slog.Logger, reg prometheus.Registerer, opts ...Option) (*Publisher, error) {
	// The stream is (re)declared on every connect, so a NATS server that was down at start,
	// or restarted without its store, keeps events once it is back.
	declare := func(nc *nats.Conn) {
		if err := ensureStream(context.Background(), nc); err != nil {
			log.Warn("events stream not declared; events are published but may not be kept", "err", err)
		}
	}
	p := &Publisher{
		log:    log,
		tracer: noop.NewTracerProvider().Tracer(""),
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_events_published_total", Help: "Events handed to NATS, by subject.",
		}, []string{"subject"}),
	}
	for _, o := range opts {
		o(p)
	}
	nc, err := nats.Connect(url, append([]nats.Option{
		nats.Name("mantle"),
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected; events are buffered until it returns", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			log.Info("nats reconnected", "url", c.ConnectedUrl())
			declare(c)
		}),
		nats.ConnectHandler(declare),
	}, p.connect...)...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats at %s: %w", url, err)
	}
	if nc.IsConnected() {
		declare(nc)
	} else {
		log.Warn("nats not reachable yet; starting anyway and buffering events", "url", url)
	}
	p.nc = nc
	if err := reg.Register(p.published); err != nil {
		nc.Close()
		return nil, fmt.Errorf("register event metrics: %w", err)
	}
	// Shared with a spool of the same process (metrics.go).
	if p.dropped, err = registerShared(reg, newDroppedCounter()); err != nil {
		nc.Close()
		return nil, err
	}
	return p, nil
}

func ensureStream(ctx context.Context, nc *nats.Conn) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:     StreamName,
		Subjects: []string{"mantle.events.>"},
		MaxAge:   7 * 24 * time.Hour,
		Storage:  jetstream.FileStorage,
	})
	if err != nil {
		return fmt.Errorf("create stream %s (is JetStream enabled on the server?): %w", StreamName, err)
	}
	return nil
}

// Publish marshals msg and hands it to the NATS client without waiting for the network.
// The span covers the hand-over only (the client flushes on its own goroutine).
func (p *Publisher) Publish(ctx context.Context, subject string, msg proto.Message) {
	ctx, span := p.tracer.Start(ctx, "send "+subject, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			attribute.String("messaging.system", "nats"),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.destination.name", subject),
		))
	defer span.End()
	data, err := proto.Marshal(msg)
	if err == nil {
		m := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
		rpc.Propagator.Inject(ctx, headerCarrier(m.Header))
		err = p.nc.PublishMsg(m)
	}
	if err != nil {
		span.SetStatus(codes.Error, "event dropped")
		span.SetAttributes(attribute.String("error.type", fmt.Sprintf("%T", err)))
		p.dropped.WithLabelValues(subject, dropReason(err)).Inc()
		p.log.WarnContext(ctx, "event dropped", "subject", subject, "err", err)
		return
	}
	span.SetAttributes(attribute.Int("messaging.message.body.size", len(data)))
	p.published.WithLabelValues(subject).Inc()
}

// headerCarrier lets the propagator write NATS headers. nats.Header's keys are case
// sensitive, unlike HTTP's, so the W3C names go in exactly as the propagator spells them
// (traceparent, tracestate) and a consumer reads them with the same spelling.
type headerCarrier nats.Header

func (h headerCarrier) Get(key string) string { return nats.Header(h).Get(key) }
func (h headerCarrier) Set(key, value string) { nats.Header(h).Set(key, value) }
func (h headerCarrier) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// TraceContext returns ctx carrying the span context a published message's headers name,
// for consumers that continue the publisher's trace.
func TraceContext(ctx context.Context, h nats.Header) context.Context {
	return rpc.Propagator.Extract(ctx, headerCarrier(h))
}

// Conn exposes the connection for subscribers in the same process (tests, tools).
func (p *Publisher) Conn() *nats.Conn { return p.nc }

// Close flushes buffered events and closes the connection.
func (p *Publisher) Close() {
	if err := p.nc.FlushTimeout(2 * time.Second); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		p.log.Warn("flush events on close", "err", err)
	}
	p.nc.Close()
}

// Discard is a Publisher stand-in for processes configured without NATS: events are
// logged at debug level and dropped.
type Discard struct{ Log *slog.Logger }

// Publish logs the event subject.
func (d Discard) Publish(ctx context.Context, subject string, _ proto.Message) {
	d.Log.DebugContext(ctx, "event not published: no nats configured", "subject", subject)
}
