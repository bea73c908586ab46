// A session: one sequence being generated or scored with one model. It owns the KV
// cache, the activations and the worker threads, all allocated here; the per-token
// path allocates nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "core/threadpool.h"
#include "kv/kv_cache.h"
#include "model/forward.h"
#include "model/model.h"
#include "sparse/sparse_attention.h"

namespace kivi::runtime {

// What happens when the cache is full:
//   stop:   an error (the default): the context length is a hard limit;
//   shift:  the oldest half of the tokens after the sink blocks are dropped and the
//           rest renumbered (llama.cpp's context shift), then generation goes on;
//   window: StreamingLLM (Xiao et al. 2023): the sink tokens and the most recent
//           `window` tokens are kept and attended, older blocks are recycled, so memory
//           stays at the context length however long generation runs.
// Dropping takes whole storage blocks, without copying: the block table skips them.
// Keys stored before RoPE are rotated by their cache positions in attention, so a
// drop only renumbers them. Keys stored after RoPE keep their rotation: in a window
// they stay at their absolute positions (and new tokens continue from there); a shift
// re-rotates them, which only f32 and f16 keys allow.
enum class ContextOverflow : uint8_t { kStop = 0, kShift = 1, kWindow = 2 };
ContextOverflow parse_context_overflow(const std::string& s);
const char* context_overflow_name(ContextOverflow o);

struct SessionOptions {
  int ctx = 0;            // tokens; 0 = the model's context
  int threads = 0;        // 0 = all hardware threads
  int max_batch = 64;     // prefill chunk
  kv::CacheConfig cache;  // formats, G, R, ...; shape fields are filled from the model
  ContextOverflow overflow = ContextOverflow::kStop;
  int sinks = 4;  // shift and window: tokens at the start that are always kept
  model::ForwardOptions forward;
  sparse::Options sparse;  // block-sparse decode attention (off by default)
  ThreadPool* pool =
      nullptr;  // shared worker threads (sessions run one at a time); null = own pool of `threads`
  // Context parallelism (model/context_parallel.h): this rank's group; the cache then
  // holds ctx / size positions (null or one rank: the whole context).
  model::CpComm* cp = nullptr;
  // Tokens the cache can be cut back by (speculative decoding drops rejected drafts:
  // truncate()); KIVI's residual rings keep that many more rows. Needs the stop policy,
  // no block selection, no sliding-window layers and one process.
  int rewind = 0;
};

// Bytes a session allocates for `ctx` tokens: the KV cache reservation, the activations
// of a prefill chunk of `max_batch` tokens, the RoPE table and the logits (the attention
// workspace is small beside them). For memory checks before creating one.
// With sparse attention the block summaries are counted too.
uint64_t session_bytes(const model::ModelConfig& c, const kv::CacheConfig& cache, int ctx,
                       int max_batch = 64, const sparse::Options& sparse = {});

class Session {
 public:
  Session(const model::Model& m, const SessionOptions& opt);
  // The context a session of these options has: --ctx, or the model's.
  static int context_for(const model::Model& m, const SessionOptions& opt) {
    return opt.ctx > 0 ? opt.ctx : m.config().ctx;
  }

  const model::Model& model() const { return m_; }
  kv::KvCache& cache() { return *cache_; }
  const kv::KvCache& cache() const { return *cache_; }
  // Block-sparse attention (its summaries and statistics), or null when off.
  sparse::SparseAttention* sparse() { return sparse_.get(); }
  const sparse::SparseAttention* sparse() const { return sparse_.get(); }
  // Bytes of the cache and of the block summaries beside it: used and allocated.
  uint64_t kv_bytes_used() const;
  uint64_t kv_bytes_reserved() const;
  ThreadPool& pool() { return *pool_; }
  int ctx() const { return ctx_; }
  // Tokens fed (evicted ones included; over every shard under context parallelism).
  int pos() const {
    return opt_.forward.cp.comm ? static_cast<int>(st_->cp_pos) : cache_->position(0);
  }
  int vocab() const { return m_.config().vocab_size; }
  const SessionOptions& options() const { return opt_; }

  // Shows every token's attention in every layer to `o` (null: nobody) from the next
  // call on (model/forward.h); the observer must outlive its use.
  void set_attention_observer(model::AttentionObserver* o) { opt_.forward.observer = o; }

  // Feeds tokens (batched in chunks of max_batch) and returns the logits of the last
  // one. If all_logits is non-null it receives [n, vocab].
  const float* prefill(const std::vector<int>& tokens, float* all_logits = nullptr);
  // An embedding of `tokens`: the final hidden states (after the output norm) pooled by
  // their mean or the last token's, scaled to unit length. Runs from an empty cache and
  // leaves it empty; throws kivi::Error for no tokens or more than the context.
  enum class Pooling { kMean, kLast };
  std::vector<float> embed(const std::vector<int>& tokens, Pooling pooling);
  // Feeds one token and returns its logits [vocab].
  const float* decode(int token);
  // Feeds tokens with the logits of every position ([n, vocab] into all_logits), each
  // equal bit for bit to what decoding the tokens one by one gives (the stream attention
  // path): speculative decoding's verification.
  const float* verify(const std::vector<int>& tokens, float* all_logits);
  // Cuts the cache back to its first n tokens, the state feeding only them leaves, bit
  // for bit: pos() - n at most SessionOptions::rewind. Throws kivi::Error otherwise.
  void truncate(int n);
  // Empties the cache.
  void reset();
  // Tokens dropped from the cache so far (shift and window policies), the number of
  // times room was made, and the seconds that took.
  int64_t dropped() const { return dropped_; }
  int overflows() const { return overflows_; }
  double overflow_seconds() const { return overflow_seconds_; }
  // The attention window of the window policy (tokens), else 0.
  // The RoPE position of cache position 0 (window policy: positions dropped so far).
  int64_t position_offset() const;
  // Sets the counters above and the position offset, as a saved session had them
  // (runtime/session_file.h).
  void restore_counters(int64_t position_offset, int64_t dropped, int overflows);
  // Context parallelism: this rank's shard (null in one process), and the position a
  // loaded shard's context continues from.
  const model::CpShard* cp_shard() const {
    return opt_.forward.cp.comm ? &opt_.forward.cp : nullptr;
  }
  void restore_cp_position(int64_t positions);
  int window() const { return opt_.overflow == ContextOverflow::kWindow ? opt_.forward.window : 0; }

 private:
  const model::Model& m_;
  SessionOptions opt_;
  int ctx_;
  std::unique_ptr<ThreadPool> own_pool_;
  ThreadPool* pool_ = nullptr;
  std::unique_ptr<kv::KvCache> cache_;
  std::unique_ptr<sparse::SparseAttention> sparse_;
  std::unique_ptr<model::ForwardState> st_;
  AlignedBuffer<float> logits_;  // [max_batch, vocab] when scoring chunks, else [vocab]
  int sink_keep_ = 0;            // tokens kept at the start: the sinks rounded up to whole blocks
  int64_t dropped_ = 0;
  int overflows_ = 0;
  double overflow_seconds_ = 0.0;
  // Drops tokens after the sink blocks so that the next one fits (shift and window).
  void make_room();
};

}  // namespace kivi::runtime
