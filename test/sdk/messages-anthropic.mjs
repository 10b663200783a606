// Runs the official Anthropic TypeScript SDK against mantle's /v1/messages, through to a
// recording Anthropic-type upstream, and checks field by field that the upstream received a
// correct Anthropic request and what the SDK got back.
// Usage: MANTLE_URL=... MANTLE_API_KEY=... UPSTREAM_URL=... node messages-anthropic.mjs
import Anthropic from "@anthropic-ai/sdk";
import assert from "node:assert/strict";

const client = new Anthropic({ baseURL: process.env.MANTLE_URL, apiKey: process.env.MANTLE_API_KEY, maxRetries: 0 });
const received = async () => (await fetch(process.env.UPSTREAM_URL + "/recorded/last")).json();
let passed = 0;
const check = async (name, fn) => {
  await fn();
  passed++;
  console.log("ok", name);
};

const tools = [
  { name: "get_weather", description: "Weather of a city", input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } },
  { name: "get_time", input_schema: { type: "object", properties: { tz: { type: "string" } } } },
];
const question = { role: "user", content: "Weather and time in Paris?" };
// The recording upstream answers any request with tools with these two calls (after a
// thinking block, which mantle does not pass on).
const wantBlocks = [
  { type: "tool_use", id: "toolu_a", name: "get_weather", input: { city: "Paris" } },
  { type: "tool_use", id: "toolu_b", name: "get_time", input: { tz: "CET" } },
];

await check("text, system, sampling fields, stop sequences, top_k", async () => {
  const r = await client.messages.create({
    model: "claude", max_tokens: 100, system: "Be brief.", messages: [{ role: "user", content: "Say ok." }],
    temperature: 0.2, top_p: 0.9, top_k: 40, stop_sequences: ["END"], metadata: { user_id: "u-1" },
  });
  const up = await received();
  assert.equal(up.model, "claude-up");
  assert.equal(up.system, "Be brief.");
  assert.deepEqual(up.messages, [{ role: "user", content: "Say ok." }]);
  assert.equal(up.max_tokens, 100);
  assert.equal(up.temperature, 0.2);
  assert.equal(up.top_p, 0.9);
  assert.equal(up.top_k, 40);
  assert.deepEqual(up.stop_sequences, ["END"]);
  assert.deepEqual(up.metadata, { user_id: "u-1" });
  assert.deepEqual(r.content, [{ type: "text", text: '{"a":1}' }]);
  assert.equal(r.stop_reason, "end_turn");
});

await check("tools and a forced tool choice", async () => {
  const r = await client.messages.create({ model: "claude", max_tokens: 100, messages: [question], tools, tool_choice: { type: "any", disable_parallel_tool_use: false } });
  const up = await received();
  assert.deepEqual(up.tools, tools);
  assert.deepEqual(up.tool_choice, { type: "any" });
  assert.deepEqual(r.content, wantBlocks);
  assert.equal(r.stop_reason, "tool_use");
});

await check("tools streamed as input_json_delta", async () => {
  const stream = client.messages.stream({ model: "claude", max_tokens: 100, messages: [question], tools });
  let deltas = 0;
  stream.on("inputJson", () => { deltas++; });
  const final = await stream.finalMessage();
  assert.equal((await received()).stream, true);
  assert.deepEqual(final.content, wantBlocks);
  assert.equal(final.stop_reason, "tool_use");
  assert.ok(deltas >= 2, `${deltas} input_json_delta events`);
});

await check("the tool_result turn, a failed tool's is_error, and an image", async () => {
  const r = await client.messages.create({ model: "claude", max_tokens: 100, tools, messages: [
    question,
    { role: "assistant", content: [{ type: "text", text: "Looking." }, ...wantBlocks] },
    { role: "user", content: [
      { type: "tool_result", tool_use_id: "toolu_a", content: "sunny" },
      { type: "tool_result", tool_use_id: "toolu_b", content: "time service down", is_error: true },
      { type: "image", source: { type: "base64", media_type: "image/png", data: "iVBORw0KGgo=" } },
      { type: "text", text: "And this picture?" },
    ] },
  ] });
  assert.deepEqual((await received()).messages, [
    { role: "user", content: "Weather and time in Paris?" },
    { role: "assistant", content: [{ type: "text", text: "Looking." }, ...wantBlocks] },
    { role: "user", content: [
      { type: "tool_result", tool_use_id: "toolu_a", content: "sunny" },
      { type: "tool_result", tool_use_id: "toolu_b", content: "time service down", is_error: true },
      { type: "image", source: { type: "base64", media_type: "image/png", data: "iVBORw0KGgo=" } },
      { type: "text", text: "And this picture?" },
    ] },
  ]);
  assert.equal(r.stop_reason, "tool_use");
});

await check("extended thinking", async () => {
  await client.messages.create({ model: "claude", max_tokens: 4096, messages: [{ role: "user", content: "Think." }], thinking: { type: "enabled", budget_tokens: 1024 } });
  const up = await received();
  assert.deepEqual(up.thinking, { type: "enabled", budget_tokens: 1024 });
  assert.equal(up.max_tokens, 4096);
});

await check("thinking with top_k, which Anthropic refuses, is refused by name before any call", async () => {
  const before = await received();
  await assert.rejects(
    client.messages.create({ model: "claude", max_tokens: 4096, messages: [{ role: "user", content: "Think." }], thinking: { type: "enabled", budget_tokens: 1024 }, top_k: 5 }),
    (err) => err instanceof Anthropic.BadRequestError && err.error.error.message.includes("thinking"),
  );
  assert.deepEqual(await received(), before, "the upstream was called");
});

console.log(`anthropic-sdk messages to an Anthropic upstream: ${passed} passed, 0 failed`);
