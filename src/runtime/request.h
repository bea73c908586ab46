// A generation request as the scheduler sees it, and the handle through which the
// client that made it follows it: text as it is released, the end and its reason,
// token counts. The scheduler's thread writes; the client's thread waits and reads,
// or cancels (a client that went away), which frees the sequence at the next step.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/generation.h"
#include "runtime/sampler.h"

namespace kivi::runtime {

// A generated token's log-probability under the model (log-softmax of its logits, before
// sampling's penalties, bias and temperature), with the `top` most likely tokens.
struct TokenLogprob {
  int token = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int, float>> top;  // (token, logprob), most likely first
};

// The log-probability of `token` and the top_k most likely of logits[vocab] (ties to the
// lower id), in double for the normalizer.
TokenLogprob token_logprob(const float* logits, int vocab, int token, int top_k);

struct GenerationRequest {
  std::vector<int> prompt;  // token ids, BOS included where the model wants one
  int max_tokens = 16;      // generated tokens at most (the end marker not counted)
  SamplerOptions sampling;
  std::vector<std::string> stop;  // stop strings
  std::vector<int> end_tokens;    // tokens that end the reply besides EOS/BOS (a chat format's)
  bool ignore_eos = false;        // never sample an end token (load tests, benchmarks)
  int logprobs = -1;              // >= 0: each token's log-probability and that many alternatives
  std::shared_ptr<const grammar::Grammar> grammar;  // structured output: the reply's grammar
  GrammarTrigger grammar_trigger;  // where the grammar starts (tool calls); empty: at once
  bool grammar_markup = false;     // the grammar writes markup tokens (harmony's tool calls)
  // The same, as the generation options every front end uses (runtime/generation.h).
  GenerationOptions options() const;
};

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

class RequestHandle {
 public:
  struct Update {
    std::string text;         // released since the last wait()
    std::vector<int> tokens;  // generated since the last wait() (text may lag behind them)
    std::vector<TokenLogprob> logprobs;  // of those tokens, when the request asked
    bool admitted = false;
    bool finished = false;
    FinishReason reason = FinishReason::kNone;
    int prompt_tokens = 0;
    int completion_tokens = 0;
    int shared_prompt_tokens = 0;  // prompt tokens whose storage is shared with other sequences
    int cached_prompt_tokens = 0;  // prompt tokens taken from the prefix cache, not prefilled
    std::string error;
  };

  explicit RequestHandle(int prompt_tokens);

  // Waits until something new happens or `timeout` passes, and takes what is new.
  Update wait(std::chrono::milliseconds timeout);
  // The client is gone: the scheduler drops the request (queued) or frees its sequence.
  void cancel() { cancelled_.store(true, std::memory_order_release); }
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

  // Scheduler side.
  void admitted(int shared_prompt_tokens, int cached_prompt_tokens = 0);
  // New text (possibly empty) and, if token >= 0, the token just generated.
  // `lp`: its log-probability, when the request asked.
  void push(const std::string& text, int token, int completion_tokens,
            const TokenLogprob* lp = nullptr);
  void finish(FinishReason r, int completion_tokens, const std::string& error = "");
  bool finished() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool changed_ = false;
  Update state_;  // text accumulates here until taken
  std::atomic<bool> cancelled_{false};
};

}  // namespace kivi::runtime
