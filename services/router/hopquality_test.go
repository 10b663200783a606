package router

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
)

// fullQuality sets every field of a QualityContext, so a field added to the message later
// is covered by the tests below without editing them.
func fullQuality(t *testing.T) *mantlev1.QualityContext {
	t.Helper()
	qc := &mantlev1.QualityContext{}
	m := qc.ProtoReflect()
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := m.Mutable(fd).List()
			l.Append(l.NewElement()) // an empty element is still an element
		case fd.IsList():
			m.Mutable(fd).List().Append(sampleScalar(t, fd))
		case fd.Message() != nil:
			m.Mutable(fd) // an empty sub-message, present
		default:
			m.Set(fd, sampleScalar(t, fd))
		}
	}
	qc.Deadline = timestamppb.New(timestamppb.Now().AsTime())
	// Every field of the usage too: hopQuality copies them one by one.
	qc.Usage = &mantlev1.Usage{}
	u := qc.Usage.ProtoReflect()
	for i := range u.Descriptor().Fields().Len() {
		fd := u.Descriptor().Fields().Get(i)
		u.Set(fd, sampleScalar(t, fd))
	}
	return qc
}

func sampleScalar(t *testing.T, fd protoreflect.FieldDescriptor) protoreflect.Value {
	t.Helper()
	switch fd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString("v-" + string(fd.Name()))
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.Int32Kind:
		return protoreflect.ValueOfInt32(7)
	case protoreflect.Int64Kind:
		return protoreflect.ValueOfInt64(7)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(0.5)
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(1)
	}
	t.Fatalf("field %s: kind %s has no sample; extend sampleScalar", fd.Name(), fd.Kind())
	return protoreflect.Value{}
}

func TestHopQualityDropsOnlyTheRouterOwnFields(t *testing.T) {
	qc := fullQuality(t)
	got := hopQuality(qc)

	want := proto.Clone(qc).(*mantlev1.QualityContext)
	want.Audit, want.Attempts, want.Overhead, want.UpstreamLatency, want.Waited = nil, nil, nil, nil, nil
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("hopQuality (-want +got):\n%s", diff)
	}
	if len(qc.Audit) == 0 || len(qc.Attempts) == 0 {
		t.Fatal("hopQuality changed its input")
	}
	// The copy shares nothing the router goes on changing.
	qc.Usage.InputTokens = 1000
	qc.Deadline.Seconds++
	qc.SkippedSteps[0] = "changed"
	if got.Usage.InputTokens == 1000 || got.Deadline.Seconds == qc.Deadline.Seconds || got.SkippedSteps[0] == "changed" {
		t.Errorf("the copy shares state with the request's QualityContext: %v", got)
	}
	if empty := hopQuality(nil); empty == nil || proto.Size(empty) != 0 {
		t.Errorf("hopQuality(nil) = %v, want an empty QualityContext", empty)
	}
	// Absent sub-messages stay absent.
	if bare := hopQuality(&mantlev1.QualityContext{RequestId: "r"}); bare.Deadline != nil || bare.Usage != nil || bare.Verification != nil {
		t.Errorf("hopQuality of a QualityContext without sub-messages = %v, want none present", bare)
	}
}

func TestOtherServicesGetNoAuditButTheirStepsAreKept(t *testing.T) {
	h := newHarness(t, testConfig(), &harness{cache: &fakeCache{declineStore: true}})
	resp, err := h.router.Complete(context.Background(), ask("chat"))
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	for _, sent := range h.cache.lookups {
		if len(sent.Audit) != 0 || len(sent.Attempts) != 0 {
			t.Errorf("cache was sent %d audit steps and %d attempts, want none", len(sent.Audit), len(sent.Attempts))
		}
		if sent.RequestId != resp.GetQuality().GetRequestId() || sent.Tenant == "" && resp.GetQuality().GetTenant() != "" {
			t.Errorf("cache was sent request %q tenant %q, want the request's", sent.RequestId, sent.Tenant)
		}
	}
	var order []string
	for _, s := range resp.GetQuality().GetAudit() {
		order = append(order, s.GetService()+"/"+s.GetStep())
	}
	want := []string{"router/admit", "router/reserve", "cache/lookup", "router/lookup"}
	if len(order) < len(want) || !cmp.Equal(order[:len(want)], want) {
		t.Errorf("audit starts %q, want %q: the cache's step must be adopted once, in place", order, want)
	}
	// The prompt policy refused the lookup, so it would refuse the answer: no Store call.
	if n := h.cache.stored(); n != 0 {
		t.Errorf("%d Store calls for a prompt the cache declined, want 0", n)
	}
}

func TestStoreIsSentWhenTheCacheDidNotDecline(t *testing.T) {
	h := newHarness(t, testConfig(), nil)
	if _, err := h.router.Complete(context.Background(), ask("chat")); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if n := h.cache.stored(); n != 1 {
		t.Errorf("%d Store calls, want 1 for a verified answer to a cacheable prompt", n)
	}
}

// TestOnlyPlainAnswersAreStored: an answer the rules touched, or one under review, is not
// offered to the cache; the audit says why.
func TestOnlyPlainAnswersAreStored(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		edit   func(v *verifierv1.VerifyResponse)
		stored int
		audit  string
	}{
		{"plain", func(*verifierv1.VerifyResponse) {}, 1, ""},
		{"masked", func(v *verifierv1.VerifyResponse) {
			v.Actions = []*verifierv1.AppliedAction{{RuleId: "mask-codename", Action: "mask"}}
		}, 0, "not cached: rules applied (mask-codename)"},
		{"noticed", func(v *verifierv1.VerifyResponse) { v.UserNotice = "Not legal advice." }, 0, "not cached: carries a notice"},
		{"under review", func(v *verifierv1.VerifyResponse) { v.ReviewId = "rv_1" }, 0, "not cached: under review (rv_1)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, testConfig(), &harness{verifier: &fakeVerifier{verdict: func(in *verifierv1.VerifyRequest) (*verifierv1.VerifyResponse, error) {
				v := pass(in)
				tt.edit(v)
				return v, nil
			}}})
			resp, err := h.router.Complete(context.Background(), ask("chat"))
			if err != nil {
				t.Fatalf("Complete: %v", err)
			}
			if n := h.cache.stored(); n != tt.stored {
				t.Errorf("%d Store calls, want %d", n, tt.stored)
			}
			var got string
			for _, s := range resp.GetQuality().GetAudit() {
				if s.GetStep() == "store" {
					got = s.GetDetail()
				}
			}
			if got != tt.audit {
				t.Errorf("store audit %q, want %q", got, tt.audit)
			}
		})
	}
}

// BenchmarkHopQuality copies a request's QualityContext for a hop, as each of a mesh
// request's four to five calls to another service does.
func BenchmarkHopQuality(b *testing.B) {
	qc := &mantlev1.QualityContext{RequestId: "req_0123456789ab", Tenant: "acme", Route: "chat",
		Deadline: timestamppb.Now(), Usage: &mantlev1.Usage{InputTokens: 30, OutputTokens: 40, TotalTokens: 70},
		Verification: &mantlev1.Verification{L1Passed: true}, SkippedSteps: []string{"l3"}}
	b.ReportAllocs()
	for b.Loop() {
		_ = hopQuality(qc)
	}
}
