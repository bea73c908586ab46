// Tool calls through the official OpenAI JavaScript client, the arguments checked with an
// independent JSON-schema validator (ajv):
//   node tools_test.mjs BASE_URL API_KEY MODEL RUNS
// RUNS seeded requests with tool_choice "required" (temperature 1): every reply that ends
// by itself has finish_reason "tool_calls", calls to offered functions only, with
// arguments that parse and validate against the function's parameters. Then a named
// function, a streamed reply whose deltas add up to the calls, the round trip (the
// call, the tool's result, the answer), "auto" and "none", and the 400s of bad tools.
// Prints one JSON line of results; exits 1 on the first check that fails, naming it.
import OpenAI from "openai";
import Ajv from "ajv";

const [baseURL, apiKey, model, runsArg] = process.argv.slice(2);
const runs = Number(runsArg || 100);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 300000 });
const ajv = new Ajv({ strict: false });
const results = {};

function check(cond, what) {
  if (!cond) {
    console.error(`tools_test: FAILED: ${what}`);
    process.exit(1);
  }
}

const tools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "The weather in a city",
      parameters: {
        type: "object",
        properties: {
          city: { type: "string", maxLength: 16 },
          unit: { enum: ["celsius", "fahrenheit"] },
          days: { type: "integer", minimum: 1, maximum: 7 },
        },
        required: ["city", "unit"],
        additionalProperties: false,
      },
    },
  },
  {
    type: "function",
    function: {
      name: "add",
      parameters: {
        type: "object",
        properties: { a: { type: "number" }, b: { type: "number" } },
        required: ["a", "b"],
        additionalProperties: false,
      },
    },
  },
  { type: "function", function: { name: "now" } },
];
const validators = {
  get_weather: ajv.compile(tools[0].function.parameters),
  add: ajv.compile(tools[1].function.parameters),
  now: ajv.compile({ type: "object", additionalProperties: false }),
};
const messages = [{ role: "user", content: "What is the weather in Paris?" }];

function check_calls(calls, what, only) {
  check(Array.isArray(calls) && calls.length > 0, `${what}: no tool_calls`);
  for (const c of calls) {
    check(c.type === "function" && /^call_[A-Za-z0-9]{24}$/.test(c.id), `${what}: call ${JSON.stringify(c)}`);
    check(c.function.name in validators, `${what}: unknown function ${c.function.name}`);
    if (only) check(c.function.name === only, `${what}: called ${c.function.name}, not ${only}`);
    let args;
    try {
      args = JSON.parse(c.function.arguments);
    } catch (e) {
      check(false, `${what}: arguments are not JSON: ${c.function.arguments}`);
    }
    check(validators[c.function.name](args),
          `${what}: ${c.function.arguments} fails ${c.function.name}'s schema: ` +
              JSON.stringify(validators[c.function.name].errors));
  }
}

// tool_choice "required": `runs` seeds, a few at a time.
let called = 0, length = 0;
for (let start = 0; start < runs; start += 8) {
  const batch = [];
  for (let seed = start; seed < Math.min(runs, start + 8); ++seed) {
    batch.push(client.chat.completions.create({
      model, messages, tools, tool_choice: "required", temperature: 1, seed, max_tokens: 300,
      parallel_tool_calls: false,
    }));
  }
  for (const r of await Promise.all(batch)) {
    const c = r.choices[0];
    if (c.finish_reason === "length") {
      ++length;
      continue;
    }
    check(c.finish_reason === "tool_calls", `required: finish_reason ${c.finish_reason}`);
    check(c.message.content === null, `required: content ${JSON.stringify(c.message.content)}`);
    check_calls(c.message.tool_calls, "required");
    ++called;
  }
}
check(called >= runs * 0.8, `required: only ${called} of ${runs} replies ended with calls`);
results.required = { tool_calls: called, length };

// A named function, one call at a time.
{
  const r = await client.chat.completions.create({
    model, messages, tools, temperature: 1, seed: 7, max_tokens: 200,
    tool_choice: { type: "function", function: { name: "add" } }, parallel_tool_calls: false,
  });
  check(r.choices[0].finish_reason === "tool_calls", `named: ${r.choices[0].finish_reason}`);
  check_calls(r.choices[0].message.tool_calls, "named", "add");
  check(r.choices[0].message.tool_calls.length === 1, "named: more than one call");
  results.named = r.choices[0].message.tool_calls[0].function;
}

// Streamed: the deltas add up to calls that validate, and no content.
{
  const stream = await client.chat.completions.create({
    model, messages, tools, tool_choice: "required", temperature: 1, seed: 3, max_tokens: 300,
    parallel_tool_calls: false, stream: true,
  });
  const calls = [];
  let finish = null, content = "";
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta ?? {};
    content += d.content ?? "";
    for (const t of d.tool_calls ?? []) {
      calls[t.index] ??= { id: t.id, type: t.type, function: { name: "", arguments: "" } };
      calls[t.index].function.name += t.function?.name ?? "";
      calls[t.index].function.arguments += t.function?.arguments ?? "";
    }
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  check(finish === "tool_calls", `stream: finish ${finish}`);
  check(content === "", `stream: content ${JSON.stringify(content)}`);
  check_calls(calls, "stream");
  results.streamed = calls.length;
}

// The round trip: the model's call, the tool's result, the model's answer.
{
  const first = await client.chat.completions.create({
    model, messages, tools, tool_choice: "required", temperature: 0, max_tokens: 300,
    parallel_tool_calls: false,
  });
  const msg = first.choices[0].message;
  check_calls(msg.tool_calls, "round trip");
  const history = [...messages, msg];
  for (const c of msg.tool_calls) {
    history.push({ role: "tool", tool_call_id: c.id, content: JSON.stringify({ temp: 21 }) });
  }
  const answer = await client.chat.completions.create({
    model, messages: history, tools, temperature: 0, max_tokens: 20,
  });
  const a = answer.choices[0];
  if (a.finish_reason === "tool_calls") {
    check_calls(a.message.tool_calls, "round trip answer");
  } else {
    check(typeof a.message.content === "string", "round trip: no answer");
  }
  check(answer.usage.prompt_tokens > first.usage.prompt_tokens, "round trip: the history is short");
  // tool_choice "none": text only, the tools not shown.
  const none = await client.chat.completions.create({
    model, messages: history, tools, tool_choice: "none", temperature: 0, max_tokens: 20,
  });
  check(typeof none.choices[0].message.content === "string", "none: no content");
  check(none.choices[0].message.tool_calls === undefined, "none: tool calls");
  check(none.usage.prompt_tokens < answer.usage.prompt_tokens, "none: the tools are shown");
  results.round_trip = { calls: msg.tool_calls.length, answer_tokens: answer.usage.completion_tokens };
}

// "auto": text, or calls that validate.
{
  let with_calls = 0;
  for (let seed = 0; seed < 8; ++seed) {
    const r = await client.chat.completions.create({
      model, messages, tools, temperature: 1, seed, max_tokens: 60,
    });
    const c = r.choices[0];
    if (c.finish_reason === "tool_calls") {
      check_calls(c.message.tool_calls, "auto");
      ++with_calls;
    } else {
      check(typeof c.message.content === "string", "auto: no content");
    }
  }
  results.auto_with_calls = with_calls;
}

// Bad tools are 400s naming the field.
async function status_of(body) {
  try {
    await client.chat.completions.create({ model, messages, max_tokens: 4, ...body });
    return { status: 200 };
  } catch (e) {
    return { status: e.status, param: e.param ?? e.error?.param };
  }
}
const bad = {
  type: await status_of({ tools: [{ type: "retrieval" }] }),
  name: await status_of({ tools: [{ type: "function", function: { name: "no spaces" } }] }),
  schema: await status_of({ tools: [{ type: "function", function: { name: "f", parameters: {
    type: "object", properties: { s: { type: "string", pattern: "a+" } } } } }] }),
  choice: await status_of({ tools, tool_choice: { type: "function", function: { name: "nope" } } }),
  arguments: await status_of({ messages: [messages[0], { role: "assistant", tool_calls: [
    { id: "x", type: "function", function: { name: "now", arguments: "not json" } }] },
    { role: "tool", tool_call_id: "x", content: "r" }] }),
};
for (const [k, v] of Object.entries(bad)) check(v.status === 400, `bad ${k}: status ${v.status}`);
results.bad = bad;
console.log(JSON.stringify(results));
