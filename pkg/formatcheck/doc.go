// Package formatcheck is mantle's L1 answer check: fast, synchronous, side-effect-free
// checks that an LLM answer has the shape the request asked for and is readable at all.
//
// It is a library, not a service, because two services need the same verdict on the same
// answer: the verifier runs it as the first layer of Verify (followed by its L2 rules and
// L3 semantic checks), and the router runs it itself when the verifier cannot be reached,
// so that a malformed answer still fails over to the next candidate instead of reaching the
// caller (the answer then goes out marked unverified). Services never import each other;
// both import this package. Keeping one implementation means the fallback cannot drift
// from what the verifier would have said.
//
// # Checks
//
// A Checker is built once from a Config (New) and is safe for concurrent use. Check runs,
// in this order:
//
//   - truncated: finish_reason "length" (or Anthropic's "max_tokens").
//   - encoding: invalid UTF-8, U+FFFD replacement characters, and common mojibake markers
//     ("Ã©", "â€™", "锟斤拷", ...) that betray text decoded with the wrong charset.
//   - tool calls (toolcalls.go), when the answer has any or tool_choice demands one:
//     tool_call_arguments (not a JSON object), tool_call_schema (against the offered
//     tool's parameters, compiled and bounded like a response schema), tool_call_unknown
//     (a tool the request did not offer) and tool_choice (none forbids calls; required or
//     a named function demands one, of that function). An answer with tool calls is
//     checked no further: its text is a preamble, not the answer the format describes.
//     A text answer where tool_choice demands a call gets its tool_choice finding last.
//   - empty: nothing but whitespace and no tool call (nothing else is checked then).
//   - refusal: a configured refusal phrase (English and Chinese defaults). See refusal.go for
//     where in the answer a phrase counts. Only looked for when the answer is not JSON that
//     parsed: an apology inside a well-formed value is a business matter, not a format one.
//   - repetition: the same sentence or line, or a short cycle of them, repeated
//     RepetitionThreshold times in a row (a decoding loop). See repetition.go.
//   - html and markdown (warnings): HTML tags leaked into the answer; a text answer that
//     opens a code fence it never closes.
//   - JSON, when the format asks for it: markdown_fence (a warning; the answer is
//     unwrapped), json_parse, json_type (FormatJSONObject needs an object), schema (JSON
//     Schema validation with santhosh-tekuri/jsonschema, one finding per failing JSON
//     pointer; schemas are compiled once, cached, and may not reference anything outside
//     themselves), required_field (present and non-empty) and low_confidence (a top-level
//     numeric "confidence" below the threshold; degraded answers get their own threshold).
//
// # Classes
//
// Every blocking finding carries the mantle.v1.ErrorClass the router routes on: truncated
// -> ERROR_CLASS_TRUNCATED, refusal -> ERROR_CLASS_REFUSAL, low_confidence ->
// ERROR_CLASS_VERIFICATION_FAILED (well-formed but untrustworthy); every other blocking
// finding is ERROR_CLASS_MALFORMED_OUTPUT. Findings are listed in a fixed order and a
// Result's class is the class of the first blocking one: the order puts the finding that
// explains the others first (a truncated answer also fails to parse; garbled bytes defeat
// every later check; a refusal to a JSON request is not JSON).
//
// Codes (CodeTruncated, ...) are stable: dashboards and callers key on them.
package formatcheck
