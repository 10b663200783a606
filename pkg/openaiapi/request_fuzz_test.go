package openaiapi

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// FuzzDecodeChatRequest: any body either decodes into a request that marshals (valid
// UTF-8 throughout, as gRPC needs) or is refused with a field error; never a panic. The
// seed corpus is in testdata/fuzz/FuzzDecodeChatRequest.
func FuzzDecodeChatRequest(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		cr, err := DecodeChatRequest(body)
		if err != nil {
			var v *rpc.ValidationError
			if !errors.As(err, &v) || len(v.Violations) == 0 || v.Violations[0].Field == "" {
				t.Fatalf("error without a field: %v", err)
			}
			return
		}
		if _, err := proto.Marshal(cr.Request); err != nil {
			t.Fatalf("decoded request does not marshal: %v", err)
		}
	})
}
