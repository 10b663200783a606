package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mantle-mesh/mantle/pkg/jsonfield"
)

// mcpBackend calls one tool of an MCP server over streamable HTTP, through the official
// go-sdk client. The session is opened on first use and reused; a call that fails at the
// transport drops it, and the next call opens a new one.
type mcpBackend struct {
	url      string
	tool     string
	client   *mcp.Client
	http     *http.Client
	maxBytes int

	mu      sync.Mutex
	session *mcp.ClientSession
}

// idempotencyKeyCtx carries an action's key to the HTTP request that carries its call.
type idempotencyKeyCtx struct{}

// headerTransport adds the tool's configured headers, and the call's idempotency key, to
// every request of the MCP session.
type headerTransport struct {
	base    http.RoundTripper
	headers http.Header
}

func (t headerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	for name, v := range t.headers {
		req.Header[name] = v
	}
	if key, ok := req.Context().Value(idempotencyKeyCtx{}).(string); ok && key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return t.base.RoundTrip(req)
}

func newMCPBackend(tc ToolConfig, getenv func(string) string, client *http.Client, maxBytes int) *mcpBackend {
	h := http.Header{}
	for name, env := range tc.Backend.HeadersEnv {
		h.Set(name, getenv(env))
	}
	client.Transport = headerTransport{base: client.Transport, headers: h}
	name := tc.Backend.Tool
	if name == "" {
		name = tc.Name
	}
	return &mcpBackend{
		url: tc.Backend.URL, tool: name, http: client, maxBytes: maxBytes,
		client: mcp.NewClient(&mcp.Implementation{Name: "mantle-agent", Version: "v1"}, nil),
	}
}

// connect returns the open session, opening one under ctx when there is none.
func (b *mcpBackend) connect(ctx context.Context) (*mcp.ClientSession, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.session != nil {
		return b.session, nil
	}
	s, err := b.client.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint: b.url, HTTPClient: b.http, MaxRetries: -1, DisableStandaloneSSE: true,
	}, nil)
	if err != nil {
		return nil, err
	}
	b.session = s
	return s, nil
}

// drop forgets a session that failed, so that the next call opens a new one.
func (b *mcpBackend) drop(s *mcp.ClientSession) {
	b.mu.Lock()
	if b.session == s {
		b.session = nil
	}
	b.mu.Unlock()
	_ = s.Close()
}

func (b *mcpBackend) close() {
	b.mu.Lock()
	s := b.session
	b.session = nil
	b.mu.Unlock()
	if s != nil {
		_ = s.Close()
	}
	b.http.CloseIdleConnections()
}

func (b *mcpBackend) call(ctx context.Context, c backendCall) (backendResult, error) {
	s, err := b.connect(ctx)
	if err != nil {
		// The session never opened: the tool was not called.
		ce := classifyTransport(ctx, err)
		if ce.failure == failUnknown && ctx.Err() == nil {
			ce.failure, ce.outcome = failRefused, "unavailable"
		}
		return backendResult{}, ce
	}
	params := &mcp.CallToolParams{Name: b.tool, Arguments: json.RawMessage(c.args)}
	if c.idempotencyKey != "" {
		params.Meta = mcp.Meta{"mantle/idempotency_key": c.idempotencyKey}
		ctx = context.WithValue(ctx, idempotencyKeyCtx{}, c.idempotencyKey)
	}
	res, err := s.CallTool(ctx, params)
	if err != nil {
		b.drop(s)
		return backendResult{}, classifyMCP(ctx, err)
	}
	return mcpResult(res, b.maxBytes)
}

// classifyMCP classifies a failed MCP call. A JSON-RPC error is the server refusing the
// request (an unknown tool, invalid params) before running it; anything else happened
// on the way, and the call may have run.
func classifyMCP(ctx context.Context, err error) *callError {
	if ctx.Err() != nil {
		return &callError{failure: failUnknown, outcome: "timeout", err: err}
	}
	var rpcErr *jsonrpc.Error
	if errors.As(err, &rpcErr) {
		return &callError{failure: failRefused, outcome: "unavailable", err: err}
	}
	return classifyTransport(ctx, err)
}

// mcpResult turns an MCP tool result into a backend result: its structured content when
// there is one, else its text content (one text part as is, several joined), as JSON.
func mcpResult(res *mcp.CallToolResult, maxBytes int) (backendResult, error) {
	var out []byte
	var err error
	if res.StructuredContent != nil {
		out, err = json.Marshal(res.StructuredContent)
	} else {
		var texts []string
		for _, c := range res.Content {
			switch v := c.(type) {
			case *mcp.TextContent:
				texts = append(texts, v.Text)
			default:
				b, merr := json.Marshal(c)
				if merr != nil {
					return backendResult{}, &callError{failure: failBadResponse, outcome: "bad_response", err: merr}
				}
				texts = append(texts, string(b))
			}
		}
		text := strings.Join(texts, "\n")
		if jsonfield.Valid([]byte(text)) && text != "" {
			out = []byte(text)
		} else {
			out, err = json.Marshal(text)
		}
	}
	if err != nil {
		return backendResult{}, &callError{failure: failBadResponse, outcome: "bad_response", err: err}
	}
	if len(out) > maxBytes {
		return backendResult{}, &callError{failure: failBadResponse, outcome: "bad_response",
			err: fmt.Errorf("the result is larger than max_result_bytes (%d)", maxBytes)}
	}
	return backendResult{result: string(out), isError: res.IsError}, nil
}
