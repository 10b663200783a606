package router

import (
	"unicode"
	"unicode/utf8"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
)

// errRestartDiverged ends a restarted stream whose answer does not begin with the text the
// caller already has: splicing it would give the caller two different answers in one.
var errRestartDiverged = &provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED, Message: "the restarted answer diverged from the text already sent"}

// splicer lets a stream restarted from the beginning on a model that cannot continue a
// prefill finish an answer that broke mid-way: it holds the new answer back while it
// repeats the text the caller already has, and passes on only what extends it. Texts are
// compared after whitespace is collapsed, since models differ in spacing more than in
// words. A restart that says anything else is refused (errRestartDiverged), never spliced.
type splicer struct {
	want    []rune // the caller's text, normalised
	matched int    // how many runes of want the restart has repeated
	space   bool   // the last normalised rune was a space (or nothing yet)
	spliced bool   // the restart has caught up: everything from here on is new
	// trimSpace: the caller's text ended in whitespace, so whitespace right after the
	// splice point would double it.
	trimSpace bool
	rest      []byte // what was passed on: the final answer is the caller's text plus this
	next      Sink
}

func newSplicer(sent string, next Sink) *splicer {
	s := &splicer{space: true, next: next}
	for _, r := range sent {
		if unicode.IsSpace(r) {
			if !s.space {
				s.want = append(s.want, ' ')
			}
			s.space = true
			continue
		}
		s.want = append(s.want, r)
		s.space = false
	}
	s.trimSpace = len(s.want) > 0 && s.want[len(s.want)-1] == ' '
	s.space = true
	if len(s.want) == 0 {
		s.spliced = true
	}
	return s
}

// sink is the Sink the restarted attempt streams into.
func (s *splicer) sink(d Delta) error {
	if s.spliced {
		return s.pass(d, d.Content)
	}
	if len(d.ToolCalls) > 0 {
		return errRestartDiverged // the caller has text; a tool call here is another answer
	}
	for i, r := range d.Content {
		// The rune's own width: a space of any width compares as ' ', and an invalid byte
		// reads as RuneError, which is wider than the one byte it stands for.
		_, width := utf8.DecodeRuneInString(d.Content[i:])
		if unicode.IsSpace(r) {
			if s.space {
				continue
			}
			r = ' '
			s.space = true
		} else {
			s.space = false
		}
		if s.want[s.matched] != r {
			return errRestartDiverged
		}
		s.matched++
		if s.matched == len(s.want) {
			s.spliced = true
			// Logprobs belong to the whole piece, most of which the caller already has.
			d.Logprobs = nil
			return s.pass(d, d.Content[i+width:])
		}
	}
	return nil
}

// pass sends the new part of a piece on.
func (s *splicer) pass(d Delta, content string) error {
	if s.trimSpace {
		trimmed := trimLeftSpace(content)
		if trimmed != "" {
			s.trimSpace = false
		}
		content = trimmed
	}
	if content == "" && len(d.ToolCalls) == 0 && d.Logprobs == nil {
		return nil
	}
	d.Content = content
	s.rest = append(s.rest, content...)
	return s.next(d)
}

func trimLeftSpace(s string) string {
	for i, r := range s {
		if !unicode.IsSpace(r) {
			return s[i:]
		}
	}
	return ""
}

// toolHold keeps the pieces of a streamed answer from the caller while they are only tool
// calls: a tool call is of no use to the caller until it is whole, and held back it can
// still be checked and, when bad, replaced by another candidate's. The first text (or
// anything else) sends what was held and everything after it straight through. What is
// held is the stream's own assembly of the calls (calls, which the stream adds each piece
// to before it reaches the sink), sent joined per call, not piece by piece: a long argument
// in small pieces would otherwise cost a Delta per piece, many times its text.
type toolHold struct {
	next    Sink
	calls   *provider.ToolCallAssembler
	first   Delta // the first piece held, for the model, level and flags of what is held
	holding bool
	passing bool
}

func (h *toolHold) sink(d Delta) error {
	if !h.passing && d.Content == "" && len(d.ToolCalls) > 0 && d.Logprobs == nil {
		if !h.holding {
			h.first, h.holding = d, true
		}
		return nil
	}
	if !h.passing {
		h.passing = true
		if held := h.held(); held != nil {
			if err := h.next(held[0]); err != nil {
				return err
			}
			// The calls as assembled include this piece's own: it goes on without them,
			// if anything is left.
			d.ToolCalls = nil
			if d.Content == "" && len(d.Logprobs) == 0 {
				return nil
			}
		}
	}
	return h.next(d)
}

// held returns what is held as one delta, every call whole in index order; none when
// nothing is.
func (h *toolHold) held() []Delta {
	if !h.holding {
		return nil
	}
	calls := h.calls.Calls()
	d := h.first // of the same answer as every piece held: all but the calls alike
	// Assembled, not as it arrived: whether the first piece had company says nothing of
	// what follows this one (Delta.More).
	d.More = false
	d.ToolCalls = make([]provider.ToolCallDelta, len(calls))
	for i, c := range calls {
		d.ToolCalls[i] = provider.ToolCallDelta{Index: i, ID: c.ID, Type: c.Type, Name: c.Name, Arguments: c.Arguments}
	}
	return []Delta{d}
}
