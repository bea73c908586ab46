// Perplexity and KL divergence measured exactly as deployed.
//
// Scoring convention: the text is tokenized once (dummy-prefix space at its start, no
// BOS) and split into consecutive chunks of ctx - 1 tokens. Each chunk starts from an
// empty cache and is fed as [BOS] + chunk; every chunk token is scored by the
// log-probability the model gave it after the tokens before it in the chunk. So all
// text tokens are scored once, each with between 0 and ctx - 2 tokens of context.
//   streaming: tokens are fed one at a time through the cache, as generation does;
//   batched:   each chunk is prefilled at once (the same cache updates, batched matmuls).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/session.h"

namespace kivi::io {
class AtomicFile;
}

namespace kivi::runtime {

enum class EvalMode : uint8_t { kStreaming = 0, kBatched = 1 };
EvalMode parse_eval_mode(const std::string& s);
const char* eval_mode_name(EvalMode m);

struct PerplexityResult {
  double ppl = 0, mean_nll = 0, nll_stderr = 0;
  int64_t tokens = 0;  // scored tokens
  int chunks = 0;
  std::vector<float> nll;  // per scored token
};

// Called for every scored token with its index and the log-softmax [vocab] it was
// scored with (for saving and comparing distributions).
using LogprobSink = std::function<void(int64_t index, int token, const float* logprobs)>;

// Scores `tokens` (the tokenized text, without BOS) with the session's model and
// cache. Throws if there are fewer than 2 tokens. `progress(done, total)` is optional.
// prompt > 0 (streaming): each chunk's first `prompt` inputs are one prefill, as a
// prompt before generation, and the others stream one at a time.
PerplexityResult evaluate_perplexity(Session& s, const std::vector<int>& tokens, EvalMode mode,
                                     const LogprobSink& sink = {},
                                     const std::function<void(int64_t, int64_t)>& progress = {},
                                     int prompt = 0);

// log-softmax of logits[n] into out[n], in double internally.
void log_softmax(const float* logits, float* out, int n);

// FNV-1a 64-bit hash of token ids (identifies a text's tokenization).
uint64_t hash_tokens(const std::vector<int>& tokens);

// Identifies a model for --kld-base: FNV-1a over its shape (layers, dim, FFN, heads,
// KV heads, vocabulary, context length, ALiBi or not) and the f32 values of its first
// attention norm and its output norm, which every conversion (llama2.c, GGUF f32 or f16)
// keeps as they are.
uint64_t model_fingerprint(const model::Model& m);

// A file of log-probabilities, for comparing runs (--save-logits / --kld-base):
//   header (little-endian): char magic[8] = "KIVILP2\0", u32 vocab, u32 ctx,
//                           u64 n_tokens (scored), u64 token_hash (hash_tokens of the text),
//                           u64 model (model_fingerprint)
//   body: for each scored token: u32 token id, then f32 log-probabilities [vocab]
// The writer goes through a temporary file renamed into place by close().
class LogprobWriter {
 public:
  LogprobWriter(const std::string& path, int vocab, int ctx, int64_t n_tokens, uint64_t token_hash,
                uint64_t model);
  ~LogprobWriter();  // without close(), the temporary file is removed
  void write(int token, const float* logprobs);
  void close();

 private:
  std::unique_ptr<io::AtomicFile> file_;
  int vocab_;
};

class LogprobReader {
 public:
  // Throws naming what differs if the file was written for another model or vocabulary,
  // another context length, or another text (token count or hash).
  LogprobReader(const std::string& path, int vocab, int ctx, int64_t n_tokens, uint64_t token_hash,
                uint64_t model);
  ~LogprobReader();
  // Reads the next record; returns its token id.
  int read(float* logprobs);

 private:
  std::string path_;
  void* f_ = nullptr;
  int vocab_;
};

// KL divergence statistics of a run against a saved base.
struct KldStats {
  double mean = 0, median = 0, p99 = 0, max = 0;
  double top1_agree = 0;        // percent of tokens whose argmax matches the base
  int64_t first_disagree = -1;  // index of the first scored token whose argmax differs
  int64_t tokens = 0;
};
// KL(P_base || P_run) per token from log-probabilities.
double kl_divergence(const float* base_logprobs, const float* logprobs, int n);
KldStats summarize_kld(const std::vector<double>& kld, const std::vector<char>& agree);

}  // namespace kivi::runtime
