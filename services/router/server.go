package router

import (
	"context"

	"google.golang.org/protobuf/types/known/durationpb"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// server adapts the Router to mantle.router.v1.RouterService.
type server struct {
	routerv1.UnimplementedRouterServiceServer
	router *Router
}

func (s *server) Complete(ctx context.Context, req *routerv1.CompleteRequest) (*routerv1.CompleteResponse, error) {
	resp, err := s.router.Complete(ctx, req.GetRequest())
	return resp, toStatus(err)
}

func (s *server) StreamComplete(req *routerv1.StreamCompleteRequest, stream routerv1.RouterService_StreamCompleteServer) error {
	final, err := s.router.Stream(stream.Context(), req.GetRequest(), func(d Delta) error {
		return stream.Send(&routerv1.StreamCompleteResponse{Event: &routerv1.StreamCompleteResponse_Delta{
			Delta: &routerv1.Delta{Content: d.Content, Model: d.Model},
		}})
	})
	if err != nil {
		return toStatus(err)
	}
	return stream.Send(&routerv1.StreamCompleteResponse{Event: &routerv1.StreamCompleteResponse_Final{Final: final}})
}

func (s *server) DescribeRoutes(_ context.Context, req *routerv1.DescribeRoutesRequest) (*routerv1.DescribeRoutesResponse, error) {
	return s.router.Describe(req.GetRoute())
}

// Describe reports the routing table with live per-key state.
func (r *Router) Describe(only string) (*routerv1.DescribeRoutesResponse, error) {
	if only != "" {
		if _, ok := r.routes[only]; !ok {
			return nil, toStatus(&unknownRouteError{name: only})
		}
	}
	resp := &routerv1.DescribeRoutesResponse{}
	for _, name := range r.routeNames {
		if only != "" && name != only {
			continue
		}
		rt := r.routes[name]
		out := &routerv1.Route{
			Name:          rt.name,
			Scenario:      rt.scenario,
			LadderLevel:   mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY,
			DefaultBudget: durationpb.New(rt.budget),
		}
		for i, u := range rt.candidates {
			c := &routerv1.Candidate{Model: u.model.Name, Provider: u.provider, Level: levelOf(i)}
			for _, k := range u.keys {
				snap := k.stats.snapshot()
				c.Keys = append(c.Keys, &routerv1.KeyState{
					KeyId:         k.id,
					BreakerState:  mantlev1.BreakerState_BREAKER_STATE_CLOSED,
					BreakerReason: "no breaker configured",
					LatencyP50:    durationpb.New(snap.p50),
					LatencyP95:    durationpb.New(snap.p95),
					LatencyP99:    durationpb.New(snap.p99),
					Calls:         snap.calls,
					Failures:      snap.failures,
					InFlight:      snap.inFlight,
				})
			}
			out.Candidates = append(out.Candidates, c)
		}
		resp.Routes = append(resp.Routes, out)
	}
	return resp, nil
}
