// Package embed turns the last user message of a prompt into a vector for the semantic
// cache. Two embedders are here:
//
//   - Lexical, built in and offline: character unigrams and bigrams for Chinese (and other
//     scripts written without spaces), words, word pairs and character trigrams for the
//     rest, hashed into 2^24 buckets and weighted by log term frequency times a static
//     weight that lowers function words (the, my, 的, 吗, 怎么). It needs no model and no
//     network and takes microseconds.
//   - OpenAI, a client for the /v1/embeddings API of OpenAI, Ollama, TEI, vLLM and
//     DashScope's compatible mode.
//
// What the lexical embedder can match: the same question with other spelling, spacing,
// punctuation, word order, function words or small additions ("how do I reset my
// password" and "how to reset password"; "退货流程是什么" and "退货的流程"). What it cannot:
// a paraphrase that shares few words ("忘记密码怎么办" and "密码想不起来了"; "cancel my plan" and
// "stop my subscription"), synonyms, or another language. It measures shared wording, not
// meaning, so its threshold is set high, and two questions that share most words but differ
// in one that matters (a product name) can still score high; the cache's near-miss check
// and thresholds are what keep those apart.
//
// Every embedder has a namespace (lexical-v1, openai-<model>-<dims>[-<version>]). Vectors
// from different namespaces are never compared: the cache scopes entries by namespace, and
// the Qdrant backend keeps one collection per namespace.
package embed
