package router

import (
	"encoding/json"
	"fmt"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

var validRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true}

// validate checks a request and returns its route. Field names are the gRPC field paths so
// BadRequest details point at what to fix.
func (r *Router) validate(req *routerv1.Request) (*route, error) {
	if req == nil {
		return nil, rpc.Invalid("request", "required")
	}
	v := &rpc.ValidationError{}
	if req.Model == "" {
		v.Add("request.model", "required: name a model or route (GET /v1/models lists them)")
	}
	if len(req.Messages) == 0 {
		v.Add("request.messages", "at least one message is required")
	}
	size, hasUser := 0, false
	for i, m := range req.Messages {
		if !validRoles[m.GetRole()] {
			v.Add(fmt.Sprintf("request.messages[%d].role", i), "want system, developer, user, assistant or tool, got %q", m.GetRole())
		}
		if m.GetRole() == "user" {
			hasUser = true
			if !hasContent(m) {
				v.Add(fmt.Sprintf("request.messages[%d].content", i), "must not be empty")
			}
		}
		size += messageBytes(m)
	}
	for _, t := range req.Tools {
		size += len(t.GetName()) + len(t.GetDescription()) + len(t.GetParameters())
	}
	size += len(req.ExtraBody)
	validateChat(v, req)
	if len(req.Messages) > 0 && !hasUser {
		v.Add("request.messages", "at least one user message is required")
	}
	if size > r.conf().MaxPromptBytes {
		v.Add("request.messages", "prompt is %d bytes; the limit is %d (router.max_prompt_bytes)", size, r.conf().MaxPromptBytes)
	}
	if req.MaxTokens < 0 {
		v.Add("request.max_tokens", "must not be negative, got %d", req.MaxTokens)
	}
	if r.conf().MaxOutputTokens > 0 && int(req.MaxTokens) > r.conf().MaxOutputTokens {
		v.Add("request.max_tokens", "must be at most %d, got %d", r.conf().MaxOutputTokens, req.MaxTokens)
	}
	if t := req.Temperature; t != nil && (*t < 0 || *t > 2) {
		v.Add("request.temperature", "must be between 0 and 2, got %g", *t)
	}
	if rf := req.ResponseFormat; rf.GetType() == mantlev1.ResponseFormat_TYPE_JSON_SCHEMA {
		if rf.JsonSchema == "" {
			v.Add("request.response_format.json_schema", "required for TYPE_JSON_SCHEMA")
		} else if !json.Valid([]byte(rf.JsonSchema)) {
			v.Add("request.response_format.json_schema", "is not valid JSON")
		}
	}
	if len(req.IdempotencyKey) > 256 {
		v.Add("request.idempotency_key", "must be at most 256 bytes")
	}
	if err := v.OrNil(); err != nil {
		return nil, err
	}
	rt, ok := r.table().routes[req.Model]
	if !ok {
		return nil, &unknownRouteError{name: req.Model}
	}
	if err := checkCarried(rt, req); err != nil {
		return nil, err
	}
	return rt, nil
}
