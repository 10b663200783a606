package cache

import (
	"context"
	"fmt"

	cachev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/cache/v1"
	"github.com/mantle-mesh/mantle/pkg/app"
)

// Module returns the cache module: it serves mantle.cache.v1.CacheService from an in-memory
// index. It calls no other service and has no background work.
func Module(cfg Config) app.Module {
	return app.Module{
		Name: serviceName,
		New: func(_ context.Context, env app.Env) (app.Runnable, error) {
			index := NewMemoryIndex(cfg.MaxEntries)
			svc, err := NewService(cfg, index, env.Clock, env.Metrics)
			if err != nil {
				return nil, fmt.Errorf("cache: %w", err)
			}
			if err := registerMemoryIndexMetrics(env.Metrics, index); err != nil {
				return nil, fmt.Errorf("cache: %w", err)
			}
			cachev1.RegisterCacheServiceServer(env.GRPC, newServer(svc, env.Clock, env.Log))
			return nil, nil
		},
	}
}
