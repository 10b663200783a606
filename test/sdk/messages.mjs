// Runs the official Anthropic TypeScript SDK against mantle's /v1/messages, through to a
// recording OpenAI-type upstream, and checks field by field what the upstream received and
// what the SDK got back.
// Usage: MANTLE_URL=... MANTLE_API_KEY=... UPSTREAM_URL=... node messages.mjs
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
// What an OpenAI-type upstream must receive for them.
const openAITools = [
  { type: "function", function: { name: "get_weather", description: "Weather of a city", parameters: tools[0].input_schema } },
  { type: "function", function: { name: "get_time", parameters: tools[1].input_schema } },
];
const question = { role: "user", content: "Weather and time in Paris?" };
// The recording upstream answers any request with tools with these two calls.
const wantBlocks = [
  { type: "tool_use", id: "call_a", name: "get_weather", input: { city: "Paris" } },
  { type: "tool_use", id: "call_b", name: "get_time", input: { tz: "CET" } },
];

await check("text, system, sampling fields", async () => {
  const r = await client.messages.create({
    model: "chat", max_tokens: 100, system: "Be brief.", messages: [{ role: "user", content: "Say ok." }],
    temperature: 0.2, top_p: 0.9, metadata: { user_id: "u-1" },
  });
  const up = await received();
  assert.equal(up.model, "gpt");
  assert.deepEqual(up.messages, [{ role: "system", content: "Be brief." }, { role: "user", content: "Say ok." }]);
  assert.equal(up.max_tokens, 100);
  assert.equal(up.temperature, 0.2);
  assert.equal(up.top_p, 0.9);
  assert.equal(up.user, "u-1");
  assert.equal(r.type, "message");
  assert.equal(r.role, "assistant");
  assert.equal(r.model, "gpt");
  assert.match(r.id, /^msg_/);
  assert.deepEqual(r.content, [{ type: "text", text: "ok" }]);
  assert.equal(r.stop_reason, "end_turn");
  assert.equal(r.stop_sequence, null);
  assert.deepEqual(r.usage, { input_tokens: 5, output_tokens: 3 });
});

await check("tools", async () => {
  const r = await client.messages.create({ model: "chat", max_tokens: 100, messages: [question], tools, tool_choice: { type: "auto" } });
  const up = await received();
  assert.deepEqual(up.tools, openAITools);
  assert.equal(up.tool_choice, "auto");
  assert.deepEqual(r.content, wantBlocks);
  assert.equal(r.stop_reason, "tool_use");
});

await check("tools, streamed with input_json_delta", async () => {
  const stream = client.messages.stream({ model: "chat", max_tokens: 100, messages: [question], tools, tool_choice: { type: "any", disable_parallel_tool_use: false } });
  const events = [];
  for await (const event of stream) {
    events.push(event.type === "content_block_delta" ? `${event.type}:${event.delta.type}` : event.type);
  }
  const final = await stream.finalMessage();
  const up = await received();
  assert.equal(up.stream, true);
  assert.equal(up.tool_choice, "required");
  assert.equal(up.parallel_tool_calls, true);
  assert.deepEqual(final.content, wantBlocks);
  assert.equal(final.stop_reason, "tool_use");
  assert.deepEqual(final.usage, { input_tokens: 5, output_tokens: 3 });
  assert.equal(events[0], "message_start");
  assert.ok(events.includes("content_block_delta:input_json_delta"), events.join(" "));
  assert.deepEqual(events.slice(-2), ["message_delta", "message_stop"]);
});

await check("tool_result turn", async () => {
  const messages = [
    question,
    { role: "assistant", content: wantBlocks },
    { role: "user", content: [
      { type: "tool_result", tool_use_id: "call_a", content: "sunny" },
      { type: "tool_result", tool_use_id: "call_b", content: [{ type: "text", text: "14:00" }] },
    ] },
  ];
  const r = await client.messages.create({ model: "chat", max_tokens: 100, messages });
  assert.deepEqual((await received()).messages, [
    question,
    { role: "assistant", content: null, tool_calls: [
      { id: "call_a", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris"}' } },
      { id: "call_b", type: "function", function: { name: "get_time", arguments: '{"tz":"CET"}' } },
    ] },
    { role: "tool", tool_call_id: "call_a", content: "sunny" },
    { role: "tool", tool_call_id: "call_b", content: [{ type: "text", text: "14:00" }] },
  ]);
  assert.deepEqual(r.content, [{ type: "text", text: "ok" }]);
});

await check("image", async () => {
  await client.messages.create({ model: "chat", max_tokens: 100, messages: [{ role: "user", content: [
    { type: "image", source: { type: "base64", media_type: "image/png", data: "iVBORw0KGgo=" } },
    { type: "text", text: "What is in this image?" },
  ] }] });
  assert.deepEqual((await received()).messages, [{ role: "user", content: [
    { type: "image_url", image_url: { url: "data:image/png;base64,iVBORw0KGgo=" } },
    { type: "text", text: "What is in this image?" },
  ] }]);
});

await check("stop_sequences", async () => {
  const r = await client.messages.create({ model: "chat", max_tokens: 100, messages: [{ role: "user", content: "Count." }], stop_sequences: ["END", "\n\n"] });
  assert.deepEqual((await received()).stop, ["END", "\n\n"]);
  assert.equal(r.stop_reason, "end_turn");
});

await check("streamed text", async () => {
  const stream = client.messages.stream({ model: "chat", max_tokens: 100, messages: [{ role: "user", content: "Say ok." }] });
  let text = "";
  stream.on("text", (t) => { text += t; });
  const final = await stream.finalMessage();
  assert.equal(text, "ok");
  assert.deepEqual(final.content, [{ type: "text", text: "ok" }]);
  assert.equal(final.stop_reason, "end_turn");
});

await check("unknown field refused by name", async () => {
  const before = await received();
  await assert.rejects(
    client.messages.create({ model: "chat", max_tokens: 100, messages: [question], frequency_penalty: 1 }),
    (err) => err instanceof Anthropic.BadRequestError && err.error?.type === "error" &&
      err.error.error.type === "invalid_request_error" && err.error.error.message.includes("frequency_penalty"),
  );
  assert.deepEqual(await received(), before, "the upstream was called");
});

await check("a field the OpenAI-type upstream cannot carry refused by name", async () => {
  await assert.rejects(
    client.messages.create({ model: "chat", max_tokens: 100, messages: [question], top_k: 40 }),
    (err) => err instanceof Anthropic.BadRequestError && err.error.error.message.includes("top_k"),
  );
});

await check("wrong key", async () => {
  const other = new Anthropic({ baseURL: process.env.MANTLE_URL, apiKey: "sk-wrong", maxRetries: 0 });
  await assert.rejects(
    other.messages.create({ model: "chat", max_tokens: 100, messages: [question] }),
    (err) => err instanceof Anthropic.AuthenticationError && err.error.error.type === "authentication_error",
  );
});

console.log(`anthropic-sdk messages: ${passed} passed, 0 failed`);
