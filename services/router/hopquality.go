package router

import (
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// Fields of the QualityContext that stay with the router when it calls quota, cache or
// verifier. The audit trail and the attempts grow with every step and retry, none of the
// other services reads them, and each hop would otherwise marshal them twice (request and
// response): on loopback that was about a third of the full mesh's overhead.
var hopOmitted = map[protoreflect.Name]bool{
	"audit":    true,
	"attempts": true,
}

// hopQuality is the QualityContext to send to another service: a copy of qc without the
// fields in hopOmitted. Sub-messages are cloned, so the copy can be marshalled while hedges
// go on changing qc. The services append their own audit steps to it and return it; take
// them back with adoptAudit(qc, sent, returned).
func hopQuality(qc *mantlev1.QualityContext) *mantlev1.QualityContext {
	out := &mantlev1.QualityContext{}
	if qc == nil {
		return out
	}
	dst := out.ProtoReflect()
	qc.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if hopOmitted[fd.Name()] {
			return true
		}
		switch {
		case fd.IsList():
			list := dst.Mutable(fd).List()
			src := v.List()
			for i := range src.Len() {
				e := src.Get(i)
				if fd.Message() != nil {
					e = protoreflect.ValueOfMessage(proto.Clone(e.Message().Interface()).ProtoReflect())
				}
				list.Append(e)
			}
		case fd.Message() != nil && !fd.IsMap():
			dst.Set(fd, protoreflect.ValueOfMessage(proto.Clone(v.Message().Interface()).ProtoReflect()))
		case fd.IsMap():
			m := dst.Mutable(fd).Map()
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				m.Set(k, mv)
				return true
			})
		default:
			dst.Set(fd, v)
		}
		return true
	})
	return out
}
