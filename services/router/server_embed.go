package router

import (
	"context"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
)

func (s *server) Embed(ctx context.Context, req *routerv1.EmbedRequest) (*routerv1.EmbedResponse, error) {
	release, err := s.router.admit(req.GetPriority())
	if err != nil {
		return nil, err
	}
	defer release()
	resp, err := s.router.Embed(ctx, req)
	return resp, toStatus(err)
}
