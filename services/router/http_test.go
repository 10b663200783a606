package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/openaiapi"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

func TestWriteError(t *testing.T) {
	t.Parallel()
	str := func(s string) *string { return &s }
	tests := []struct {
		name       string
		err        error
		wantStatus int
		wantBody   openAIError
		retryAfter string // "" means no header
	}{
		{"invalid argument names the field", rpc.InvalidArgument(errorDomain, rpc.Invalid("request.messages[0].content", "must not be empty")),
			400, openAIError{Message: "invalid request.messages[0].content: must not be empty", Type: "invalid_request_error", Param: str("messages[0].content"), Code: "invalid_request"}, ""},
		{"header field keeps its name", rpc.InvalidArgument(errorDomain, rpc.Invalid(HeaderPriority, "bad")),
			400, openAIError{Message: "invalid x-mantle-priority: bad", Type: "invalid_request_error", Param: str(HeaderPriority), Code: "invalid_request"}, ""},
		{"content filtered", rpc.Status(codes.FailedPrecondition, errorDomain, ReasonContentFiltered, "flagged"),
			400, openAIError{Message: "flagged", Type: "invalid_request_error", Code: "content_filtered"}, ""},
		{"out of range", status.Error(codes.OutOfRange, "too far"),
			400, openAIError{Message: "too far", Type: "invalid_request_error", Code: "out_of_range"}, ""},
		{"unauthenticated", rpc.Status(codes.Unauthenticated, "auth.mantle", rpc.ReasonUnauthenticated, "invalid API key"),
			401, openAIError{Message: "invalid API key", Type: "authentication_error", Code: "unauthenticated"}, ""},
		{"permission denied", rpc.Status(codes.PermissionDenied, "quota.mantle", rpc.ReasonPermissionDenied, "no"),
			403, openAIError{Message: "no", Type: "permission_error", Code: "permission_denied"}, ""},
		{"unknown route", rpc.Status(codes.NotFound, errorDomain, ReasonUnknownRoute, `unknown model or route "x"`),
			404, openAIError{Message: `unknown model or route "x"`, Type: "invalid_request_error", Code: "unknown_route"}, ""},
		{"quota with retry info rounds up", rpc.ResourceExhausted("quota.mantle", "tenant:a", "over TPM", 1500*time.Millisecond),
			429, openAIError{Message: "over TPM", Type: "rate_limit_error", Code: "quota_exhausted"}, "2"},
		{"quota with whole seconds", rpc.ResourceExhausted("quota.mantle", "tenant:a", "over RPM", 3*time.Second),
			429, openAIError{Message: "over RPM", Type: "rate_limit_error", Code: "quota_exhausted"}, "3"},
		{"resource exhausted without retry info", status.Error(codes.ResourceExhausted, "full"),
			429, openAIError{Message: "full", Type: "rate_limit_error", Code: "resource_exhausted"}, ""},
		{"all candidates failed", rpc.Status(codes.Unavailable, errorDomain, ReasonAllCandidatesFailed, "no candidate could answer"),
			503, openAIError{Message: "no candidate could answer", Type: "api_error", Code: "all_candidates_failed"}, ""},
		{"overloaded says when to come back", errOverloaded,
			503, openAIError{Message: "the router is overloaded and sheds requests; retry after 1s", Type: "api_error", Code: "overloaded"}, "1"},
		{"deadline", rpc.Status(codes.DeadlineExceeded, errorDomain, ReasonDeadlineExceeded, "the deadline budget ran out"),
			504, openAIError{Message: "the deadline budget ran out", Type: "timeout_error", Code: "deadline_exceeded"}, ""},
		{"canceled", status.Error(codes.Canceled, "request canceled"),
			499, openAIError{Message: "request canceled", Type: "api_error", Code: "canceled"}, ""},
		{"internal", rpc.Status(codes.Internal, "mantle", rpc.ReasonInternal, "internal error"),
			500, openAIError{Message: "internal error", Type: "api_error", Code: "internal"}, ""},
		{"not a status", errors.New("boom"),
			500, openAIError{Message: "boom", Type: "api_error", Code: "unknown"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w := httptest.NewRecorder()
			writeError(w, tt.err)
			if w.Code != tt.wantStatus {
				t.Errorf("HTTP status = %d, want %d", w.Code, tt.wantStatus)
			}
			if ct := w.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q, want application/json", ct)
			}
			if got := w.Header().Get("Retry-After"); got != tt.retryAfter {
				t.Errorf("Retry-After = %q, want %q", got, tt.retryAfter)
			}
			var body struct {
				Error openAIError `json:"error"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %q: %v", w.Body, err)
			}
			if diff := cmp.Diff(tt.wantBody, body.Error); diff != "" {
				t.Errorf("error body (-want +got):\n%s", diff)
			}
		})
	}
}

func TestChatRequestToProto(t *testing.T) {
	t.Parallel()
	temp, yes := 0.5, true
	tests := []struct {
		name      string
		body      string
		headers   map[string]string
		want      *routerv1.Request
		wantField string // BadRequest field on error
	}{
		{
			name: "string content",
			body: `{"model":"chat","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi","name":"ann"}],"max_tokens":50,"temperature":0.5,"user":"u1"}`,
			want: &routerv1.Request{Model: "chat", MaxTokens: 50, Temperature: &temp, User: "u1", Messages: []*mantlev1.ChatMessage{
				{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi", Name: "ann"}}},
		},
		{
			name: "array content",
			body: `{"model":"chat","messages":[{"role":"user","content":[{"type":"text","text":"look: "},{"type":"image_url","image_url":{"url":"https://x/y.png"}},{"type":"text","text":"what is it?"}]}]}`,
			want: &routerv1.Request{Model: "chat", Messages: []*mantlev1.ChatMessage{{Role: "user", Parts: []*mantlev1.ContentPart{
				{Part: &mantlev1.ContentPart_Text{Text: "look: "}},
				{Part: &mantlev1.ContentPart_Image{Image: &mantlev1.ImagePart{Url: "https://x/y.png"}}},
				{Part: &mantlev1.ContentPart_Text{Text: "what is it?"}},
			}}}},
		},
		{name: "max_tokens and max_completion_tokens disagree", body: `{"model":"chat","messages":[],"max_tokens":50,"max_completion_tokens":70}`, wantField: "max_tokens"},
		{
			name: "max_completion_tokens alone",
			body: `{"model":"chat","max_completion_tokens":70}`,
			want: &routerv1.Request{Model: "chat", MaxTokens: 70, MaxTokensIsCompletion: true},
		},
		{name: "unknown field", body: `{"model":"chat","frobnicate":1}`, wantField: "frobnicate"},
		{name: "unknown message field", body: `{"model":"chat","messages":[{"role":"user","content":"x","colour":"red"}]}`, wantField: "messages[0].colour"},
		{
			name:    "headers",
			body:    `{"model":"chat"}`,
			headers: map[string]string{HeaderScenario: "support", HeaderPriority: "High", "Idempotency-Key": "idem-1"},
			want:    &routerv1.Request{Model: "chat", Scenario: "support", Priority: mantlev1.Priority_PRIORITY_HIGH, IdempotencyKey: "idem-1"},
		},
		{
			name:    "priority batch",
			body:    `{"model":"chat"}`,
			headers: map[string]string{HeaderPriority: "batch"},
			want:    &routerv1.Request{Model: "chat", Priority: mantlev1.Priority_PRIORITY_BATCH},
		},
		{name: "unknown priority", body: `{"model":"chat"}`, headers: map[string]string{HeaderPriority: "urgent"}, wantField: HeaderPriority},
		{name: "unspecified priority", body: `{"model":"chat"}`, headers: map[string]string{HeaderPriority: "unspecified"}, wantField: HeaderPriority},
		{name: "scenario not UTF-8", body: `{"model":"chat"}`, headers: map[string]string{HeaderScenario: "sup\xffport"}, wantField: HeaderScenario},
		{name: "idempotency key not UTF-8", body: `{"model":"chat"}`, headers: map[string]string{"Idempotency-Key": "\xc3("}, wantField: "Idempotency-Key"},
		{
			name: "response_format text",
			body: `{"model":"chat","response_format":{"type":"text"}}`,
			want: &routerv1.Request{Model: "chat", ResponseFormat: &mantlev1.ResponseFormat{Type: mantlev1.ResponseFormat_TYPE_TEXT}},
		},
		{
			name: "response_format json_object",
			body: `{"model":"chat","response_format":{"type":"json_object"}}`,
			want: &routerv1.Request{Model: "chat", ResponseFormat: &mantlev1.ResponseFormat{Type: mantlev1.ResponseFormat_TYPE_JSON_OBJECT}},
		},
		{
			name: "response_format json_schema",
			body: `{"model":"chat","response_format":{"type":"json_schema","json_schema":{"name":"answer","strict":true,"schema":{"type":"object","required":["a"]}}}}`,
			want: &routerv1.Request{Model: "chat", ResponseFormat: &mantlev1.ResponseFormat{Type: mantlev1.ResponseFormat_TYPE_JSON_SCHEMA,
				JsonSchema: `{"type":"object","required":["a"]}`, JsonSchemaName: "answer", JsonSchemaStrict: &yes}},
		},
		{name: "response_format json_schema without json_schema", body: `{"model":"chat","response_format":{"type":"json_schema"}}`, wantField: "response_format.json_schema"},
		{name: "response_format unknown", body: `{"model":"chat","response_format":{"type":"yaml"}}`, wantField: "response_format.type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := http.Header{}
			for k, v := range tt.headers {
				h.Set(k, v)
			}
			// As the front door does: the priority header first, then the body.
			var got *routerv1.Request
			priority, err := headerPriority(h)
			if err == nil {
				var cr *openaiapi.ChatRequest
				if cr, err = openaiapi.DecodeChatRequest([]byte(tt.body)); err == nil {
					got, err = chatToProto(cr.Request, h, priority)
				}
			}
			if tt.wantField != "" {
				if fields := rpc.BadRequestFields(toStatus(err)); len(fields) != 1 || fields[0] != tt.wantField {
					t.Fatalf("toProto error %v has fields %v, want [%s]", err, fields, tt.wantField)
				}
				return
			}
			if err != nil {
				t.Fatalf("toProto: %v", err)
			}
			if diff := cmp.Diff(tt.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("toProto (-want +got):\n%s", diff)
			}
		})
	}
}

func TestStatusDetailsSurviveWriteError(t *testing.T) {
	t.Parallel()
	// A status with several BadRequest fields reports the first as OpenAI's param.
	err := rpc.Status(codes.InvalidArgument, errorDomain, rpc.ReasonInvalidRequest, "bad",
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "request.model"}, {Field: "request.messages"}}})
	w := httptest.NewRecorder()
	writeError(w, err)
	var body struct {
		Error openAIError `json:"error"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if body.Error.Param == nil || *body.Error.Param != "model" {
		t.Errorf("param = %v, want model", body.Error.Param)
	}
}

// A request that failed after admission answers with its QualityContext, as an answer
// would: the caller sees what was tried without asking anyone.
func TestFailedRequestErrorCarriesQuality(t *testing.T) {
	t.Parallel()
	qc := &mantlev1.QualityContext{RequestId: "req-9", Attempts: []*mantlev1.Attempt{
		{Model: "a", ErrorClass: mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED},
		{Model: "b", ErrorClass: mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT},
	}}
	failed := &failedRequest{err: &exhaustedError{class: mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT}, quality: qc}
	w := httptest.NewRecorder()
	writeError(w, toStatus(failed))
	if w.Code != http.StatusServiceUnavailable {
		t.Errorf("HTTP status = %d, want 503", w.Code)
	}
	if got := w.Header().Get(HeaderRequestID); got != "req-9" {
		t.Errorf("%s = %q, want req-9", HeaderRequestID, got)
	}
	var body struct {
		Error  openAIError `json:"error"`
		Mantle struct {
			RequestID string `json:"request_id"`
			Attempts  []struct {
				Model      string `json:"model"`
				ErrorClass string `json:"error_class"`
			} `json:"attempts"`
		} `json:"mantle"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatalf("body %q: %v", w.Body, err)
	}
	if body.Error.Code != "all_candidates_failed" {
		t.Errorf("error code %q, want all_candidates_failed", body.Error.Code)
	}
	var got []string
	for _, a := range body.Mantle.Attempts {
		got = append(got, a.Model+":"+a.ErrorClass)
	}
	want := []string{"a:ERROR_CLASS_OVERLOADED", "b:ERROR_CLASS_TRANSIENT"}
	if body.Mantle.RequestID != "req-9" || !cmp.Equal(got, want) {
		t.Errorf("mantle = %+v, want request req-9 with attempts %v", body.Mantle, want)
	}
	// Errors raised before admission have no context to show.
	w = httptest.NewRecorder()
	writeError(w, toStatus(&unknownRouteError{name: "x"}))
	if strings.Contains(w.Body.String(), `"mantle"`) {
		t.Errorf("unknown route error body %s carries a mantle field", w.Body)
	}
}

// A failed request's context stays small enough for any gRPC client's trailer limit: the
// audit trail goes first, then the attempts.
func TestFailedQualityDetailIsBounded(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 200)
	tests := []struct {
		name                    string
		audit, attempts         int
		wantAudit, wantAttempts bool
	}{
		{"small: whole", 5, 3, true, true},
		{"long audit: dropped", 100, 3, false, true},
		{"long audit and many attempts: both dropped", 100, 100, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			qc := &mantlev1.QualityContext{RequestId: "req-1", DegradationReason: "all failed"}
			for range tt.audit {
				qc.Audit = append(qc.Audit, &mantlev1.AuditStep{Service: "router", Step: "attempt", Detail: long})
			}
			for range tt.attempts {
				qc.Attempts = append(qc.Attempts, &mantlev1.Attempt{Model: "a", ErrorMessage: long})
			}
			got := FailedQuality(toStatus(&failedRequest{err: &exhaustedError{}, quality: qc}))
			if got == nil || got.RequestId != "req-1" || got.DegradationReason != "all failed" {
				t.Fatalf("detail %v, want the request's context", got)
			}
			if (len(got.Audit) > 0) != tt.wantAudit || (len(got.Attempts) > 0) != tt.wantAttempts {
				t.Errorf("detail has %d audit steps and %d attempts; want audit %t, attempts %t", len(got.Audit), len(got.Attempts), tt.wantAudit, tt.wantAttempts)
			}
			if n := proto.Size(got); tt.audit > 10 && n > maxDetailBytes {
				t.Errorf("detail is %d bytes, want at most %d", n, maxDetailBytes)
			}
		})
	}
}

func TestWithQuality(t *testing.T) {
	t.Parallel()
	qc := &mantlev1.QualityContext{RequestId: "req_1", Audit: []*mantlev1.AuditStep{{Step: "route", Detail: `quote " and \ slash`}}}
	for _, tt := range []struct {
		name    string
		v       any
		wantErr bool
		want    []string // members besides mantle
	}{
		{name: "completion", v: openaiapi.ChatCompletion{ID: "chatcmpl-1", Object: "chat.completion", Choices: []openaiapi.Choice{}}, want: []string{"choices", "created", "id", "model", "object"}},
		{name: "error body", v: errorBody{Error: openAIError{Message: "m"}}, want: []string{"error"}},
		{name: "empty object", v: struct{}{}, want: []string{}},
		{name: "not an object", v: []int{1}, wantErr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, err := withQuality(tt.v, qc)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("withQuality(%T) = %s, want an error", tt.v, b)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]json.RawMessage
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatalf("withQuality(%T) = %s: not JSON: %v", tt.v, b, err)
			}
			var keys []string
			for k := range got {
				if k != "mantle" {
					keys = append(keys, k)
				}
			}
			slices.Sort(keys)
			if diff := cmp.Diff(tt.want, keys, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("members (-want +got):\n%s", diff)
			}
			back := new(mantlev1.QualityContext)
			if err := protojson.Unmarshal(got["mantle"], back); err != nil {
				t.Fatalf("mantle = %s: %v", got["mantle"], err)
			}
			if !proto.Equal(back, qc) {
				t.Errorf("mantle = %v, want %v", back, qc)
			}
		})
	}
}

// TestAnswerBytes holds the answer's rendering to json.Marshal's bytes (HTML and line
// separators escaped as Marshal escapes them) followed by the QualityContext, and checks
// that an answer rendered into a reused buffer carries nothing of the one before.
func TestAnswerBytes(t *testing.T) {
	qc := &mantlev1.QualityContext{RequestId: "req_1"}
	answer := func(content string) openaiapi.ChatCompletion {
		return openaiapi.ChatCompletion{ID: "chatcmpl-1", Object: "chat.completion",
			Choices: []openaiapi.Choice{{Message: &openaiapi.Message{Role: "assistant", Content: &content}}}}
	}
	// What the front door rendered before it used pooled buffers.
	marshalled := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		q, err := (protojson.MarshalOptions{UseProtoNames: true}).Marshal(qc)
		if err != nil {
			t.Fatal(err)
		}
		// appendQualityJSON writes protojson's members without its random spacing.
		var compact bytes.Buffer
		if err := json.Compact(&compact, q); err != nil {
			t.Fatal(err)
		}
		return string(b[:len(b)-1]) + `,"mantle":` + compact.String() + "}\n"
	}
	long := answer(strings.Repeat("a long answer <b>&amp;</b> \u2028 ", 400))
	short := answer("short <i>")
	for _, v := range []openaiapi.ChatCompletion{long, short, long, short} {
		rec := httptest.NewRecorder()
		writeJSONWithQuality(rec, http.StatusOK, v, qc, nil)
		if got, want := rec.Body.String(), marshalled(v); got != want {
			t.Fatalf("answer of %d bytes, want %d:\n%.300s\nwant\n%.300s", len(got), len(want), got, want)
		}
	}
	// Appending keeps what the buffer held.
	b, err := appendWithQuality([]byte("prefix"), short, qc)
	if err != nil {
		t.Fatal(err)
	}
	if want := "prefix" + strings.TrimSuffix(marshalled(short), "\n"); string(b) != want {
		t.Errorf("appended %s, want %s", b, want)
	}
	if _, err := appendWithQuality([]byte("{}"), []int{1}, qc); err == nil {
		t.Error("an array after a buffer holding an object was taken for an object")
	}
}

// TestSetResponseHeaders: the answer's headers are what http.Header.Set would make of
// them, though set without it.
func TestSetResponseHeaders(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		resp *routerv1.CompleteResponse
		want map[string]string
	}{
		{
			name: "verified, with the tenant's limits",
			resp: &routerv1.CompleteResponse{
				Quality: &mantlev1.QualityContext{FallbackLevel: mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL, CacheHit: true,
					QualityGrade: mantlev1.QualityGrade_QUALITY_GRADE_HIGH},
				RateLimit: &routerv1.RateLimit{LimitRequests: 600, RemainingRequests: 598, LimitTokens: 200000, RemainingTokens: 198964,
					ResetRequests: durationpb.New(140 * time.Millisecond), ResetTokens: durationpb.New(310 * time.Millisecond)},
			},
			want: map[string]string{
				"x-mantle-fallback-level": "backup_model", "x-mantle-cache": "hit", "x-mantle-quality": "high",
				"x-ratelimit-limit-requests": "600", "x-ratelimit-remaining-requests": "598",
				"x-ratelimit-limit-tokens": "200000", "x-ratelimit-remaining-tokens": "198964",
				"x-ratelimit-reset-requests": "140ms", "x-ratelimit-reset-tokens": "310ms",
			},
		},
		{
			name: "unverified, quota off",
			resp: &routerv1.CompleteResponse{Quality: &mantlev1.QualityContext{FallbackLevel: mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY}},
			want: map[string]string{"x-mantle-fallback-level": "primary", "x-mantle-cache": "miss", "x-mantle-quality": "unverified"},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			want := http.Header{}
			for k, v := range tt.want {
				want.Set(k, v)
			}
			w := httptest.NewRecorder()
			setResponseHeaders(w, tt.resp)
			if diff := cmp.Diff(want, w.Header()); diff != "" {
				t.Errorf("headers (-want +got):\n%s", diff)
			}
			// A value's slice is its own: adding to one header leaves the others as they were.
			w.Header().Add("x-mantle-cache", "again")
			if got := w.Header().Values("x-mantle-quality"); len(got) != 1 || got[0] != tt.want["x-mantle-quality"] {
				t.Errorf("x-mantle-quality = %q after adding to x-mantle-cache", got)
			}
		})
	}
}

// TestAppendCompletionLeavesTheRestToJSON: only chat completions passed by value are
// written by hand; anything else (a pointer, nil or not, an error object) is left to
// encoding/json.
func TestAppendCompletionLeavesTheRestToJSON(t *testing.T) {
	for _, v := range []any{(*openaiapi.ChatCompletion)(nil), map[string]any{"error": "x"}} {
		if b, ok := appendCompletion([]byte("x"), v); ok || string(b) != "x" {
			t.Errorf("appendCompletion(%T) = %q, %t; want x unchanged and false", v, b, ok)
		}
	}
	if b, ok := appendCompletion(nil, openaiapi.ChatCompletion{}); !ok || string(b) != `{"id":"","object":"","created":0,"model":"","choices":null}` {
		t.Errorf("appendCompletion(ChatCompletion{}) = %q, %t", b, ok)
	}
}
