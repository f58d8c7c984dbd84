// The Vercel AI SDK's OpenAI provider with its web search tool, against the gateway (tests/test_web_search.py).
// Usage: node ai_sdk_web_search.mjs GATEWAY_URL SDK_DIR; prints one JSON object: the answer, its sources, the tool calls.
import { createRequire } from "node:module";
import path from "node:path";

const [url, sdkDir] = process.argv.slice(2);
const require = createRequire(path.join(sdkDir, "package.json"));
const { generateText } = await import(require.resolve("ai"));
const { createOpenAI } = await import(require.resolve("@ai-sdk/openai"));

const openai = createOpenAI({ baseURL: url + "/v1", apiKey: "sk-test" });
const result = await generateText({
  model: openai.responses("searcher"),
  prompt: "What is structured concurrency?",
  tools: { web_search: openai.tools.webSearch({ searchContextSize: "low" }) },
  maxRetries: 0,
});
const calls = result.steps.flatMap((step) => step.toolCalls.map((call) => ({ name: call.toolName, input: call.input })));
console.log(JSON.stringify({ text: result.text, sources: result.sources.map((s) => ({ url: s.url, title: s.title })), calls }));
