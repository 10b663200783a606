package app_test

import (
	"context"
	"errors"
	"io"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"

	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// TestReflectionIsOperatorOnly: gRPC reflection lists every method of every service, so it
// is off unless configured, and then answers operator keys only; a tenant key (or none)
// cannot list services, over either reflection version.
func TestReflectionIsOperatorOnly(t *testing.T) {
	t.Parallel()
	authn, err := rpc.NewAuthenticator([]rpc.TenantKey{{ID: "acme", KeySHA256: rpc.HashKey("sk-tenant")}}, nil,
		rpc.WithOperators([]rpc.TenantKey{{ID: "ops", KeySHA256: rpc.HashKey("sk-operator")}}, nil))
	if err != nil {
		t.Fatal(err)
	}
	// list asks for the services over reflection version v ("v1" or "v1alpha") with key.
	list := func(t *testing.T, conn *grpc.ClientConn, v, key string) ([]string, error) {
		ctx := t.Context()
		if key != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+key)
		}
		var names []string
		if v == "v1alpha" {
			stream, err := grpc_reflection_v1alpha.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
			if err != nil {
				return nil, err
			}
			// A refused stream fails Send with io.EOF; Recv has the status.
			if err := stream.Send(&grpc_reflection_v1alpha.ServerReflectionRequest{MessageRequest: &grpc_reflection_v1alpha.ServerReflectionRequest_ListServices{}}); err != nil && !errors.Is(err, io.EOF) {
				return nil, err
			}
			resp, err := stream.Recv()
			if err != nil {
				return nil, err
			}
			for _, s := range resp.GetListServicesResponse().GetService() {
				names = append(names, s.GetName())
			}
			return names, stream.CloseSend()
		}
		stream, err := grpc_reflection_v1.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
		if err != nil {
			return nil, err
		}
		if err := stream.Send(&grpc_reflection_v1.ServerReflectionRequest{MessageRequest: &grpc_reflection_v1.ServerReflectionRequest_ListServices{}}); err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		resp, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		for _, s := range resp.GetListServicesResponse().GetService() {
			names = append(names, s.GetName())
		}
		return names, stream.CloseSend()
	}
	tests := []struct {
		name       string
		reflection bool
		key        string
		want       codes.Code
	}{
		{"off by default, even for an operator", false, "sk-operator", codes.Unimplemented},
		{"on: a tenant key is refused", true, "sk-tenant", codes.PermissionDenied},
		{"on: no key is refused", true, "", codes.Unauthenticated},
		{"on: an operator key lists the services", true, "sk-operator", codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig("blocker")
			cfg.GRPCReflection = tt.reflection
			deps := testDeps()
			deps.Authenticator = authn
			a, err := app.New(context.Background(), cfg, []app.Module{newBlocker().module("blocker", nil, nil)}, deps)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- a.Run(ctx) }()
			t.Cleanup(func() { cancel(); <-done })
			conn, err := grpc.NewClient(a.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close() })
			for _, v := range []string{"v1", "v1alpha"} {
				names, err := list(t, conn, v, tt.key)
				if got := status.Code(err); got != tt.want {
					t.Fatalf("%s: list services = %v, %v; want %s", v, names, err, tt.want)
				}
				if tt.want == codes.OK && len(names) == 0 {
					t.Errorf("%s: an operator listed no services", v)
				}
			}
		})
	}
}
