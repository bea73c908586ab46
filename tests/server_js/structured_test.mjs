// Structured output through the official OpenAI JavaScript client, checked with an
// independent JSON-schema validator (ajv):
//   node structured_test.mjs BASE_URL API_KEY MODEL RUNS
// For each schema, RUNS sampled requests with seeds 0..RUNS-1 (temperature 1): every
// reply that ends by itself ("stop") must parse and validate; a reply cut by max_tokens
// ("length") is counted apart. Then a json_object reply, and the 400s of a schema and a
// grammar that do not compile, with where they fail. Prints one JSON line of results;
// exits 1 on the first check that fails, naming it.
import OpenAI from "openai";
import Ajv from "ajv";

const [baseURL, apiKey, model, runsArg] = process.argv.slice(2);
const runs = Number(runsArg || 100);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 300000 });
const ajv = new Ajv({ strict: false });
const results = {};

function check(cond, what) {
  if (!cond) {
    console.error(`structured_test: FAILED: ${what}`);
    process.exit(1);
  }
}

const schemas = {
  person: {
    type: "object",
    properties: {
      name: { type: "string", maxLength: 12 },
      age: { type: "integer", minimum: 0, maximum: 150 },
      pets: { type: "array", items: { enum: ["cat", "dog", "fish"] }, maxItems: 3 },
      nickname: { anyOf: [{ type: "string", maxLength: 8 }, { type: "null" }] },
    },
    required: ["name", "age", "pets", "nickname"],
    additionalProperties: false,
  },
  measures: {
    type: "object",
    properties: {
      ok: { type: "boolean" },
      ratio: { type: "number" },
      count: { type: "integer" },
      tags: { type: "array", items: { type: "string", maxLength: 5 }, minItems: 1, maxItems: 2 },
      note: { type: "string", maxLength: 10 },
    },
    required: ["ok", "ratio", "count", "tags"],
    additionalProperties: false,
  },
  tree: {
    $defs: {
      node: {
        type: "object",
        properties: {
          value: { type: "integer", minimum: -9, maximum: 9 },
          children: { type: "array", items: { $ref: "#/$defs/node" }, maxItems: 2 },
        },
        required: ["value", "children"],
        additionalProperties: false,
      },
    },
    $ref: "#/$defs/node",
  },
};

// Chat requests with response_format json_schema, `runs` seeds, a few at a time.
async function run_schema(name, schema) {
  const validate = ajv.compile(schema);
  let stop = 0, length = 0;
  for (let start = 0; start < runs; start += 8) {
    const batch = [];
    for (let seed = start; seed < Math.min(runs, start + 8); ++seed) {
      batch.push(client.chat.completions.create({
        model,
        messages: [{ role: "user", content: `Describe a ${name} as JSON.` }],
        response_format: { type: "json_schema", json_schema: { name, schema, strict: true } },
        temperature: 1,
        seed,
        max_tokens: 400,
      }));
    }
    for (const r of await Promise.all(batch)) {
      const ch = r.choices[0];
      if (ch.finish_reason === "length") {
        ++length;
        continue;
      }
      check(ch.finish_reason === "stop", `${name}: finish_reason ${ch.finish_reason}`);
      let doc;
      try {
        doc = JSON.parse(ch.message.content);
      } catch (e) {
        check(false, `${name}: reply does not parse: ${JSON.stringify(ch.message.content)}`);
      }
      check(validate(doc), `${name}: ${JSON.stringify(doc)} fails the schema: ${ajv.errorsText(validate.errors)}`);
      ++stop;
    }
  }
  return { stop, length };
}

for (const [name, schema] of Object.entries(schemas)) {
  results[name] = await run_schema(name, schema);
}
// The bounded schemas always finish.
check(results.person.stop === runs, "person: every reply ends by itself");
check(results.measures.stop === runs, "measures: every reply ends by itself");
check(results.tree.stop >= runs / 2, "tree: most replies end by itself");

// Any JSON object, on the completions endpoint. A story model writes stories inside the
// strings and objects; a bias towards the quote and the closing brace makes it close
// them, so the replies end.
const root = baseURL.replace(/\/v1$/, "");
const tok = await fetch(`${root}/tokenize`, {
  method: "POST", headers: { Authorization: `Bearer ${apiKey}` },
  body: JSON.stringify({ content: '"}', add_special: false }),
}).then((r) => r.json());
const bias = Object.fromEntries(tok.tokens.map((t) => [t, 10]));
let objects = 0;
for (let seed = 0; seed < Math.min(runs, 20); ++seed) {
  const r = await client.completions.create({
    model, prompt: "The data:", temperature: 1, seed, max_tokens: 400,
    response_format: { type: "json_object" }, logit_bias: bias,
  });
  if (r.choices[0].finish_reason !== "stop") continue;
  const doc = JSON.parse(r.choices[0].text);
  check(doc !== null && typeof doc === "object" && !Array.isArray(doc), "json_object gives an object");
  ++objects;
}
results.json_objects = objects;
check(objects >= Math.min(runs, 20) / 2, `json_object: most replies end (${objects})`);

// What does not compile is a 400 that says where.
async function error_of(body) {
  try {
    await client.chat.completions.create({ model, messages: [{ role: "user", content: "hi" }], ...body });
  } catch (e) {
    check(e instanceof OpenAI.APIError, "typed error");
    return { status: e.status, message: e.message };
  }
  return { status: 200 };
}
const badSchema = await error_of({
  response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "object", properties: { a: { type: "string", pattern: "^a+$" } } } } },
});
check(badSchema.status === 400 && /\/properties\/a/.test(badSchema.message), `bad schema: ${badSchema.message}`);
const badGrammar = await error_of({ grammar: 'root ::= "a" | b' });
check(badGrammar.status === 400 && /line 1, column 16/.test(badGrammar.message), `bad grammar: ${badGrammar.message}`);
results.bad_schema = badSchema.message;
results.bad_grammar = badGrammar.message;

console.log(JSON.stringify(results));
