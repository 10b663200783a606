package router

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	cachev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/cache/v1"
	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// partitionOf is what the cache's scope (its partition, services/cache key.go) is made
// of, minus the tenant: the last turn's text is left out, since the cache compares it by
// similarity within the partition. Two prompts with one partition may share an answer.
func partitionOf(p *cachev1.Prompt) string {
	var b []byte
	add := func(s string) { b = binary.AppendUvarint(b, uint64(len(s))); b = append(b, s...) }
	add(p.GetScenario())
	add(p.GetModel())
	add(p.GetModelFamily())
	if p.Temperature != nil {
		add(fmt.Sprint(math.Round(*p.Temperature * 10)))
	} else {
		add("unset")
	}
	add(fmt.Sprint(p.GetMaxTokens()))
	rf := p.GetResponseFormat()
	add(rf.GetType().String())
	add(rf.GetJsonSchema())
	for _, f := range slices.Sorted(slices.Values(rf.GetRequiredFields())) {
		add(f)
	}
	msgs := p.GetMessages()
	for _, m := range msgs[:len(msgs)-1] {
		add(m.GetRole())
		add(m.GetName())
		add(m.GetContent())
	}
	add(p.GetContextFingerprint())
	sum := sha256.Sum256(b)
	return string(sum[:])
}

func scopeOf(t *testing.T, req *routerv1.Request) string {
	t.Helper()
	// The model names the route, and the scenario is the QualityContext's.
	p := cachePrompt(req, &route{name: req.GetModel()}, &mantlev1.QualityContext{Scenario: req.GetScenario()})
	msgs := p.GetMessages()
	last := msgs[len(msgs)-1]
	// What the cache's validatePrompt needs, or it refuses the prompt.
	if last.GetRole() != "user" || last.GetContent() == "" {
		t.Fatalf("the cache would refuse the prompt: last message %v", last)
	}
	for i, m := range msgs {
		if len(m.GetParts()) > 0 || len(m.GetToolCalls()) > 0 || m.GetToolCallId() != "" || m.GetRefusal() != "" {
			t.Fatalf("prompt.messages[%d] carries more than text, which the cache refuses", i)
		}
	}
	return partitionOf(p)
}

// scalar is a value for fd: variant 1 fills, variant 2 differs from it.
func fieldValue(fd protoreflect.FieldDescriptor, v int) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(v == 1)
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(fmt.Sprintf("%s-%d", fd.Name(), v))
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte{byte(v), 0xff})
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(v + 1))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(int64(v + 1))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(v + 1))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(uint64(v + 1))
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(0.5 * float64(v))
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(0.5 * float32(v))
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(fd.Enum().Values().Get(v % fd.Enum().Values().Len()).Number())
	}
	panic("unhandled kind " + fd.Kind().String())
}

// fill sets every field of m, recursively. A repeated message with a oneof gets one
// element per member, so every member is covered.
func fill(m protoreflect.Message) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.ContainingOneof() != nil && !fd.ContainingOneof().IsSynthetic() && m.WhichOneof(fd.ContainingOneof()) != nil {
			continue
		}
		switch {
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			mp.Set(protoreflect.ValueOfString("k").MapKey(), fieldValue(fd.MapValue(), 1))
		case fd.IsList() && fd.Message() != nil:
			list := m.Mutable(fd).List()
			oneofs := fd.Message().Oneofs()
			if oneofs.Len() > 0 && !oneofs.Get(0).IsSynthetic() {
				members := oneofs.Get(0).Fields()
				for j := range members.Len() {
					e := list.NewElement()
					if members.Get(j).Message() != nil {
						e.Message().Set(members.Get(j), protoreflect.ValueOfMessage(e.Message().Mutable(members.Get(j)).Message()))
						fill(e.Message().Mutable(members.Get(j)).Message())
					} else {
						e.Message().Set(members.Get(j), fieldValue(members.Get(j), 1))
					}
					list.Append(e)
				}
				continue
			}
			e := list.NewElement()
			fill(e.Message())
			list.Append(e)
		case fd.IsList():
			m.Mutable(fd).List().Append(fieldValue(fd, 1))
		case fd.Message() != nil:
			fill(m.Mutable(fd).Message())
		default:
			m.Set(fd, fieldValue(fd, 1))
		}
	}
}

// leaf is one scalar in a filled message: its path and a change to it.
type leaf struct {
	path  string
	field protoreflect.FullName
	// within are the message fields the leaf is inside of.
	within []protoreflect.FullName
	change func()
}

func leaves(m protoreflect.Message, path string, within []protoreflect.FullName, out *[]leaf) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		p := path + "." + string(fd.Name())
		in := append(slices.Clone(within), fd.FullName())
		switch {
		case fd.IsMap():
			*out = append(*out, leaf{p + "{k}", fd.FullName(), within, func() {
				v.Map().Set(protoreflect.ValueOfString("k").MapKey(), fieldValue(fd.MapValue(), 2))
			}})
		case fd.IsList() && fd.Message() != nil:
			for i := range v.List().Len() {
				leaves(v.List().Get(i).Message(), fmt.Sprintf("%s[%d]", p, i), in, out)
			}
			*out = append(*out, leaf{p + "[+]", fd.FullName(), within, func() {
				e := v.List().NewElement()
				v.List().Append(e)
			}})
		case fd.IsList():
			*out = append(*out, leaf{p + "[0]", fd.FullName(), within, func() { v.List().Set(0, fieldValue(fd, 2)) }})
		case fd.Message() != nil:
			leaves(v.Message(), p, in, out)
		default:
			*out = append(*out, leaf{p, fd.FullName(), within, func() { m.Set(fd, fieldValue(fd, 2)) }})
		}
		return true
	})
}

// reachable lists every field of md and of the messages under it.
func reachable(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) {
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if seen[fd.FullName()] {
			continue
		}
		seen[fd.FullName()] = true
		if fd.IsMap() {
			continue
		}
		if fd.Message() != nil {
			reachable(fd.Message(), seen)
		}
	}
}

// TestCacheScopeCoversEveryField changes each field of a request, at every depth, one at
// a time, and checks that the cache's scope changes, except for the fields
// outsideFingerprint says do not change the answer. The fields come from the descriptor,
// so a field added to the proto is covered (and must pass) without editing this test.
func TestCacheScopeCoversEveryField(t *testing.T) {
	unchanged := map[string]bool{}
	for name := range outsideFingerprint {
		if (&routerv1.Request{}).ProtoReflect().Descriptor().Fields().ByName(name) == nil {
			t.Errorf("outsideFingerprint names %s, which Request does not have", name)
		}
	}
	// The fields that do not change the answer keep the scope; the others outside the
	// fingerprint change it through the prompt.
	for _, name := range []string{"priority", "idempotency_key", "service_tier", "metadata", "store", "user", "session_id", "step_id", "step_required"} {
		unchanged["mantle.router.v1.Request."+name] = true
	}

	base := func() *routerv1.Request {
		req := &routerv1.Request{}
		fill(req.ProtoReflect())
		req.Messages = append(req.Messages, proto.Clone(req.Messages[0]).(*mantlev1.ChatMessage))
		return req
	}
	want := scopeOf(t, base())
	var all []leaf
	leaves(base().ProtoReflect(), "request", nil, &all)
	visited := map[protoreflect.FullName]bool{}
	for i := range all {
		req := base()
		var ls []leaf
		leaves(req.ProtoReflect(), "request", nil, &ls)
		l := ls[i]
		visited[l.field] = true
		for _, f := range l.within {
			visited[f] = true
		}
		l.change()
		got := scopeOf(t, req)
		if unchanged[string(l.field)] {
			if got != want {
				t.Errorf("%s changed the scope; it does not change the answer and would split entries", l.path)
			}
			continue
		}
		if got == want {
			t.Errorf("%s did not change the scope: requests differing in it would share an answer", l.path)
		}
	}
	seen := map[protoreflect.FullName]bool{}
	reachable((&routerv1.Request{}).ProtoReflect().Descriptor(), seen)
	for name := range seen {
		if !visited[name] {
			t.Errorf("field %s was never changed by the test", name)
		}
	}
	if len(all) < 60 {
		t.Errorf("only %d leaves: the filler missed fields", len(all))
	}
}

// TestCacheScopeText covers the turns the cache compares itself: the last user question's
// text is the one thing a semantic hit may differ in; everything else is exact.
func TestCacheScopeText(t *testing.T) {
	user := func(s string) *mantlev1.ChatMessage { return &mantlev1.ChatMessage{Role: "user", Content: s} }
	img := func(url string, data []byte) *mantlev1.ContentPart {
		return &mantlev1.ContentPart{Part: &mantlev1.ContentPart_Image{Image: &mantlev1.ImagePart{Url: url, Data: data}}}
	}
	text := func(s string) *mantlev1.ContentPart {
		return &mantlev1.ContentPart{Part: &mantlev1.ContentPart_Text{Text: s}}
	}
	withParts := func(parts ...*mantlev1.ContentPart) *mantlev1.ChatMessage {
		return &mantlev1.ChatMessage{Role: "user", Parts: parts}
	}
	toolTurns := func(result string) []*mantlev1.ChatMessage {
		return []*mantlev1.ChatMessage{user("weather in Paris?"),
			{Role: "assistant", ToolCalls: []*mantlev1.ToolCall{{Id: "c1", Type: "function", Name: "weather", Arguments: `{"city":"Paris"}`}}},
			{Role: "tool", ToolCallId: "c1", Content: result}}
	}
	tests := []struct {
		name   string
		a, b   []*mantlev1.ChatMessage
		shared bool // a and b have one scope
	}{
		{"last question text", []*mantlev1.ChatMessage{user("hi")}, []*mantlev1.ChatMessage{user("hello")}, true},
		{"text parts as the last question", []*mantlev1.ChatMessage{withParts(text("hi"))}, []*mantlev1.ChatMessage{withParts(text("hello"))}, true},
		{"earlier turn text", []*mantlev1.ChatMessage{user("a"), user("hi")}, []*mantlev1.ChatMessage{user("b"), user("hi")}, false},
		{"image bytes", []*mantlev1.ChatMessage{withParts(text("what is it?"), img("", []byte{1}))}, []*mantlev1.ChatMessage{withParts(text("what is it?"), img("", []byte{2}))}, false},
		{"image url", []*mantlev1.ChatMessage{withParts(text("what is it?"), img("https://x/a.png", nil))}, []*mantlev1.ChatMessage{withParts(text("what is it?"), img("https://x/b.png", nil))}, false},
		{"question beside an image", []*mantlev1.ChatMessage{withParts(text("what is it?"), img("https://x/a.png", nil))}, []*mantlev1.ChatMessage{withParts(text("what colour is it?"), img("https://x/a.png", nil))}, false},
		{"image alone", []*mantlev1.ChatMessage{withParts(img("https://x/a.png", nil))}, []*mantlev1.ChatMessage{withParts(img("https://x/b.png", nil))}, false},
		{"tool result", toolTurns("sunny"), toolTurns("rain"), false},
		{"split text parts", []*mantlev1.ChatMessage{user("x"), withParts(text("a\nb"))}, []*mantlev1.ChatMessage{user("x"), withParts(text("a"), text("b"))}, false},
		{"text parts vs content", []*mantlev1.ChatMessage{user("x"), withParts(text("a"))}, []*mantlev1.ChatMessage{user("x"), user("a")}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := scopeOf(t, &routerv1.Request{Messages: tt.a})
			b := scopeOf(t, &routerv1.Request{Messages: tt.b})
			if (a == b) != tt.shared {
				t.Errorf("shared scope = %v, want %v", a == b, tt.shared)
			}
		})
	}
	if fp := contextFingerprint(&routerv1.Request{Model: "m", Messages: []*mantlev1.ChatMessage{user("hi")}}); fp != "" {
		t.Errorf("a plain request has fingerprint %q; its entries would change keys", fp)
	}
}

// TestToolCallHitsOnlyExact: a cached answer with tool calls answers the identical prompt
// (an exact or coalesced hit), tool calls and finish reason included, and never a similar
// one, whose arguments would be another question's.
func TestToolCallHitsOnlyExact(t *testing.T) {
	calls := []*mantlev1.ToolCall{{Id: "call_a", Type: "function", Name: "convert", Arguments: `{"c":20}`}}
	for _, tt := range []struct {
		name      string
		coalesced bool
		served    bool
	}{{"similar prompt", false, false}, {"identical prompt", true, true}} {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, testConfig(), &harness{})
			h.cache.hit = &cachev1.Entry{Id: "e1", SourceModel: "b", FinishReason: "tool_calls", ToolCalls: calls}
			if tt.coalesced {
				h.cache.coalesced, h.cache.clock = time.Millisecond, h.clock
			}
			resp, err := h.router.Complete(context.Background(), ask("chat"))
			if err != nil {
				t.Fatal(err)
			}
			if served := resp.GetQuality().GetCacheHit(); served != tt.served {
				t.Fatalf("served from the cache = %t, want %t", served, tt.served)
			}
			if tt.served && (resp.GetFinishReason() != "tool_calls" || len(resp.GetMessage().GetToolCalls()) != 1 || !proto.Equal(resp.GetMessage().GetToolCalls()[0], calls[0])) {
				t.Errorf("answer %v, want the cached tool calls", resp)
			}
			if !tt.served && h.calls("a") != 1 {
				t.Errorf("a called %d times, want the model asked", h.calls("a"))
			}
		})
	}
}

// TestContextFingerprintSharesNotClones: the fingerprint built from the hashed fields alone
// is the one a clone of the whole request, cleared of the others, gave; and req is left
// as it was.
func TestContextFingerprintSharesNotClones(t *testing.T) {
	t.Parallel()
	filled := &routerv1.Request{}
	fill(filled.ProtoReflect())
	filled.Messages = append(filled.Messages, proto.Clone(filled.Messages[0]).(*mantlev1.ChatMessage))
	unknown := &routerv1.Request{Model: "m", Messages: []*mantlev1.ChatMessage{{Role: "user", Content: "q"}}}
	unknown.ProtoReflect().SetUnknown(protoreflect.RawFields{0xf8, 0x7f, 0x01}) // field 2047, varint 1
	temp := 0.3
	for _, tc := range []struct {
		name string
		req  *routerv1.Request
	}{
		{"plain text", &routerv1.Request{Model: "m", Messages: []*mantlev1.ChatMessage{{Role: "user", Content: "q"}}, Temperature: &temp, User: "u"}},
		{"every field", filled},
		{"a tool turn", &routerv1.Request{Model: "m", Messages: []*mantlev1.ChatMessage{{Role: "assistant", ToolCalls: []*mantlev1.ToolCall{{Id: "c", Name: "f"}}}, {Role: "tool", ToolCallId: "c", Content: "r"}}}},
		{"unknown fields", unknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			before := proto.Clone(tc.req)
			got, want := contextFingerprint(tc.req), clonedFingerprint(tc.req)
			if got != want {
				t.Errorf("fingerprint %q, want %q", got, want)
			}
			if !proto.Equal(tc.req, before) {
				t.Error("the request changed")
			}
		})
	}
}

// clonedFingerprint is contextFingerprint made from a clone of the whole request cleared
// of the fields outside the fingerprint (messages among them).
func clonedFingerprint(req *routerv1.Request) string {
	c := proto.Clone(req).(*routerv1.Request)
	m := c.ProtoReflect()
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		if _, out := outsideFingerprint[fields.Get(i).Name()]; out {
			m.Clear(fields.Get(i))
		}
	}
	return hashFingerprint(c, req.Messages)
}

// BenchmarkContextFingerprint measures the fingerprint every cacheable request computes:
// of a plain text request (the usual one, whose fingerprint is empty) and of one with a
// tool and sampling fields.
func BenchmarkContextFingerprint(b *testing.B) {
	temp, topP := 0.2, 0.9
	plain := &routerv1.Request{Model: "m", Messages: []*mantlev1.ChatMessage{{Role: "system", Content: "s"}, {Role: "user", Content: "q"}}, Temperature: &temp, MaxTokens: 256}
	tools := proto.Clone(plain).(*routerv1.Request)
	tools.TopP = &topP
	tools.Tools = []*mantlev1.Tool{{Type: "function", Name: "lookup", Description: "finds an order", Parameters: `{"type":"object"}`}}
	tools.ToolChoice = "auto"
	for _, bc := range []struct {
		name string
		req  *routerv1.Request
	}{{"plain", plain}, {"tools", tools}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				contextFingerprint(bc.req)
			}
		})
	}
}
