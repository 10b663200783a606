// Package rules is the verifier's L2 layer: business rules written in CEL
// (https://cel.dev), compiled once into a Set, evaluated against each answer under a cost
// limit, and turned into actions on the answer.
//
// A rule has an id, the scenarios it applies to (none: all), a boolean CEL condition and one
// action:
//
//   - block: the answer fails (the router then tries a fresher model).
//   - degrade: the answer fails and the router should serve its degraded form instead.
//   - mask: a JSON field (or, with a pattern, the matching parts of it; without a field,
//     of the whole text) is replaced by a mask.
//   - replace: a JSON field (or the whole text) is replaced by a fixed value.
//   - notice: a notice is appended to the text, or written to a JSON field.
//   - review: the answer goes to human review.
//
// Any action may also carry a notice for the end user.
//
// Conditions see these variables:
//
//	text      string  the answer as it will be delivered (after L1 unwrapped any fence)
//	output    dyn     the parsed JSON answer, null for text answers
//	question  string  the last user message
//	request   map     {model, scenario, tenant, question, response_format, messages: [{role, content}]}
//	scenario, model, tenant string; degraded bool (the answer is not from the primary model)
//	quality   mantle.v1.QualityContext
//
// plus the standard library and the cel-go strings extension. Use has(output.field) before
// reading a field a JSON answer may lack: an evaluation error makes the rule not apply (it is
// reported in Result.Errors, never fails the answer).
//
// Conditions are evaluated against the answer as L1 left it, all of them, before any action
// is applied; actions then apply in rule order. A Set is immutable; an Engine swaps sets
// atomically, so a reload never disturbs an evaluation in progress, and a set that fails to
// compile is rejected whole while the last good one stays live.
package rules
