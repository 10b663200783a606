package router

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	cachev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/cache/v1"
	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// outsideFingerprint are the fields of routerv1.Request that the context fingerprint
// leaves out, and why. Every other field, including one added later, is hashed into it,
// so a request that differs in it never shares a cached answer: forgetting a field costs
// hits, never correctness. cachescope_test.go walks the descriptor and holds this list
// to what it says.
var outsideFingerprint = map[protoreflect.Name]string{
	"model":           "the prompt's model (the route)",
	"messages":        "the prompt's messages; their structure beyond text is hashed separately",
	"max_tokens":      "the prompt's max_tokens",
	"temperature":     "the prompt's temperature",
	"scenario":        "the prompt's scenario (the QualityContext's)",
	"user":            "the prompt's end_user, which scopes personal prompts",
	"priority":        "admission order; the answer is the same",
	"idempotency_key": "replay of one request; the answer is the same",
	"service_tier":    "latency and price class; the answer is the same",
	"metadata":        "tags for the provider's stored completions; the answer is the same",
	"store":           "whether the provider keeps the completion; the answer is the same",
	"session_id":      "the agent session the request is a step of; the answer is the same",
	"step_id":         "the step's id in its session; the answer is the same",
	"step_required":   "whether the step's failure ends its session; the answer is the same",
}

// placeholderQuestion stands for a last turn whose text the cache cannot compare (an image
// alone, a tool result): the turn itself is in the fingerprint, so only a request with the
// identical turn shares the scope, and the placeholder matches only itself.
const placeholderQuestion = "[mantle: the last turn is in the context fingerprint]"

// cachePrompt is the request as the cache scopes it. The scenario is the request's own
// (the x-mantle-scenario header or the gRPC field, else the route's): it decides the
// cache's policy (cacheable, TTL, thresholds) and which verifier rules the answer met, so
// answers of two scenarios never share an entry.
//
// The cache compares text turns; everything else that changes the answer (tools, tool
// choice, sampling fields, response format options, images and other parts, tool turns)
// goes into the context fingerprint, which the cache hashes into the scope: a semantic
// hit can only come from an entry whose fingerprint is identical.
func cachePrompt(req *routerv1.Request, rt *route, qc *mantlev1.QualityContext) *cachev1.Prompt {
	msgs := make([]*mantlev1.ChatMessage, len(req.Messages))
	for i, m := range req.Messages {
		msgs[i] = &mantlev1.ChatMessage{Role: m.GetRole(), Name: m.GetName(), Content: messageText(m)}
	}
	if n := len(msgs); n > 0 {
		last := msgs[n-1]
		lm := req.Messages[n-1]
		// A last turn that is not the user's text (a tool result, an image alone) is only
		// ever matched exactly: its whole content is in the fingerprint.
		if last.Role != "user" || last.Content == "" || len(lm.GetParts()) > 0 && !onlyText(lm.GetParts()) {
			last.Role, last.Content = "user", placeholderQuestion
		}
	}
	return &cachev1.Prompt{
		Scenario:           qc.Scenario,
		Model:              rt.name,
		Messages:           msgs,
		Temperature:        req.Temperature,
		MaxTokens:          req.MaxTokens,
		ResponseFormat:     req.ResponseFormat,
		ContextFingerprint: contextFingerprint(req),
		// The cache keeps answers about one person's records for that person only.
		EndUser: req.User,
	}
}

// messageText is m's text as the cache compares it: its content and its text parts
// (validation allows only one of them).
func messageText(m *mantlev1.ChatMessage) string {
	if len(m.GetParts()) == 0 {
		return m.GetContent()
	}
	var texts []string
	if m.GetContent() != "" {
		texts = append(texts, m.GetContent())
	}
	for _, p := range m.GetParts() {
		if t, ok := p.GetPart().(*mantlev1.ContentPart_Text); ok {
			texts = append(texts, t.Text)
		}
	}
	return strings.Join(texts, "\n")
}

func onlyText(parts []*mantlev1.ContentPart) bool {
	for _, p := range parts {
		if _, ok := p.GetPart().(*mantlev1.ContentPart_Text); !ok {
			return false
		}
	}
	return true
}

// contextFingerprint hashes everything in req that changes the answer and that the cache
// does not compare itself: every field outside outsideFingerprint, and the messages'
// structure beyond their text (parts with images by their bytes or URL, tool calls, tool
// call ids, refusals, names). "" for a plain text request, so its entries keep their keys.
func contextFingerprint(req *routerv1.Request) string {
	// c holds the fields hashed, shared with req (c is only marshalled), rather than a
	// clone of req cleared of the others: a clone copied every message of the
	// conversation only to drop them. They are copied by name, not by ranging over req's
	// fields through reflection, which cost a hundredth of the whole mesh's CPU;
	// TestContextFingerprintSharesNotClones fills every field of the descriptor and
	// compares with a clone cleared of outsideFingerprint, so a field added to Request
	// and not copied here fails it.
	c := &routerv1.Request{
		ResponseFormat:        req.ResponseFormat,
		Tools:                 req.Tools,
		ToolChoice:            req.ToolChoice,
		ToolChoiceFunction:    req.ToolChoiceFunction,
		ParallelToolCalls:     req.ParallelToolCalls,
		Stop:                  req.Stop,
		N:                     req.N,
		Seed:                  req.Seed,
		TopP:                  req.TopP,
		PresencePenalty:       req.PresencePenalty,
		FrequencyPenalty:      req.FrequencyPenalty,
		LogitBias:             req.LogitBias,
		Logprobs:              req.Logprobs,
		TopLogprobs:           req.TopLogprobs,
		MaxTokensIsCompletion: req.MaxTokensIsCompletion,
		ReasoningEffort:       req.ReasoningEffort,
		Modalities:            req.Modalities,
		ExtraBody:             req.ExtraBody,
		TopK:                  req.TopK,
		Thinking:              req.Thinking,
	}
	if u := req.ProtoReflect().GetUnknown(); len(u) > 0 {
		c.ProtoReflect().SetUnknown(u)
	}
	return hashFingerprint(c, req.Messages)
}

// hashFingerprint hashes c, the request's fields that the fingerprint holds, with the
// structure of its messages when they carry more than text.
func hashFingerprint(c *routerv1.Request, messages []*mantlev1.ChatMessage) string {
	if messagesStructured(messages) {
		last := len(messages) - 1
		for i, msg := range messages {
			s := proto.Clone(msg).(*mantlev1.ChatMessage)
			// The text of the last user question is what the cache compares (exactly or by
			// similarity); earlier turns' text is in the cache's own history hash. A last
			// turn the cache sees as a placeholder keeps its text here.
			if i < last || (msg.GetRole() == "user" && messageText(msg) != "" && onlyText(msg.GetParts())) {
				s.Content = ""
				for _, p := range s.Parts {
					if t, ok := p.GetPart().(*mantlev1.ContentPart_Text); ok {
						t.Text = ""
					}
				}
			}
			c.Messages = append(c.Messages, s)
		}
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	if err != nil {
		// Unreachable for a validated request; a unique value keeps it out of every scope
		// that another request could share.
		return "unhashable"
	}
	if len(b) == 0 {
		return ""
	}
	sum := sha256.Sum256(b)
	return "router.v1:" + hex.EncodeToString(sum[:])
}

// messagesStructured reports whether any message carries more than a role, text and (for
// an earlier turn) a name, which is all the cache compares itself.
func messagesStructured(msgs []*mantlev1.ChatMessage) bool {
	for i, m := range msgs {
		if len(m.GetParts()) > 0 || len(m.GetToolCalls()) > 0 || m.GetToolCallId() != "" || m.GetRefusal() != "" ||
			m.GetContentNull() || (i == len(msgs)-1 && (m.GetName() != "" || m.GetRole() != "user")) {
			return true
		}
	}
	return false
}
