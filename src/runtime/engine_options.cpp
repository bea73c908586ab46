#include "runtime/engine_options.h"

#include "kv/layer_formats.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "grammar/json_schema.h"
#include "core/rng.h"
#include "core/suggest.h"
#include "core/sysinfo.h"
#include "core/threadpool.h"
#include "kv/format.h"
#include "kv/layer_formats.h"
#include "model/context_parallel.h"

namespace kivi::runtime {

namespace {

constexpr const char* kKv = "KV cache";
constexpr const char* kSparse = "Sparse attention";
constexpr const char* kRun = "Model";

const std::vector<OptionSpec> kSpecs = {
    {"ctx", 'c', "N",
     "Context length in tokens; the KV cache is allocated for N. Default: the "
     "model's (checked against the memory available beside the weights).",
     "", kRun},
    {"threads", 0, "N",
     "Worker threads, counting the main one (0 = every hardware thread this process may use). "
     "More than the hardware has is capped to it, with a warning, unless --threads-force. "
     "(llama.cpp spells this -t; here -t names the tokenizer file.)",
     "0", kRun},
    {"threads-force", 0, "",
     "Use --threads N even above the hardware thread count (threads then share cores and idle "
     "ones block instead of spinning).",
     "", kRun},
    {"kv-cache", 0, "FORMAT",
     "Cache format for keys and values. Formats: f32, f16, int8, kivi2, kivi4, kivi8, and the "
     "rotated vector formats tq2, tq2.5, tq3, tq3.5, tq4 (a Hadamard rotation per head, Lloyd-Max "
     "codes, one scale per token).",
     "f32", kKv},
    {"kv-cache-k", 0, "FORMAT", "Key format (overrides --kv-cache for keys), e.g. kivi4.", "", kKv},
    {"kv-cache-v", 0, "FORMAT", "Value format (overrides --kv-cache for values), e.g. kivi2.", "",
     kKv},
    {"kv-cache-layers", 0, "MAP",
     "Per-layer formats, overriding --kv-cache: rules LAYERS:FORMAT separated by ';', LAYERS a "
     "list of layers and ranges or '*' for the rest, FORMAT one format or KEY/VALUE, e.g. "
     "\"0,1,15:kivi4;*:kivi2\" or \"0-3:kivi4/kivi2;*:kivi2\". Every layer is covered once.",
     "", kKv},
    {"int8-granularity", 0, "G",
     "int8 scale granularity: tensor (one per layer and K/V, fixed at the first prefill; later "
     "overflow is clamped and counted), token, head or group.",
     "head", kKv},
    {"group-size", 'G', "G",
     "Quantization group: KIVI key groups of G tokens; KIVI value and int8 groups of min(G, "
     "head_dim) channels.",
     "32", kKv},
    {"residual", 'R', "R",
     "Residual window of the KIVI and tq formats: the last R tokens stay in full precision (for "
     "KIVI a multiple of G).",
     "128", kKv},
    {"kv-rotate", 0, "R",
     "none, or hadamard: int8 keys and values and KIVI values are rotated per layer and KV head "
     "by a seeded randomized Hadamard transform before they are quantized, which spreads "
     "outlier channels (KIVI keys, quantized per channel, and float rows are not rotated; tq "
     "formats always are).",
     "none", kKv},
    {"kv-rotation-seed", 0, "SEED",
     "tq formats and --kv-rotate: the base seed of the per-layer, per-head Hadamard rotations "
     "(recorded in KV files).",
     "1802073705", kKv},
    {"key-flush", 0, "POLICY",
     "KIVI key flush: batch (quantize all R when the residual reaches R) or group (quantize the "
     "oldest G when it exceeds R).",
     "batch", kKv},
    {"key-rope", 0, "WHERE",
     "Keys stored after RoPE (post, as KIVI does) or before it (pre: quantized unrotated, where "
     "channel outliers stay in their channels, and rotated by position inside attention).",
     "post", kKv},
    {"kv-share", 0, "N",
     "Cross-layer KV sharing: each group of N adjacent layers reads the first layer's keys and "
     "values (the others skip their K and V projections and store no cache). 1 = no sharing.",
     "1", kKv},
    {"kv-share-map", 0, "LIST",
     "Cross-layer KV sharing by pairs BORROWER:OWNER (comma-separated, owner earlier than "
     "borrower), e.g. 3:1,5:2; applied after --kv-share.",
     "", kKv},
    {"scale-dtype", 0, "TYPE", "Storage of scales and zero points: f16 (half the bytes) or f32.",
     "f16", kKv},
    {"attn-precision", 0, "MODE",
     "Attention over quantized caches: exact (float math on the stored codes, within 1e-5 of "
     "dequantize-then-attend) or fast (integer dot products with the query and the softmax "
     "weights rounded to int16; ~1e-3 relative error, faster on x86).",
     "exact", kKv},
    {"prefill", 0, "MODE",
     "How a prompt chunk attends: tiled (query tiles against each stored block, which is read "
     "once per tile; equal to stream up to float rounding) or stream (token by token with the "
     "decode kernels, bit for bit what decoding one token at a time gives).",
     "tiled", kKv},
    {"window", 0, "N",
     "Sliding-window attention over the last N tokens (0 = full). With --context-overflow "
     "window: the window kept in the cache (default: the context minus the sink blocks and one "
     "block).",
     "0", kKv},
    {"context-overflow", 0, "POLICY",
     "When the cache is full: stop (an error), shift (drop the oldest half after the sinks and "
     "go on), or window (keep the sinks and the most recent --window tokens; memory stays flat).",
     "stop", kKv},
    {"sinks", 0, "N",
     "Tokens at the start kept by the shift and window policies (attention "
     "sinks).",
     "4", kKv},
    {"sparse", 0, "KIND",
     "Block-sparse attention: each KV head attends the top blocks by their summary (quest: "
     "per-channel key min/max bound; max; mean; fix: the mean of the keys at offsets 0, B/4, "
     "B/2, 3B/4; random: a baseline) plus the sinks and the local window; off = dense.",
     "off", kSparse},
    {"sparse-block", 0, "N", "Tokens per block (a multiple of the KIVI key group G).", "64",
     kSparse},
    {"sparse-budget", 0, "N", "Tokens of selected blocks per KV head and step.", "4096", kSparse},
    {"sparse-sinks", 0, "N", "First tokens always attended.", "4", kSparse},
    {"sparse-local", 0, "N",
     "Most recent tokens always attended (with KIVI's residual and any block not yet "
     "summarized).",
     "256", kSparse},
    {"sparse-dense-layers", 0, "N", "The first N layers attend densely.", "0", kSparse},
    {"sparse-heads", 0, "MODE",
     "per: each KV head selects its own blocks; shared: the KV heads' scores are summed and "
     "every head attends the same blocks.",
     "per", kSparse},
    {"sparse-reselect", 0, "N",
     "Select every N decode steps and reuse the blocks in between (the local window reaches "
     "back to the last selection).",
     "1", kSparse},
    {"sparse-reuse-layers", 0, "N",
     "Of every N consecutive sparse layers the first selects and the others attend its blocks.",
     "1", kSparse},
    {"sparse-preselect", 0, "W",
     "After a prefill, the attention of its last W tokens picks candidate blocks per KV head "
     "(SnapKV-style, max-pooled over neighbouring blocks); decode selects among them and the "
     "blocks filled since. 0 = off.",
     "0", kSparse},
    {"sparse-candidates", 0, "N",
     "Tokens of candidate blocks per KV head kept by --sparse-preselect.", "16384", kSparse},
};

constexpr const char* kGen = "Generation";

const std::vector<OptionSpec> kGenSpecs = {
    {"max-tokens", 'n', "N", "Tokens to generate (-1 = until an end token or a full context).",
     "256", kGen},
    {"temp", 0, "T", "Sampling temperature; 0 = greedy (argmax).", "0.8", kGen, "temperature"},
    {"top-k", 0, "K", "Sample from the K most likely tokens (0 = off).", "40", kGen},
    {"top-p", 0, "P",
     "Sample from the smallest set of tokens whose probability reaches P (1 = off).", "0.95", kGen},
    {"min-p", 0, "P",
     "Sample only from tokens of at least P times the most likely token's probability (0 = off).",
     "0", kGen},
    {"seed", 's', "S", "Random seed; the same seed gives the same text (-1 = a random one).", "42",
     kGen},
    {"repeat-penalty", 0, "R",
     "Divide the positive logits (multiply the negative ones) of tokens seen among the last "
     "--repeat-last-n tokens, the prompt's included, by R (1 = off; as llama.cpp).",
     "1", kGen},
    {"repeat-last-n", 0, "N", "Tokens the repeat penalty looks back over (-1 = all).", "64", kGen},
    {"presence-penalty", 0, "P",
     "Subtract P from the logit of every token generated so far (-2 to 2; as OpenAI).", "0", kGen},
    {"frequency-penalty", 0, "F",
     "Subtract F times its count from the logit of every token generated so far (-2 to 2; as "
     "OpenAI).",
     "0", kGen},
    {"logit-bias", 0, "ID:BIAS,...",
     "Add BIAS (-100 to 100) to the logit of token ID, e.g. 15043:-100 to all but ban it.", "",
     kGen},
    {"ignore-eos", 0, "",
     "Never sample an end token (EOS, BOS, end of turn): generate N tokens, for long runs and "
     "benchmarks (as llama.cpp's --ignore-eos).",
     "", kGen},
    {"grammar-file", 0, "FILE",
     "Constrain the reply to the sentences of a GBNF grammar (llama.cpp's format; the rule "
     "'root' is where the reply starts).",
     "", kGen},
    {"json-schema", 0, "SCHEMA",
     "Constrain the reply to a JSON document valid under SCHEMA: JSON text, or the path of a "
     "file holding it ('{}' = any JSON value).",
     "", kGen},
    {"lookup", 0, "N",
     "Speculative decoding by prompt lookup: draft up to N tokens (0 = off, at most 64) that "
     "followed an earlier occurrence of the latest tokens and check them in one batched step. "
     "The text is the same; text that repeats earlier text takes fewer steps.",
     "0", kGen},
    {"lookup-ngram", 0, "N",
     "Tokens --lookup matches (the longest of N down to 1 that occurred before).", "3", kGen},
};

// The grammar --grammar-file or --json-schema asks for, or null.
std::shared_ptr<const grammar::Grammar> read_grammar(const std::string& file,
                                                     const std::string& schema,
                                                     const std::string& file_flag,
                                                     const std::string& schema_flag) {
  if (!file.empty() && !schema.empty())
    fail("%s and %s both constrain the reply; give one", file_flag.c_str(), schema_flag.c_str());
  auto slurp = [](const std::string& path, const std::string& flag) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("%s: cannot read '%s'", flag.c_str(), path.c_str());
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  std::string gbnf;
  std::string where;
  if (!file.empty()) {
    gbnf = slurp(file, file_flag);
    where = file_flag + " " + file;
  } else if (!schema.empty()) {
    const size_t first = schema.find_first_not_of(" \t\r\n");
    const bool inline_json =
        first != std::string::npos &&
        (schema[first] == '{' || schema[first] == '[' || schema == "true" || schema == "false");
    const std::string text = inline_json ? schema : slurp(schema, schema_flag);
    const nlohmann::ordered_json j =
        nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) fail("%s: the schema is not valid JSON", schema_flag.c_str());
    try {
      gbnf = grammar::json_schema_to_gbnf(j);
    } catch (const grammar::SchemaError& e) {
      fail("%s: %s", schema_flag.c_str(), e.what());
    }
    where = schema_flag;
  } else {
    return nullptr;
  }
  try {
    return std::make_shared<const grammar::Grammar>(grammar::Grammar::parse(gbnf));
  } catch (const grammar::GrammarError& e) {
    fail("%s: %s", where.c_str(), e.what());
  }
}

const OptionSpec* find_in(const std::vector<OptionSpec>& specs, const std::string& name) {
  for (const auto& s : specs)
    if (name == s.name) return &s;
  return nullptr;
}

// Reads given values with the table's defaults, naming options as the front end spells them.
class Reader {
 public:
  Reader(const OptionValues& v, OptionSpelling s, const std::vector<OptionSpec>& specs = kSpecs)
      : v_(v), s_(s), specs_(specs) {}
  bool given(const char* n) const { return v_.count(n) != 0; }
  std::string name(const char* n) const {
    const OptionSpec* sp = find_in(specs_, n);
    if (s_ == OptionSpelling::kKeyword && sp && sp->keyword) return sp->keyword;
    return spell_option(n, s_);
  }
  // "--sparse KIND" or "sparse=KIND": how the user gives the option a value.
  std::string with_value(const char* n, const char* value) const {
    return name(n) + (s_ == OptionSpelling::kFlag ? " " : "=") + value;
  }
  std::string str(const char* n) const {
    auto it = v_.find(n);
    return it != v_.end() ? it->second : find_in(specs_, n)->def;
  }
  bool flag(const char* n) const {
    auto it = v_.find(n);
    if (it == v_.end()) return false;
    const std::string& s = it->second;
    if (s == "1" || s == "true" || s == "True") return true;
    if (s == "0" || s == "false" || s == "False") return false;
    fail("%s: '%s' is not true or false", name(n).c_str(), s.c_str());
  }
  int integer(const char* n, int64_t lo, int64_t hi) const {
    return static_cast<int>(integer64(n, lo, std::min<int64_t>(hi, INT32_MAX)));
  }
  int64_t integer64(const char* n, int64_t lo, int64_t hi) const {
    const std::string s = str(n);
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || errno == ERANGE)
      fail("%s: '%s' is not an integer", name(n).c_str(), s.c_str());
    if (v < lo || v > hi) {
      fail("%s = %lld is out of range (valid: %lld to %lld)", name(n).c_str(), v,
           static_cast<long long>(lo), static_cast<long long>(hi));
    }
    return v;
  }
  double number(const char* n) const {
    const std::string s = str(n);
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0' || !std::isfinite(v))
      fail("%s: '%s' is not a number", name(n).c_str(), s.c_str());
    return v;
  }

 private:
  const OptionValues& v_;
  OptionSpelling s_;
  const std::vector<OptionSpec>& specs_;
};

std::vector<std::pair<int, int>> parse_share_map(const std::string& text, const std::string& opt) {
  std::vector<std::pair<int, int>> pairs;
  size_t i = 0;
  while (i <= text.size()) {
    const size_t e = std::min(text.find(',', i), text.size());
    const std::string item = text.substr(i, e - i);
    const size_t colon = item.find(':');
    char* end = nullptr;
    long b = -1, o = -1;
    if (colon != std::string::npos && colon > 0 && colon + 1 < item.size()) {
      b = std::strtol(item.c_str(), &end, 10);
      const bool b_ok = end == item.c_str() + colon;
      o = std::strtol(item.c_str() + colon + 1, &end, 10);
      if (!b_ok || *end != '\0') b = o = -1;
    }
    if (b < 0 || o < 0 || b > (1 << 20) || o > (1 << 20)) {
      fail("%s: '%s' is not BORROWER:OWNER (layer numbers, e.g. 3:1)", opt.c_str(), item.c_str());
    }
    pairs.emplace_back(static_cast<int>(b), static_cast<int>(o));
    i = e + 1;
  }
  return pairs;
}

// FORMAT[+shareN][+pre]: a format with cache policies attached (benchmark lists).
void apply_format_spec(const std::string& spec_in, const std::string& opt, kv::CacheConfig& c,
                       kv::Int8Granularity gran) {
  std::string spec = spec_in;
  std::vector<std::string> policies;
  for (size_t plus = spec.find('+'); plus != std::string::npos; plus = spec.find('+')) {
    const size_t next = spec.find('+', plus + 1);
    policies.push_back(
        spec.substr(plus + 1, next == std::string::npos ? std::string::npos : next - plus - 1));
    spec.erase(plus, next == std::string::npos ? std::string::npos : next - plus);
  }
  const kv::StreamFormat f{kv::parse_format(spec, opt.c_str()), gran};
  c.k = f;
  c.v = f;
  for (const auto& p : policies) {
    char* end = nullptr;
    if (p.rfind("share", 0) == 0 && p.size() > 5) {
      const long n = std::strtol(p.c_str() + 5, &end, 10);
      if (*end != '\0' || n < 1 || n > (1 << 16))
        fail("'+%s': expected +shareN with N >= 1", p.c_str());
      c.share_every = static_cast<int>(n);
    } else if (p == "pre") {
      c.key_rope = kv::KeyRope::kPre;
    } else {
      fail("'+%s': unknown cache policy (valid: +shareN, +pre)", p.c_str());
    }
  }
}

sparse::Options parse_sparse(const Reader& r) {
  sparse::Options o;
  if (!r.given("sparse") || r.str("sparse") == "off") {
    for (const char* n : {"sparse-block", "sparse-budget", "sparse-sinks", "sparse-local",
                          "sparse-dense-layers", "sparse-heads", "sparse-reselect",
                          "sparse-reuse-layers", "sparse-preselect", "sparse-candidates"}) {
      if (r.given(n))
        fail("%s needs %s (quest, max, mean, fix or random)", r.name(n).c_str(),
             r.with_value("sparse", "KIND").c_str());
    }
    return o;
  }
  o.kind = sparse::parse_kind(r.str("sparse"));
  o.block = r.integer("sparse-block", 1, 65536);
  o.budget = r.integer("sparse-budget", 0, model::kMaxContext);
  o.sinks = r.integer("sparse-sinks", 0, model::kMaxContext);
  o.local = r.integer("sparse-local", 1, model::kMaxContext);
  o.dense_layers = r.integer("sparse-dense-layers", 0, 1 << 16);
  o.heads = sparse::parse_heads(r.str("sparse-heads"));
  o.reselect = r.integer("sparse-reselect", 1, 65536);
  o.reuse_layers = r.integer("sparse-reuse-layers", 1, 65536);
  o.preselect = r.integer("sparse-preselect", 0, model::kMaxContext);
  o.candidates = r.integer("sparse-candidates", 0, model::kMaxContext);
  if (r.given("sparse-candidates") && o.preselect == 0)
    fail("%s needs %s", r.name("sparse-candidates").c_str(),
         r.with_value("sparse-preselect", "W").c_str());
  o.validate();
  return o;
}

std::vector<std::string> spec_names() {
  std::vector<std::string> names;
  for (const auto& s : kSpecs) names.push_back(s.name);
  return names;
}

}  // namespace

const std::vector<OptionSpec>& session_option_specs() { return kSpecs; }

bool OptionSpec::takes_integer() const {
  if (std::string(name) == "ctx") return true;
  if (def[0] == '\0') return false;
  for (const char* c = def; *c; ++c) {
    if (*c < '0' || *c > '9') return false;
  }
  return true;
}

const OptionSpec* find_session_option(const std::string& name) { return find_in(kSpecs, name); }

const std::vector<OptionSpec>& generation_option_specs() { return kGenSpecs; }

const OptionSpec* find_generation_option(const std::string& name) {
  return find_in(kGenSpecs, name);
}

GenerationOptions parse_generation_options(const OptionValues& given, OptionSpelling spelling) {
  const Reader r(given, spelling, kGenSpecs);
  for (const auto& [name, value] : given) {
    if (!find_generation_option(name)) {
      std::vector<std::string> known;
      for (const auto& s : kGenSpecs) known.push_back(r.name(s.name));
      const std::string spelled = spell_option(name, spelling);
      fail("unknown generation option '%s'%s", spelled.c_str(),
           did_you_mean(spelled, known).c_str());
    }
  }
  GenerationOptions g;
  g.max_tokens = r.integer("max-tokens", -1, 1 << 24);
  SamplerOptions& so = g.sampler;
  const double temp = r.number("temp"), top_p = r.number("top-p");
  // One wording for each range, whichever front end and value.
  if (!(temp >= 0.0 && temp <= 100.0))
    fail("%s = %g is out of range (valid: 0 to 100)", r.name("temp").c_str(), temp);
  if (!(top_p > 0.0 && top_p <= 1.0)) {
    fail("%s = %g is out of range (valid: greater than 0, up to 1)", r.name("top-p").c_str(),
         top_p);
  }
  so.temperature = static_cast<float>(temp);
  so.top_p = static_cast<float>(top_p);
  so.top_k = r.integer("top-k", 0, 1 << 24);
  const int64_t seed = r.integer64("seed", -1, INT64_MAX);
  so.seed = seed < 0 ? random_seed() : static_cast<uint64_t>(seed);
  so.min_p = static_cast<float>(r.number("min-p"));
  so.repeat_penalty = static_cast<float>(r.number("repeat-penalty"));
  so.repeat_last_n = r.integer("repeat-last-n", -1, 1 << 24);
  so.presence_penalty = static_cast<float>(r.number("presence-penalty"));
  so.frequency_penalty = static_cast<float>(r.number("frequency-penalty"));
  if (r.given("logit-bias") && !r.str("logit-bias").empty())
    so.logit_bias = parse_logit_bias(r.str("logit-bias"));
  for (const char* n : {"min-p", "repeat-penalty", "presence-penalty", "frequency-penalty"}) {
    if (!std::isfinite(r.number(n)))
      fail("%s = %g is not a number", r.name(n).c_str(), r.number(n));
  }
  try {
    check_sampler_options(so);
  } catch (const Error& e) {
    // The sampler names CLI flags; the front end may spell them as keywords.
    std::string msg = e.what();
    for (const char* n : {"min-p", "repeat-penalty", "repeat-last-n", "presence-penalty",
                          "frequency-penalty", "logit-bias"}) {
      const std::string flag = std::string("--") + n, mine = r.name(n);
      if (msg.rfind(flag, 0) == 0) msg = mine + msg.substr(flag.size());
    }
    fail("%s", msg.c_str());
  }
  g.ignore_eos = r.flag("ignore-eos");
  g.lookup = r.integer("lookup", 0, 64);
  g.lookup_ngram = r.integer("lookup-ngram", 1, 16);
  g.grammar = read_grammar(r.given("grammar-file") ? r.str("grammar-file") : "",
                           r.given("json-schema") ? r.str("json-schema") : "",
                           r.name("grammar-file"), r.name("json-schema"));
  return g;
}

std::vector<std::pair<int, float>> parse_logit_bias(const std::string& text) {
  std::vector<std::pair<int, float>> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t end = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, end - at);
    const size_t colon = item.find(':');
    char* e1 = nullptr;
    char* e2 = nullptr;
    const long id = colon == std::string::npos ? -1 : std::strtol(item.c_str(), &e1, 10);
    const double bias =
        colon == std::string::npos ? 0.0 : std::strtod(item.c_str() + colon + 1, &e2);
    if (colon == std::string::npos || e1 != item.c_str() + colon || colon == 0 || !e2 ||
        *e2 != '\0' || e2 == item.c_str() + colon + 1 || id < 0 || id > (1 << 30) ||
        !std::isfinite(bias)) {
      fail("--logit-bias: '%s' is not ID:BIAS (e.g. 15043:-100)", item.c_str());
    }
    out.emplace_back(static_cast<int>(id), static_cast<float>(bias));
    at = end + 1;
  }
  return out;
}

std::string spell_option(const std::string& name, OptionSpelling s) {
  if (s == OptionSpelling::kFlag) return "--" + name;
  std::string k = name;
  std::replace(k.begin(), k.end(), '-', '_');
  return k;
}

std::vector<std::string> kv_option_names() {
  std::vector<std::string> names;
  for (const auto& s : kSpecs) {
    if (std::string(s.section) != kRun) names.push_back(s.name);
  }
  return names;
}

SessionOptions parse_session_options(const OptionValues& given, OptionSpelling spelling) {
  for (const auto& [name, value] : given) {
    if (!find_session_option(name)) {
      std::vector<std::string> known;
      for (const auto& n : spec_names()) known.push_back(spell_option(n, spelling));
      const std::string spelled = spell_option(name, spelling);
      fail("unknown session option '%s'%s", spelled.c_str(), did_you_mean(spelled, known).c_str());
    }
  }
  const Reader r(given, spelling);
  SessionOptions o;
  o.ctx = r.given("ctx") ? r.integer("ctx", 1, model::kMaxContext) : 0;
  const int requested = r.integer("threads", 0, 1024);
  o.threads = requested == 0 ? 0 : resolve_thread_count(requested, r.flag("threads-force")).threads;

  kv::CacheConfig& c = o.cache;
  const kv::Int8Granularity gran = kv::parse_granularity(r.str("int8-granularity"));
  c.group_size = r.integer("group-size", 1, 65536);
  c.residual = r.integer("residual", 0, model::kMaxContext);
  c.key_flush = kv::parse_key_flush(r.str("key-flush"));
  c.param_type = kv::parse_param_type(r.str("scale-dtype"));
  c.key_rope = kv::parse_key_rope(r.str("key-rope"));
  c.share_every = r.integer("kv-share", 1, 1 << 16);
  c.rotation_seed = static_cast<uint64_t>(r.integer64("kv-rotation-seed", 0, INT64_MAX));
  c.rotate = kv::parse_kv_rotate(r.str("kv-rotate"));
  apply_format_spec(r.str("kv-cache"), r.name("kv-cache"), c, gran);
  if (r.given("kv-cache-k") && !r.str("kv-cache-k").empty())
    c.k.format = kv::parse_format(r.str("kv-cache-k"), r.name("kv-cache-k").c_str());
  if (r.given("kv-cache-v") && !r.str("kv-cache-v").empty())
    c.v.format = kv::parse_format(r.str("kv-cache-v"), r.name("kv-cache-v").c_str());
  if (r.given("kv-cache-layers")) {
    c.layer_map = r.str("kv-cache-layers");  // checked against the model's layers
  }
  if (r.given("kv-share-map"))
    c.share_map = parse_share_map(r.str("kv-share-map"), r.name("kv-share-map"));

  o.forward.precision = attn::parse_precision(r.str("attn-precision"));
  o.forward.prefill = attn::parse_prefill_mode(r.str("prefill"));
  o.forward.window = r.integer("window", 0, model::kMaxContext);
  o.overflow = parse_context_overflow(r.str("context-overflow"));
  o.sinks = r.integer("sinks", 0, 512);
  o.sparse = parse_sparse(r);
  return o;
}

kv::CacheConfig cache_shape_for(const model::ModelConfig& c, const kv::CacheConfig& cache,
                                int ctx) {
  kv::CacheConfig cc = cache;
  cc.n_layers = c.n_layers;
  cc.n_kv_heads = c.n_kv_heads;
  cc.head_dim = c.head_dim();
  cc.ctx = ctx;
  cc.layer_window = c.layer_windows();
  if (!cc.layer_map.empty())
    cc.layer_formats = kv::parse_layer_formats(cc.layer_map, cc.n_layers, cc.k.granularity);
  cc.validate();
  return cc;
}

ContextChoice resolve_context(const model::Model& m, const SessionOptions& o) {
  const auto& c = m.config();
  if (o.ctx > c.ctx && !c.synthetic)
    fail("--ctx %d is larger than the model's context length %d", o.ctx, c.ctx);
  const uint64_t avail = sys::available_memory_bytes();
  // The mapped weights stay resident while the model runs; the rest is the session's.
  const uint64_t weights = m.weight_bytes();
  const uint64_t budget = avail == 0 ? UINT64_MAX : avail > weights ? avail - weights : 0;
  // Under context parallelism this process holds one shard of the positions.
  const int cp = o.cp ? o.cp->size() : 1;
  auto bytes = [&](int n) {
    const int held = cp > 1 ? (n + cp - 1) / cp : n;
    return session_bytes(c, o.cache, held, o.max_batch, o.sparse);
  };
  auto fits = [&](int n) { return bytes(n) <= budget; };
  auto need = [&](int n) { return sys::human_bytes(static_cast<double>(bytes(n))); };
  const std::string have = sys::human_bytes(static_cast<double>(budget));
  auto largest_fit = [&](int limit) {
    int fit = 0;  // the largest power of two that fits
    for (int n = 256; n < limit && fits(n); n *= 2) fit = n;
    return fit;
  };
  ContextChoice out;
  if (o.ctx > 0) {
    if (!fits(o.ctx)) {
      const int fit = largest_fit(o.ctx);
      fail(
          "a session of %d tokens needs %s (KV cache %s) but only %s of memory is available "
          "beside the weights; pass a smaller --ctx%s",
          o.ctx, need(o.ctx).c_str(), describe_cache(o.cache).c_str(), have.c_str(),
          fit > 0 ? strfmt(" (%d fits)", fit).c_str() : "");
    }
    out.ctx = o.ctx;
    return out;
  }
  if (c.synthetic) {
    // A synthetic model's context length is nominal (the real model's); a cache for all
    // of it (8 GiB in f32 for llama-3.2-1b's 131072) would only slow every run down.
    int n = std::min(c.ctx, kSyntheticDefaultCtx);
    while (n > 256 && !fits(n)) n /= 2;
    if (!fits(n)) {
      fail(
          "a session of %d tokens needs %s (KV cache %s) but only %s of memory is available beside "
          "the weights",
          n, need(n).c_str(), describe_cache(o.cache).c_str(), have.c_str());
    }
    if (n < c.ctx) {
      out.note = strfmt(
          "context of %d tokens (the synthetic model's nominal context is %d; --ctx N sets it)", n,
          c.ctx);
    }
    out.ctx = n;
    return out;
  }
  if (fits(c.ctx)) {
    out.ctx = c.ctx;
    return out;
  }
  const int fit = largest_fit(c.ctx);
  fail(
      "a session over the model's full context of %d tokens needs %s (KV cache %s) but only %s of "
      "memory is available beside the weights; pass --ctx N%s",
      c.ctx, need(c.ctx).c_str(), describe_cache(o.cache).c_str(), have.c_str(),
      fit > 0 ? strfmt(" (%d fits)", fit).c_str() : "");
}

std::string describe_cache(const kv::CacheConfig& c) {
  std::string s = c.mixed()              ? kv::describe_layer_formats(c)
                  : !c.layer_map.empty() ? "per layer: " + c.layer_map
                  : c.k == c.v           ? kv::describe(c.k)
                                         : "K " + kv::describe(c.k) + " / V " + kv::describe(c.v);
  if (c.has_residual()) {
    s += strfmt(" (G=%d, R=%d, %s flush, %s scales)", c.group_size, c.residual,
                kv::key_flush_name(c.key_flush), kv::param_type_name(c.param_type));
  } else if (c.any_stream(
                 [](const kv::StreamFormat& f, bool) { return f.format == kv::Format::kInt8; })) {
    s += strfmt(" (%s scales)", kv::param_type_name(c.param_type));
  }
  if (c.key_rope == kv::KeyRope::kPre) s += ", keys before RoPE";
  const bool rk = c.rotates(true), rv = c.rotates(false);
  if (rk || rv) s += rk && rv ? ", rotated" : rk ? ", keys rotated" : ", values rotated";
  const std::string sharing = kv::describe_sharing(c);
  if (!sharing.empty()) s += ", shared across " + sharing;
  return s;
}

}  // namespace kivi::runtime
