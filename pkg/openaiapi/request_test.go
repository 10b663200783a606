package openaiapi

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
)

// TestDecodeMessages: every member of a message is decoded, an absent or null one left
// empty, and a wrong one refused naming its path.
func TestDecodeMessages(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		messages string
		want     string // the messages as protojson, when decoded
		wantErr  string
	}{
		{"role and content", `[{"role":"user","content":"hi"}]`, `[{"role":"user","content":"hi"}]`, ""},
		{"every member", `[{"role":"assistant","name":"n","refusal":"r","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"ok"}]`,
			`[{"role":"assistant","name":"n","toolCalls":[{"id":"c","type":"function","name":"f","arguments":"{}"}],"refusal":"r","contentNull":true},{"role":"tool","content":"ok","toolCallId":"c"}]`, ""},
		{"absent content", `[{"role":"user"}]`, `[{"role":"user","contentNull":true}]`, ""},
		{"null members", `[{"role":"user","name":null,"tool_calls":null,"content":"x"}]`, `[{"role":"user","content":"x"}]`, ""},
		{"parts", `[{"role":"user","content":[{"type":"text","text":"a"}]}]`, `[{"role":"user","parts":[{"text":"a"}]}]`, ""},
		{"a wrong name", `[{"role":"user","content":"x"},{"role":"user","name":3}]`, "", "messages[1].name: want a string"},
		{"a wrong role", `[{"role":true}]`, "", "messages[0].role: want a string"},
		{"a wrong content", `[{"role":"user","content":3}]`, "", "messages[0].content: want a string, null or a list"},
		{"a wrong part", `[{"role":"user","content":[{"type":"video"}]}]`, "", "messages[0].content[0].type: want text"},
		{"wrong tool calls", `[{"role":"assistant","tool_calls":{}}]`, "", "messages[0].tool_calls: want a list of tool calls"},
		{"unknown members, the first in order named", `[{"role":"user","zz":1,"content":"x","aa":2}]`, "", "messages[0].aa: unknown field"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cr, err := DecodeChatRequest([]byte(`{"model":"m","messages":` + tt.messages + `}`))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, m := range cr.Request.GetMessages() {
				got = append(got, protojson.MarshalOptions{}.Format(m))
			}
			if g := "[" + strings.Join(got, ",") + "]"; strings.ReplaceAll(g, " ", "") != tt.want {
				t.Errorf("messages %s\nwant %s", g, tt.want)
			}
		})
	}
}

func BenchmarkDecodeChatRequest(b *testing.B) {
	body := []byte(`{"model":"gpt-4o-mini","temperature":0,"max_tokens":256,"messages":[` +
		`{"role":"system","content":"You are a helpful support agent for a parcel company."},` +
		`{"role":"user","content":"Benchmark request 12345: how long does a parcel to Lisbon take?"}]}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeChatRequest(body); err != nil {
			b.Fatal(err)
		}
	}
}
