// Continuous batching: many requests share one model, one worker pool and one KV block
// pool. A thread of its own runs steps; each step advances every admitted sequence by
// one token (decoding) or by a chunk of its prompt (prefilling, at most
// `prefill_chunk` prompt tokens per step over all sequences), in one batched forward
// pass (model/forward_batch.h). Sequences join and leave between steps.
//
// Blocks on demand: a request leaves the queue (first come, first served) when a
// sequence slot is free and the pool can reserve blocks for its prompt and first token
// (less the blocks of a published identical prefix, which it maps instead); a decoding
// sequence reserves the block its next token needs before each step, so memory follows
// what sequences hold, not what they may ask for. When the pool runs dry, kept
// sequences are evicted first; then the newest active sequence is preempted: its blocks
// go back to the pool and it returns to the head of the queue with its sampler, its
// stop rule and its tokens so far, to be prefilled again (prompt and generated tokens)
// when memory frees up. The oldest sequence always grows, and every request alone fits
// the pool (submit() refuses the rest), so no admitted request fails for lack of
// memory. With --prefill stream the recomputed cache is the one decoding built, bit for
// bit, and a preempted sequence gives the tokens it gives alone. The queue is bounded;
// a full queue refuses new requests.
//
// A sequence ends at an end-of-text token (EOS, BOS, or a chat format's end marker), a
// stop string, max_tokens, or when its client cancels; its reservation goes back to the
// pool at once, and its blocks too unless the prefix cache keeps them.
//
// Prefix cache (SchedulerOptions::prefix_cache): a sequence that ends normally keeps
// its cache in its slot (every layer's blocks and the KIVI residual window: the exact
// state after its last token). A request whose prompt starts with all of a kept
// sequence's tokens takes that slot and prefills only the rest (a multi-turn chat
// resumes after its previous turn). One that shares a shorter prefix with it takes it
// cut back to that prefix (kv::KvCache::truncate; KIVI caches keep `rewind_tokens`
// more full-precision rows for this) when the prefix is at least half of what the slot
// holds or no slot is empty; otherwise it takes an empty slot, else the least recently
// used kept one. A request in a fresh slot also starts after the published
// blocks of an identical prompt prefix (a shared system prompt) when those blocks hold
// the whole state (formats without a residual window, kv::KvCache::resumes_at_blocks).
// Kept sequences are evicted, least recently used first, when admission needs their
// blocks. Either way the logits are those of a cold prefill of the whole prompt.
//
// Under tensor parallelism (SchedulerOptions::link) one leader schedules and every
// follower repeats its steps over its own shares of the weights and caches
// (runtime/step_link.h).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/aligned.h"
#include "core/error.h"
#include "core/threadpool.h"
#include "kv/block_pool.h"
#include "kv/kv_cache.h"
#include "model/forward_batch.h"
#include "model/model.h"
#include "runtime/histogram.h"
#include "runtime/request.h"
#include "runtime/generation.h"
#include "runtime/speculative.h"
#include "runtime/step_link.h"

namespace kivi::runtime {

struct SchedulerOptions {
  int parallel = 4;              // sequences decoded together (slots)
  int ctx = 0;                   // tokens per sequence (prompt + generated); required
  int queue = 64;                // requests waiting for a slot or for memory
  int prefill_chunk = 64;        // prompt tokens per step, over all prefilling sequences
  uint64_t kv_budget_bytes = 0;  // the pool plus every slot's residual rings and tables
  int64_t kv_budget_tokens = 0;  // or: the pool's size in tokens; both 0: parallel * ctx tokens
  kv::CacheConfig cache;         // formats, G, R, ...; the shape comes from the model
  model::ForwardOptions forward;
  int threads = 0;            // 0 = all hardware threads
  bool prefix_cache = false;  // keep ended sequences' caches for later prompts (see above)
  int rewind_tokens = 64;     // with prefix_cache: how far a kept KIVI cache can be cut back
  // Speculative decoding by prompt lookup (runtime/speculative.h): each decoding
  // sequence drafts up to `lookup` tokens (0 = off) from its own prompt and reply and
  // checks them in its row of the step; the tokens are those plain decoding gives.
  int lookup = 0;
  int lookup_ngram = 3;
  // Or drafts from a draft model (--draft-model): every slot drafts with a session of
  // its own like this one's (same model, cache format, draft length); not with lookup.
  std::shared_ptr<const DraftModel> draft;
  // Ranks that run every step together: the leader sends its records through the link,
  // followers repeat them. With a link the scheduler waits for start() (leader) or
  // follow() (follower), so that no record is sent before every rank has built its own.
  StepLink* link = nullptr;
};

// Blocks a budget buys, and the bytes every slot needs beside the pool.
struct PoolPlan {
  int blocks = 0;
  int block_tokens = 0;
  uint64_t block_bytes = 0;
  uint64_t slot_bytes = 0;  // one sequence's residual rings and block tables
};
PoolPlan plan_pool(const kv::CacheConfig& shaped, const SchedulerOptions& o);
// The cache configuration every sequence of a scheduler gets: the model's shape, no
// sliding-window eviction (blocks stay in the pool), and KIVI rings long enough to cut
// back what the prefix cache and speculation need.
kv::CacheConfig scheduler_cache_shape(const model::ModelConfig& m, const SchedulerOptions& o);

struct SchedulerStats {
  int parallel = 0, queue_capacity = 0, ctx = 0;
  int queued = 0, active = 0, prefilling = 0;
  int cancelling = 0;  // cancelled by their clients, not yet ended by the scheduler
  uint64_t submitted = 0, admitted = 0, completed = 0, cancelled = 0, rejected_queue_full = 0,
           errors = 0;
  uint64_t prompt_tokens = 0, generated_tokens = 0, steps = 0;
  // Sequences preempted when the pool ran dry, and the tokens prefilled again for them.
  uint64_t preemptions = 0, recomputed_tokens = 0;
  // Speculative decoding: verifications run, tokens drafted, drafts accepted.
  uint64_t spec_verifications = 0, spec_drafted = 0, spec_accepted = 0;
  double tokens_per_second = 0;  // generated, over the last 10 s
  int blocks_total = 0, blocks_used = 0, blocks_free = 0, blocks_reserved = 0, blocks_shared = 0;
  int blocks_published = 0, peak_blocks_used = 0, block_tokens = 0;
  uint64_t block_bytes = 0, slot_bytes = 0;
  int64_t tokens_held = 0;       // tokens in the caches of active sequences
  uint64_t bytes_allocated = 0;  // used blocks plus the rings of active sequences
  uint64_t peak_bytes_allocated = 0;
  double compression_vs_f16 = 0;  // f16 bytes of tokens_held / bytes_allocated
  // Prefix cache: admissions, those that skipped some prefill, the prompt tokens not
  // prefilled, the kept sequences evicted, and what the kept sequences hold now.
  uint64_t prefix_queries = 0, prefix_hits = 0, prefill_tokens_saved = 0, prefix_evictions = 0;
  int cached_sequences = 0, cached_blocks = 0;
  int64_t cached_tokens = 0;
  // Latencies (seconds) of requests, as vLLM exports them: submission to admission,
  // submission to the first generated token, the mean gap between later tokens, and
  // submission to the end (requests that end normally).
  Histogram queue_time, time_to_first_token, time_per_output_token, request_latency;
  std::string cache_format;  // e.g. "kivi2"
};

class Scheduler {
 public:
  Scheduler(const model::Model& m, const SchedulerOptions& o);
  ~Scheduler();  // finishes every request as cancelled and stops the thread
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  enum class Submit { kQueued, kQueueFull, kTooLong, kOverBudget, kStopped };
  // Queues a request. kTooLong: the prompt leaves no room in the context, or prompt +
  // max_tokens exceed it; kOverBudget: it could never fit the pool; kQueueFull: try
  // later. `handle` is set only for kQueued.
  Submit submit(GenerationRequest r, std::shared_ptr<RequestHandle>* handle);

  SchedulerStats stats() const;
  const SchedulerOptions& options() const { return opt_; }
  const kv::CacheConfig& cache_config() const { return shaped_; }
  const model::Model& model() const { return m_; }
  // Stops accepting and finishes everything (also done by the destructor).
  void stop();
  // Holds the scheduler between steps: once pause() returns, no request is admitted and
  // no step runs until resume(); submit() still queues (or refuses when the queue is
  // full) and cancellations are noted. Lets a caller observe or change a fixed state,
  // e.g. a test that must close clients before any of them can finish.
  void pause();
  void resume();

  // Slots (llama-server's /slots). What each slot holds: a running request, or the cache
  // an ended one left for the prefix cache (`tokens` of it), or nothing.
  struct SlotInfo {
    int id = 0;
    bool processing = false;
    int tokens = 0;                     // in its cache
    int n_prompt = 0, n_generated = 0;  // of the running request
  };
  std::vector<SlotInfo> slots() const;
  // Saving a slot's kept cache to a KV file, restoring one into a slot (it becomes a kept
  // sequence: a request whose prompt starts with its tokens resumes from it) and erasing
  // a slot's kept cache. They run on the scheduler's thread between steps and wait for
  // it; each throws SlotError (a slot that is running, out of range, empty; a pool with no
  // room) or kivi::Error (the file). Need the prefix cache and one process.
  struct SlotResult {
    int tokens = 0;
    uint64_t bytes = 0;
    double seconds = 0;
  };
  class SlotError : public Error {
   public:
    enum Kind { kNoSlot, kBusy, kEmpty, kNoRoom, kOff };
    SlotError(Kind k, const std::string& m) : Error(m), kind(k) {}
    Kind kind;
  };
  SlotResult save_slot(int id, const std::string& path);
  SlotResult restore_slot(int id, const std::string& path);
  SlotResult erase_slot(int id);

  // With a link: the leader starts scheduling; a follower repeats the leader's steps
  // until the leader stops, then returns. Throws when a follower's pool answers
  // differently from the leader's (the ranks were given different options).
  void start();
  void follow();

 private:
  struct Slot {
    std::unique_ptr<kv::KvCache> cache;
    AlignedBuffer<float> logits;  // [vocab]
    std::shared_ptr<RequestHandle> req;
    GenerationRequest params;
    std::vector<int> tokens;  // prompt, then generated tokens
    int fed = 0;              // tokens in the cache
    int prefill_end = 0;      // prefilling until fed reaches it (the prompt, or all of
                              // tokens for a preempted sequence that resumes)
    int n_prompt = 0, n_generated = 0;
    uint64_t order = 0;      // admission order (prefill goes first come, first served)
    uint64_t last_used = 0;  // when a kept sequence ended (least recently used first)
    double submitted = 0, first_token = 0;  // now_seconds() at submit() and the first token
    std::unique_ptr<Continuation> gen;      // sampling, stop rule, text
    // Speculation: this step's draft, the rows fed (the pending token, then the draft),
    // their logits, and the next draft's length at most (0: not started).
    std::vector<int> draft, feed;
    AlignedBuffer<float> all_logits;
    int draft_length = 0;
    std::unique_ptr<DraftModel> drafter;  // with SchedulerOptions::draft
    bool active() const { return req != nullptr; }
    // Ended and kept by the prefix cache: the cache holds tokens[0, fed).
    bool kept() const { return req == nullptr && fed > 0; }
    bool prefilling() const { return fed < prefill_end; }
  };
  // What a preempted sequence takes back to the queue: all but its cache.
  struct Preempted {
    std::vector<int> tokens;  // prompt, then generated tokens
    std::unique_ptr<Continuation> gen;
    int n_prompt = 0, n_generated = 0;
    uint64_t order = 0;
    double first_token = 0;
  };
  struct Waiting {
    GenerationRequest params;
    std::shared_ptr<RequestHandle> req;
    double submitted = 0;                  // now_seconds()
    std::unique_ptr<Preempted> preempted;  // set for a sequence that resumes
    const std::vector<int>& tokens() const { return preempted ? preempted->tokens : params.prompt; }
  };

  void loop();
  // Runs f on the scheduler's thread between steps and waits for it (its exception, if
  // any, is rethrown here).
  void on_loop(const std::function<void()>& f);
  void run_commands();          // on the scheduler's thread
  Slot& slot_for_file(int id);  // a slot no request runs in, or SlotError
  // Moves waiting requests into free slots; under mu_. True if any was admitted.
  bool admit_locked();
  // Whether a prompt shares full blocks with a sequence still prefilling that has not
  // published them yet: it then waits for them, to map them rather than compute and
  // store them again (the n choices of one request, a system prompt sent together).
  bool waits_for_prefill(const std::vector<int>& prompt) const;
  // The slot for a prompt: the kept sequence that shares the longest usable prefix
  // with it (*resume = that prefix's tokens: all the kept ones, or fewer when the slot
  // can be cut back), else an empty slot, else the least recently used kept one; -1 if
  // every slot is active.
  int pick_slot(const std::vector<int>& prompt, int* resume) const;
  // Forgets slot i's tokens and gives its blocks back.
  void clear_slot(int i);
  // Evicts the least recently used kept sequence other than slot `except`; false if none.
  bool evict_one(int except);
  // Reserves the block each decoding sequence's next token needs, oldest first,
  // evicting kept sequences and then preempting the newest active ones; under mu_.
  void grow_locked();
  // Gives slot i's blocks back and puts its sequence at the head of the queue; under mu_.
  void preempt_locked(int i);
  // Forgets ended requests; returns SchedulerStats::cancelling. Under mu_.
  int prune_live_locked() const;
  void step();
  // Chooses the next token from `logits` (s.logits by default) and passes it on.
  void sample(Slot& s);
  // Passes a chosen step to the client: the token, its text and logprobs (from
  // `logits`), and the end of the sequence when the step ends it.
  void emit(Slot& s, const Continuation::Step& st, const float* logits);
  // Speculation (runtime/scheduler_speculate.cpp): the draft of decoding slot i for this
  // step, with its blocks reserved (0 tokens when there is none or no room), and the
  // verification of a step's rows: the Continuation chooses while it agrees with the
  // draft, and the cache is cut back past the first other choice.
  int plan_draft(int i);
  void verify(int i, int rows);
  void end(Slot& s, FinishReason r, const std::string& error = "");
  void publish_stats();
  void publish_stats_locked();
  // What a step record holds (runtime/scheduler_follow.cpp): kShare slot n tokens[n]
  // shared assumed; kReserve slot tokens ok; kClear slot; kKeep slot; kTruncate slot n;
  // kStep n (slot fed n logits tokens[n]) * n; kStop.
  enum Op : int32_t { kShare = 1, kReserve, kClear, kKeep, kTruncate, kStep, kStop };
  // The leader's record of cache operations since the last step (empty without a link).
  void note(std::initializer_list<int32_t> words);
  void note_tokens(const int* tokens, int n);
  void send_record();
  void repeat_step(const std::vector<int32_t>& w, size_t& i);

  const model::Model& m_;
  SchedulerOptions opt_;
  kv::CacheConfig shaped_;
  PoolPlan plan_;
  ThreadPool pool_;
  std::unique_ptr<kv::BlockPool> blocks_;
  std::unique_ptr<model::BatchForward> fwd_;
  std::vector<Slot> slots_;
  std::vector<model::BatchSequence> batch_;  // [parallel]
  std::vector<int> batch_slot_;              // [parallel]
  std::vector<int32_t> record_;              // leader: operations not yet sent
  uint64_t next_order_ = 0;
  uint64_t use_clock_ = 0;  // orders kept sequences by when they ended
  int max_chunk_ = 1;       // prompt tokens of one sequence per step

  mutable std::mutex mu_;  // queue_, stopping_, counters, stats_
  std::condition_variable cv_;
  std::deque<Waiting> queue_;
  std::deque<std::function<void()>> commands_;              // on_loop()'s, not yet run
  std::vector<SlotInfo> slot_info_;                         // as of the last step
  mutable std::vector<std::weak_ptr<RequestHandle>> live_;  // submitted, for `cancelling`
  uint64_t queue_version_ = 0;  // counts submissions, to wake the idle loop
  bool stopping_ = false;
  bool paused_ = false;  // pause() asked for a hold
  bool held_ = false;    // the loop is holding (no step in flight)
  std::condition_variable held_cv_;
  SchedulerStats stats_;
  std::deque<std::pair<double, int>> recent_;  // (time, tokens generated in a step), last 10 s
  std::thread thread_;
};

}  // namespace kivi::runtime
