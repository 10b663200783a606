package anthropicapi

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// FuzzDecodeMessagesRequest: any body either decodes into a request that marshals (valid
// UTF-8 throughout, as gRPC needs) or is refused with a field error; never a panic. The
// seed corpus is in testdata/fuzz/FuzzDecodeMessagesRequest.
func FuzzDecodeMessagesRequest(f *testing.F) {
	f.Add([]byte(`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		mr, err := DecodeMessagesRequest(body)
		if err != nil {
			var v *rpc.ValidationError
			if !errors.As(err, &v) || len(v.Violations) == 0 || v.Violations[0].Field == "" {
				t.Fatalf("error without a field: %v", err)
			}
			return
		}
		if _, err := proto.Marshal(mr.Request); err != nil {
			t.Fatalf("decoded request does not marshal: %v", err)
		}
	})
}
