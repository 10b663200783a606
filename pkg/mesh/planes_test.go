package mesh_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"

	quotav1 "github.com/mantle-mesh/mantle/pkg/api/mantle/quota/v1"
	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// meshAudiences is the audience table the mesh's modules declare.
func meshAudiences(t *testing.T) rpc.Audiences {
	t.Helper()
	var tables []rpc.Audiences
	for _, m := range mesh.Modules(mesh.Default()) {
		tables = append(tables, m.Audiences)
	}
	all, err := rpc.Merge(tables...)
	if err != nil {
		t.Fatal(err)
	}
	return all
}

// meshMethods are the full names of every method of every mantle service whose
// descriptors the generated code registered (pkg/api), streams included.
func meshMethods(t *testing.T) map[string]protoreflect.MethodDescriptor {
	t.Helper()
	methods := map[string]protoreflect.MethodDescriptor{}
	protoregistry.GlobalFiles.RangeFiles(func(f protoreflect.FileDescriptor) bool {
		if !strings.HasPrefix(string(f.Package()), "mantle.") {
			return true
		}
		for i := 0; i < f.Services().Len(); i++ {
			s := f.Services().Get(i)
			for j := 0; j < s.Methods().Len(); j++ {
				m := s.Methods().Get(j)
				methods["/"+string(s.FullName())+"/"+string(m.Name())] = m
			}
		}
		return true
	})
	if len(methods) < 20 {
		t.Fatalf("found %d mantle methods in the registry; the generated packages are not linked in", len(methods))
	}
	return methods
}

func TestEveryMethodHasAnAudience(t *testing.T) {
	t.Parallel()
	audiences := meshAudiences(t)
	for name := range meshMethods(t) {
		if _, ok := audiences[name]; !ok {
			t.Errorf("%s has no audience: declare it in its service's Audiences", name)
		}
	}
	for name := range audiences {
		if _, ok := meshMethods(t)[name]; !ok {
			t.Errorf("audience declared for %s, which no service has", name)
		}
	}
}

// TestTenantKeyCannotLeaveTheTenantPlane calls every method of every service with a
// tenant key through the real gRPC ports of a split mesh, where each service listens on
// its own: service and operator methods are refused before any handler runs, tenant
// methods are not refused by their plane.
func TestTenantKeyCannotLeaveTheTenantPlane(t *testing.T) {
	logs := &syncBuffer{}
	cfg := testConfig()
	cfg.Log.Level = "warn"
	m := meshtest.StartWith(t, cfg, meshtest.Split, mesh.Options{LogOutput: logs})
	audiences := meshAudiences(t)
	t.Run("methods", func(t *testing.T) { tenantOnEveryMethod(t, m, audiences) })
	t.Run("refusals are logged and counted, without the key", func(t *testing.T) {
		logs.mu.Lock()
		out := logs.buf.String()
		logs.mu.Unlock()
		if !strings.Contains(out, `"msg":"call refused"`) || !strings.Contains(out, `"reason":"wrong_plane"`) ||
			!strings.Contains(out, `"method":"/mantle.quota.v1.QuotaService/ObserveUpstream"`) || !strings.Contains(out, `"tenant":"acme"`) {
			t.Errorf("no refusal line with reason, method and tenant in the quota log:\n%.2000s", out)
		}
		if strings.Contains(out, acmeKey) {
			t.Error("a log line contains the tenant's key")
		}
		if n := counterValue(t, m.Processes["quota"], "mantle_auth_refusals_total", map[string]string{"reason": "wrong_plane", "code": "PermissionDenied"}); n < 4 {
			t.Errorf(`quota's mantle_auth_refusals_total{reason="wrong_plane"} = %v, want at least its 4 service methods`, n)
		}
	})
}

func tenantOnEveryMethod(t *testing.T, m *meshtest.Mesh, audiences rpc.Audiences) {
	for name, md := range meshMethods(t) {
		svc := strings.TrimPrefix(string(md.Parent().FullName()), "mantle.")
		svc, _, _ = strings.Cut(svc, ".")
		conn := meshtest.Dial(t, m.Processes[svc].App.GRPCAddr())
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(authed(acmeKey), 10*time.Second)
			defer cancel()
			err := invokeEmpty(ctx, conn, name, md.IsStreamingServer() || md.IsStreamingClient())
			refused := status.Code(err) == codes.PermissionDenied && rpc.ErrorInfo(err).GetDomain() == "auth.mantle"
			switch aud := audiences[name]; aud {
			case rpc.AudienceService, rpc.AudienceOperator:
				if !refused {
					t.Errorf("tenant key on a %s method = %v, want PERMISSION_DENIED from auth.mantle", aud, err)
				}
			case rpc.AudienceTenant:
				if refused || status.Code(err) == codes.Unauthenticated {
					t.Errorf("tenant key on a tenant method = %v, want it past authentication", err)
				}
			}
		})
	}
}

// invokeEmpty calls method with an empty request (a valid encoding of every message).
func invokeEmpty(ctx context.Context, conn *grpc.ClientConn, method string, stream bool) error {
	if !stream {
		return conn.Invoke(ctx, method, &emptypb.Empty{}, &emptypb.Empty{})
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, method)
	if err != nil {
		return err
	}
	if err := st.SendMsg(&emptypb.Empty{}); err != nil {
		return err
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	return st.RecvMsg(&emptypb.Empty{})
}

// TestTenantCannotApproveItsOwnDraftRule: a tenant that drafted a rule from its own
// review approved it through DecideDraftRule and rewrote every tenant's answers. Approval,
// widening a draft beyond its tenant and rule reloads are the operator's; an operator key
// passes the gate.
func TestTenantCannotApproveItsOwnDraftRule(t *testing.T) {
	t.Parallel()
	m := meshtest.Start(t, testConfig(), meshtest.All)
	client := verifierv1.NewVerifierServiceClient(meshtest.Dial(t, m.GRPCAddr))
	for _, key := range []string{acmeKey, tightKey} {
		for _, widen := range []bool{false, true} {
			_, err := client.DecideDraftRule(authed(key), &verifierv1.DecideDraftRuleRequest{DraftRuleId: "draft-1", Approve: true, Widen: widen, Reviewer: "me"})
			if status.Code(err) != codes.PermissionDenied || rpc.ErrorInfo(err).GetReason() != rpc.ReasonPermissionDenied {
				t.Errorf("DecideDraftRule (widen %v) with a tenant key = %v, want PERMISSION_DENIED", widen, err)
			}
		}
		if _, err := client.ReloadRules(authed(key), &verifierv1.ReloadRulesRequest{}); status.Code(err) != codes.PermissionDenied {
			t.Errorf("ReloadRules with a tenant key = %v, want PERMISSION_DENIED", err)
		}
	}
	// The operator reaches the handler, which knows no such draft (or has no review store).
	_, err := client.DecideDraftRule(authed(meshtest.OperatorKey), &verifierv1.DecideDraftRuleRequest{DraftRuleId: "draft-1", Approve: true, Widen: true, Reviewer: "ops"})
	if rpc.ErrorInfo(err).GetDomain() != "verifier.mantle" {
		t.Errorf("DecideDraftRule with the operator key = %v, want the verifier's own answer", err)
	}
}

// TestTenantCannotTouchSharedBudgets: one ObserveUpstream call (remaining 0, reset a day)
// locked every tenant out, and a loop of AcquireRetry drained the mesh-wide retry budget.
// Both are service-plane RPCs: refused with a tenant key, also one that dresses up as a
// service, and another tenant's requests go on.
func TestTenantCannotTouchSharedBudgets(t *testing.T) {
	t.Parallel()
	m := meshtest.Start(t, testConfig(), meshtest.Split)
	quota := quotav1.NewQuotaServiceClient(meshtest.Dial(t, m.Processes["quota"].App.GRPCAddr()))
	observe := &quotav1.ObserveUpstreamRequest{UpstreamKeyId: "sim", RemainingRequests: 0, RemainingTokens: 0,
		ResetRequests: durationpb.New(86400e9), ResetTokens: durationpb.New(86400e9)}
	forged := metadata.AppendToOutgoingContext(authed(acmeKey), rpc.MetadataService, "router", rpc.MetadataOnBehalfOf, "tight")
	wrongSecret := metadata.AppendToOutgoingContext(context.Background(), rpc.MetadataMeshSecret, "guessed-guessed-guessed-guessed-guessed", rpc.MetadataService, "router")
	for _, c := range []struct {
		name string
		ctx  context.Context
		want codes.Code
	}{
		{"tenant key", authed(acmeKey), codes.PermissionDenied},
		{"tenant key with service metadata", forged, codes.PermissionDenied},
		{"wrong mesh secret", wrongSecret, codes.Unauthenticated},
		{"operator key", authed(meshtest.OperatorKey), codes.PermissionDenied},
	} {
		if _, err := quota.ObserveUpstream(c.ctx, observe); status.Code(err) != c.want {
			t.Errorf("%s: ObserveUpstream = %v, want %v", c.name, err, c.want)
		}
		for range 3 {
			if _, err := quota.AcquireRetry(c.ctx, &quotav1.AcquireRetryRequest{UpstreamKeyId: "sim"}); status.Code(err) != c.want {
				t.Fatalf("%s: AcquireRetry = %v, want %v", c.name, err, c.want)
			}
		}
	}
	router := routerv1.NewRouterServiceClient(meshtest.Dial(t, m.GRPCAddr))
	if _, err := router.Complete(authed(tightKey), &routerv1.CompleteRequest{Request: ask("primary", "still served?")}); err != nil {
		t.Errorf("another tenant's Complete after the attempts: %v", err)
	}
}

// counterValue reads one counter of a process's registry.
func counterValue(t *testing.T, p *mesh.Process, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := p.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}
