package router

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/httpheader"
	"github.com/mantle-mesh/mantle/pkg/openaiapi"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// HTTP headers of the OpenAI-compatible front door.
const (
	HeaderFallbackLevel = "x-mantle-fallback-level"
	HeaderCache         = "x-mantle-cache"
	HeaderQuality       = "x-mantle-quality"
	HeaderRequestID     = "x-mantle-request-id"
	// HeaderScenario and HeaderPriority let OpenAI SDK users set mantle fields without
	// changing the request body.
	HeaderScenario = "x-mantle-scenario"
	HeaderPriority = "x-mantle-priority"
	// HeaderBudget is the whole-request deadline budget in milliseconds.
	HeaderBudget = "x-mantle-budget-ms"
	// HeaderSession and HeaderStep make the request a model step of an agent session
	// (session_id, step_id); HeaderStepRequired (true or false) is step_required.
	HeaderSession      = "x-mantle-session"
	HeaderStep         = "x-mantle-step"
	HeaderStepRequired = "x-mantle-step-required"
	// HeaderReplayed is true on an answer that is a session step's recorded result: no
	// model was called.
	HeaderReplayed = "x-mantle-replayed"
)

// messagesPath is the Anthropic Messages door; every other path of the API is OpenAI's.
const messagesPath = "/v1/messages"

// frontDoor serves the OpenAI-compatible HTTP API on top of the Router.
type frontDoor struct {
	router *Router
	auth   *rpc.Authenticator
	log    *slog.Logger
}

func (f *frontDoor) register(mux *http.ServeMux) {
	mux.Handle("POST /v1/chat/completions", f.traced("/v1/chat/completions", f.chatCompletions))
	mux.Handle("POST "+messagesPath, f.traced(messagesPath, f.messages))
	mux.Handle("GET /v1/models", f.traced("/v1/models", f.models))
	mux.Handle("POST /v1/embeddings", f.traced("/v1/embeddings", f.embeddings))
	f.registerTools(mux)
	f.registerSessions(mux)
}

func (f *frontDoor) authenticate(w http.ResponseWriter, r *http.Request) (context.Context, bool) {
	return f.login(w, r, r.Header.Get("Authorization"), writeError)
}

// login gives the request its ids and checks credential, an Authorization header value;
// a refusal is written with writeErr, in the door's shape.
func (f *frontDoor) login(w http.ResponseWriter, r *http.Request, credential string, writeErr func(http.ResponseWriter, error)) (context.Context, bool) {
	ctx := r.Context()
	id := r.Header.Get("X-Request-Id") // canonical, so Get does not make it so anew
	if rpc.ValidRequestID(id) {
		ctx = rpc.WithCallerRequestID(ctx, id)
	} else {
		// Made up here so the id can go in the response headers even of early errors; not a
		// caller's id, so it does not make the request replayable.
		id = rpc.NewRequestID()
		ctx = rpc.WithRequestID(ctx, id)
	}
	// The front door's span (see traced) holds the caller's trace id, or a new one with
	// tracing on; with tracing off and no valid traceparent, one is made up here.
	if rpc.TraceID(ctx) == "" {
		ctx = rpc.WithTraceID(ctx, rpc.NewTraceID())
	}
	w.Header().Set(canonicalRequestID, id) // canonical, so Set does not make it so anew
	if !f.auth.Enabled() {
		return ctx, true
	}
	ctx, err := f.auth.LoginHTTP(ctx, credential, r.Pattern)
	if err != nil {
		writeErr(w, err)
		return nil, false
	}
	return ctx, true
}

func (f *frontDoor) models(w http.ResponseWriter, r *http.Request) {
	if _, ok := f.authenticate(w, r); !ok {
		return
	}
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	out := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	for _, name := range f.router.table().names {
		out.Data = append(out.Data, model{ID: name, Object: "model", OwnedBy: "mantle"})
	}
	writeJSON(w, http.StatusOK, out)
}

func (f *frontDoor) chatCompletions(w http.ResponseWriter, r *http.Request) {
	arrived := f.router.deps.Clock.Now()
	ctx, ok := f.authenticate(w, r)
	if !ok {
		return
	}
	ctx, door := withDoor(ctx, arrived)
	// Refused before the body is read: under overload a refusal must cost next to
	// nothing. A priority header that does not parse is refused as normal here and
	// reported as invalid below.
	priority, priorityErr := headerPriority(r.Header)
	release, err := f.router.admit(priority)
	if err != nil {
		writeOverloaded(w)
		return
	}
	defer release()
	// Room for the prompt limit plus JSON overhead; beyond it the body is not read at all.
	limit := int64(f.router.conf().MaxPromptBytes)*2 + 64<<10
	cr, ok := f.decodeChat(w, r, limit)
	if !ok {
		return
	}
	if priorityErr != nil {
		writeError(w, toStatus(priorityErr))
		return
	}
	req, err := chatToProto(cr.Request, r.Header, priority)
	if err != nil {
		writeError(w, toStatus(err))
		return
	}
	budget, err := headerBudget(r.Header)
	if err != nil {
		writeError(w, toStatus(err))
		return
	}
	if budget > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, budget)
		defer cancel()
	}
	if cr.Stream {
		f.stream(ctx, w, req, cr.IncludeUsage)
		return
	}
	door.storesAfter = true
	defer door.makeStores(f.router, w) // after the answer below is written
	resp, err := f.router.Complete(ctx, req)
	if err != nil {
		writeError(w, toStatus(err))
		return
	}
	setResponseHeaders(w, resp)
	writeJSONWithQuality(w, http.StatusOK, completionJSON(resp), resp.Quality, func(h http.Header) {
		// After the answer is encoded, so that its time counts.
		setServerTiming(h, arrived, f.router.deps.Clock.Now(), resp.Quality)
	})
}

// chatToProto completes req, decoded from the body, with h's mantle headers and the
// priority its x-mantle-priority gave (headerPriority, read once before the body).
func chatToProto(req *routerv1.Request, h http.Header, priority mantlev1.Priority) (*routerv1.Request, error) {
	// Header values may hold any bytes; gRPC's strings must be UTF-8 (the JSON body's
	// already are), and over the network a request carrying them would fail at the first
	// hop, in process only later.
	for _, name := range [...]struct{ name, canonical string }{
		{HeaderScenario, canonicalScenario}, {"Idempotency-Key", "Idempotency-Key"},
		{HeaderSession, canonicalSession}, {HeaderStep, canonicalStep},
	} {
		if v := h.Get(name.canonical); !utf8.ValidString(v) {
			return nil, rpc.Invalid(name.name, "must be UTF-8 text")
		}
	}
	req.Scenario = h.Get(canonicalScenario)
	req.IdempotencyKey = h.Get("Idempotency-Key")
	req.Priority = priority
	req.SessionId, req.StepId = h.Get(canonicalSession), h.Get(canonicalStep)
	switch v := h.Get(canonicalStepRequired); v {
	case "", "false":
	case "true":
		req.StepRequired = true
	default:
		return nil, rpc.Invalid(HeaderStepRequired, "want true or false, got %q", v)
	}
	return req, nil
}

func (f *frontDoor) stream(ctx context.Context, w http.ResponseWriter, req *routerv1.Request, includeUsage bool) {
	rc := http.NewResponseController(w)
	started := false
	id := "chatcmpl-" + rpc.RequestID(ctx)
	created := f.router.deps.Clock.Now().Unix()
	// One buffer for every event of the stream: a chunk per delta.
	var event, chunk []byte
	// hold keeps a delta's event in the connection's buffer when the next delta follows
	// at once (Delta.More): one write for the events that arrived together.
	hold := false
	writeData := func(b []byte) error {
		event = append(append(append(event[:0], "data: "...), b...), "\n\n"...)
		if _, err := w.Write(event); err != nil || hold {
			return err
		}
		return rc.Flush()
	}
	writeEvent := func(v any) error {
		b, ok := appendCompletion(chunk[:0], v)
		if ok {
			chunk = b
		} else {
			var err error
			if b, err = json.Marshal(v); err != nil {
				return err
			}
		}
		return writeData(b)
	}
	// A delta's chunk is written as it is (not boxed into an any each time).
	var deltas deltaChunks
	writeDelta := func(d Delta) error {
		c := deltas.of(id, created, d)
		b, ok := c.AppendJSON(chunk[:0])
		if !ok {
			return writeEvent(*c)
		}
		chunk = b
		return writeData(b)
	}
	final, err := f.router.Stream(ctx, req, func(d Delta) error {
		if !started {
			started = true
			// Headers go out with the first delta; quality is only known at the end, so
			// it travels in the last chunk's mantle field instead.
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Cache-Control", "no-cache")
			w.Header().Set(HeaderFallbackLevel, ShortLevel(d.Level))
			w.Header().Set(HeaderCache, cacheHeader(d.Cached, d.Stale))
			if d.Replayed {
				w.Header().Set(HeaderReplayed, "true")
			}
			w.WriteHeader(http.StatusOK)
		}
		hold = d.More
		err := writeDelta(d)
		hold = false
		return err
	})
	if err != nil {
		if !started {
			writeError(w, toStatus(err))
			return
		}
		st := status.Convert(toStatus(err))
		_ = writeEvent(map[string]any{"error": openAIError{Message: st.Message(), Type: "api_error", Code: reasonOf(st.Err())}})
		return
	}
	if !started {
		// A cached answer with empty content, or a provider that sent nothing: still a
		// well-formed stream.
		w.Header().Set("Content-Type", "text/event-stream")
		setResponseHeaders(w, final)
		w.WriteHeader(http.StatusOK)
	}
	fr := final.FinishReason
	last := chunkJSON(id, created, final.Model, &openaiapi.Message{}, &fr, nil)
	if b, err := withQuality(last, final.Quality); err == nil {
		_ = writeData(b)
	} else {
		// The finish reason goes out even when the QualityContext cannot.
		_ = writeEvent(last)
	}
	if includeUsage {
		usage := chunkJSON(id, created, final.Model, nil, nil, final.Usage)
		_ = writeEvent(usage)
	}
	_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
	_ = rc.Flush()
}

// chunkHead is a streamed chunk without its choices.
func chunkHead(id string, created int64, model string) openaiapi.ChatCompletion {
	return openaiapi.ChatCompletion{ID: id, Object: "chat.completion.chunk", Created: created, Model: model}
}

func chunkJSON(id string, created int64, model string, delta *openaiapi.Message, finish *string, usage *mantlev1.Usage) openaiapi.ChatCompletion {
	c := chunkHead(id, created, model)
	c.Choices = []openaiapi.Choice{}
	if delta != nil {
		c.Choices = append(c.Choices, openaiapi.Choice{Delta: delta, FinishReason: finish})
	}
	if usage != nil {
		c.Usage = usageJSON(usage)
	}
	return c
}

func completionJSON(resp *routerv1.CompleteResponse) openaiapi.ChatCompletion {
	content := resp.GetMessage().GetContent()
	msg := &openaiapi.Message{Role: "assistant", ToolCalls: toolCallsJSON(resp.GetMessage().GetToolCalls())}
	if content != "" || len(msg.ToolCalls) == 0 {
		// content is there, "" included, as OpenAI sends it; an answer that is only tool
		// calls has none.
		msg.Content = &content
	}
	choice := openaiapi.Choice{Message: msg, FinishReason: &resp.FinishReason}
	if resp.Logprobs != "" {
		choice.Logprobs = json.RawMessage(resp.Logprobs)
	}
	return openaiapi.ChatCompletion{
		ID:      "chatcmpl-" + resp.Id,
		Object:  "chat.completion",
		Created: resp.GetQuality().GetAudit()[0].GetAt().GetSeconds(),
		Model:   resp.Model,
		Choices: []openaiapi.Choice{choice},
		Usage:   usageJSON(resp.Usage),
	}
}

func usageJSON(u *mantlev1.Usage) *openaiapi.Usage {
	return &openaiapi.Usage{PromptTokens: u.GetInputTokens(), CompletionTokens: u.GetOutputTokens(), TotalTokens: u.GetTotalTokens()}
}

// withQuality marshals v, a JSON object, with a `mantle` member holding qc in protojson.
// The QualityContext is appended, not embedded as a json.RawMessage, which encoding/json
// would parse and compact a second time.
func withQuality(v any, qc *mantlev1.QualityContext) ([]byte, error) {
	return appendWithQuality(nil, v, qc)
}

// appendWithQuality appends withQuality's JSON to dst.
func appendWithQuality(dst []byte, v any, qc *mantlev1.QualityContext) ([]byte, error) {
	b, ok := appendCompletion(dst, v)
	if !ok {
		// An Encoder writes into dst where json.Marshal would return a new slice; it
		// escapes HTML as Marshal does, and ends the object with a newline, dropped below.
		w := appendWriter{b: dst}
		if err := json.NewEncoder(&w).Encode(v); err != nil {
			return nil, err
		}
		b = bytes.TrimSuffix(w.b, []byte("\n"))
	}
	if len(b)-len(dst) < 2 || b[len(b)-1] != '}' {
		return nil, fmt.Errorf("withQuality: %T is not a JSON object", v)
	}
	b = b[:len(b)-1]
	if len(b)-len(dst) > 1 {
		b = append(b, ',')
	}
	b = append(b, `"mantle":`...)
	if q, ok := appendQualityJSON(b, qc); ok {
		b = q
	} else {
		var err error
		if b, err = (protojson.MarshalOptions{UseProtoNames: true}).MarshalAppend(b, qc); err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

// appendCompletion appends v as json.Marshal would when it is a chat completion or chunk
// (the door passes them by value) that ChatCompletion.AppendJSON writes: every one
// without logprobs. It reports whether it did.
func appendCompletion(dst []byte, v any) ([]byte, bool) {
	if c, ok := v.(openaiapi.ChatCompletion); ok {
		return c.AppendJSON(dst)
	}
	return dst, false
}

// appendWriter is an io.Writer that appends to b.
type appendWriter struct{ b []byte }

func (w *appendWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}

// answerBuffers holds the buffers answers are rendered into: an answer with its
// QualityContext is a few KB, and every request renders one.
var answerBuffers = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledAnswer is the largest buffer put back: a rare long answer is left to the
// collector rather than held by the pool.
const maxPooledAnswer = 64 << 10

func setResponseHeaders(w http.ResponseWriter, resp *routerv1.CompleteResponse) {
	// Every answer sets these: their names are canonical already (http.Header.Set
	// canonicalises a lowercase name into a new string each time).
	hs := httpheader.NewSetter(w.Header(), 4+len(canonicalRateLimit))
	qc := resp.GetQuality()
	hs.Set(canonicalFallbackLevel, ShortLevel(qc.GetFallbackLevel()))
	hs.Set(canonicalCache, cacheHeader(qc.GetCacheHit(), qc.GetCacheStale()))
	if g := qc.GetQualityGrade(); g != mantlev1.QualityGrade_QUALITY_GRADE_UNSPECIFIED {
		hs.Set(canonicalQuality, shortGrade(g))
	} else {
		hs.Set(canonicalQuality, "unverified")
	}
	if qc.GetSessionReplayed() {
		hs.Set(canonicalReplayed, "true")
	}
	if rl := resp.GetRateLimit(); rl != nil {
		hs.Set(canonicalRateLimit[0], strconv.FormatInt(rl.LimitRequests, 10))
		hs.Set(canonicalRateLimit[1], strconv.FormatInt(rl.RemainingRequests, 10))
		hs.Set(canonicalRateLimit[2], strconv.FormatInt(rl.LimitTokens, 10))
		hs.Set(canonicalRateLimit[3], strconv.FormatInt(rl.RemainingTokens, 10))
		hs.Set(canonicalRateLimit[4], rl.GetResetRequests().AsDuration().String())
		hs.Set(canonicalRateLimit[5], rl.GetResetTokens().AsDuration().String())
	}
}

// Canonical forms of the headers every request may carry and every answer carries
// (chatToProto, headerPriority, headerBudget; login, setResponseHeaders): given a
// lower-case name, http.Header's Get and Set make its canonical form anew each time.
var (
	canonicalScenario      = http.CanonicalHeaderKey(HeaderScenario)
	canonicalPriority      = http.CanonicalHeaderKey(HeaderPriority)
	canonicalBudget        = http.CanonicalHeaderKey(HeaderBudget)
	canonicalSession       = http.CanonicalHeaderKey(HeaderSession)
	canonicalStep          = http.CanonicalHeaderKey(HeaderStep)
	canonicalStepRequired  = http.CanonicalHeaderKey(HeaderStepRequired)
	canonicalRequestID     = http.CanonicalHeaderKey(HeaderRequestID)
	canonicalFallbackLevel = http.CanonicalHeaderKey(HeaderFallbackLevel)
	canonicalCache         = http.CanonicalHeaderKey(HeaderCache)
	canonicalQuality       = http.CanonicalHeaderKey(HeaderQuality)
	canonicalReplayed      = http.CanonicalHeaderKey(HeaderReplayed)
	canonicalRateLimit     = [...]string{
		http.CanonicalHeaderKey("x-ratelimit-limit-requests"),
		http.CanonicalHeaderKey("x-ratelimit-remaining-requests"),
		http.CanonicalHeaderKey("x-ratelimit-limit-tokens"),
		http.CanonicalHeaderKey("x-ratelimit-remaining-tokens"),
		http.CanonicalHeaderKey("x-ratelimit-reset-requests"),
		http.CanonicalHeaderKey("x-ratelimit-reset-tokens"),
	}
)

type openAIError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// errorShape is how the front doors answer one kind of error: the HTTP status, and the
// error type in OpenAI's and in Anthropic's error JSON. errorShapeOf is the one mapping
// from mantle's errors to both, so the doors cannot drift apart.
type errorShape struct {
	status    int
	openAI    string
	anthropic string
	// anthropicStatus, when not 0, is the status on the Anthropic door: Anthropic answers
	// overload with 529, which its SDKs retry.
	anthropicStatus int
}

// The shapes of errors found before a request reaches the router.
var (
	shapeInvalid  = errorShape{status: http.StatusBadRequest, openAI: "invalid_request_error", anthropic: "invalid_request_error"}
	shapeTooLarge = errorShape{status: http.StatusRequestEntityTooLarge, openAI: "invalid_request_error", anthropic: "request_too_large"}
	shapeAuth     = errorShape{status: http.StatusUnauthorized, openAI: "authentication_error", anthropic: "authentication_error"}
)

// errorShapeOf is the shape of a gRPC status err.
func errorShapeOf(err error) errorShape {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		if rpc.ErrorInfo(err).GetReason() == ReasonIdempotencyKeyReused {
			return errorShape{status: http.StatusUnprocessableEntity, openAI: "invalid_request_error", anthropic: "invalid_request_error"}
		}
		return shapeInvalid
	case codes.Unauthenticated:
		return shapeAuth
	case codes.PermissionDenied:
		return errorShape{status: http.StatusForbidden, openAI: "permission_error", anthropic: "permission_error"}
	case codes.NotFound:
		return errorShape{status: http.StatusNotFound, openAI: "invalid_request_error", anthropic: "not_found_error"}
	case codes.ResourceExhausted:
		return errorShape{status: http.StatusTooManyRequests, openAI: "rate_limit_error", anthropic: "rate_limit_error"}
	case codes.Unavailable:
		if rpc.ErrorInfo(err).GetReason() == ReasonOverloaded {
			return errorShape{status: http.StatusServiceUnavailable, openAI: "api_error", anthropic: "overloaded_error", anthropicStatus: 529}
		}
		return errorShape{status: http.StatusServiceUnavailable, openAI: "api_error", anthropic: "api_error"}
	case codes.DeadlineExceeded:
		return errorShape{status: http.StatusGatewayTimeout, openAI: "timeout_error", anthropic: "api_error"}
	case codes.Canceled:
		// client closed request; nobody reads it, but logs do
		return errorShape{status: 499, openAI: "api_error", anthropic: "api_error"}
	}
	return errorShape{status: http.StatusInternalServerError, openAI: "api_error", anthropic: "api_error"}
}

// statusOnAnthropic is the HTTP status of the shape on the Anthropic door.
func (s errorShape) statusOnAnthropic() int {
	if s.anthropicStatus != 0 {
		return s.anthropicStatus
	}
	return s.status
}

// setRetryAfter sets Retry-After from err's RetryInfo (a quota bucket's refill, an
// overloaded router) in whole seconds, rounded up.
func setRetryAfter(w http.ResponseWriter, err error) {
	if d, ok := rpc.RetryDelay(err); ok {
		w.Header().Set("Retry-After", strconv.Itoa(int((d+time.Second-1)/time.Second)))
	}
}

// writeError renders a gRPC status as OpenAI's error JSON with the matching HTTP status,
// so SDKs raise their usual exception types (BadRequestError, RateLimitError, ...).
func writeError(w http.ResponseWriter, err error) {
	st := status.Convert(err)
	shape := errorShapeOf(err)
	httpStatus, typ := shape.status, shape.openAI
	setRetryAfter(w, err)
	param := ""
	if fields := rpc.BadRequestFields(err); len(fields) > 0 {
		param = strings.TrimPrefix(fields[0], "request.")
	}
	e := openAIError{Message: st.Message(), Type: typ, Code: reasonOf(err)}
	if param != "" {
		e.Param = &param
	}
	body := errorBody{Error: e}
	// A request that failed after it was admitted says what it tried, as an answer would.
	if qc := FailedQuality(err); qc != nil {
		w.Header().Set(HeaderRequestID, qc.GetRequestId())
		writeJSONWithQuality(w, httpStatus, body, qc, nil)
		return
	}
	writeJSON(w, httpStatus, body)
}

// headerPriority reads x-mantle-priority: unset is PRIORITY_UNSPECIFIED.
func headerPriority(h http.Header) (mantlev1.Priority, error) {
	p := h.Get(canonicalPriority)
	if p == "" {
		return mantlev1.Priority_PRIORITY_UNSPECIFIED, nil
	}
	v, ok := mantlev1.Priority_value["PRIORITY_"+strings.ToUpper(p)]
	if !ok || v == 0 {
		return mantlev1.Priority_PRIORITY_UNSPECIFIED, rpc.Invalid(HeaderPriority, "want critical, high, normal or batch, got %q", p)
	}
	return mantlev1.Priority(v), nil
}

// overloadedResponse is writeError's rendering of errOverloaded, made once: the front
// door may refuse thousands of requests a second, and each refusal would otherwise
// decode the status's details three times.
var overloadedResponse = func() *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	writeError(w, errOverloaded)
	return w
}()

// writeOverloaded answers a request the shedder refused.
func writeOverloaded(w http.ResponseWriter) {
	writeCanned(w, overloadedResponse)
}

// writeCanned writes a response rendered once.
func writeCanned(w http.ResponseWriter, canned *httptest.ResponseRecorder) {
	for k, vs := range canned.Header() {
		for _, v := range vs {
			w.Header().Add(k, v) // not the shared slice: a middleware may add to it
		}
	}
	w.WriteHeader(canned.Code)
	_, _ = w.Write(canned.Body.Bytes())
}

// cacheHeader is x-mantle-cache: hit, stale (a hit past its time to live, served because
// no model could answer) or miss.
func cacheHeader(hit, stale bool) string {
	switch {
	case hit && stale:
		return "stale"
	case hit:
		return "hit"
	}
	return "miss"
}

// reasonOf is the OpenAI error code of err: its ErrorInfo reason, or its gRPC code, in
// snake_case (DeadlineExceeded becomes deadline_exceeded).
func reasonOf(err error) string {
	if info := rpc.ErrorInfo(err); info != nil {
		return strings.ToLower(info.Reason)
	}
	var b strings.Builder
	for i, c := range status.Code(err).String() {
		if i > 0 && unicode.IsUpper(c) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToLower(c))
	}
	return b.String()
}

func writeOpenAIError(w http.ResponseWriter, httpStatus int, typ, code, param, msg string) {
	e := openAIError{Message: msg, Type: typ, Code: code}
	if param != "" {
		e.Param = &param
	}
	writeJSON(w, httpStatus, errorBody{Error: e})
}

type errorBody struct {
	Error openAIError `json:"error"`
}

func writeJSON(w http.ResponseWriter, httpStatus int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpStatus)
	_ = json.NewEncoder(w).Encode(v)
}

// writeJSONWithQuality writes v with qc as its `mantle` member (withQuality). lastHeaders,
// when not nil, sets headers once the body is encoded, just before they are written.
func writeJSONWithQuality(w http.ResponseWriter, httpStatus int, v any, qc *mantlev1.QualityContext, lastHeaders func(http.Header)) {
	buf := answerBuffers.Get().(*[]byte)
	b, err := appendWithQuality((*buf)[:0], v, qc)
	if lastHeaders != nil {
		lastHeaders(w.Header())
	}
	if err != nil {
		answerBuffers.Put(buf)
		// Only a broken QualityContext can fail; the answer still goes out.
		writeJSON(w, httpStatus, v)
		return
	}
	b = append(b, '\n')
	w.Header().Set("Content-Type", "application/json")
	// The length is known: without it an answer over 2 KB (most, with their quality
	// context) would go out chunked.
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(httpStatus)
	_, _ = w.Write(b) // copied into the connection's buffer or written through; not kept
	if cap(b) <= maxPooledAnswer {
		*buf = b
		answerBuffers.Put(buf)
	}
}
