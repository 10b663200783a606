package router

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/formatcheck"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

var validRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true}

// validate checks a request and returns its route. Field names are the gRPC field paths so
// BadRequest details point at what to fix.
func (r *Router) validate(ctx context.Context, req *routerv1.Request) (*route, error) {
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
		if err := r.validateSchema(ctx, "request.response_format.json_schema", rf.JsonSchema, v); err != nil {
			return nil, err
		}
	}
	// A tool's parameters schema is what L1 validates the tool call's arguments against:
	// bounded and compiled here like a response_format schema.
	for i, t := range req.Tools {
		if p := t.GetParameters(); p != "" && isJSONObject(p) {
			if err := r.validateSchema(ctx, fmt.Sprintf("request.tools[%d].function.parameters", i), p, v); err != nil {
				return nil, err
			}
		}
	}
	validateLabels(req, v)
	validateSession(req, v)
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
	if isEmbeddingsRoute(rt) {
		return nil, rpc.Invalid("request.model", "%q is an embeddings model or route: use POST /v1/embeddings (the Embed RPC)", req.Model)
	}
	if err := checkCarried(rt, req); err != nil {
		return nil, err
	}
	return rt, nil
}

// validateSchema refuses a JSON Schema (a json_schema response format, a tool's
// parameters) the verifier could not use, before any model is asked: compiled here (within
// formatcheck's size, depth and expansion limits, and cached for the local L1 check), so
// that neither a schema bomb nor "notaschema" costs a paid call.
func (r *Router) validateSchema(ctx context.Context, field, schema string, v *rpc.ValidationError) error {
	switch trimmed := strings.TrimSpace(schema); {
	case trimmed == "":
		v.Add(field, "required for TYPE_JSON_SCHEMA")
		return nil
	case trimmed[0] != '{' && trimmed != "true" && trimmed != "false":
		v.Add(field, "must be a JSON object or boolean")
		return nil
	}
	var serr *formatcheck.SchemaError
	if err := r.schemas.CompileSchema(ctx, schema); errors.As(err, &serr) {
		v.Add(field, "%s", serr.Problem)
	} else if err != nil {
		return err
	}
	return nil
}

// Caller-chosen labels become metric labels, breaker keys and log fields: bounded in
// length and to a plain charset.
const maxLabelBytes = 64

// validateLabels checks the caller-chosen strings that are not prose: the scenario, and
// that every text field is UTF-8 (gRPC over the network refuses it at the first hop; in
// process it would reach a provider).
func validateLabels(req *routerv1.Request, v *rpc.ValidationError) {
	if s := req.Scenario; s != "" && !validLabel(s) {
		v.Add("request.scenario", "must be 1 to %d characters of a-z, A-Z, 0-9, '_', '-', '.' or ':'", maxLabelBytes)
	}
	for i, m := range req.Messages {
		if !utf8.ValidString(m.GetContent()) {
			v.Add(fmt.Sprintf("request.messages[%d].content", i), "must be UTF-8 text")
		}
		if !utf8.ValidString(m.GetName()) {
			v.Add(fmt.Sprintf("request.messages[%d].name", i), "must be UTF-8 text")
		}
	}
	for field, s := range map[string]string{"request.model": req.Model, "request.user": req.User, "request.idempotency_key": req.IdempotencyKey} {
		if !utf8.ValidString(s) {
			v.Add(field, "must be UTF-8 text")
		}
	}
}

// validLabel reports whether s is a label a caller may choose.
func validLabel(s string) bool {
	if len(s) == 0 || len(s) > maxLabelBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.' || c == ':') {
			return false
		}
	}
	return true
}
