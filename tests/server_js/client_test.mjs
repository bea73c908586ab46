// Drives a running `kivi serve` with the official OpenAI JavaScript client:
//   node client_test.mjs BASE_URL API_KEY MODEL
// a completion, several choices, a streamed chat, log-probabilities, the model list, and errors (unknown model, wrong key,
// a prompt longer than the context). Prints one JSON line of results; exits 1 on the
// first check that fails, naming it.
import OpenAI from "openai";

const [baseURL, apiKey, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });
const results = {};

function check(cond, what) {
  if (!cond) {
    console.error(`client_test: FAILED: ${what}`);
    process.exit(1);
  }
}

// A completion, greedy.
const c = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 20, temperature: 0 });
check(c.object === "text_completion", "completion object");
check(typeof c.choices[0].text === "string" && c.choices[0].text.length > 0, "completion text");
check(c.usage.prompt_tokens > 0 && c.usage.completion_tokens > 0, "completion usage");
check(c.usage.total_tokens === c.usage.prompt_tokens + c.usage.completion_tokens, "usage total");
results.completion = c.choices[0].text;
results.completion_finish = c.choices[0].finish_reason;

// Several choices: n sampled sequences of one prompt, each with its index.
const many = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 8, temperature: 0.9, seed: 3, n: 3 });
check(many.choices.length === 3, "n = 3 gives three choices");
check(many.choices.every((ch, i) => ch.index === i && typeof ch.text === "string"), "choice indices");
results.choices = many.choices.length;

// A streamed chat: deltas concatenated, a finish reason, usage in the last chunk.
const stream = await client.chat.completions.create({
  model,
  messages: [
    { role: "system", content: "You tell short stories." },
    { role: "user", content: "Tell me about a cat." },
  ],
  max_tokens: 24,
  temperature: 0,
  stream: true,
  stream_options: { include_usage: true },
});
let text = "";
let chunks = 0;
let finish = null;
let usage = null;
let role = null;
for await (const chunk of stream) {
  chunks++;
  check(chunk.object === "chat.completion.chunk", "chunk object");
  if (chunk.usage) usage = chunk.usage;
  for (const choice of chunk.choices) {
    if (choice.delta.role) role = choice.delta.role;
    if (choice.delta.content) text += choice.delta.content;
    if (choice.finish_reason) finish = choice.finish_reason;
  }
}
check(role === "assistant", "stream role");
check(chunks >= 3, "several chunks");
check(text.length > 0, "streamed text");
check(finish === "length" || finish === "stop", "stream finish reason");
check(usage && usage.completion_tokens > 0, "stream usage");
results.chat = text;
results.chat_chunks = chunks;

// The same chat without streaming gives the same text (greedy).
const whole = await client.chat.completions.create({
  model,
  messages: [
    { role: "system", content: "You tell short stories." },
    { role: "user", content: "Tell me about a cat." },
  ],
  max_tokens: 24,
  temperature: 0,
});
check(whole.choices[0].message.content === text, "streamed and whole chat agree");

// Log-probabilities through the client's types: one entry per token, the greedy token on
// top of its alternatives.
const withLp = await client.chat.completions.create({
  model,
  messages: [{ role: "user", content: "Tell me about a cat." }],
  max_tokens: 8,
  temperature: 0,
  logprobs: true,
  top_logprobs: 2,
});
const lp = withLp.choices[0].logprobs.content;
check(lp.length === withLp.usage.completion_tokens, "one logprob per token");
check(lp.every((e) => e.logprob <= 0 && e.top_logprobs.length === 2), "logprob values");
check(lp.every((e) => e.top_logprobs[0].token === e.token), "greedy token on top");
check(lp.map((e) => e.token).join("").trim() === withLp.choices[0].message.content.trim(), "logprob tokens spell the reply");
results.logprobs = lp.length;

const models = await client.models.list();
check(models.data.some((m) => m.id === model), "model list");

// Errors come back as the client's typed errors with the server's status and message.
async function status_of(p) {
  try {
    await p;
    return 0;
  } catch (e) {
    check(e instanceof OpenAI.APIError, "typed error");
    return e.status;
  }
}
results.unknown_model = await status_of(client.completions.create({ model: "no-such-model", prompt: "hi" }));
check(results.unknown_model === 404, "unknown model is 404");
const wrong = new OpenAI({ baseURL, apiKey: apiKey + "x", maxRetries: 0 });
results.wrong_key = await status_of(wrong.models.list());
check(results.wrong_key === 401, "wrong key is 401");
results.too_long = await status_of(
  client.completions.create({ model, prompt: "tell me a story ".repeat(400), max_tokens: 4 })
);
check(results.too_long === 400, "prompt longer than the context is 400");
try {
  await client.completions.create({ model, prompt: "hi", max_tokens: 100000 });
} catch (e) {
  results.too_long_message = e.message;
  check(e.status === 400 && /maximum context length/.test(e.message), "max_tokens error message");
}

console.log(JSON.stringify(results));
