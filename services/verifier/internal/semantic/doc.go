// Package semantic is the verifier's L3 layer: checks on what an answer means rather than
// how it is formatted, run after the answer has gone out.
//
//   - relevance: cosine similarity of the answer to the question, through an Embedder;
//   - consistency: the best similarity of the answer to reference snippets (from the request
//     or the scenario's configuration);
//   - divergence: how far the answer is from earlier answers to the same normalised
//     question (History);
//   - an optional LLM judge (Judge), called through the router with its own small budget.
//
// Embedder is declared here, by its consumer. Lexical is a built-in implementation that
// needs no model: feature hashing of words and CJK character bigrams. It measures topical
// overlap, not meaning (it cannot tell "需要鉴定" from "无需鉴定"), so its similarities are
// lower than a neural embedder's and the score calibration (Config.RelevanceFull,
// ConsistencyFull) is per embedder. The cache service has an embedder of its own; the two
// can be unified behind this interface.
package semantic
