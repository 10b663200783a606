package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/mantle-mesh/mantle/pkg/provider"
)

func TestChatBodyExtraBody(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		extra   string
		want    map[string]string // members of the body
		wantErr string
	}{
		{name: "added as is", extra: `{"top_k":40,"chat_template_kwargs":{"thinking":true}}`, want: map[string]string{"top_k": `40`, "chat_template_kwargs": `{"thinking":true}`, "model": `"m"`}},
		{name: "a member mantle sets", extra: `{"model":"other"}`, wantErr: "extra_body.model"},
		{name: "not an object", extra: `[1]`, wantErr: "not a JSON object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req := provider.Request{Model: "m", Messages: []provider.Message{{Role: "user", Content: "hi"}}, ExtraBody: json.RawMessage(tt.extra)}
			b, err := json.Marshal(chatBody(req, false))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Marshal error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]json.RawMessage
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			for k, v := range tt.want {
				if string(got[k]) != v {
					t.Errorf("body[%s] = %s, want %s", k, got[k], v)
				}
			}
		})
	}
}

// TestEncodeJSONIsMarshal: the body post sends (EncodeJSON, which skips json.Marshal's
// second pass) is json.Marshal's, byte for byte, and so are its errors.
func TestEncodeJSONIsMarshal(t *testing.T) {
	t.Parallel()
	temp := 0.5
	for _, tt := range []struct {
		name string
		req  provider.Request
	}{
		{"plain", provider.Request{Model: "m", Messages: []provider.Message{{Role: "user", Content: "hi <b>&</b> \u2028 é"}}}},
		{"options", provider.Request{Model: "m", Temperature: &temp, Stop: []string{"x"}, Messages: []provider.Message{{Role: "system", Content: "s"}, {Role: "user", Parts: []provider.Part{{Type: provider.PartText, Text: "t"}}}}}},
		{"extra body", provider.Request{Model: "m", Messages: []provider.Message{{Role: "user", Content: "hi"}}, ExtraBody: json.RawMessage(`{"top_k":40,"z":"<"}`)}},
		{"extra body naming a set member", provider.Request{Model: "m", ExtraBody: json.RawMessage(`{"model":"other"}`)}},
		{"extra body not an object", provider.Request{Model: "m", ExtraBody: json.RawMessage(`[1]`)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			body := chatBody(tt.req, false)
			want, wantErr := json.Marshal(body)
			got, err := body.EncodeJSON()
			if !bytes.Equal(got, want) || fmt.Sprint(err) != fmt.Sprint(wantErr) {
				t.Errorf("EncodeJSON = %s, %v\nwant (json.Marshal) %s, %v", got, err, want, wantErr)
			}
		})
	}
}
