package app

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/wrapperspb"

	// Every package of pkg/api, so that all of mantle's messages are registered.
	agentv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/agent/v1"
	_ "github.com/mantle-mesh/mantle/pkg/api/mantle/cache/v1"
	_ "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	_ "github.com/mantle-mesh/mantle/pkg/api/mantle/quota/v1"
	_ "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	_ "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	_ "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// TestCopyMessageSharesNothing: for every message of pkg/api, with every field set (each
// case of each oneof in turn), copyMessage copies through the generated clone into a
// message that held something else, the copy equals the original, and changing every
// field of either in place, down to the elements of lists and the bytes of bytes fields,
// leaves the other as it was: caller and handler share no memory.
func TestCopyMessageSharesNothing(t *testing.T) {
	t.Parallel()
	var types []protoreflect.MessageType
	protoregistry.GlobalTypes.RangeMessages(func(mt protoreflect.MessageType) bool {
		if strings.HasPrefix(string(mt.Descriptor().FullName()), "mantle.") {
			types = append(types, mt)
		}
		return true
	})
	if len(types) < 50 {
		t.Fatalf("found %d messages of pkg/api; are its packages imported?", len(types))
	}
	for _, mt := range types {
		t.Run(string(mt.Descriptor().FullName()), func(t *testing.T) {
			t.Parallel()
			if _, ok := mt.Zero().Interface().(cloner); !ok {
				t.Fatal("no generated CloneMessageVT: is pkg/api generated with buf.gen.yaml's vtproto plugin?")
			}
			for variant := range oneofCases(mt.Descriptor()) {
				src := mt.New()
				fill(src, variant, 0)
				dst := mt.New()
				fill(dst, variant+1, 0) // copyMessage replaces, it does not merge
				if err := copyMessage(dst.Interface(), src.Interface()); err != nil {
					t.Fatal(err)
				}
				if !proto.Equal(dst.Interface(), src.Interface()) {
					t.Fatalf("variant %d: the copy differs from the original", variant)
				}
				for _, side := range []struct {
					name           string
					changed, other protoreflect.Message
				}{{"copy", dst, src}, {"original", src, dst}} {
					before := proto.Clone(side.other.Interface())
					mutate(side.changed)
					if !proto.Equal(side.other.Interface(), before) {
						t.Fatalf("variant %d: changing the %s changed the other", variant, side.name)
					}
				}
			}
		})
	}
}

// TestCopyMessageWithoutClone: a message without a generated clone (a well-known type) is
// copied too, and replaces what dst held.
func TestCopyMessageWithoutClone(t *testing.T) {
	t.Parallel()
	src, dst := wrapperspb.Bytes([]byte("abc")), wrapperspb.Bytes([]byte("something else"))
	if err := copyMessage(dst, src); err != nil {
		t.Fatal(err)
	}
	if string(dst.Value) != "abc" {
		t.Fatalf("copy = %q", dst.Value)
	}
	dst.Value[0] = 'x'
	if string(src.Value) != "abc" {
		t.Fatalf("changing the copy changed the original: %q", src.Value)
	}
	if err := copyMessage(dst, "not a message"); err == nil {
		t.Fatal("copying a string into a message succeeded")
	}
}

// oneofCases is the number of variants that set each case of each oneof of md, or of
// the messages it holds, at least once.
func oneofCases(md protoreflect.MessageDescriptor) int {
	n := 1
	seen := map[protoreflect.FullName]bool{}
	var walk func(md protoreflect.MessageDescriptor)
	walk = func(md protoreflect.MessageDescriptor) {
		if seen[md.FullName()] {
			return
		}
		seen[md.FullName()] = true
		for i := range md.Oneofs().Len() {
			n = max(n, md.Oneofs().Get(i).Fields().Len())
		}
		for i := range md.Fields().Len() {
			if f := md.Fields().Get(i); f.Message() != nil {
				walk(f.Message())
			}
		}
	}
	walk(md)
	return n
}

// fill sets every field of m, down to messages four deep: lists and maps with two
// entries, each oneof to its case number variant (modulo its cases). Values depend on
// variant, so that two fills of different variants differ.
func fill(m protoreflect.Message, variant, depth int) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if o := fd.ContainingOneof(); o != nil && !o.IsSynthetic() && o.Fields().Get(variant%o.Fields().Len()) != fd {
			continue
		}
		switch {
		case fd.IsList():
			l := m.Mutable(fd).List()
			for j := range 2 {
				if fd.Message() != nil {
					if depth < 4 {
						fill(l.AppendMutable().Message(), variant+j, depth+1)
					}
					continue
				}
				l.Append(scalar(fd, variant+j))
			}
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			for j := range 2 {
				k := scalar(fd.MapKey(), variant+j).MapKey()
				if fd.MapValue().Message() != nil {
					fill(mp.Mutable(k).Message(), variant+j, depth+1)
					continue
				}
				mp.Set(k, scalar(fd.MapValue(), variant+j))
			}
		case fd.Message() != nil:
			if depth < 4 {
				fill(m.Mutable(fd).Message(), variant, depth+1)
			}
		default:
			m.Set(fd, scalar(fd, variant))
		}
	}
}

// mutate changes every field m holds in place: the messages it points to, the elements
// of its lists, the bytes of its bytes fields.
func mutate(m protoreflect.Message) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList():
			l := v.List()
			for j := range l.Len() {
				switch {
				case fd.Message() != nil:
					mutate(l.Get(j).Message())
				case fd.Kind() == protoreflect.BytesKind:
					flip(l.Get(j).Bytes())
				default:
					l.Set(j, other(fd, l.Get(j)))
				}
			}
		case fd.IsMap():
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				if fd.MapValue().Message() != nil {
					mutate(mv.Message())
				} else {
					v.Map().Set(k, other(fd.MapValue(), mv))
				}
				return true
			})
		case fd.Message() != nil:
			mutate(v.Message())
		case fd.Kind() == protoreflect.BytesKind:
			flip(v.Bytes())
		default:
			m.Set(fd, other(fd, v))
		}
		return true
	})
}

// other is a value for fd other than v.
func other(fd protoreflect.FieldDescriptor, v protoreflect.Value) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(!v.Bool())
	case protoreflect.EnumKind:
		values := fd.Enum().Values()
		for i := range values.Len() {
			if n := values.Get(i).Number(); n != v.Enum() {
				return protoreflect.ValueOfEnum(n)
			}
		}
	}
	return scalar(fd, 100)
}

func flip(b []byte) {
	for i := range b {
		b[i] ^= 0xff
	}
}

// scalar is a value for fd that is not its default, different for each n.
func scalar(fd protoreflect.FieldDescriptor, n int) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(n%2 == 0)
	case protoreflect.EnumKind:
		// Not the first value (the default), when there is another.
		values := fd.Enum().Values()
		if values.Len() == 1 {
			return protoreflect.ValueOfEnum(values.Get(0).Number())
		}
		return protoreflect.ValueOfEnum(values.Get(1 + n%(values.Len()-1)).Number())
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(n + 1))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(int64(n + 1))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(n + 1))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(uint64(n + 1))
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(float32(n) + 0.5)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(float64(n) + 0.5)
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(fmt.Sprint("s", n))
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte{byte(n), 1, 2})
	}
	panic(fmt.Sprintf("no scalar of kind %v", fd.Kind()))
}

// sessionWatcher is an agent SessionService whose WatchSession sends two answers and
// changes the first after sending it.
type sessionWatcher struct {
	agentv1.UnimplementedSessionServiceServer
}

func (sessionWatcher) WatchSession(in *agentv1.WatchSessionRequest, stream grpc.ServerStreamingServer[agentv1.WatchSessionResponse]) error {
	first := &agentv1.WatchSessionResponse{State: agentv1.SessionState_SESSION_STATE_ACTIVE, EndReason: "for " + in.GetSessionId()}
	if err := stream.Send(first); err != nil {
		return err
	}
	first.EndReason = "changed by the handler" // must not reach the caller
	in.SessionId = "changed by the handler"
	return stream.Send(&agentv1.WatchSessionResponse{State: agentv1.SessionState_SESSION_STATE_COMPLETED})
}

// TestLocalConnStreamCopies: the messages of a stream between modules are copies both
// ways, as over the network.
func TestLocalConnStreamCopies(t *testing.T) {
	t.Parallel()
	chain, err := rpc.ServerInterceptors(slog.New(slog.DiscardHandler), prometheus.NewRegistry(), nil,
		rpc.Audiences{agentv1.SessionService_WatchSession_FullMethodName: rpc.AudienceService})
	if err != nil {
		t.Fatal(err)
	}
	c := newLocalConn(chain, rpc.ClientIdentity{}, nil, nil)
	c.RegisterService(&agentv1.SessionService_ServiceDesc, sessionWatcher{})
	req := &agentv1.WatchSessionRequest{SessionId: "s1"}
	stream, err := agentv1.NewSessionServiceClient(c).WatchSession(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	var got []*agentv1.WatchSessionResponse
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, resp)
	}
	if len(got) != 2 || got[0].GetEndReason() != "for s1" || got[1].GetState() != agentv1.SessionState_SESSION_STATE_COMPLETED {
		t.Fatalf("stream = %v", got)
	}
	if req.GetSessionId() != "s1" {
		t.Errorf("the caller's request became %q", req.GetSessionId())
	}
}
