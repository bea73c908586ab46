#include "runtime/scheduler.h"

#include <algorithm>
#include <cstdio>

#include "runtime/engine_options.h"
#include "core/error.h"
#include "core/timer.h"

namespace kivi::runtime {

PoolPlan plan_pool(const kv::CacheConfig& c, const SchedulerOptions& o) {
  PoolPlan p;
  p.block_tokens = c.block();
  p.block_bytes = kv::BlockPool::bytes_per_block(c);
  const uint64_t row = static_cast<uint64_t>(c.n_kv_heads) * c.head_dim * sizeof(float);
  const uint64_t n_logical = (static_cast<uint64_t>(c.ctx) + p.block_tokens - 1) / p.block_tokens;
  p.slot_bytes =
      (static_cast<uint64_t>(kv::key_ring_capacity(c) + kv::value_ring_capacity(c)) * row +
       n_logical * sizeof(int32_t)) *
      static_cast<uint64_t>(kv::stored_layers(c));
  int64_t blocks = 0;
  if (o.kv_budget_bytes > 0) {
    const uint64_t slots = p.slot_bytes * static_cast<uint64_t>(o.parallel);
    if (o.kv_budget_bytes <= slots) {
      fail(
          "--kv-budget of %llu bytes does not cover the %d sequences' residual windows and block "
          "tables "
          "(%llu bytes)",
          static_cast<unsigned long long>(o.kv_budget_bytes), o.parallel,
          static_cast<unsigned long long>(slots));
    }
    blocks = static_cast<int64_t>((o.kv_budget_bytes - slots) / p.block_bytes);
  } else {
    const int64_t tokens =
        o.kv_budget_tokens > 0 ? o.kv_budget_tokens : static_cast<int64_t>(o.parallel) * o.ctx;
    blocks = (tokens + p.block_tokens - 1) / p.block_tokens;
  }
  if (blocks < 1) {
    fail("--kv-budget buys no block of the cache (a block of %d tokens takes %llu bytes)",
         p.block_tokens, static_cast<unsigned long long>(p.block_bytes));
  }
  if (blocks > (int64_t{1} << 30))
    fail("--kv-budget asks for %lld blocks; at most 2^30", static_cast<long long>(blocks));
  p.blocks = static_cast<int>(blocks);
  return p;
}

kv::CacheConfig scheduler_cache_shape(const model::ModelConfig& m, const SchedulerOptions& o) {
  kv::CacheConfig c = cache_shape_for(m, o.cache, o.ctx);
  // Sliding-window layers keep every block of their sequences in the shared pool (blocks
  // are shared between sequences by prefix, so none is evicted); attention still reads
  // only the window (model::BatchForward).
  c.layer_window.clear();
  // Kept KIVI caches can be cut back rewind_tokens, and speculation cuts rejected drafts
  // back: the rings keep that many more rows.
  const int draft = o.draft ? o.draft->max_tokens() : o.lookup;
  if (c.has_residual()) c.ring_slack = std::max(o.prefix_cache ? o.rewind_tokens : 0, draft);
  return c;
}

Scheduler::Scheduler(const model::Model& m, const SchedulerOptions& o)
    : m_(m), opt_(o), pool_(o.threads > 0 ? o.threads : hardware_threads()) {
  const auto& c = m.config();
  if (opt_.parallel < 1 || opt_.parallel > 4096)
    fail("--parallel = %d, expected 1 to 4096", opt_.parallel);
  if (opt_.queue < 0) fail("--queue = %d, expected >= 0", opt_.queue);
  if (opt_.prefill_chunk < 1) fail("--prefill-chunk = %d, expected >= 1", opt_.prefill_chunk);
  if (opt_.ctx < 2) fail("--ctx = %d, expected >= 2", opt_.ctx);
  if (opt_.rewind_tokens < 0 || opt_.rewind_tokens > (1 << 20))
    fail("rewind_tokens = %d, expected 0 to 2^20", opt_.rewind_tokens);
  if (opt_.lookup < 0 || opt_.lookup > 64)
    fail("--lookup %d: expected 0 to 64 tokens", opt_.lookup);
  if (opt_.lookup_ngram < 1 || opt_.lookup_ngram > 16)
    fail("--lookup-ngram %d: expected 1 to 16 tokens", opt_.lookup_ngram);
  if (opt_.draft) {
    if (opt_.lookup > 0) fail("--draft-model and --lookup: choose one source of drafts");
    opt_.lookup = opt_.draft->max_tokens();  // the draft length from here on
  }
  if (opt_.lookup > 0 && opt_.link)
    fail("--lookup, --draft-model: speculative decoding is not served over ranks yet");
  shaped_ = scheduler_cache_shape(c, opt_);
  auto tensor_scaled = [](const kv::StreamFormat& f) {
    return f.format == kv::Format::kInt8 && f.granularity == kv::Int8Granularity::kTensor;
  };
  if (tensor_scaled(shaped_.k) || tensor_scaled(shaped_.v)) {
    // One scale per tensor is fixed by a sequence's whole first prefill; chunked
    // prefill interleaved with other sequences would fix a different one.
    fail("--int8-granularity tensor is not supported when serving (valid: token, head, group)");
  }
  // KIVI caches with cross-layer sharing take one token per sequence and step
  // (model/forward_batch.h); other caches take prompt chunks.
  max_chunk_ = kv::stored_layers(shaped_) < shaped_.n_layers && shaped_.has_residual()
                   ? 1
                   : opt_.prefill_chunk;
  if (max_chunk_ == 1 && opt_.lookup > 0)
    fail("--lookup: KIVI caches shared across layers take one token per step (no drafts)");
  plan_ = plan_pool(shaped_, opt_);
  blocks_ = std::make_unique<kv::BlockPool>(shaped_, plan_.blocks);
  fwd_ = std::make_unique<model::BatchForward>(
      c, opt_.parallel * (1 + opt_.lookup) + opt_.prefill_chunk, opt_.parallel, opt_.ctx,
      pool_.size(), shaped_.block());
  // vLLM's buckets (seconds).
  stats_.queue_time = stats_.request_latency =
      Histogram({0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0});
  stats_.time_to_first_token =
      Histogram({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
                 1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0});
  stats_.time_per_output_token = Histogram({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                            0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0});
  slots_.resize(opt_.parallel);
  for (Slot& s : slots_) {
    s.cache = std::make_unique<kv::KvCache>(*blocks_, opt_.ctx);
    s.logits.reset(static_cast<size_t>(c.vocab_size));
    s.tokens.reserve(opt_.ctx + 1);
    if (opt_.draft) {
      s.drafter = std::make_unique<DraftModel>(opt_.draft->shared_model(), m, opt_.draft->options(),
                                               opt_.draft->max_tokens());
    }
  }
  batch_.resize(opt_.parallel);
  batch_slot_.resize(opt_.parallel);
  stats_.parallel = opt_.parallel;
  stats_.queue_capacity = opt_.queue;
  stats_.ctx = opt_.ctx;
  stats_.blocks_total = plan_.blocks;
  stats_.blocks_free = plan_.blocks;
  stats_.block_tokens = plan_.block_tokens;
  stats_.block_bytes = plan_.block_bytes;
  stats_.slot_bytes = plan_.slot_bytes;
  stats_.cache_format = shaped_.k == shaped_.v
                            ? kv::describe(shaped_.k)
                            : kv::describe(shaped_.k) + "/" + kv::describe(shaped_.v);
  publish_stats_locked();  // the slots' list before the first step
  if (!opt_.link) thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::pause() {
  std::unique_lock<std::mutex> lock(mu_);
  paused_ = true;
  cv_.notify_all();  // an idle loop wakes to hold
  held_cv_.wait(lock, [&] { return held_ || stopping_; });
}

void Scheduler::resume() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    paused_ = false;
  }
  cv_.notify_all();
}

Scheduler::Submit Scheduler::submit(GenerationRequest r, std::shared_ptr<RequestHandle>* handle) {
  const int n = static_cast<int>(r.prompt.size());
  if (n < 1 || n >= opt_.ctx || r.max_tokens < 1 ||
      n + static_cast<int64_t>(r.max_tokens) > opt_.ctx) {
    return Submit::kTooLong;
  }
  const int64_t need =
      (static_cast<int64_t>(n) + r.max_tokens + plan_.block_tokens - 1) / plan_.block_tokens;
  if (need > plan_.blocks) return Submit::kOverBudget;
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return Submit::kStopped;
  ++stats_.submitted;
  if (static_cast<int>(queue_.size()) >= opt_.queue) {
    ++stats_.rejected_queue_full;
    return Submit::kQueueFull;
  }
  auto h = std::make_shared<RequestHandle>(n);
  queue_.push_back({std::move(r), h, now_seconds(), nullptr});
  if (live_.size() >= 2 * static_cast<size_t>(opt_.parallel + opt_.queue)) prune_live_locked();
  live_.push_back(h);
  ++queue_version_;
  *handle = h;
  cv_.notify_all();
  return Submit::kQueued;
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  SchedulerStats s = stats_;
  s.queued = static_cast<int>(queue_.size());
  s.cancelling = prune_live_locked();
  return s;
}

int Scheduler::prune_live_locked() const {
  // Forgets ended requests; counts those not yet ended whose clients cancelled them.
  int cancelling = 0;
  size_t kept = 0;
  for (size_t i = 0; i < live_.size(); ++i) {
    const auto h = live_[i].lock();
    if (!h || h->finished()) continue;
    if (h->cancelled()) ++cancelling;
    live_[kept++] = live_[i];
  }
  live_.resize(kept);
  return cancelling;
}

// A kept sequence is cut back only for a common prefix of at least this many tokens
// (every prompt shares its first token or two with every other).
constexpr int kMinCut = 8;

int Scheduler::pick_slot(const std::vector<int>& prompt, int* resume) const {
  const int n = static_cast<int>(prompt.size());
  int empty = -1, lru = -1;
  int full = -1, full_len = 0;  // a kept sequence whose tokens all begin the prompt
  int half = -1, half_len = 0;  // a cut back that keeps at least half of a kept sequence
  int any = -1, any_len = 0;    // any cut back
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
    const Slot& s = slots_[i];
    if (s.active()) continue;
    if (!s.kept()) {
      if (empty < 0) empty = i;
      continue;
    }
    if (lru < 0 || s.last_used < slots_[lru].last_used) lru = i;
    // The common prefix, short of the prompt's last token (whose logits come from
    // feeding it).
    const int limit = std::min(s.fed, n - 1);
    int c = 0;
    while (c < limit && s.tokens[c] == prompt[c]) ++c;
    if (c == s.fed) {
      if (c > full_len) full = i, full_len = c;
      continue;
    }
    if (c < kMinCut || !s.cache->can_truncate(c)) continue;
    if (c > any_len) any = i, any_len = c;
    if (2 * c >= s.fed && c > half_len) half = i, half_len = c;
  }
  // A kept tail is given up for a short common prefix only when no slot is empty.
  int cut = half, cut_len = half_len;
  if (empty < 0 && any_len > cut_len) cut = any, cut_len = any_len;
  if (full >= 0 && full_len >= cut_len) {
    *resume = full_len;
    return full;
  }
  if (cut >= 0) {
    *resume = cut_len;
    return cut;
  }
  *resume = 0;
  return empty >= 0 ? empty : lru;
}

void Scheduler::clear_slot(int i) {
  Slot& s = slots_[i];
  s.cache->clear();
  s.tokens.clear();
  s.fed = 0;
  note({kClear, i});
}

bool Scheduler::evict_one(int except) {
  int lru = -1;
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
    if (i == except || !slots_[i].kept()) continue;
    if (lru < 0 || slots_[i].last_used < slots_[lru].last_used) lru = i;
  }
  if (lru < 0) return false;
  clear_slot(lru);
  ++stats_.prefix_evictions;
  return true;
}

bool Scheduler::waits_for_prefill(const std::vector<int>& prompt) const {
  const int B = plan_.block_tokens;
  for (const Slot& s : slots_) {
    if (!s.active() || !s.prefilling()) continue;
    const size_t n = std::min(prompt.size(), static_cast<size_t>(s.prefill_end));
    size_t common = 0;
    while (common < n && s.tokens[common] == prompt[common]) ++common;
    if (static_cast<int>(common) / B > s.cache->blocks_published()) return true;
  }
  return false;
}

bool Scheduler::admit_locked() {
  bool any = false;
  while (!queue_.empty()) {
    Waiting& w = queue_.front();
    if (w.req->cancelled()) {
      w.req->finish(FinishReason::kCancelled, w.preempted ? w.preempted->n_generated : 0);
      ++stats_.cancelled;
      queue_.pop_front();
      continue;
    }
    const std::vector<int>& prompt = w.tokens();
    if (waits_for_prefill(prompt)) break;
    int resume = 0;
    const int slot = pick_slot(prompt, &resume);
    if (slot < 0) break;
    Slot& s = slots_[slot];
    const int n = static_cast<int>(prompt.size());
    const int B = plan_.block_tokens;
    int shared = 0, cached = resume;
    if (resume > 0 && resume < s.fed) {
      // Cut back to the common prefix; a block it must copy may need another kept
      // sequence's memory first.
      bool cut = s.cache->truncate(resume);
      while (!cut && evict_one(slot)) cut = s.cache->truncate(resume);
      if (cut) {
        s.tokens.resize(resume);
        s.fed = resume;
        note({kTruncate, slot, resume});
      } else {
        resume = cached = 0;
      }
    }
    if (resume == 0) {
      if (s.kept()) {
        clear_slot(slot);
        ++stats_.prefix_evictions;
      }
      shared = s.cache->share_prefix(prompt.data(), n);
      // Start after the shared blocks when they hold the whole state, leaving at least
      // the prompt's last token to feed.
      if (opt_.prefix_cache && s.cache->resumes_at_blocks())
        cached = std::min(shared * B, (n - 1) / B * B);
      s.cache->assume_shared(cached);
      note({kShare, slot, n});
      note_tokens(prompt.data(), n);
      note({shared, cached});
    }
    // The prompt and the first generated token; kept sequences give their blocks up,
    // least recently used first, when this one needs them.
    const int need = std::min(n + 1, opt_.ctx);
    bool reserved = s.cache->reserve(need);
    while (!reserved && evict_one(slot)) reserved = s.cache->reserve(need);
    note({kReserve, slot, need, reserved ? 1 : 0});
    if (!reserved) {
      if (resume == 0) clear_slot(slot);  // a kept sequence stays kept
      break;  // first come, first served: later requests wait behind this one
    }
    s.tokens.assign(prompt.begin(), prompt.end());  // before `prompt` moves with w.params
    s.params = std::move(w.params);
    s.req = std::move(w.req);
    s.submitted = w.submitted;
    s.fed = cached;
    s.prefill_end = n;
    s.draft_length = 0;  // speculation starts afresh in this slot
    if (w.preempted) {
      // A preempted sequence resumes where it was: its cache is prefilled again.
      Preempted& p = *w.preempted;
      s.gen = std::move(p.gen);
      s.n_prompt = p.n_prompt;
      s.n_generated = p.n_generated;
      s.order = p.order;
      s.first_token = p.first_token;
      stats_.recomputed_tokens += static_cast<uint64_t>(n - cached);
      queue_.pop_front();  // w is gone from here on
      any = true;
      continue;
    }
    queue_.pop_front();  // w is gone from here on
    s.n_prompt = n;
    s.n_generated = 0;
    s.order = next_order_++;
    stats_.queue_time.observe(now_seconds() - s.submitted);
    GenerationOptions go = s.params.options();
    if (go.grammar) {
      // Built at the first request with a grammar (of its kind).
      go.vocab_trie = m_.vocab_trie(go.grammar_markup);
    }
    s.gen = std::make_unique<Continuation>(m_.tokenizer(), go, s.params.prompt.back());
    s.gen->sampler().observe_prompt(s.params.prompt);
    s.req->admitted(resume > 0 ? std::min(n, s.cache->blocks_shared() * B) : shared * B, cached);
    ++stats_.admitted;
    stats_.prompt_tokens += n;
    if (opt_.prefix_cache) {
      ++stats_.prefix_queries;
      stats_.prefix_hits += cached > 0;
      stats_.prefill_tokens_saved += static_cast<uint64_t>(cached);
    }
    any = true;
  }
  return any;
}

void Scheduler::grow_locked() {
  std::vector<int> order;
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
    if (slots_[i].active() && !slots_[i].prefilling()) order.push_back(i);
  }
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return slots_[a].order < slots_[b].order; });
  for (const int i : order) {
    Slot& s = slots_[i];
    if (!s.active()) continue;  // preempted for an older one
    const int need = s.fed + 1;
    for (;;) {
      const bool ok = s.cache->reserve(need);
      note({kReserve, i, need, ok ? 1 : 0});
      if (ok) break;
      if (evict_one(-1)) continue;
      // The newest active sequence gives its blocks up (this one, when it is the newest).
      int newest = -1;
      for (int j = 0; j < static_cast<int>(slots_.size()); ++j) {
        if (slots_[j].active() && (newest < 0 || slots_[j].order > slots_[newest].order))
          newest = j;
      }
      preempt_locked(newest);
      if (newest == i) break;
    }
  }
}

void Scheduler::preempt_locked(int i) {
  Slot& s = slots_[i];
  auto p = std::make_unique<Preempted>();
  // The cache holds tokens[0, fed): a decoding sequence has one sampled token more,
  // which the prefill on its return feeds for the next logits.
  p->tokens = s.tokens;
  p->gen = std::move(s.gen);
  p->n_prompt = s.n_prompt;
  p->n_generated = s.n_generated;
  p->order = s.order;
  p->first_token = s.first_token;
  Waiting w;
  w.params = std::move(s.params);
  w.req = std::move(s.req);
  w.submitted = s.submitted;
  w.preempted = std::move(p);
  queue_.push_front(std::move(w));
  ++queue_version_;
  clear_slot(i);
  s.prefill_end = 0;
  ++stats_.preemptions;
}

void Scheduler::end(Slot& s, FinishReason r, const std::string& error) {
  if (r == FinishReason::kStop || r == FinishReason::kLength) {
    // What the generation still held (a split character, a possible stop string).
    const std::string rest = s.gen->end(StopReason::kLength).text;
    if (!rest.empty()) s.req->push(rest, -1, s.n_generated);
  }
  s.req->finish(r, s.n_generated, error);
  s.req.reset();
  s.gen.reset();
  const int slot = static_cast<int>(&s - slots_.data());
  std::lock_guard<std::mutex> lock(mu_);
  if (opt_.prefix_cache && (r == FinishReason::kStop || r == FinishReason::kLength) && s.fed > 0) {
    // Kept: the cache holds tokens[0, fed) (not the last sampled token, never fed).
    s.tokens.resize(s.fed);
    s.cache->release_reservation();
    s.last_used = ++use_clock_;
    note({kKeep, slot});
  } else {
    clear_slot(slot);
  }
  if (r == FinishReason::kCancelled) {
    ++stats_.cancelled;
  } else if (r == FinishReason::kError) {
    ++stats_.errors;
  } else {
    ++stats_.completed;
    const double now = now_seconds();
    stats_.request_latency.observe(now - s.submitted);
    if (s.n_generated > 1)
      stats_.time_per_output_token.observe((now - s.first_token) / (s.n_generated - 1));
  }
}

void Scheduler::sample(Slot& s) {
  Continuation::Step st;
  try {
    st = s.gen->next(s.logits.data());
  } catch (const Error& e) {  // a grammar that cannot go on (too ambiguous)
    end(s, FinishReason::kError, e.what());
    return;
  }
  emit(s, st, s.logits.data());
}

void Scheduler::emit(Slot& s, const Continuation::Step& st, const float* logits) {
  if (st.token >= 0) {
    s.tokens.push_back(st.token);
    if (++s.n_generated == 1) {
      s.first_token = now_seconds();
      std::lock_guard<std::mutex> lock(mu_);
      stats_.time_to_first_token.observe(s.first_token - s.submitted);
    }
  }
  if (st.token >= 0 && s.params.logprobs >= 0) {
    const TokenLogprob lp =
        token_logprob(logits, m_.config().vocab_size, st.token, s.params.logprobs);
    s.req->push(st.text, st.token, s.n_generated, &lp);
  } else if (st.token >= 0 || !st.text.empty()) {
    s.req->push(st.text, st.token, s.n_generated);
  }
  if (st.done) {
    end(s, st.reason == StopReason::kLength ? FinishReason::kLength : FinishReason::kStop);
  }
}

void Scheduler::step() {
  // Clients that went away free their sequences before the step.
  for (Slot& s : slots_) {
    if (s.active() && s.req->cancelled()) end(s, FinishReason::kCancelled);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    grow_locked();
  }
  int n = 0;
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
    Slot& s = slots_[i];
    if (!s.active() || s.prefilling()) continue;
    const int d = opt_.lookup > 0 ? plan_draft(i) : 0;
    batch_[n] =
        d > 0 ? model::BatchSequence{s.cache.get(), s.feed.data(), 1 + d, s.all_logits.data(), true}
              : model::BatchSequence{s.cache.get(), s.tokens.data() + s.fed, 1, s.logits.data(),
                                     false};
    batch_slot_[n++] = i;
  }
  // Prompt chunks, oldest admission first, within the step's prompt budget.
  int budget = opt_.prefill_chunk;
  while (budget > 0) {
    int best = -1;
    for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
      const Slot& s = slots_[i];
      if (!s.active() || !s.prefilling()) continue;
      if (std::find(batch_slot_.begin(), batch_slot_.begin() + n, i) != batch_slot_.begin() + n)
        continue;
      if (best < 0 || s.order < slots_[best].order) best = i;
    }
    if (best < 0) break;
    Slot& s = slots_[best];
    const int k = std::min({budget, s.prefill_end - s.fed, max_chunk_});
    batch_[n] = {s.cache.get(), s.tokens.data() + s.fed, k,
                 s.fed + k == s.prefill_end ? s.logits.data() : nullptr};
    batch_slot_[n++] = best;
    budget -= k;
  }
  if (n == 0) return;
  if (opt_.link) {
    note({kStep, n});
    for (int j = 0; j < n; ++j) {
      note({batch_slot_[j], slots_[batch_slot_[j]].fed, batch_[j].n, batch_[j].logits ? 1 : 0});
      note_tokens(batch_[j].tokens, batch_[j].n);
    }
    send_record();
  }
  try {
    fwd_->run(m_, batch_.data(), n, &pool_, opt_.forward);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kivi serve: step failed: %s\n", e.what());
    for (int j = 0; j < n; ++j) end(slots_[batch_slot_[j]], FinishReason::kError, e.what());
    return;
  }
  int generated = 0;
  for (int j = 0; j < n; ++j) {
    Slot& s = slots_[batch_slot_[j]];
    if (batch_[j].all_logits) {
      const int before = s.n_generated;
      verify(batch_slot_[j], batch_[j].n);
      generated += s.n_generated - before;
      continue;
    }
    s.fed += batch_[j].n;
    s.cache->publish(s.tokens.data());
    if (!batch_[j].logits) continue;
    const int before = s.n_generated;
    sample(s);
    generated += s.n_generated - before;
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.steps;
  stats_.generated_tokens += generated;
  const double now = now_seconds();
  recent_.emplace_back(now, generated);
  while (!recent_.empty() && recent_.front().first < now - 10.0) recent_.pop_front();
}

void Scheduler::publish_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  publish_stats_locked();
}

void Scheduler::publish_stats_locked() {
  int active = 0, prefilling = 0, kept = 0, kept_blocks = 0;
  int64_t tokens = 0, kept_tokens = 0;
  for (const Slot& s : slots_) {
    if (s.kept()) {
      ++kept;
      kept_blocks += s.cache->blocks_mapped();
      kept_tokens += s.fed;
    }
    if (!s.active()) continue;
    ++active;
    prefilling += s.prefilling();
    tokens += s.fed;
  }
  const auto& c = shaped_;
  const uint64_t used = static_cast<uint64_t>(blocks_->used_blocks()) * plan_.block_bytes +
                        static_cast<uint64_t>(active) * plan_.slot_bytes;
  const double f16 =
      static_cast<double>(tokens) * c.n_layers * 2.0 * c.n_kv_heads * c.head_dim * 2.0;
  slot_info_.resize(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    SlotInfo& o = slot_info_[i];
    o.id = static_cast<int>(i);
    o.processing = s.active();
    o.tokens = s.fed;
    o.n_prompt = s.active() ? s.n_prompt : 0;
    o.n_generated = s.active() ? s.n_generated : 0;
  }
  stats_.active = active;
  stats_.cached_sequences = kept;
  stats_.cached_blocks = kept_blocks;
  stats_.cached_tokens = kept_tokens;
  stats_.prefilling = prefilling;
  stats_.tokens_held = tokens;
  stats_.blocks_used = blocks_->used_blocks();
  stats_.blocks_free = blocks_->free_blocks();
  stats_.blocks_reserved = blocks_->reserved_blocks();
  stats_.blocks_shared = blocks_->shared_blocks();
  stats_.blocks_published = blocks_->published_blocks();
  stats_.peak_blocks_used = std::max(stats_.peak_blocks_used, stats_.blocks_used);
  stats_.bytes_allocated = used;
  stats_.peak_bytes_allocated = std::max(stats_.peak_bytes_allocated, used);
  stats_.compression_vs_f16 = used > 0 ? f16 / static_cast<double>(used) : 0.0;
  if (recent_.size() >= 2) {
    const double span = recent_.back().first - recent_.front().first;
    int64_t sum = 0;
    for (size_t i = 1; i < recent_.size(); ++i) sum += recent_[i].second;
    stats_.tokens_per_second = span > 0 ? static_cast<double>(sum) / span : 0.0;
  } else {
    stats_.tokens_per_second = 0.0;
  }
}

void Scheduler::loop() {
  for (;;) {
    run_commands();
    bool any_active = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stopping_) break;
      if (paused_) {
        held_ = true;
        held_cv_.notify_all();
        cv_.wait(lock, [&] { return stopping_ || !paused_; });
        held_ = false;
        continue;
      }
      // New sequences and their reservations show in the same moment they leave the
      // queue, so no one sees a request in neither place.
      if (admit_locked()) publish_stats_locked();
      for (const Slot& s : slots_) any_active = any_active || s.active();
      if (!any_active) {
        // Idle: wake for a new request, or now and then to drop cancelled ones.
        const uint64_t seen = queue_version_;
        cv_.wait_for(lock, std::chrono::milliseconds(50), [&] {
          return stopping_ || paused_ || queue_version_ != seen || !commands_.empty();
        });
        continue;
      }
    }
    step();
    publish_stats();
  }
  // Stopping: everything still running or waiting ends as cancelled.
  for (Slot& s : slots_) {
    if (s.active()) end(s, FinishReason::kCancelled);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Waiting& w : queue_)
      w.req->finish(FinishReason::kCancelled, w.preempted ? w.preempted->n_generated : 0);
    queue_.clear();
  }
  run_commands();  // those queued while it stopped
  publish_stats();
  if (opt_.link) {
    note({kStop});
    send_record();
  }
}

}  // namespace kivi::runtime
