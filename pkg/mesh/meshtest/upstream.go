package meshtest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// RecordingUpstream is an OpenAI-compatible server that keeps the bodies it was sent. It
// answers a request that offers tools (and does not say tool_choice none) with parallel
// tool calls of the first two tools offered (streamed as index-based pieces when asked to
// stream): the first with arguments {"city":"Paris"}, the second with {"tz":"CET"}. Any
// other request gets text, and logprobs when they were asked for.
type RecordingUpstream struct {
	recorded
}

// ServeHTTP answers POST .../chat/completions; GET .../recorded/last returns the latest
// body (for tests in other languages).
func (u *RecordingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if u.serveLast(w, r) {
		return
	}
	raw, _ := io.ReadAll(r.Body)
	var body map[string]json.RawMessage
	if err := json.Unmarshal(raw, &body); err != nil {
		http.Error(w, `{"error":{"message":"not JSON","type":"invalid_request_error"}}`, http.StatusBadRequest)
		return
	}
	u.add(body)
	first, second := offeredTools(body["tools"], body["tool_choice"])
	tools := first != ""
	logprobs := string(body["logprobs"]) == "true"
	const lp = `{"content":[{"token":"ok","logprob":-0.1,"bytes":[111,107],"top_logprobs":[]}]}`
	if string(body["stream"]) == "true" {
		w.Header().Set("Content-Type", "text/event-stream")
		send := func(s string) { fmt.Fprintf(w, "data: %s\n\n", s) }
		if tools {
			send(`{"id":"u1","object":"chat.completion.chunk","model":"up","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":` + first + `,"arguments":""}}]},"finish_reason":null}]}`)
			send(`{"id":"u1","object":"chat.completion.chunk","model":"up","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]},"finish_reason":null}]}`)
			if second != "" {
				send(`{"id":"u1","object":"chat.completion.chunk","model":"up","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":` + second + `,"arguments":"{\"tz\":"}}]},"finish_reason":null}]}`)
			}
			send(`{"id":"u1","object":"chat.completion.chunk","model":"up","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]},"finish_reason":null}]}`)
			if second != "" {
				send(`{"id":"u1","object":"chat.completion.chunk","model":"up","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"\"CET\"}"}}]},"finish_reason":null}]}`)
			}
			send(`{"id":"u1","object":"chat.completion.chunk","model":"up","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`)
		} else {
			logp := ""
			if logprobs {
				logp = `,"logprobs":` + lp
			}
			send(`{"id":"u1","object":"chat.completion.chunk","model":"up","choices":[{"index":0,"delta":{"role":"assistant","content":"ok"}` + logp + `,"finish_reason":null}]}`)
			send(`{"id":"u1","object":"chat.completion.chunk","model":"up","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`)
		}
		send(`{"id":"u1","object":"chat.completion.chunk","model":"up","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}`)
		send(`[DONE]`)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if tools {
		calls := `{"id":"call_a","type":"function","function":{"name":` + first + `,"arguments":"{\"city\":\"Paris\"}"}}`
		if second != "" {
			calls += `,{"id":"call_b","type":"function","function":{"name":` + second + `,"arguments":"{\"tz\":\"CET\"}"}}`
		}
		fmt.Fprint(w, `{"id":"u1","object":"chat.completion","model":"up","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[`+
			calls+`]},"finish_reason":"tool_calls"}],`+
			`"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}`)
		return
	}
	logp := ""
	if logprobs {
		logp = `,"logprobs":` + lp
	}
	content := `"ok"`
	if _, ok := body["response_format"]; ok {
		content = `"{\"a\":1}"`
	}
	fmt.Fprint(w, `{"id":"u1","object":"chat.completion","model":"up","choices":[{"index":0,"message":{"role":"assistant","content":`+content+`}`+logp+`,"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}`)
}

// offeredTools returns the names of the first two tools of a request (OpenAI's
// tools[].function.name or Anthropic's tools[].name), as JSON strings ("" when absent):
// the upstreams call only tools they were offered, and none when tool_choice is none
// (OpenAI's "none", Anthropic's {"type":"none"}), as a model does: mantle's L1 check fails
// any other call.
func offeredTools(raw, choice json.RawMessage) (first, second string) {
	var typed struct {
		Type string `json:"type"`
	}
	if string(choice) == `"none"` || (json.Unmarshal(choice, &typed) == nil && typed.Type == "none") {
		return "", ""
	}
	var tools []struct {
		Name     string `json:"name"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(raw, &tools) != nil {
		return "", ""
	}
	names := make([]string, 0, 2)
	for _, t := range tools[:min(len(tools), 2)] {
		name := t.Function.Name
		if name == "" {
			name = t.Name
		}
		b, _ := json.Marshal(name)
		names = append(names, string(b))
	}
	names = append(names, "", "")
	return names[0], names[1]
}
