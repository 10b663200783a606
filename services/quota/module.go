package quota

import (
	"context"

	quotav1 "github.com/mantle-mesh/mantle/pkg/api/mantle/quota/v1"
	"github.com/mantle-mesh/mantle/pkg/app"
)

// Module returns the quota module: it keeps state in memory for now and depends on no
// other service. Its Runnable is the reservation sweeper.
func Module(cfg Config) app.Module {
	return app.Module{
		Name: "quota",
		New: func(_ context.Context, env app.Env) (app.Runnable, error) {
			svc, err := NewService(cfg, Deps{
				Store:   NewMemoryStore(),
				Clock:   env.Clock,
				Metrics: env.Metrics,
				Log:     env.Log.With("service", "quota"),
				Events:  env.Events,
			})
			if err != nil {
				return nil, err
			}
			quotav1.RegisterQuotaServiceServer(env.GRPC, newServer(svc))
			return svc, nil
		},
	}
}
