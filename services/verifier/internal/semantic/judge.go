package semantic

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// Completer is the part of the router's client the judge uses
// (routerv1.RouterServiceClient satisfies it).
type Completer interface {
	Complete(ctx context.Context, in *routerv1.CompleteRequest, opts ...grpc.CallOption) (*routerv1.CompleteResponse, error)
}

// JudgeConfig is the judge's budget and where it asks.
type JudgeConfig struct {
	// Route is the router route (model or alias) that judges.
	Route string
	// Scenario marks judge calls. The verifier skips L3 for this scenario, so the judge's
	// own answers are never judged (which would loop).
	Scenario string
	// Timeout bounds one judgement.
	Timeout time.Duration
	// MaxTokens bounds the judge's answer ({"score": 0.8} needs few).
	MaxTokens int32
	// PerMinute is the judge's budget: at most this many calls per minute; the rest are
	// scored without the judge.
	PerMinute int
	// APIKey is the tenant key the judge calls the router with; "" sends none (auth off).
	APIKey string
}

// RouterJudge asks an LLM, through the router, to grade an answer.
type RouterJudge struct {
	cfg    JudgeConfig
	client Completer
	clock  clockwork.Clock

	mu          sync.Mutex
	windowStart time.Time
	used        int
}

// NewRouterJudge returns a judge that calls client.
func NewRouterJudge(cfg JudgeConfig, client Completer, clock clockwork.Clock) *RouterJudge {
	return &RouterJudge{cfg: cfg, client: client, clock: clock}
}

const judgePrompt = `You grade answers. Rate from 0 to 1 how correctly, relevantly and completely the ANSWER ` +
	`addresses the QUESTION (1: fully correct and on topic; 0: wrong, off topic or evasive). ` +
	`Reply with only a JSON object {"score": <number>}.`

// spend takes one call from the per-minute budget.
func (j *RouterJudge) spend() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	now := j.clock.Now()
	if now.Sub(j.windowStart) >= time.Minute {
		j.windowStart, j.used = now, 0
	}
	if j.used >= j.cfg.PerMinute {
		return false
	}
	j.used++
	return true
}

// Judge implements Judge.
func (j *RouterJudge) Judge(ctx context.Context, question, answer string) (float64, error) {
	if !j.spend() {
		return 0, ErrOverBudget
	}
	ctx, cancel := context.WithTimeout(ctx, j.cfg.Timeout)
	defer cancel()
	if j.cfg.APIKey != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+j.cfg.APIKey)
	}
	temperature := 0.0
	resp, err := j.client.Complete(ctx, &routerv1.CompleteRequest{Request: &routerv1.Request{
		Model:    j.cfg.Route,
		Scenario: j.cfg.Scenario,
		Messages: []*mantlev1.ChatMessage{
			{Role: "system", Content: judgePrompt},
			{Role: "user", Content: "QUESTION:\n" + question + "\n\nANSWER:\n" + answer},
		},
		MaxTokens:      j.cfg.MaxTokens,
		Temperature:    &temperature,
		ResponseFormat: &mantlev1.ResponseFormat{Type: mantlev1.ResponseFormat_TYPE_JSON_OBJECT, RequiredFields: []string{"score"}},
		Priority:       mantlev1.Priority_PRIORITY_BATCH,
	}})
	if err != nil {
		return 0, fmt.Errorf("judge: %w", err)
	}
	return parseScore(resp.GetMessage().GetContent())
}

func parseScore(content string) (float64, error) {
	var out struct {
		Score *float64 `json:"score"`
	}
	content = strings.TrimSpace(content)
	if err := json.Unmarshal([]byte(content), &out); err != nil || out.Score == nil {
		return 0, fmt.Errorf("judge: answer %q has no numeric score", content)
	}
	return min(1, max(0, *out.Score)), nil
}
