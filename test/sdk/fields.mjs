// Runs the official OpenAI Node SDK through mantle to a recording OpenAI-type upstream and
// checks, field by field, what the upstream received and what the SDK got back.
// Usage: MANTLE_BASE_URL=... MANTLE_API_KEY=... UPSTREAM_URL=... node fields.mjs
import OpenAI from "openai";
import assert from "node:assert/strict";

const client = new OpenAI({ baseURL: process.env.MANTLE_BASE_URL, apiKey: process.env.MANTLE_API_KEY, maxRetries: 0 });
const received = async () => (await fetch(process.env.UPSTREAM_URL + "/recorded/last")).json();
let passed = 0;
const check = async (name, fn) => {
  await fn();
  passed++;
  console.log("ok", name);
};

const tools = [
  { type: "function", function: { name: "get_weather", description: "Weather of a city", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] }, strict: true } },
  { type: "function", function: { name: "get_time", parameters: { type: "object", properties: { tz: { type: "string" } } } } },
];
const question = { role: "user", content: "Weather and time in Paris?" };
const wantCalls = [
  { id: "call_a", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris"}' } },
  { id: "call_b", type: "function", function: { name: "get_time", arguments: '{"tz":"CET"}' } },
];

await check("tool calling, parallel calls", async () => {
  const r = await client.chat.completions.create({ model: "chat", messages: [question], tools, tool_choice: "auto", parallel_tool_calls: true });
  const up = await received();
  assert.deepEqual(up.tools, tools);
  assert.equal(up.tool_choice, "auto");
  assert.equal(up.parallel_tool_calls, true);
  assert.equal(r.choices[0].finish_reason, "tool_calls");
  assert.deepEqual(r.choices[0].message.tool_calls, wantCalls);
});

await check("tool calling, streamed deltas", async () => {
  const stream = await client.chat.completions.create({ model: "chat", messages: [question], tools, stream: true });
  const calls = [];
  let finish = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      for (const d of c.delta?.tool_calls ?? []) {
        calls[d.index] ??= { id: "", type: "", function: { name: "", arguments: "" } };
        const call = calls[d.index];
        if (d.id) call.id = d.id;
        if (d.type) call.type = d.type;
        call.function.name += d.function?.name ?? "";
        call.function.arguments += d.function?.arguments ?? "";
      }
      finish = c.finish_reason ?? finish;
    }
  }
  assert.equal((await received()).stream, true);
  assert.deepEqual(calls, wantCalls);
  assert.equal(finish, "tool_calls");
});

await check("tool results turn", async () => {
  const messages = [
    question,
    { role: "assistant", content: null, tool_calls: wantCalls },
    { role: "tool", tool_call_id: "call_a", content: "sunny" },
    { role: "tool", tool_call_id: "call_b", content: "14:00" },
  ];
  const r = await client.chat.completions.create({ model: "chat", messages });
  assert.deepEqual((await received()).messages, messages);
  assert.equal(r.choices[0].message.content, "ok");
});

await check("vision", async () => {
  const messages = [{ role: "user", content: [
    { type: "text", text: "What is in this image?" },
    { type: "image_url", image_url: { url: "data:image/png;base64,iVBORw0KGgo=", detail: "low" } },
  ] }];
  await client.chat.completions.create({ model: "chat", messages });
  assert.deepEqual((await received()).messages, messages);
});

await check("stop, seed, top_p, logprobs", async () => {
  const r = await client.chat.completions.create({ model: "chat", messages: [{ role: "user", content: "Say ok." }], stop: ["\n\n", "END"], seed: 7, top_p: 0.9, logprobs: true, top_logprobs: 2 });
  const up = await received();
  assert.deepEqual(up.stop, ["\n\n", "END"]);
  assert.equal(up.seed, 7);
  assert.equal(up.top_p, 0.9);
  assert.equal(up.logprobs, true);
  assert.equal(up.top_logprobs, 2);
  assert.deepEqual(r.choices[0].logprobs, { content: [{ token: "ok", logprob: -0.1, bytes: [111, 107], top_logprobs: [] }] });
});

await check("json_schema structured output", async () => {
  const response_format = { type: "json_schema", json_schema: { name: "answer", strict: true, schema: { type: "object", properties: { a: { type: "integer" } }, required: ["a"], additionalProperties: false } } };
  const r = await client.chat.completions.create({ model: "chat", messages: [{ role: "user", content: "Give a." }], response_format });
  assert.deepEqual((await received()).response_format, response_format);
  assert.deepEqual(JSON.parse(r.choices[0].message.content), { a: 1 });
});

await check("unknown field refused by name", async () => {
  await assert.rejects(
    client.chat.completions.create({ model: "chat", messages: [question], top_k: 40 }),
    (err) => err instanceof OpenAI.BadRequestError && err.param === "top_k",
  );
});

console.log(`openai-node fields: ${passed} passed, 0 failed`);
