package router

import (
	"context"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// server adapts the Router to mantle.router.v1.RouterService.
type server struct {
	routerv1.UnimplementedRouterServiceServer
	router *Router
}

func (s *server) Complete(ctx context.Context, req *routerv1.CompleteRequest) (*routerv1.CompleteResponse, error) {
	release, err := s.router.admit(req.GetRequest().GetPriority())
	if err != nil {
		return nil, err
	}
	defer release()
	resp, err := s.router.Complete(ctx, req.GetRequest())
	return resp, toStatus(err)
}

func (s *server) StreamComplete(req *routerv1.StreamCompleteRequest, stream routerv1.RouterService_StreamCompleteServer) error {
	release, err := s.router.admit(req.GetRequest().GetPriority())
	if err != nil {
		return err
	}
	defer release()
	final, err := s.router.Stream(stream.Context(), req.GetRequest(), func(d Delta) error {
		return stream.Send(&routerv1.StreamCompleteResponse{Event: &routerv1.StreamCompleteResponse_Delta{
			Delta: &routerv1.Delta{Content: d.Content, Model: d.Model, ToolCalls: toolCallDeltasProto(d.ToolCalls), Logprobs: string(d.Logprobs)},
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
		if _, ok := r.table().routes[only]; !ok {
			return nil, toStatus(&unknownRouteError{name: only})
		}
	}
	resp := &routerv1.DescribeRoutesResponse{}
	for _, name := range r.table().names {
		if only != "" && name != only {
			continue
		}
		rt := r.table().routes[name]
		out := &routerv1.Route{
			Name:          rt.name,
			Scenario:      rt.scenario,
			LadderLevel:   r.ladderLevel(rt),
			DefaultBudget: durationpb.New(rt.budget),
		}
		for i, u := range rt.candidates {
			c := &routerv1.Candidate{Model: u.model.Name, Provider: u.provider, Level: levelOf(i)}
			for _, k := range u.keys {
				snap := k.stats.snapshot()
				state, reason, openUntil := r.keyHealth(k)
				ks := &routerv1.KeyState{
					KeyId:         k.id,
					BreakerState:  state,
					BreakerReason: reason,
					LatencyP50:    durationpb.New(snap.p50),
					LatencyP95:    durationpb.New(snap.p95),
					LatencyP99:    durationpb.New(snap.p99),
					Calls:         snap.calls,
					Failures:      snap.failures,
					InFlight:      snap.inFlight,
				}
				if k.cooldown.Active() {
					ks.CooldownUntil = timestamppb.New(k.cooldown.Until())
				}
				if state == mantlev1.BreakerState_BREAKER_STATE_OPEN && !openUntil.IsZero() {
					ks.NextProbeAt = timestamppb.New(openUntil)
				}
				c.Keys = append(c.Keys, ks)
			}
			out.Candidates = append(out.Candidates, c)
		}
		resp.Routes = append(resp.Routes, out)
	}
	return resp, nil
}

// ladderLevel is the level a request on rt would be answered at now: forced by an operator,
// or the first level with a candidate whose breaker admits calls.
func (r *Router) ladderLevel(rt *route) mantlev1.FallbackLevel {
	switch rt.ladder.ForceLevel {
	case ForceCache:
		return mantlev1.FallbackLevel_FALLBACK_LEVEL_CACHED_APPROXIMATE
	case ForceTemplate:
		return mantlev1.FallbackLevel_FALLBACK_LEVEL_TEMPLATE
	}
	for i, u := range append(append([]*upstream{}, rt.candidates...), rt.smaller...) {
		for _, k := range u.keys {
			if state, _, _ := r.keyHealth(k); state != mantlev1.BreakerState_BREAKER_STATE_OPEN && !k.cooldown.Active() {
				if i < len(rt.candidates) {
					return levelOf(i)
				}
				return mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL
			}
		}
	}
	if rt.ladder.Cache {
		return mantlev1.FallbackLevel_FALLBACK_LEVEL_CACHED_APPROXIMATE
	}
	return mantlev1.FallbackLevel_FALLBACK_LEVEL_TEMPLATE
}
