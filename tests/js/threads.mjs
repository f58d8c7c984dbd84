// The official TypeScript SDK's message threads against the gateway (tests/test_message_threads.py):
// thread.send() over three turns, then the tool runner over three turns on a strict backend.
// Usage: node threads.mjs GATEWAY_URL SDK_DIR; prints one JSON object: what the SDK sent and got.
import { createRequire } from "node:module";
import path from "node:path";

const [url, sdkDir] = process.argv.slice(2);
const require = createRequire(path.join(sdkDir, "package.json"));
const { default: Anthropic } = await import(require.resolve("@anthropic-ai/sdk"));
const { betaTool } = await import(require.resolve("@anthropic-ai/sdk/helpers/beta/json-schema"));

const sent = [];
const recording = async (input, init) => {
  if (init && typeof init.body === "string") sent.push(JSON.parse(init.body));
  return fetch(input, init);
};
const client = new Anthropic({ baseURL: url, apiKey: "sk-test", maxRetries: 0, fetch: recording });

const thread = client.beta.messages.thread({ model: "text", max_tokens: 64, system: "You answer in one line." });
const replies = [];
for (const text of ["one", "two", "three"]) {
  const reply = await thread.send({ role: "user", content: text });
  replies.push({ id: reply.id, text: reply.content[0].text });
}

const ran = [];
const lookup = betaTool({
  name: "lookup",
  description: "Look something up.",
  inputSchema: { type: "object", properties: { n: { type: "integer" } }, required: ["n"] },
  run: async ({ n }) => {
    ran.push(n);
    return `result ${n}`;
  },
});
const runner = client.beta.messages.toolRunner({
  model: "lookup-twice",
  max_tokens: 64,
  system: "You answer in one line.",
  tools: [lookup],
  messages: [{ role: "user", content: "find it" }],
});
const stops = [];
let last = null;
for await (const message of runner) {
  stops.push(message.stop_reason);
  last = message;
}
console.log(JSON.stringify({ sent, replies, ran, stops, final: last.content[0].text }));
