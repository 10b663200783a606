// Runs the official OpenAI Node SDK against mantle with only baseURL and apiKey changed.
// Usage: MANTLE_BASE_URL=http://127.0.0.1:8080/v1 MANTLE_API_KEY=sk-... node compat.mjs
import OpenAI from "openai";
import assert from "node:assert/strict";

const client = new OpenAI({ baseURL: process.env.MANTLE_BASE_URL, apiKey: process.env.MANTLE_API_KEY, maxRetries: 0 });
const messages = [{ role: "user", content: "What does a circuit breaker protect?" }];

// Non-streaming, with the raw response to read mantle's headers.
const { data, response } = await client.chat.completions.create({ model: "chat", messages }).withResponse();
assert.equal(data.object, "chat.completion");
assert.ok(data.choices[0].message.content.length > 0, "empty answer");
assert.ok(data.usage.total_tokens > 0, "no usage");
assert.ok(response.headers.get("x-mantle-fallback-level"), "no x-mantle-fallback-level header");
assert.ok(response.headers.get("x-mantle-request-id"), "no x-mantle-request-id header");

// Streaming with usage.
const stream = await client.chat.completions.create({ model: "chat", messages, stream: true, stream_options: { include_usage: true } });
let text = "";
let usage = null;
for await (const chunk of stream) {
  for (const c of chunk.choices) text += c.delta?.content ?? "";
  if (chunk.usage) usage = chunk.usage;
}
assert.ok(text.length > 0, "empty stream");
assert.ok(usage && usage.total_tokens > 0, "no usage in stream");

// Models and errors map to the SDK's own exception types.
const models = await client.models.list();
assert.ok(models.data.some((m) => m.id === "chat"), "chat route not listed");
await assert.rejects(client.chat.completions.create({ model: "no-such-model", messages }), OpenAI.NotFoundError);
await assert.rejects(client.chat.completions.create({ model: "chat", messages: [] }), OpenAI.BadRequestError);
const wrongKey = new OpenAI({ baseURL: process.env.MANTLE_BASE_URL, apiKey: "sk-wrong", maxRetries: 0 });
await assert.rejects(wrongKey.chat.completions.create({ model: "chat", messages }), OpenAI.AuthenticationError);

console.log("openai-node compat: 6 passed, 0 failed");
