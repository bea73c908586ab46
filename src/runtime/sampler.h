// Token sampling: greedy (temperature 0), temperature, top-k, top-p (nucleus, Holtzman
// et al. 2020) and min-p, with a seeded generator so the same seed gives the same text.
// Before choosing, the logits are adjusted in this order:
//   logit_bias        l[t] += bias[t] (OpenAI's, -100 to 100; -100 all but bans t);
//   repeat_penalty    llama.cpp's: a token among the last repeat_last_n tokens (prompt
//                     included) gets l / p when l > 0, else l * p;
//   presence_penalty, frequency_penalty   OpenAI's: l[t] -= presence * (c[t] > 0) +
//                     frequency * c[t], c[t] = times t was generated so far.
// Then: temperature, top-k, top-p, and min-p (keep the tokens whose probability is at
// least min_p times the most probable one's), on the tempered probabilities.
// A TokenFilter (a grammar) limits the choice to the tokens it allows, as if every other
// token were banned. The sampler asks it about the token it would pick first and builds
// the whole mask only when that token is refused: for greedy decoding the pick is then
// the masked argmax, and for sampling without top-k, top-p and min-p a second draw from
// the masked distribution after a refused first draw gives exactly the masked
// distribution (p(t) + (1 - Z) p(t) / Z = p(t) / Z, Z the allowed mass).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/rng.h"

namespace kivi::runtime {

struct SamplerOptions {
  float temperature = 0.0f;  // 0 = greedy
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  uint64_t seed = 0;
  float min_p = 0.0f;           // 0 = off
  float repeat_penalty = 1.0f;  // 1 = off
  int repeat_last_n = 64;       // tokens the repeat penalty looks back over; -1 = all
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::vector<std::pair<int, float>> logit_bias;  // (token, bias)
  bool adjusts() const {
    return repeat_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f ||
           !logit_bias.empty();
  }
};

// Throws kivi::Error for a temperature outside [0, 100], a negative top-k, a top-p
// outside (0, 1], a min-p outside [0, 1], penalties outside their ranges (repeat: (0, 10],
// presence and frequency: [-2, 2], repeat_last_n >= -1) or a bias outside [-100, 100], in
// the words of the CLI's range errors.
void check_sampler_options(const SamplerOptions& o);

class TokenFilter {
 public:
  virtual ~TokenFilter() = default;
  virtual bool allows(int token) = 0;
  // allowed[t] for the whole vocabulary (1 = allowed); valid until the next call.
  virtual const std::vector<char>& mask() = 0;
};

class Sampler {
 public:
  // Throws kivi::Error for a logit_bias token outside the vocabulary.
  explicit Sampler(const SamplerOptions& o, int vocab);
  // Picks a token from logits[vocab] (not modified); with a filter, one it allows, or -1
  // when it allows none that is not banned.
  int sample(const float* logits, TokenFilter* filter = nullptr);
  // The prompt's tokens, for the repeat penalty's window (before the first sample).
  void observe_prompt(const std::vector<int>& tokens);
  // Records a generated token (for the penalties).
  void accept(int token);
  // Tokens never picked (as a logit of -inf): `ignore_eos` bans the end tokens, as
  // llama.cpp does. At least one token must stay allowed.
  void ban(const std::vector<int>& tokens);
  // The generator's state, for saving a sampled conversation and resuming it exactly.
  const Rng& rng() const { return rng_; }
  void set_rng(const Rng& r) { rng_ = r; }

 private:
  bool allowed(int t) const {
    return (banned_.empty() || !banned_[t]) && (mask_ == nullptr || (*mask_)[t]);
  }
  bool truncates() const;
  int choose(const float* logits);
  SamplerOptions o_;
  const std::vector<char>* mask_ = nullptr;  // a filter's mask, during a filtered choice
  std::vector<char> banned_;                 // [vocab] when any token is banned
  Rng rng_;
  std::vector<std::pair<float, int>> cand_;  // allocated once
  std::vector<float> probs_;
  std::vector<float> adjusted_;             // [vocab] the adjusted logits, when any adjust
  std::vector<int> recent_;                 // the repeat penalty's window, oldest first
  std::vector<int> seen_;                   // the window's distinct tokens (scratch)
  std::unordered_map<int, int> generated_;  // times each token was generated
};

// argmax with ties to the lowest id.
int argmax(const float* x, int n);

}  // namespace kivi::runtime
