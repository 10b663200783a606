package meshtest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// AnthropicRecordingUpstream is a Messages API server that keeps the bodies it was sent. It
// answers a request that offers tools (and does not say tool_choice none) with parallel
// tool_use blocks of the first two tools offered (streamed as input_json_delta pieces when
// asked to stream): the first with input {"city":"Paris"}, the second with {"tz":"CET"}.
// Any other request gets the text {"a":1}, which also satisfies a JSON response format
// the verifier checks.
type AnthropicRecordingUpstream struct {
	recorded
}

// ServeHTTP answers POST .../messages; GET .../recorded/last returns the latest body (for
// tests in other languages).
func (u *AnthropicRecordingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if u.serveLast(w, r) {
		return
	}
	raw, _ := io.ReadAll(r.Body)
	var body map[string]json.RawMessage
	if err := json.Unmarshal(raw, &body); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"type":"error","error":{"type":"invalid_request_error","message":"not JSON"}}`)
		return
	}
	u.add(body)
	first, second := offeredTools(body["tools"], body["tool_choice"])
	tools := first != ""
	w.Header().Set("Request-Id", "req_ant")
	if string(body["stream"]) == "true" {
		w.Header().Set("Content-Type", "text/event-stream")
		send := func(name, data string) { fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, data) }
		send("message_start", `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-up","stop_reason":null,"usage":{"input_tokens":5,"output_tokens":1}}}`)
		stop := "end_turn"
		if tools {
			stop = "tool_use"
			send("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}`)
			send("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"two calls"}}`)
			send("content_block_stop", `{"type":"content_block_stop","index":0}`)
			send("content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_a","name":`+first+`,"input":{}}}`)
			send("content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"city\":"}}`)
			if second != "" {
				send("content_block_start", `{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_b","name":`+second+`,"input":{}}}`)
				send("content_block_delta", `{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"tz\":"}}`)
			}
			send("content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"\"Paris\"}"}}`)
			if second != "" {
				send("content_block_delta", `{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"\"CET\"}"}}`)
			}
			send("content_block_stop", `{"type":"content_block_stop","index":1}`)
			if second != "" {
				send("content_block_stop", `{"type":"content_block_stop","index":2}`)
			}
		} else {
			send("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
			send("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"{\"a\":1}"}}`)
			send("content_block_stop", `{"type":"content_block_stop","index":0}`)
		}
		send("message_delta", `{"type":"message_delta","delta":{"stop_reason":"`+stop+`","stop_sequence":null},"usage":{"output_tokens":3}}`)
		send("message_stop", `{"type":"message_stop"}`)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if tools {
		fmt.Fprint(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-up","content":[`+
			`{"type":"thinking","thinking":"two calls","signature":"sig"},`+
			`{"type":"tool_use","id":"toolu_a","name":`+first+`,"input":{"city":"Paris"}}`+secondBlock(second)+`],`+
			`"stop_reason":"tool_use","usage":{"input_tokens":5,"output_tokens":3}}`)
		return
	}
	fmt.Fprint(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-up","content":[{"type":"text","text":"{\"a\":1}"}],"stop_reason":"end_turn","usage":{"input_tokens":5,"output_tokens":3}}`)
}

func secondBlock(name string) string {
	if name == "" {
		return ""
	}
	return `,{"type":"tool_use","id":"toolu_b","name":` + name + `,"input":{"tz":"CET"}}`
}
