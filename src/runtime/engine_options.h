// The options that turn a model into a running session, declared once: the CLI's flags,
// the server's settings, the Python keywords and eval all read them from this table and
// parse them with one parser, so every front end takes the same names, defaults, ranges
// and error messages.
//
// A front end collects what the user gave as name=value pairs (names as the table spells
// them: "kv-cache-k"; Python's kv_cache_k is the same name with underscores) and calls
// parse_session_options(); what was not given takes the table's default.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/generation.h"
#include "runtime/session.h"

namespace kivi::runtime {

struct OptionSpec {
  const char* name;     // long name, e.g. "kv-cache-k"
  char short_name;      // 0 = none
  const char* metavar;  // "" for a flag
  const char* help;
  const char* def;      // shown in help and used when absent; "" = none
  const char* section;  // "Model", "KV cache", "Sparse attention", "Generation"
  // The Python keyword when it is not the name with underscores (temperature for temp).
  const char* keyword = nullptr;
  bool is_flag() const { return metavar[0] == '\0'; }
  // Whether the value is an integer (its default is one; the context has none).
  bool takes_integer() const;
};

// Every session option: threads, context, KV cache formats and policies, attention
// precision and windows, context overflow, block-sparse attention.
const std::vector<OptionSpec>& session_option_specs();
// The spec named `name`, or null.
const OptionSpec* find_session_option(const std::string& name);

// The generation options: max-tokens (-n), temp, top-k, top-p, seed, ignore-eos.
const std::vector<OptionSpec>& generation_option_specs();
const OptionSpec* find_generation_option(const std::string& name);

// How errors spell an option: "--kv-cache-k" (command line) or "kv_cache_k" (keywords).
enum class OptionSpelling { kFlag, kKeyword };
std::string spell_option(const std::string& name, OptionSpelling s);

// name -> value as given; a flag given is "1" (or "true"/"false" from keywords).
using OptionValues = std::map<std::string, std::string>;

// Parses and validates the given session options; an unknown name is an error that
// suggests the closest known one. ctx stays 0 when not given (see resolve_context()).
SessionOptions parse_session_options(const OptionValues& given,
                                     OptionSpelling spelling = OptionSpelling::kFlag);

// "ID:BIAS,ID:BIAS" (token ids and logit biases) as pairs; kivi::Error naming a bad item.
std::vector<std::pair<int, float>> parse_logit_bias(const std::string& text);
// Parses and validates the given generation options (the sampler's ranges; seed -1 picks
// a random seed); stop strings and end tokens are the caller's to add.
GenerationOptions parse_generation_options(const OptionValues& given,
                                           OptionSpelling spelling = OptionSpelling::kFlag);

// The names of the session options that set up a KV cache (formats, policies, sparse
// attention): a front end without a cache refuses them.
std::vector<std::string> kv_option_names();

// The cache configuration shaped for a model and a context: layers, KV heads, head
// dimension, per-layer windows. Validated.
kv::CacheConfig cache_shape_for(const model::ModelConfig& c, const kv::CacheConfig& cache, int ctx);

// The context a session gets, checked against memory. With o.ctx > 0: that context, or
// an error when it exceeds the model's (real models) or when the session would not fit
// in the memory available beside the weights. With o.ctx == 0, for a real model its own
// context (or an error saying how much fits); for a synthetic model (speed tests)
// min(its nominal context, kSyntheticDefaultCtx), halved until it fits, and `note` says
// so when shorter than the nominal one.
inline constexpr int kSyntheticDefaultCtx = 4096;
struct ContextChoice {
  int ctx = 0;
  std::string note;
};
ContextChoice resolve_context(const model::Model& m, const SessionOptions& o);

// "kivi2 (G=32, R=128, batch flush, f16 scales)": a one-line description of a cache.
std::string describe_cache(const kv::CacheConfig& c);

}  // namespace kivi::runtime
