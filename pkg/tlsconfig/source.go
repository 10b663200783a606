package tlsconfig

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
)

// Files names the PEM files of a Source. CertFile and KeyFile go together; a Source
// without them presents no certificate (a client of a server that asks for none). Without
// CAFile, peers are verified against the system's roots.
type Files struct {
	CertFile, KeyFile, CAFile string
}

// Options are a Source's collaborators.
type Options struct {
	// Clock paces the checks for changed files; the real clock when nil.
	Clock clockwork.Clock
	// Log receives rotations and failed reloads; slog.Default when nil.
	Log *slog.Logger
	// Metrics, when set, counts reloads and shows the certificate's expiry.
	Metrics *Metrics
	// ReloadInterval is how often, at most, the files are read again; 0 means
	// DefaultReloadInterval.
	ReloadInterval time.Duration
}

// Source holds a certificate and a CA pool read from files, and reads the files again,
// at most once per reload interval, when a handshake needs them. Changed files are parsed
// and take effect for the next handshake; files that do not parse (a rotation caught
// half-written, a key that does not match its certificate) are logged and counted, and
// the previous material is kept until the next check finds a good pair. Connections
// already established keep the certificate they were made with.
type Source struct {
	name     string
	files    Files
	clock    clockwork.Clock
	interval time.Duration
	log      *slog.Logger
	metrics  *Metrics

	mu   sync.Mutex   // serialises reads of the files
	next atomic.Int64 // unix nanoseconds of the next check
	cur  atomic.Pointer[material]
}

// material is one generation of what the files held.
type material struct {
	raw  [3][]byte        // cert, key and CA files as read
	cert *tls.Certificate // nil without a certificate
	pool *x509.CertPool   // nil without a CA file: the system's roots
}

// Load reads the files once (an error names the file) and returns a Source that keeps
// them current. name labels its log lines and metrics ("mesh", "redis", "nats").
func Load(name string, files Files, opts Options) (*Source, error) {
	if (files.CertFile == "") != (files.KeyFile == "") {
		return nil, errors.New("tls: cert_file and key_file go together")
	}
	if opts.Clock == nil {
		opts.Clock = clockwork.NewRealClock()
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.ReloadInterval <= 0 {
		opts.ReloadInterval = DefaultReloadInterval
	}
	s := &Source{name: name, files: files, clock: opts.Clock, interval: opts.ReloadInterval, log: opts.Log, metrics: opts.Metrics}
	m, err := s.read(nil)
	if err != nil {
		return nil, err
	}
	s.cur.Store(m)
	s.next.Store(s.clock.Now().Add(s.interval).UnixNano())
	s.observe(m, "loaded")
	return s, nil
}

// FromConfig loads the Source of a process's tls block.
func FromConfig(c Config, opts Options) (*Source, error) {
	if c.ReloadInterval > 0 {
		opts.ReloadInterval = c.ReloadInterval
	}
	return Load("mesh", Files{CertFile: c.CertFile, KeyFile: c.KeyFile, CAFile: c.CAFile}, opts)
}

// FromClientConfig loads the Source of a client's tls block; nil when TLS is off.
func FromClientConfig(name string, c ClientConfig, opts Options) (*Source, error) {
	if !c.Enabled {
		return nil, nil
	}
	if c.ReloadInterval > 0 {
		opts.ReloadInterval = c.ReloadInterval
	}
	return Load(name, Files{CertFile: c.CertFile, KeyFile: c.KeyFile, CAFile: c.CAFile}, opts)
}

// current returns the material for a handshake, reading the files first when the reload
// interval has passed since the last check.
func (s *Source) current() *material {
	if now := s.clock.Now(); now.UnixNano() >= s.next.Load() {
		s.check(now)
	}
	return s.cur.Load()
}

func (s *Source) check(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.UnixNano() < s.next.Load() {
		return // another handshake checked meanwhile
	}
	s.next.Store(now.Add(s.interval).UnixNano())
	old := s.cur.Load()
	m, err := s.read(old)
	switch {
	case err != nil:
		s.log.Warn("tls files not reloaded; keeping the previous certificate", "source", s.name, "err", err)
		s.metrics.reload(s.name, "error")
	case m != old:
		s.cur.Store(m)
		s.observe(m, "rotated")
		s.metrics.reload(s.name, "ok")
	}
}

// read returns old when the files are unchanged, and newly parsed material otherwise.
func (s *Source) read(old *material) (*material, error) {
	var raw [3][]byte
	for i, path := range []string{s.files.CertFile, s.files.KeyFile, s.files.CAFile} {
		if path == "" {
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		raw[i] = b
	}
	if old != nil && bytes.Equal(raw[0], old.raw[0]) && bytes.Equal(raw[1], old.raw[1]) && bytes.Equal(raw[2], old.raw[2]) {
		return old, nil
	}
	m := &material{raw: raw}
	if s.files.CertFile != "" {
		cert, err := tls.X509KeyPair(raw[0], raw[1])
		if err != nil {
			return nil, fmt.Errorf("tls: %s and %s: %w", s.files.CertFile, s.files.KeyFile, err)
		}
		m.cert = &cert
	}
	if s.files.CAFile != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(raw[2]) {
			return nil, fmt.Errorf("tls: %s: no PEM certificate in it", s.files.CAFile)
		}
		m.pool = pool
	}
	return m, nil
}

func (s *Source) observe(m *material, what string) {
	if m.cert == nil {
		return
	}
	leaf := m.cert.Leaf
	s.metrics.expiry(s.name, leaf.NotAfter)
	s.log.Info("tls certificate "+what, "source", s.name, "subject", leaf.Subject.String(), "uris", fmt.Sprint(leaf.URIs), "not_after", leaf.NotAfter)
	if s.clock.Now().After(leaf.NotAfter) {
		s.log.Warn("tls certificate has expired; peers will refuse it", "source", s.name, "file", s.files.CertFile, "not_after", leaf.NotAfter)
	}
}

// ServerConfig returns the configuration of a listener: each handshake gets the current
// certificate and CA pool, and asks clients for a certificate as auth says. nextProtos are
// the ALPN protocols the listener speaks.
func (s *Source) ServerConfig(auth ClientAuth, nextProtos ...string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: nextProtos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := s.current()
			if m.cert == nil {
				return nil, errors.New("tls: a listener needs cert_file and key_file")
			}
			return &tls.Config{
				MinVersion:   tls.VersionTLS12,
				NextProtos:   nextProtos,
				Certificates: []tls.Certificate{*m.cert},
				ClientCAs:    m.pool,
				ClientAuth:   auth.tls(),
			}, nil
		},
	}
}

// ClientConfig returns the configuration of one outgoing connection: the current
// certificate (presented when the server asks) and CA pool. serverName is the name the
// server's certificate must carry; empty, the caller's dialer fills in the host dialled.
// Build one per connection, so that a rotation reaches the next one.
func (s *Source) ClientConfig(serverName string) *tls.Config {
	m := s.current()
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: m.pool, ServerName: serverName}
	if m.cert != nil {
		cert := m.cert
		// Sent whatever CAs the server lists as acceptable: a server of another CA then
		// says why it refuses (unknown authority) instead of "no certificate".
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	return cfg
}

// Certificate returns the current client certificate, for clients that take a callback
// (NATS); an error when the Source has none.
func (s *Source) Certificate() (tls.Certificate, error) {
	m := s.current()
	if m.cert == nil {
		return tls.Certificate{}, errors.New("tls: no certificate configured")
	}
	return *m.cert, nil
}

// GetClientCertificate is a tls.Config.GetClientCertificate that presents the current
// certificate, read again from its files when the reload interval has passed: a client of
// a server outside the mesh presents the process's mesh certificate with it, and a
// rotation reaches its next handshake. A Source without a certificate presents none.
func (s *Source) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	if m := s.current(); m.cert != nil {
		return m.cert, nil
	}
	return &tls.Certificate{}, nil
}

// RootCAs returns the current CA pool (nil: the system's roots), for clients that take a
// callback (NATS).
func (s *Source) RootCAs() (*x509.CertPool, error) { return s.current().pool, nil }

// HasCertificate reports whether the Source presents a certificate.
func (s *Source) HasCertificate() bool { return s.cur.Load().cert != nil }

// Metrics are the TLS metrics of a process, shared by its Sources (label source).
type Metrics struct {
	reloads  *prometheus.CounterVec
	notAfter *prometheus.GaugeVec
}

// NewMetrics registers the TLS metrics on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_tls_reloads_total",
			Help: "Changed certificate or CA files read again, by source and result (ok, error: the previous certificate is kept).",
		}, []string{"source", "result"}),
		notAfter: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "mantle_tls_certificate_not_after_seconds",
			Help: "Expiry (unix seconds) of the certificate in use, by source.",
		}, []string{"source"}),
	}
	for _, c := range []prometheus.Collector{m.reloads, m.notAfter} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register tls metrics: %w", err)
		}
	}
	return m, nil
}

func (m *Metrics) reload(source, result string) {
	if m != nil {
		m.reloads.WithLabelValues(source, result).Inc()
	}
}

func (m *Metrics) expiry(source string, t time.Time) {
	if m != nil {
		m.notAfter.WithLabelValues(source).Set(float64(t.Unix()))
	}
}
