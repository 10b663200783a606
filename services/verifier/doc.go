// Package verifier checks an LLM answer before it reaches the caller. It implements
// mantle.verifier.v1.VerifierService: the router calls Verify once per candidate answer and
// routes on the verdict (a failed verification is a verdict, not an RPC error).
//
// This is the foundation version: it runs the L1 layer only. L1 is a handful of cheap,
// deterministic checks that must stay well under a millisecond (the seed budget is < 1 ms;
// BenchmarkVerifyL1 measures a 2 KB JSON answer in a few tens of microseconds):
//
//   - truncated: finish_reason "length" (or Anthropic's "max_tokens").
//   - encoding: invalid UTF-8, U+FFFD replacement characters, and common mojibake markers
//     ("Ã©", "â€™", "锟斤拷", ...) that betray text decoded with the wrong charset.
//   - empty: nothing but whitespace.
//   - refusal: a configured refusal phrase (English and Chinese defaults). See refusal.go for
//     where in the answer a phrase counts.
//   - repetition: the same sentence or line, or a short cycle of them, repeated
//     repetition_threshold times in a row (a decoding loop). See repetition.go.
//   - JSON, when response_format asks for it: markdown_fence (non-blocking; the answer is
//     unwrapped), json_parse, json_type (TYPE_JSON_OBJECT needs an object), required_field
//     (present and non-empty) and low_confidence (a top-level numeric "confidence" below
//     confidence_threshold).
//
// Classes: truncated -> ERROR_CLASS_TRUNCATED, refusal -> ERROR_CLASS_REFUSAL,
// low_confidence -> ERROR_CLASS_VERIFICATION_FAILED (well-formed but untrustworthy); every
// other blocking finding, repetition included, is ERROR_CLASS_MALFORMED_OUTPUT.
//
// Findings are listed in that order, and the verdict's failure class is the class of the
// first blocking finding. The order puts the finding that explains the others first: a
// truncated answer also fails to parse, garbled bytes defeat every later check, and a
// refusal to a JSON request is not JSON. The router routes on that class (a refusal is not
// retried; malformed output goes to the most format-stable model).
//
// The verifier calls no other service and keeps no state beyond its configuration and its
// metrics. It reads the request's QualityContext and returns it with Verification,
// quality_grade, risk_score and an audit step filled in.
//
// Not yet here (a later issue): JSON Schema validation (the schema is only checked to be
// JSON), L2 business rules in CEL with their actions, asynchronous L3 checks and their
// follow-up events, the weighted risk model, and the human review queue. The risk score of
// this version is a placeholder (see riskScore).
package verifier
