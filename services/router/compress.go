package router

import (
	"context"
	"errors"
	"fmt"
	"strings"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
)

// Context compression (context_compression). A conversation that no model of the route
// can hold (by the prompt's counted size before any call, or after a provider's
// context-length error with no larger window left) is shortened rather than refused: the
// messages between the system messages and the most recent ones are summarised by a small
// model, and the summary takes their place as one system message. It happens at most once
// per request, the summarising calls go through the model's breakers and bulkhead like
// any attempt, and the QualityContext says what was summarised, by whom, at what cost.

// Defaults of ContextCompressionConfig's zero values.
const (
	defaultKeepRecent       = 6
	defaultMaxSummaryTokens = 512
	// maxSummaryParts bounds the summarising calls of one request: a history longer than
	// this many of the summariser's windows is not compressed (the request fails as it
	// would have).
	maxSummaryParts = 8
	// bytesPerToken converts a window in tokens to bytes of transcript, on the low side
	// (English runs about 4, CJK about 1.5 to 3 bytes per token).
	bytesPerToken = 2
	// defaultSummarizerWindow is assumed of a summariser whose context_window is unknown.
	defaultSummarizerWindow = 8192
)

const defaultCompressionPrompt = "Summarise the conversation below for the assistant that continues it. " +
	"Keep every fact, name, number, date, decision, commitment, tool result and open question; " +
	"drop greetings and repetition. Write plain sentences, no preamble."

// errNotCompressible: the conversation has nothing older than the messages kept, or is too
// long to summarise within maxSummaryParts calls.
var errNotCompressible = errors.New("the conversation cannot be compressed")

// compressedTokens is a conversation's size after compression, estimated from its size
// before (quota's count) and the bytes it lost.
func compressedTokens(before int64, bytesBefore, bytesAfter int) int64 {
	if before <= 0 || bytesBefore <= 0 {
		return 0
	}
	return max(1, before*int64(bytesAfter)/int64(bytesBefore))
}

// compressForWindow compresses x's conversation once, when its route has
// context_compression, and reopens the candidates the prompt overflowed. False: the route
// has none, it was compressed already, or compressing failed (audited).
func (r *Router) compressForWindow(ctx context.Context, x *exchange, promptTokens int64) bool {
	if x.rt.compressor == nil || x.qc.ContextCompression != nil {
		return false
	}
	if _, err := r.compress(ctx, x, promptTokens); err != nil {
		r.audit(x.qc, "compress", "not compressed: "+err.Error(), 0)
		r.deps.Log.InfoContext(ctx, "context compression failed; the request goes on as it would have", "route", x.rt.name, "err", err)
		return false
	}
	x.plan.reopenOverflowed()
	return true
}

// budgetSpent says the request has no time left for another call: its deadline passed,
// or what remains of its budget is within the hop reserve. A caller that went away is
// not a budget that ran out.
func (r *Router) budgetSpent(ctx context.Context, qc *mantlev1.QualityContext) bool {
	return errors.Is(ctx.Err(), context.DeadlineExceeded) || qc.Deadline.AsTime().Sub(r.deps.Clock.Now()) <= r.conf().HopReserve
}

// compress replaces the older part of x's conversation with a summary and returns the
// prompt's estimated size after it. x.preq is changed only when it succeeds.
func (r *Router) compress(ctx context.Context, x *exchange, promptTokens int64) (int64, error) {
	cc, u := x.rt.compression, x.rt.compressor
	msgs := x.preq.Messages
	head := 0
	for head < len(msgs) && isInstruction(msgs[head].Role) {
		head++
	}
	keep := cc.KeepRecent
	if keep <= 0 {
		keep = defaultKeepRecent
	}
	cut := len(msgs) - keep
	// A tool's result stays with the assistant turn that called for it.
	for cut > head && msgs[cut].Role == "tool" {
		cut--
	}
	if cut <= head {
		return 0, fmt.Errorf("%w: no message older than the %d kept", errNotCompressible, keep)
	}
	window := u.model.ContextWindow
	if window <= 0 {
		window = defaultSummarizerWindow
	}
	maxSummary := cc.MaxSummaryTokens
	if maxSummary <= 0 {
		maxSummary = defaultMaxSummaryTokens
	}
	prompt := cc.Prompt
	if prompt == "" {
		prompt = defaultCompressionPrompt
	}
	partBytes := (window - maxSummary) * bytesPerToken * 8 / 10
	parts := splitTranscript(transcript(msgs[head:cut]), partBytes)
	if len(parts) > maxSummaryParts {
		return 0, fmt.Errorf("%w: %d messages need %d summarising calls, more than %d", errNotCompressible, cut-head, len(parts), maxSummaryParts)
	}
	record := &mantlev1.ContextCompression{Model: u.model.Name, MessagesSummarized: int32(cut - head), PromptTokensBefore: promptTokens, Usage: &mantlev1.Usage{}}
	summaries := make([]string, 0, len(parts))
	for _, part := range parts {
		res, err := r.summarize(ctx, x, prompt, part, maxSummary)
		record.Calls++
		record.Usage.InputTokens += res.Usage.InputTokens
		record.Usage.OutputTokens += res.Usage.OutputTokens
		record.Usage.TotalTokens += res.Usage.InputTokens + res.Usage.OutputTokens
		r.addUsage(x.qc, u, res.Usage)
		if err != nil {
			x.qc.ContextCompression = record
			return 0, err
		}
		summaries = append(summaries, strings.TrimSpace(res.Content))
	}
	summary := provider.Message{Role: "system", Content: fmt.Sprintf(
		"Summary of the %d earlier messages of this conversation (the originals were too long for the context window):\n%s",
		cut-head, strings.Join(summaries, "\n"))}
	out := make([]provider.Message, 0, head+1+len(msgs)-cut)
	out = append(out, msgs[:head]...)
	out = append(out, summary)
	out = append(out, msgs[cut:]...)
	record.PromptTokensAfter = compressedTokens(promptTokens, conversationBytes(msgs), conversationBytes(out))
	x.preq.Messages = out
	x.qc.ContextCompression = record
	r.audit(x.qc, "compress", fmt.Sprintf("%d older messages summarised by %s in %d calls: about %d tokens, was %d",
		cut-head, u.model.Name, record.Calls, record.PromptTokensAfter, promptTokens), 0)
	return record.PromptTokensAfter, nil
}

// summarize asks the compressor for the summary of one part of the transcript, through
// its breakers and bulkhead like any attempt (call does the bookkeeping).
func (r *Router) summarize(ctx context.Context, x *exchange, prompt, part string, maxTokens int) (provider.Response, error) {
	u := x.rt.compressor
	key, permit, skip := r.acquire(u, x.plan.breakerScenario, nil)
	if key == nil {
		return provider.Response{}, fmt.Errorf("summariser %s: %s", u.model.Name, shortClass(skip))
	}
	release, ok := u.bulkhead.TryAcquire()
	if !ok {
		permit.Cancel()
		return provider.Response{}, fmt.Errorf("summariser %s: %s", u.model.Name, shortClass(mantlev1.ErrorClass_ERROR_CLASS_BULKHEAD_FULL))
	}
	defer release()
	sx := &exchange{rt: x.rt, tenant: x.tenant, preq: provider.Request{
		Messages:  []provider.Message{{Role: "system", Content: prompt}, {Role: "user", Content: part}},
		MaxTokens: maxTokens,
		User:      x.preq.User,
	}}
	o := r.call(ctx, sx, slot{c: &candidate{u: u}, key: key, permit: permit})
	x.qc.Audit = append(x.qc.Audit, o.audit...)
	if o.err == nil && strings.TrimSpace(o.res.Content) == "" {
		o.err = fmt.Errorf("summariser %s answered with no text", u.model.Name)
	}
	return o.res, o.err
}

// reshaped says why the answer in qc is to a changed prompt (the fast-answer rung's, or a
// compressed conversation), "" when it is not.
func reshaped(qc *mantlev1.QualityContext) string {
	switch {
	case qc.GetSimplifiedPrompt():
		return "a fast answer to the route's simplified prompt"
	case qc.GetContextCompression() != nil:
		return "an answer to a compressed conversation"
	}
	return ""
}

func isInstruction(role string) bool { return role == "system" || role == "developer" }

// transcript renders messages as the summariser reads them, one turn a paragraph. Parts
// that are not text are named, not inlined: the summariser cannot read them, and the turns
// that hold them are recent enough to be kept in most conversations.
func transcript(msgs []provider.Message) []string {
	out := make([]string, 0, len(msgs))
	for _, m := range msgs {
		var b strings.Builder
		b.WriteString(m.Role)
		if m.Name != "" {
			b.WriteString(" (" + m.Name + ")")
		}
		b.WriteString(": ")
		b.WriteString(m.Content)
		for _, p := range m.Parts {
			switch p.Type {
			case provider.PartText, provider.PartRefusal:
				b.WriteString(p.Text)
			default:
				b.WriteString(" [" + p.Type + "]")
			}
		}
		if m.Refusal != "" {
			b.WriteString(" (refused: " + m.Refusal + ")")
		}
		for _, c := range m.ToolCalls {
			b.WriteString(" [called " + c.Name + " with " + c.Arguments + "]")
		}
		if m.ToolError {
			b.WriteString(" (the tool failed)")
		}
		out = append(out, b.String())
	}
	return out
}

// splitTranscript packs turns into parts of at most limit bytes; a turn longer than limit
// is cut into several (at UTF-8 boundaries).
func splitTranscript(turns []string, limit int) []string {
	limit = max(limit, 1024)
	var parts []string
	var cur strings.Builder
	flush := func() {
		if cur.Len() > 0 {
			parts = append(parts, cur.String())
			cur.Reset()
		}
	}
	for _, t := range turns {
		for len(t) > 0 {
			if cur.Len() > 0 && cur.Len()+len(t)+1 > limit {
				flush()
			}
			n := min(len(t), limit-cur.Len())
			for n < len(t) && n > 0 && !utf8RuneStart(t[n]) {
				n--
			}
			if cur.Len() > 0 {
				cur.WriteByte('\n')
			}
			cur.WriteString(t[:n])
			t = t[n:]
			if len(t) > 0 {
				flush()
			}
		}
	}
	flush()
	return parts
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }

// conversationBytes is the size of a conversation's text, for compressedTokens.
func conversationBytes(msgs []provider.Message) int {
	n := 0
	for _, m := range msgs {
		n += len(m.Content) + len(m.Refusal)
		for _, p := range m.Parts {
			n += len(p.Text) + len(p.ImageURL) + len(p.AudioData) + len(p.FileData)
		}
		for _, c := range m.ToolCalls {
			n += len(c.Name) + len(c.Arguments)
		}
	}
	return n
}
