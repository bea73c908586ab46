#include "runtime/request.h"

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

RequestHandle::RequestHandle(int prompt_tokens) { state_.prompt_tokens = prompt_tokens; }

RequestHandle::Update RequestHandle::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return changed_; });
  changed_ = false;
  Update u = state_;
  state_.text.clear();
  state_.tokens.clear();
  return u;
}

void RequestHandle::admitted(int shared_prompt_tokens) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    state_.admitted = true;
    state_.shared_prompt_tokens = shared_prompt_tokens;
    changed_ = true;
  }
  cv_.notify_all();
}

void RequestHandle::push(const std::string& text, int token, int completion_tokens) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    state_.text += text;
    if (token >= 0) state_.tokens.push_back(token);
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
  return o;
}

}  // namespace kivi::runtime
