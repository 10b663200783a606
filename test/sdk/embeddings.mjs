// Runs the official OpenAI Node SDK's embeddings.create through mantle to an OpenAI-type
// upstream and checks what the upstream received and what the SDK got back. The SDK asks
// for base64 unless told otherwise and decodes it; mantle encodes it from the upstream's
// floats. Usage: MANTLE_BASE_URL=... MANTLE_API_KEY=... UPSTREAM_URL=... node embeddings.mjs
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

// The upstream answers input i with [i, 0.5, -0.25].
await check("embeddings, the SDK's default (base64)", async () => {
  const r = await client.embeddings.create({ model: "embed", input: ["first", "second"], dimensions: 3, user: "u1" });
  const up = await received();
  assert.deepEqual(up, { model: "embed-small", input: ["first", "second"], dimensions: 3, encoding_format: "float", user: "u1" });
  assert.equal(r.object, "list");
  assert.equal(r.model, "embed");
  assert.deepEqual(r.data.map((d) => [d.object, d.index, Array.from(d.embedding)]), [
    ["embedding", 0, [0, 0.5, -0.25]],
    ["embedding", 1, [1, 0.5, -0.25]],
  ]);
  assert.deepEqual(r.usage, { prompt_tokens: 4, total_tokens: 4 });
});

await check("embeddings, float", async () => {
  const r = await client.embeddings.create({ model: "embed", input: "one", encoding_format: "float" });
  assert.deepEqual(r.data[0].embedding, [0, 0.5, -0.25]);
  assert.equal((await received()).input[0], "one");
});

await check("embeddings, token ids", async () => {
  const r = await client.embeddings.create({ model: "embed", input: [[1, 2, 3]], encoding_format: "float" });
  assert.deepEqual((await received()).input, [[1, 2, 3]]);
  assert.equal(r.data.length, 1);
});

await check("embeddings on a chat route is a BadRequestError", async () => {
  await assert.rejects(client.embeddings.create({ model: "chat", input: "x" }), (e) => e instanceof OpenAI.BadRequestError && e.param === "model");
});

console.log(`${passed} checks passed`);
