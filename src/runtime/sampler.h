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

 private:
  SamplerOptions o_;
  Rng rng_;
  std::vector<std::pair<float, int>> cand_;  // allocated once
  std::vector<float> probs_;
};

// argmax with ties to the lowest id.
int argmax(const float* x, int n);

}  // namespace kivi::runtime
