#include "runtime/request.h"

#include <algorithm>
#include <cmath>

namespace kivi::runtime {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
    case FinishReason::kNone:
      break;
  }
  return "";
}

TokenLogprob token_logprob(const float* logits, int vocab, int token, int top_k) {
  float mx = logits[0];
  for (int i = 1; i < vocab; ++i) mx = std::max(mx, logits[i]);
  double z = 0.0;
  for (int i = 0; i < vocab; ++i) z += std::exp(static_cast<double>(logits[i]) - mx);
  const double log_z = mx + std::log(z);
  TokenLogprob r;
  r.token = token;
  r.logprob = static_cast<float>(logits[token] - log_z);
  // The top k by insertion into a list of at most k (k <= 20 from the server): one pass
  // over the logits, no allocation beyond the result.
  const int k = std::clamp(top_k, 0, vocab);
  r.top.reserve(static_cast<size_t>(k));
  for (int i = 0; i < vocab && k > 0; ++i) {
    const float x = logits[i];
    if (static_cast<int>(r.top.size()) == k && x <= logits[r.top.back().first]) continue;
    if (static_cast<int>(r.top.size()) == k) r.top.pop_back();
    auto at = r.top.end();
    while (at != r.top.begin() && logits[(at - 1)->first] < x) --at;  // ties: the lower id first
    r.top.insert(at, {i, x});
  }
  for (auto& [id, v] : r.top) v = static_cast<float>(logits[id] - log_z);
  return r;
}

RequestHandle::RequestHandle(int prompt_tokens) { state_.prompt_tokens = prompt_tokens; }

RequestHandle::Update RequestHandle::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return changed_; });
  changed_ = false;
  Update u = state_;
  state_.text.clear();
  state_.tokens.clear();
  state_.logprobs.clear();
  return u;
}

void RequestHandle::admitted(int shared_prompt_tokens, int cached_prompt_tokens) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    state_.admitted = true;
    state_.shared_prompt_tokens = shared_prompt_tokens;
    state_.cached_prompt_tokens = cached_prompt_tokens;
    changed_ = true;
  }
  cv_.notify_all();
}

void RequestHandle::push(const std::string& text, int token, int completion_tokens,
                         const TokenLogprob* lp) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    state_.text += text;
    if (token >= 0) state_.tokens.push_back(token);
    if (token >= 0 && lp) state_.logprobs.push_back(*lp);
    state_.completion_tokens = completion_tokens;
    changed_ = true;
  }
  cv_.notify_all();
}

void RequestHandle::finish(FinishReason r, int completion_tokens, const std::string& error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_.finished) return;
    state_.finished = true;
    state_.reason = r;
    state_.completion_tokens = completion_tokens;
    state_.error = error;
    changed_ = true;
  }
  cv_.notify_all();
}

bool RequestHandle::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.finished;
}

GenerationOptions GenerationRequest::options() const {
  GenerationOptions o;
  o.max_tokens = max_tokens;
  o.sampler = sampling;
  o.ignore_eos = ignore_eos;
  o.stop = stop;
  o.end_tokens = end_tokens;
  o.grammar = grammar;
  o.trigger = grammar_trigger;
  o.grammar_markup = grammar_markup;
  return o;
}

}  // namespace kivi::runtime
