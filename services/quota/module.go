package quota

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"

	"github.com/redis/go-redis/v9"

	quotav1 "github.com/mantle-mesh/mantle/pkg/api/mantle/quota/v1"
	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/tlsconfig"
	"github.com/mantle-mesh/mantle/services/quota/internal/memstore"
	"github.com/mantle-mesh/mantle/services/quota/internal/redisstore"
)

// Module returns the quota module. It depends on no other service; its Runnable runs
// the sweeper, the queue's dispatcher and, with backend redis, the Redis client's
// background work, and closes the client on the way out.
func Module(cfg Config) app.Module {
	return module(cfg, redisServerTime)
}

// module is Module with the Redis backend's decision clock chosen: tests run the
// module's own path at their fake clock.
func module(cfg Config, at decisionClock) app.Module {
	return app.Module{
		Name:      "quota",
		Audiences: audiences,
		New: func(_ context.Context, env app.Env) (app.Runnable, error) {
			log := env.Log.With("service", "quota")
			var (
				store   stateStore
				backend *redisState
			)
			switch cfg.Backend {
			case backendRedis:
				benv := env
				benv.Log = log
				var err error
				backend, err = newRedisBackend(cfg, benv, at)
				if err != nil {
					return nil, err
				}
				store = backend.store
				if env.Dependency != nil {
					env.Dependency("quota.redis", backend.store.Degradation)
				}
			default:
				store = memstore.New(env.Clock)
			}
			svc, err := newService(cfg, serviceDeps{
				Store:   store,
				Clock:   env.Clock,
				Metrics: env.Metrics,
				Log:     log,
				Events:  env.Events,
			})
			if err != nil {
				if backend != nil {
					_ = backend.Close()
				}
				return nil, err
			}
			quotav1.RegisterQuotaServiceServer(env.GRPC, newServer(svc))
			return app.RunFunc(func(ctx context.Context) error {
				err := svc.Run(ctx)
				if backend != nil {
					err = errors.Join(err, backend.Close())
				}
				return err
			}), nil
		},
	}
}

// redisState is the Redis backend as production wires it: a FailoverStore over a
// redisstore.Store over one client.
type redisState struct {
	client *redis.Client
	store  *failoverStore
}

// Where a redisState's decisions are timed.
type decisionClock bool

const (
	// redisServerTime decides at Redis's TIME, one clock for every replica: production.
	redisServerTime decisionClock = true
	// replicaClock decides at env.Clock: tests, whose fake clock then times every
	// decision, on Redis too.
	replicaClock decisionClock = false
)

// newRedisBackend builds the backend of cfg.Redis. It does not contact Redis: the
// store's Run does, and starts on its local limiter when Redis does not answer.
func newRedisBackend(cfg Config, env app.Env, at decisionClock) (*redisState, error) {
	client, err := newRedisClient(cfg.Redis, env.Var, tlsconfig.Options{Clock: env.Clock, Log: env.Log})
	if err != nil {
		return nil, err
	}
	opts := redisstore.Options{
		Prefix:         cfg.Redis.KeyPrefix,
		Clock:          env.Clock,
		ServerTime:     bool(at),
		OverLimitCache: cfg.Redis.OverLimitCache,
		FlushInterval:  cfg.RetryBudget.FlushInterval,
	}
	if cfg.Redis.AutoPipeline {
		// Closed with the client.
		ap, err := client.AutoPipeline()
		if err != nil {
			_ = client.Close()
			return nil, fmt.Errorf("redis.auto_pipeline: %w", err)
		}
		opts.Scripter = ap
	}
	primary := redisstore.New(client, opts)
	store := newFailoverStore(primary, env.Clock, failoverOptions{
		Replicas: cfg.Redis.Replicas, ProbeInterval: cfg.Redis.ProbeInterval, Log: env.Log, Events: env.Events,
	})
	return &redisState{client: client, store: store}, nil
}

// Close stops the store's batcher, then closes the client: the batcher fails the calls
// it still holds rather than leave them to a closed client.
func (b *redisState) Close() error {
	return errors.Join(b.store.Close(), b.client.Close())
}

// newRedisClient builds the client from the redis block; the password comes from the
// environment variable it names. With redis.tls on, every new connection is a TLS one
// configured from the current files (tlsOpts pace their reloads).
func newRedisClient(cfg RedisConfig, getenv func(string) string, tlsOpts tlsconfig.Options) (*redis.Client, error) {
	opts := &redis.Options{
		Addr:         cfg.Address,
		Username:     cfg.Username,
		DB:           cfg.DB,
		PoolSize:     cfg.PoolSize,
		DialTimeout:  cfg.DialTimeout,
		ReadTimeout:  cfg.Timeout,
		WriteTimeout: cfg.Timeout,
		// The store falls back on the first failure; retrying inside the client would
		// only make every request wait for the outage.
		MaxRetries: -1,
	}
	if cfg.PasswordEnv != "" {
		pw := getenv(cfg.PasswordEnv)
		if pw == "" {
			return nil, fmt.Errorf("redis.password_env: environment variable %s is unset or empty", cfg.PasswordEnv)
		}
		opts.Password = pw
	}
	src, err := tlsconfig.FromClientConfig("redis", cfg.TLS, tlsOpts)
	if err != nil {
		return nil, fmt.Errorf("redis.%w", err)
	}
	if src != nil {
		// A dialer rather than Options.TLSConfig: that one is fixed when the client is
		// built, so a rotated certificate or CA would wait for a restart.
		opts.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
			d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: cfg.DialTimeout}, Config: src.ClientConfig(cfg.TLS.ServerName)}
			return d.DialContext(ctx, network, addr)
		}
	}
	return redis.NewClient(opts), nil
}

// RouteRedisLogs sends the lines go-redis logs itself (a pool that cannot dial, a
// connection it drops) to log, as warnings in the process's format, instead of to stderr
// in go-redis's own. go-redis keeps one logger per process, so the binary calls this
// once, with its process logger; a program running several meshes (tests) leaves it
// alone.
func RouteRedisLogs(log *slog.Logger) { redisstore.RouteLogs(log) }
