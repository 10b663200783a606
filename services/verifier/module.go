package verifier

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/app"
)

// Module returns the verifier module. It has no dependencies and no background work: L1
// runs inside the call. (env.Events is unused until L3 follow-ups and review requests.)
func Module(cfg Config) app.Module {
	return app.Module{
		Name: ServiceName,
		New: func(_ context.Context, env app.Env) (app.Runnable, error) {
			// A nil *Registry must not become a non-nil Registerer interface.
			var reg prometheus.Registerer
			if env.Metrics != nil {
				reg = env.Metrics
			}
			v, err := New(cfg, env.Clock, reg)
			if err != nil {
				return nil, fmt.Errorf("verifier: %w", err)
			}
			log := env.Log
			if log == nil {
				log = slog.New(slog.DiscardHandler)
			}
			verifierv1.RegisterVerifierServiceServer(env.GRPC, NewServer(v, log.With("service", ServiceName)))
			return nil, nil
		},
	}
}
