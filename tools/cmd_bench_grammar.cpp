#include <cstdio>
#include <memory>
#include <string>

#include "common.h"
#include "core/error.h"
#include "core/json.h"
#include "grammar/json_schema.h"
#include "runtime/bench_grammar.h"
#include "runtime/engine_options.h"

namespace kivi::tools {

namespace {
// A sentence of the JSON object grammar, with strings, numbers, nesting and escapes.
const char* kSampleJson =
    R"({"name": "Lily", "age": 7, "friends": ["Tom", "Ben"], "story": {"title": "The red )"
    R"(ball", "words": 128, "happy": true, "moral": "Share \"your\" toys.\nBe kind."}, )"
    R"("scores": [1.5, -2, 3e2], "pet": null})";
}  // namespace

int cmd_bench_grammar(int argc, char** argv) {
  Args a("bench-grammar", "[-m MODEL] [--grammar-file FILE | --json-schema SCHEMA] [--sample TEXT]",
         "Times structured output per token: the full token mask of a grammar over the model's\n"
         "vocabulary, and the check of one token, at every step of a sample sentence written\n"
         "token by token, beside the model's decode step. The default grammar is any JSON\n"
         "object, with a built-in sample.");
  a.add("grammar-file", 0, "FILE", "A GBNF grammar (llama.cpp's format).");
  a.add("json-schema", 0, "SCHEMA", "A JSON schema (JSON text or the path of a file).");
  a.add("sample", 0, "TEXT", "A sentence of the grammar, walked token by token.");
  a.add("decode-steps", 0, "N", "Decode steps timed (median).", "16");
  a.add_flag("json", 0, "Print JSON instead of a table.");
  add_model_options(a);
  add_kv_options(a);
  if (!parse_command_line(a, argc, argv)) return 0;
  runtime::OptionValues v;
  if (a.given("grammar-file")) v["grammar-file"] = a.str("grammar-file");
  if (a.given("json-schema")) v["json-schema"] = a.str("json-schema");
  std::shared_ptr<const grammar::Grammar> g = runtime::parse_generation_options(v).grammar;
  if (!g)
    g = std::make_shared<const grammar::Grammar>(
        grammar::Grammar::parse(grammar::json_object_gbnf()));
  if (v.size() > 0 && !a.given("sample")) fail("--sample: give a sentence of the grammar to walk");
  const std::string sample = a.given("sample") ? a.str("sample") : kSampleJson;
  const int steps = a.integer("decode-steps", 1, 4096);
  auto m = load_model(a);
  runtime::Session s(*m, session_options(a, *m));
  const runtime::GrammarBenchResult r = runtime::bench_grammar(s, g, sample, steps);
  const double mask_pct = r.decode_ms > 0 ? 100.0 * r.mask_mean_ms / r.decode_ms : 0.0;
  const double check_pct = r.decode_ms > 0 ? 100.0 * r.check_mean_us / 1e3 / r.decode_ms : 0.0;
  if (a.given("json")) {
    JsonWriter j;
    j.begin_object();
    j.kv("vocab", r.vocab).kv("trie_nodes", static_cast<uint64_t>(r.trie_nodes));
    j.kv("trie_build_ms", r.trie_build_ms).kv("steps", r.steps);
    j.kv("mask_mean_ms", r.mask_mean_ms).kv("mask_p50_ms", r.mask_p50_ms);
    j.kv("mask_max_ms", r.mask_max_ms).kv("allowed_mean", r.allowed_mean);
    j.kv("check_mean_us", r.check_mean_us).kv("decode_ms", r.decode_ms);
    j.kv("mask_pct_of_decode", mask_pct).kv("check_pct_of_decode", check_pct);
    j.end_object();
    std::printf("%s\n", j.str().c_str());
    return 0;
  }
  std::printf("vocabulary        %d tokens, trie of %zu nodes (built in %.1f ms)\n", r.vocab,
              r.trie_nodes, r.trie_build_ms);
  std::printf("sample            %d tokens; %d tokens allowed per step on average\n", r.steps,
              r.allowed_mean);
  std::printf(
      "full mask         mean %.3f ms, median %.3f ms, max %.3f ms  (%.1f%% of a decode step)\n",
      r.mask_mean_ms, r.mask_p50_ms, r.mask_max_ms, mask_pct);
  std::printf("one-token check   mean %.2f us  (%.3f%% of a decode step)\n", r.check_mean_us,
              check_pct);
  std::printf("decode step       %.2f ms (median of %d)\n", r.decode_ms, steps);
  return 0;
}

}  // namespace kivi::tools
