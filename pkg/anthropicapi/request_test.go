package anthropicapi

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/mantle-mesh/mantle/pkg/rpc"
)

const user = `"messages":[{"role":"user","content":"hi"}]`

// TestDecodeMessagesRequest: each documented field lands in the router request (shown as
// protojson), and each field mantle cannot carry, or that is not documented, is refused
// naming its path.
func TestDecodeMessagesRequest(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		body string
		// want: substrings of the decoded request's protojson; refused: the error's field.
		want    []string
		stream  bool
		refused string
	}{
		{name: "text", body: `{"model":"m","max_tokens":10,` + user + `}`,
			want: []string{`"model":"m"`, `"max_tokens":10`, `"messages":[{"role":"user","content":"hi"}]`}},
		{name: "system string first", body: `{"model":"m","max_tokens":10,"system":"be brief",` + user + `}`,
			want: []string{`"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]`}},
		{name: "system blocks", body: `{"model":"m","max_tokens":10,"system":[{"type":"text","text":"a"},{"type":"text","text":"b"}],` + user + `}`,
			want: []string{`{"role":"system","parts":[{"text":"a"},{"text":"b"}]}`}},
		{name: "image base64 and url", body: `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[{"type":"text","text":"what?"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},{"type":"image","source":{"type":"url","url":"https://x/y.png"}}]}]}`,
			want: []string{`{"text":"what?"},{"image":{"data":"iVBORw0KGgo=","media_type":"image/png"}},{"image":{"url":"https://x/y.png"}}`}},
		{name: "document", body: `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[{"type":"document","title":"a.pdf","source":{"type":"base64","media_type":"application/pdf","data":"JVBERg=="}}]}]}`,
			want: []string{`{"file":{"filename":"a.pdf","file_data":"data:application/pdf;base64,JVBERg=="}}`}},
		{name: "tool turns", body: `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"weather?"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"get_weather","input":{"city": "Paris"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"sunny"},{"type":"tool_result","tool_use_id":"t2","content":[{"type":"text","text":"rain"}],"is_error":true},{"type":"text","text":"and?"}]}]}`,
			want: []string{
				`{"role":"assistant","tool_calls":[{"id":"t1","type":"function","name":"get_weather","arguments":"{\"city\":\"Paris\"}"}],"content_null":true}`,
				`{"role":"tool","content":"sunny","tool_call_id":"t1"}`,
				`{"role":"tool","parts":[{"text":"rain"}],"tool_call_id":"t2","tool_error":true}`,
				`{"role":"user","parts":[{"text":"and?"}]}`,
			}},
		{name: "assistant text and tool_use", body: `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"text","text":"looking"},{"type":"tool_use","id":"t1","name":"f","input":{}}]}]}`,
			want: []string{`{"role":"assistant","parts":[{"text":"looking"}],"tool_calls":[{"id":"t1","type":"function","name":"f","arguments":"{}"}]}`}},
		{name: "sampling", body: `{"model":"m","max_tokens":10,"stop_sequences":["END"],"temperature":0.2,"top_p":0.9,"top_k":40,"metadata":{"user_id":"u-1"},` + user + `}`,
			want: []string{`"temperature":0.2`, `"user":"u-1"`, `"stop":["END"]`, `"top_p":0.9`, `"top_k":40`}},
		{name: "thinking", body: `{"model":"m","max_tokens":2000,"thinking":{"type":"enabled","budget_tokens":1024},` + user + `}`,
			want: []string{`"thinking":{"type":"enabled","budget_tokens":1024}`}},
		{name: "tools", body: `{"model":"m","max_tokens":10,"tools":[{"name":"f","description":"d","input_schema":{"type":"object"}},{"type":"custom","name":"g","input_schema":{}}],"tool_choice":{"type":"auto","disable_parallel_tool_use":true},` + user + `}`,
			want: []string{`"tools":[{"type":"function","name":"f","description":"d","parameters":"{\"type\":\"object\"}"},{"type":"function","name":"g","parameters":"{}"}]`, `"tool_choice":"auto"`, `"parallel_tool_calls":false`}},
		{name: "tool_choice any", body: `{"model":"m","max_tokens":10,"tool_choice":{"type":"any"},` + user + `}`, want: []string{`"tool_choice":"required"`}},
		{name: "tool_choice tool", body: `{"model":"m","max_tokens":10,"tool_choice":{"type":"tool","name":"f","disable_parallel_tool_use":false},` + user + `}`,
			want: []string{`"tool_choice":"function"`, `"tool_choice_function":"f"`, `"parallel_tool_calls":true`}},
		{name: "tool_choice none", body: `{"model":"m","max_tokens":10,"tool_choice":{"type":"none"},` + user + `}`, want: []string{`"tool_choice":"none"`}},
		{name: "stream", body: `{"model":"m","max_tokens":10,"stream":true,` + user + `}`, stream: true},

		{name: "max_tokens required", body: `{"model":"m",` + user + `}`, refused: "max_tokens"},
		{name: "max_tokens zero", body: `{"model":"m","max_tokens":0,` + user + `}`, refused: "max_tokens"},
		{name: "messages required", body: `{"model":"m","max_tokens":1}`, refused: "messages"},
		{name: "unknown top-level", body: `{"model":"m","max_tokens":1,"frequency_penalty":1,` + user + `}`, refused: "frequency_penalty"},
		{name: "service_tier", body: `{"model":"m","max_tokens":1,"service_tier":"auto",` + user + `}`, refused: "service_tier"},
		{name: "mcp_servers", body: `{"model":"m","max_tokens":1,"mcp_servers":[],` + user + `}`, refused: "mcp_servers"},
		{name: "unknown metadata", body: `{"model":"m","max_tokens":1,"metadata":{"app":"x"},` + user + `}`, refused: "metadata.app"},
		{name: "role system in messages", body: `{"model":"m","max_tokens":1,"messages":[{"role":"system","content":"x"}]}`, refused: "messages[0].role"},
		{name: "unknown message field", body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x","name":"ann"}]}`, refused: "messages[0].name"},
		{name: "cache_control", body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}]}]}`, refused: "messages[0].content[0].cache_control"},
		{name: "system cache_control", body: `{"model":"m","max_tokens":1,"system":[{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}],` + user + `}`, refused: "system[0].cache_control"},
		{name: "citations", body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBERg=="},"citations":{"enabled":true}}]}]}`, refused: "messages[0].content[0].citations"},
		{name: "document text source", body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"text","media_type":"text/plain","data":"x"}}]}]}`, refused: "messages[0].content[0].source.type"},
		{name: "image file source", body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"file","file_id":"f"}}]}]}`, refused: "messages[0].content[0].source.type"},
		{name: "image bad base64", body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"%%%"}}]}]}`, refused: "messages[0].content[0].source.data"},
		{name: "image bad media type", body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/tiff","data":"AA=="}}]}]}`, refused: "messages[0].content[0].source.media_type"},
		{name: "url source with data", body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://x","data":"AA=="}}]}]}`, refused: "messages[0].content[0].source.data"},
		{name: "thinking block", body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"}]}]}`, refused: "messages[1].content[0].type"},
		{name: "tool_use in a user turn", body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]}]}`, refused: "messages[0].content[0].type"},
		{name: "tool_use input not an object", body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":[1]}]}]}`, refused: "messages[1].content[0].input"},
		{name: "tool_result without id", body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_result","content":"x"}]}]}`, refused: "messages[0].content[0].tool_use_id"},
		{name: "server tool", body: `{"model":"m","max_tokens":1,"tools":[{"type":"web_search_20250305","name":"web_search"}],` + user + `}`, refused: "tools[0].type"},
		{name: "tool cache_control", body: `{"model":"m","max_tokens":1,"tools":[{"name":"f","input_schema":{},"cache_control":{"type":"ephemeral"}}],` + user + `}`, refused: "tools[0].cache_control"},
		{name: "tool without schema", body: `{"model":"m","max_tokens":1,"tools":[{"name":"f"}],` + user + `}`, refused: "tools[0].input_schema"},
		{name: "tool_choice bad type", body: `{"model":"m","max_tokens":1,"tool_choice":{"type":"required"},` + user + `}`, refused: "tool_choice.type"},
		{name: "tool_choice tool without name", body: `{"model":"m","max_tokens":1,"tool_choice":{"type":"tool"},` + user + `}`, refused: "tool_choice.name"},
		{name: "thinking without budget", body: `{"model":"m","max_tokens":1,"thinking":{"type":"enabled"},` + user + `}`, refused: "thinking.budget_tokens"},
		{name: "thinking adaptive", body: `{"model":"m","max_tokens":1,"thinking":{"type":"adaptive"},` + user + `}`, refused: "thinking.type"},
		{name: "too many stop sequences", body: `{"model":"m","max_tokens":1,"stop_sequences":["a","b","c","d","e"],` + user + `}`, refused: "stop_sequences"},
		{name: "not an object", body: `[1]`, refused: "body"},
		{name: "invalid UTF-8", body: "{\"model\":\"m\xff\",\"max_tokens\":1," + user + "}", refused: "body"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			mr, err := DecodeMessagesRequest([]byte(tt.body))
			if tt.refused != "" {
				var v *rpc.ValidationError
				if !errors.As(err, &v) || v.Violations[0].Field != tt.refused {
					t.Fatalf("got %v, want an error naming %s", err, tt.refused)
				}
				return
			}
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			got := protojson.MarshalOptions{UseProtoNames: true}.Format(mr.Request)
			got = strings.Join(strings.Fields(got), "")
			for _, w := range tt.want {
				if !strings.Contains(got, strings.Join(strings.Fields(w), "")) {
					t.Errorf("decoded %s\nwant it to contain %s", got, w)
				}
			}
			if mr.Stream != tt.stream {
				t.Errorf("stream = %v, want %v", mr.Stream, tt.stream)
			}
		})
	}
}
