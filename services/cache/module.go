package cache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/qdrant/go-client/qdrant"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	cachev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/cache/v1"
	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/tlsconfig"
)

// Module returns the cache module: it serves mantle.cache.v1.CacheService from the
// configured backend. It calls no other service. Its background work (lease expiry, the
// embedded index's linking and snapshots, Qdrant's expiry sweep) runs in the returned
// Runnable.
func Module(cfg Config) app.Module {
	return app.Module{
		Name:      serviceName,
		Audiences: Audiences,
		New: func(ctx context.Context, env app.Env) (app.Runnable, error) {
			r, err := build(ctx, cfg, env, env.Var)
			if err != nil {
				return nil, fmt.Errorf("cache: %w", err)
			}
			return r, nil
		},
	}
}

// build wires the module; getenv reads secrets (API keys) from the environment.
func build(ctx context.Context, cfg Config, env app.Env, getenv func(string) string) (*runner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	embedder, err := NewEmbedder(cfg.Embedder, getenv, nil)
	if err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, clock: env.Clock, log: env.Log}
	var index Index
	switch cfg.Backend {
	case BackendQdrant:
		client, err := newQdrantClient(cfg.Qdrant, getenv, env.TLS, tlsconfig.Options{Clock: env.Clock, Log: env.Log})
		if err != nil {
			return nil, err
		}
		r.qdrant, r.closeQdrant = NewQdrantIndex(client, cfg.Qdrant.CollectionPrefix, cfg.Qdrant.Timeout), client.Close
		index = r.qdrant
	default:
		r.embedded = NewEmbeddedIndex(cfg.MaxEntries, cfg.MaxBytes)
		if path := cfg.Embedded.SnapshotPath; path != "" {
			namespace := namespaceExact
			if embedder != nil {
				namespace = embedder.Namespace()
			}
			loads, err := snapshotLoadsCounter(env.Metrics)
			if err != nil {
				return nil, err
			}
			stats, err := r.embedded.LoadFile(path, cfg.Embedded.SnapshotMaxBytes, env.Clock.Now(), namespace)
			if err != nil {
				// A cache that cannot read its snapshot starts empty; refusing to start
				// would turn a lost cache into an outage.
				loads.WithLabelValues("refused").Inc()
				env.Log.WarnContext(ctx, "cache: snapshot not loaded; starting empty", "path", path, "err", err)
				r.embedded = NewEmbeddedIndex(cfg.MaxEntries, cfg.MaxBytes)
			} else {
				loads.WithLabelValues("loaded").Inc()
				env.Log.InfoContext(ctx, "cache: snapshot loaded", "path", path, "entries", stats.Loaded,
					"expired", stats.Expired, "other_namespace", stats.OtherNamespace, "overflow", stats.Overflow)
			}
		}
		index = r.embedded
	}
	svc, err := NewService(cfg, Deps{Index: index, Embedder: embedder, Clock: env.Clock, Metrics: env.Metrics, Log: env.Log})
	if err != nil {
		r.close()
		return nil, err
	}
	r.svc = svc
	if r.embedded != nil {
		err = registerEmbeddedIndexMetrics(env.Metrics, r.embedded)
	} else {
		err = registerQdrantMetrics(env.Metrics, svc.metrics)
	}
	if err != nil {
		r.close()
		return nil, err
	}
	cachev1.RegisterCacheServiceServer(env.GRPC, newServer(svc, env.Clock, env.Log))
	return r, nil
}

// newQdrantClient returns a client for cfg. It does not connect: gRPC connects on the
// first call, so a Qdrant that is down at start makes lookups miss instead of failing the
// process. The client's own version check is off because it logs through the global
// logger; runner.Run checks the version and logs it here. mesh is the process's
// certificate, presented with client_certificate: mesh.
func newQdrantClient(cfg QdrantConfig, getenv func(string) string, mesh *tlsconfig.Source, tlsOpts tlsconfig.Options) (*qdrant.Client, error) {
	host, portText, err := net.SplitHostPort(cfg.Address)
	if err != nil {
		return nil, fmt.Errorf("qdrant.address: %w", err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return nil, fmt.Errorf("qdrant.address: %w", err)
	}
	key := ""
	if cfg.APIKeyEnv != "" {
		key = getenv(cfg.APIKeyEnv)
	}
	var dialOpts []grpc.DialOption
	if cfg.TLS {
		creds, err := qdrantCredentials(cfg, mesh, tlsOpts)
		if err != nil {
			return nil, err
		}
		// After the client's own options, so these credentials are the ones used.
		dialOpts = append(dialOpts, grpc.WithTransportCredentials(creds))
	}
	client, err := qdrant.NewClient(&qdrant.Config{
		Host: host, Port: port, APIKey: key, UseTLS: cfg.TLS,
		GrpcOptions:            dialOpts,
		SkipCompatibilityCheck: true,
		PoolSize:               1,
	})
	if err != nil {
		return nil, fmt.Errorf("qdrant: %w", err)
	}
	return client, nil
}

// qdrantCredentials are the TLS credentials of the Qdrant connection: Qdrant verified
// against ca_file (or the system's roots), and the mesh certificate presented when
// client_certificate is mesh. Both are read again at handshakes once their reload interval
// has passed, so a rotation needs no restart.
func qdrantCredentials(cfg QdrantConfig, mesh *tlsconfig.Source, opts tlsconfig.Options) (credentials.TransportCredentials, error) {
	var roots, cert *tlsconfig.Source
	if cfg.CAFile != "" {
		var err error
		if roots, err = tlsconfig.Load("qdrant", tlsconfig.Files{CAFile: cfg.CAFile}, opts); err != nil {
			return nil, fmt.Errorf("qdrant.ca_file: %w", err)
		}
	}
	if cfg.ClientCertificate == QdrantClientCertificateMesh {
		if mesh == nil || !mesh.HasCertificate() {
			return nil, errors.New("qdrant.client_certificate: mesh needs the tls block (cert_file, key_file, ca_file)")
		}
		cert = mesh
	}
	return tlsconfig.GRPCOutsideCredentials(roots, cert, ""), nil
}

// runner owns the module's background work and the resources New acquired.
type runner struct {
	cfg   Config
	clock clockwork.Clock
	log   *slog.Logger
	svc   *Service

	embedded    *EmbeddedIndex
	qdrant      *QdrantIndex
	closeQdrant func() error

	// done, when set (by tests), is told about each periodic task that ran: "snapshot",
	// "sweep" or "leases".
	done func(task string)
}

func (r *runner) ran(task string) {
	if r.done != nil {
		r.done(task)
	}
}

// Run expires abandoned leases, and per backend links stored vectors into the partitions'
// graphs and writes snapshots (embedded) or deletes expired points (Qdrant), until ctx is
// done; then it writes a last snapshot and closes the Qdrant connection.
func (r *runner) Run(ctx context.Context) error {
	defer r.close()
	if ctx.Err() != nil { // a later module failed to start: just release what New took
		return nil
	}
	if r.embedded != nil {
		// Stores return before their vectors are linked into the partitions' graphs; this
		// goroutine links them, and Run returns only after it has stopped.
		linked := make(chan struct{})
		linkCtx, stopLinking := context.WithCancel(ctx)
		go func() {
			defer close(linked)
			r.embedded.RunLinker(linkCtx, r.clock)
		}()
		defer func() {
			stopLinking()
			<-linked
		}()
	}
	leaseTicker := r.clock.NewTicker(r.cfg.Coalesce.LeaseTTL)
	defer leaseTicker.Stop()
	var snapshot, sweep <-chan time.Time
	if r.embedded != nil && r.cfg.Embedded.SnapshotPath != "" {
		t := r.clock.NewTicker(r.cfg.Embedded.SnapshotInterval)
		defer t.Stop()
		snapshot = t.Chan()
		defer r.saveSnapshot(context.WithoutCancel(ctx))
	}
	if r.qdrant != nil {
		r.checkQdrantVersion(ctx)
		t := r.clock.NewTicker(r.cfg.Qdrant.SweepInterval)
		defer t.Stop()
		sweep = t.Chan()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-leaseTicker.Chan():
			r.svc.SweepLeases()
			r.ran("leases")
		case <-snapshot:
			r.saveSnapshot(ctx)
			r.ran("snapshot")
		case <-sweep:
			r.sweepQdrant(ctx)
			r.ran("sweep")
		}
	}
}

func (r *runner) saveSnapshot(ctx context.Context) {
	start := time.Now() // wall time: this measures the write, not the cache's clock
	path := r.cfg.Embedded.SnapshotPath
	stats, err := r.embedded.SaveFile(path, r.cfg.Embedded.SnapshotMaxBytes)
	if err != nil {
		r.log.ErrorContext(ctx, "cache: snapshot failed", "path", path, "err", err)
		return
	}
	if stats.Dropped > 0 {
		r.log.WarnContext(ctx, "cache: snapshot reached embedded.snapshot_max_bytes; least recently used entries left out",
			"path", path, "written", stats.Written, "left_out", stats.Dropped, "bytes", stats.Bytes)
		return
	}
	r.log.DebugContext(ctx, "cache: snapshot written", "path", path, "entries", stats.Written, "bytes", stats.Bytes, "took", time.Since(start))
}

func (r *runner) sweepQdrant(ctx context.Context) {
	remaining, err := r.qdrant.Sweep(ctx, r.clock.Now())
	if err != nil {
		r.log.WarnContext(ctx, "cache: qdrant expiry sweep failed; retrying next interval", "err", err)
		return
	}
	r.svc.metrics.entries.Set(float64(remaining))
}

// checkQdrantVersion logs the server's version, and warns when it is not the line this
// backend was built for.
func (r *runner) checkQdrantVersion(ctx context.Context) {
	v, err := r.qdrant.ServerVersion(ctx)
	switch {
	case err != nil:
		r.log.WarnContext(ctx, "cache: qdrant not reachable yet; lookups miss until it is", "err", err)
	case !strings.HasPrefix(v, QdrantServerVersion+"."):
		r.log.WarnContext(ctx, "cache: qdrant server version differs from the one this build is tested with", "server", v, "want", QdrantServerVersion+".x")
	default:
		r.log.InfoContext(ctx, "cache: qdrant connected", "server", v)
	}
}

func (r *runner) close() {
	if r.closeQdrant != nil {
		if err := r.closeQdrant(); err != nil && !errors.Is(err, context.Canceled) {
			r.log.Warn("cache: closing the qdrant connection", "err", err)
		}
		r.closeQdrant = nil
	}
}
