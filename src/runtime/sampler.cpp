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
}

Sampler::Sampler(const SamplerOptions& o, int vocab) : o_(o), rng_(o.seed) {
  check_sampler_options(o);
  cand_.resize(vocab);
  probs_.resize(vocab);
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

int Sampler::sample(const float* logits) {
  const int n = static_cast<int>(cand_.size());
  int first = 0;
  while (!allowed(first)) ++first;
  if (o_.temperature == 0.0f) {
    if (banned_.empty()) return argmax(logits, n);
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
  // Candidates by probability, ties by id; keep top-k, then the top-p nucleus.
  int keep = n;
  const bool truncate = (o_.top_k > 0 && o_.top_k < n) || o_.top_p < 1.0f;
  if (truncate) {
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
