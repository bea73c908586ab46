#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace kivi::runtime {

int argmax(const float* x, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

void check_sampler_options(const SamplerOptions& o) {
  if (!(o.temperature >= 0.0f) || o.temperature > 100.0f) {
    fail("--temp = %g is out of range (valid: 0 to 100)", o.temperature);
  }
  if (o.top_k < 0) fail("--top-k = %d is out of range (valid: 0 or more)", o.top_k);
  if (!(o.top_p > 0.0f && o.top_p <= 1.0f))
    fail("--top-p = %g is out of range (valid: greater than 0, up to 1)", o.top_p);
  if (!(o.min_p >= 0.0f && o.min_p <= 1.0f))
    fail("--min-p = %g is out of range (valid: 0 to 1)", o.min_p);
  if (!(o.repeat_penalty > 0.0f && o.repeat_penalty <= 10.0f))
    fail("--repeat-penalty = %g is out of range (valid: above 0, up to 10)", o.repeat_penalty);
  if (o.repeat_last_n < -1)
    fail("--repeat-last-n = %d is out of range (valid: -1 for all, 0 or more)", o.repeat_last_n);
  if (!(o.presence_penalty >= -2.0f && o.presence_penalty <= 2.0f))
    fail("--presence-penalty = %g is out of range (valid: -2 to 2)", o.presence_penalty);
  if (!(o.frequency_penalty >= -2.0f && o.frequency_penalty <= 2.0f))
    fail("--frequency-penalty = %g is out of range (valid: -2 to 2)", o.frequency_penalty);
  for (const auto& [t, b] : o.logit_bias) {
    if (!(b >= -100.0f && b <= 100.0f))
      fail("--logit-bias: bias %g of token %d is out of range (valid: -100 to 100)", b, t);
  }
}

Sampler::Sampler(const SamplerOptions& o, int vocab) : o_(o), rng_(o.seed) {
  check_sampler_options(o);
  for (const auto& [t, b] : o.logit_bias) {
    if (t < 0 || t >= vocab)
      fail("--logit-bias: token id %d is outside the vocabulary (0 to %d)", t, vocab - 1);
  }
  cand_.resize(vocab);
  probs_.resize(vocab);
  if (o.adjusts()) adjusted_.resize(vocab);
}

void Sampler::observe_prompt(const std::vector<int>& tokens) {
  if (o_.repeat_penalty == 1.0f || o_.repeat_last_n == 0) return;
  const size_t keep =
      o_.repeat_last_n < 0 ? tokens.size() : std::min(tokens.size(), size_t(o_.repeat_last_n));
  recent_.assign(tokens.end() - static_cast<ptrdiff_t>(keep), tokens.end());
}

void Sampler::accept(int token) {
  if (!o_.adjusts()) return;
  if (o_.presence_penalty != 0.0f || o_.frequency_penalty != 0.0f) ++generated_[token];
  if (o_.repeat_penalty != 1.0f && o_.repeat_last_n != 0) {
    recent_.push_back(token);
    if (o_.repeat_last_n > 0 && recent_.size() > static_cast<size_t>(o_.repeat_last_n))
      recent_.erase(recent_.begin());
  }
}

void Sampler::ban(const std::vector<int>& tokens) {
  const int n = static_cast<int>(cand_.size());
  banned_.assign(n, 0);
  int left = n;
  for (int t : tokens) {
    if (t >= 0 && t < n && !banned_[t]) {
      banned_[t] = 1;
      --left;
    }
  }
  if (left == 0) fail("every token of the vocabulary is banned; nothing can be sampled");
}

bool Sampler::truncates() const {
  const int n = static_cast<int>(cand_.size());
  return (o_.top_k > 0 && o_.top_k < n) || o_.top_p < 1.0f || o_.min_p > 0.0f;
}

int Sampler::sample(const float* logits, TokenFilter* filter) {
  if (filter == nullptr) return choose(logits);
  if (o_.temperature == 0.0f || !truncates()) {
    const int t = choose(logits);
    if (filter->allows(t)) return t;
  }
  const std::vector<char>& mask = filter->mask();
  bool any = false;
  for (size_t t = 0; t < mask.size() && !any; ++t) {
    any = mask[t] && (banned_.empty() || !banned_[t]);
  }
  if (!any) return -1;
  mask_ = &mask;
  const int t = choose(logits);
  mask_ = nullptr;
  return t;
}

int Sampler::choose(const float* logits) {
  const int n = static_cast<int>(cand_.size());
  if (!adjusted_.empty()) {
    std::copy(logits, logits + n, adjusted_.begin());
    float* l = adjusted_.data();
    for (const auto& [t, b] : o_.logit_bias) l[t] += b;
    if (o_.repeat_penalty != 1.0f) {
      // Each token of the window once, however often it occurs (as llama.cpp).
      seen_.assign(recent_.begin(), recent_.end());  // no allocation once grown
      std::sort(seen_.begin(), seen_.end());
      seen_.erase(std::unique(seen_.begin(), seen_.end()), seen_.end());
      for (int t : seen_) {
        if (t < 0 || t >= n) continue;
        l[t] = l[t] > 0.0f ? l[t] / o_.repeat_penalty : l[t] * o_.repeat_penalty;
      }
    }
    for (const auto& [t, c] : generated_) {
      if (t >= 0 && t < n)
        l[t] -= o_.presence_penalty + o_.frequency_penalty * static_cast<float>(c);
    }
    logits = l;
  }
  int first = 0;
  while (!allowed(first)) ++first;
  if (o_.temperature == 0.0f) {
    if (banned_.empty() && mask_ == nullptr) return argmax(logits, n);
    int best = first;
    for (int i = first + 1; i < n; ++i) {
      if (allowed(i) && logits[i] > logits[best]) best = i;
    }
    return best;
  }
  // Softmax with temperature.
  float mx = logits[first];
  for (int i = first + 1; i < n; ++i) {
    if (allowed(i)) mx = std::max(mx, logits[i]);
  }
  double sum = 0.0;
  for (int i = 0; i < n; ++i) {
    const float p = allowed(i) ? std::exp((logits[i] - mx) / o_.temperature) : 0.0f;
    cand_[i] = {p, i};
    sum += p;
  }
  // Candidates by probability, ties by id; keep top-k, then the top-p nucleus, then the
  // tokens of at least min_p times the top probability.
  int keep = n;
  if (truncates()) {
    auto by_prob = [](const std::pair<float, int>& a, const std::pair<float, int>& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    };
    if (o_.top_k > 0 && o_.top_k < n) {
      keep = o_.top_k;
      std::partial_sort(cand_.begin(), cand_.begin() + keep, cand_.end(), by_prob);
    } else {
      std::sort(cand_.begin(), cand_.end(), by_prob);
    }
    double kept = 0.0;
    for (int i = 0; i < keep; ++i) kept += cand_[i].first;
    if (o_.top_p < 1.0f) {
      double cum = 0.0;
      for (int i = 0; i < keep; ++i) {
        cum += cand_[i].first;
        if (cum >= o_.top_p * kept) {
          keep = i + 1;
          break;
        }
      }
    }
    if (o_.min_p > 0.0f) {
      const float floor = o_.min_p * cand_[0].first;
      int k = 1;
      while (k < keep && cand_[k].first >= floor) ++k;
      keep = k;
    }
    sum = 0.0;
    for (int i = 0; i < keep; ++i) sum += cand_[i].first;
  }
  const double r = static_cast<double>(rng_.uniform()) * sum;
  double cum = 0.0;
  for (int i = 0; i < keep; ++i) {
    cum += cand_[i].first;
    if (r < cum) return cand_[i].second;
  }
  // Rounding left r at the end: the last candidate with any probability.
  for (int i = keep - 1; i > 0; --i) {
    if (cand_[i].first > 0.0f) return cand_[i].second;
  }
  return cand_[0].second;
}

}  // namespace kivi::runtime
