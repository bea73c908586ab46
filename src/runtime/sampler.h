// Token sampling: greedy (temperature 0), temperature, top-k and top-p (nucleus,
// Holtzman et al. 2020), with a seeded generator so the same seed gives the same text.
#pragma once

#include <cstdint>
#include <vector>

#include "core/rng.h"

namespace kivi::runtime {

struct SamplerOptions {
  float temperature = 0.0f;  // 0 = greedy
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  uint64_t seed = 0;
};

// Throws kivi::Error for a temperature outside [0, 100], a negative top-k or a top-p
// outside (0, 1], in the words of the CLI's range errors.
void check_sampler_options(const SamplerOptions& o);

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& o, int vocab);
  // Picks a token from logits[vocab] (not modified).
  int sample(const float* logits);
  // Tokens never picked (as a logit of -inf): `ignore_eos` bans the end tokens, as
  // llama.cpp does. At least one token must stay allowed.
  void ban(const std::vector<int>& tokens);
  // The generator's state, for saving a sampled conversation and resuming it exactly.
  const Rng& rng() const { return rng_; }
  void set_rng(const Rng& r) { rng_ = r; }

 private:
  bool allowed(int t) const { return banned_.empty() || !banned_[t]; }
  SamplerOptions o_;
  std::vector<char> banned_;  // [vocab] when any token is banned
  Rng rng_;
  std::vector<std::pair<float, int>> cand_;  // allocated once
  std::vector<float> probs_;
};

// argmax with ties to the lowest id.
int argmax(const float* x, int n);

}  // namespace kivi::runtime
