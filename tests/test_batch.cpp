// Batched decoding: the batched forward gives every sequence the logits a session gives
// it alone, bit for bit, whatever else is in the batch; the scheduler's sequences
// produce the tokens `kivi generate` produces alone; admission never overcommits the
// pool; cancelled and finished sequences return their blocks.
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "attn/prefill.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/threadpool.h"
#include "kv/block_pool.h"
#include "model/forward_batch.h"
#include "model/model.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"
#include "runtime/session.h"
#include "runtime/speculative.h"
#include "runtime/text_stream.h"
#include "test_util.h"

namespace kivi {
namespace {

using runtime::FinishReason;
using runtime::GenerationRequest;
using runtime::RequestHandle;
using runtime::Scheduler;
using runtime::SchedulerOptions;

using test::stories;

struct CacheCase {
  std::string name;
  kv::CacheConfig cache;
};

std::vector<CacheCase> cache_cases() {
  auto make = [](const char* name, kv::Format k, kv::Format v, int G, int R,
                 kv::Int8Granularity g = kv::Int8Granularity::kHead,
                 kv::KeyFlush f = kv::KeyFlush::kBatch) {
    CacheCase c;
    c.name = name;
    c.cache.k = {k, g};
    c.cache.v = {v, g};
    c.cache.group_size = G;
    c.cache.residual = R;
    c.cache.key_flush = f;
    return c;
  };
  return {
      make("f32", kv::Format::kF32, kv::Format::kF32, 32, 0),
      make("f16", kv::Format::kF16, kv::Format::kF16, 32, 0),
      make("int8/token", kv::Format::kInt8, kv::Format::kInt8, 8, 0, kv::Int8Granularity::kToken),
      make("int8/group", kv::Format::kInt8, kv::Format::kInt8, 8, 0, kv::Int8Granularity::kGroup),
      make("kivi2 G32 R32", kv::Format::kKivi2, kv::Format::kKivi2, 32, 32),
      make("kivi4/kivi2 G8 R24 group", kv::Format::kKivi4, kv::Format::kKivi2, 8, 24,
           kv::Int8Granularity::kHead, kv::KeyFlush::kGroup),
      make("kivi2 R0", kv::Format::kKivi2, kv::Format::kKivi2, 32, 0),
      [&] {
        CacheCase c = make("kivi4 pre-RoPE keys", kv::Format::kKivi4, kv::Format::kKivi4, 32, 32);
        c.cache.key_rope = kv::KeyRope::kPre;
        return c;
      }(),
      [&] {
        CacheCase c = make("f16 layers share by 2", kv::Format::kF16, kv::Format::kF16, 32, 0);
        c.cache.share_every = 2;
        return c;
      }(),
      [&] {
        CacheCase c =
            make("kivi2 layers share by 2", kv::Format::kKivi2, kv::Format::kKivi2, 32, 32);
        c.cache.share_every = 2;
        return c;
      }()};
}

// The formats the slower scheduler tests cover: all of them, or under the sanitizers a
// row format, KIVI with a residual window and a split KIVI format with group flush.
std::vector<CacheCase> scheduler_cases() {
  std::vector<CacheCase> all = cache_cases();
#ifdef KIVI_SANITIZE
  std::vector<CacheCase> some;
  for (auto& c : all) {
    if (c.name == "f16" || c.name == "kivi2 G32 R32" || c.name == "kivi4/kivi2 G8 R24 group")
      some.push_back(c);
  }
  return some;
#else
  return all;
#endif
}

const char* kTexts[] = {
    "Once upon a time, there was a little girl named Lily.",
    "Tom had a big red ball. He liked to play with it in the park every day.",
    "The sun was hot.",
    "One day, a cat and a dog went to the beach to look for shells and to swim in the blue sea.",
    "Sam",
    "There was a tree in the garden. The tree was very old and had many green leaves.",
    "Mia wanted to bake a cake for her mom. She got eggs, milk and flour.",
    "A little bird sat on a branch and sang a happy song for all the animals in the forest.",
    "Ben and Anna were friends.",
    "The boat went up and down on the big waves.",
    "Grandpa told a story about a brave knight who found a dragon in a cave near the hills.",
    "It was raining, so the children stayed inside and built a fort out of pillows and blankets.",
    "The dog barked.",
    "Lucy found a shiny key under her bed. She wondered what it could open.",
    "At the zoo, they saw a tall giraffe, a funny monkey and a sleepy lion.",
    "Tim was sad because his toy car was broken. His dad said he could fix it.",
};

// Keys and values of one sequence run alone: logits at every position.
std::vector<float> alone_logits(const model::Model& m, const kv::CacheConfig& cc,
                                const std::vector<int>& tokens, int threads) {
  runtime::SessionOptions o;
  o.threads = threads;
  o.cache = cc;
  o.ctx = 512;
  runtime::Session s(m, o);
  const int V = m.config().vocab_size;
  std::vector<float> out(tokens.size() * V);
  for (size_t i = 0; i < tokens.size(); ++i)
    std::memcpy(&out[i * V], s.decode(tokens[i]), V * sizeof(float));
  return out;
}

// Sequences of different lengths join, prefill in random chunks beside others'
// decoding rows, and leave; every logits row equals the sequence's own, alone.
TEST(BatchForward, EverySequenceGetsItsOwnLogitsBitForBit) {
  KIVI_REQUIRE_MODEL();
  const auto& m = stories();
  const auto& tk = m.tokenizer();
  const int V = m.config().vocab_size;
  const int S = 6;
  std::vector<std::vector<int>> seqs;
  for (int s = 0; s < S; ++s) {
    std::vector<int> t = tk.encode(std::string(kTexts[s]) + " " + kTexts[s + 6], true);
    seqs.push_back(t);
  }
  for (const auto& cc : cache_cases()) {
    for (int threads : {1, 2}) {
      for (bool shared : {false, true}) {
        // KIVI caches shared across layers take one token per sequence and step.
        const bool one_row = cc.cache.share_every > 1 && cc.cache.has_residual();
        std::vector<std::vector<float>> ref;
        for (const auto& t : seqs) ref.push_back(alone_logits(m, cc.cache, t, threads));
        kv::CacheConfig shaped = cc.cache;
        shaped.n_layers = m.config().n_layers;
        shaped.n_kv_heads = m.config().n_kv_heads;
        shaped.head_dim = m.config().head_dim();
        shaped.ctx = 512;
        std::unique_ptr<kv::BlockPool> pool;
        if (shared) pool = std::make_unique<kv::BlockPool>(shaped, 64);
        std::vector<std::unique_ptr<kv::KvCache>> caches;
        for (int s = 0; s < S; ++s) {
          caches.push_back(shared ? std::make_unique<kv::KvCache>(*pool, 512)
                                  : std::make_unique<kv::KvCache>(shaped));
        }
        ThreadPool tp(threads);
        model::BatchForward fwd(m.config(), 64, S, 512, threads, shaped.block());
        std::vector<int> fed(S, 0);
        std::vector<std::vector<float>> logits(S, std::vector<float>(V));
        Rng rng(threads * 7 + shared);
        int checked = 0;
        for (int step = 0; step < 400; ++step) {
          std::vector<model::BatchSequence> batch;
          std::vector<int> who;
          int rows = 0;
          for (int s = 0; s < S; ++s) {
            const int left = static_cast<int>(seqs[s].size()) - fed[s];
            if (left == 0 || step < 3 * s) continue;  // sequence s joins at step 3 s
            // Mostly single rows (decoding), sometimes a chunk (prefilling).
            int k = rng.next_u64() % 3 == 0 ? 1 + static_cast<int>(rng.next_u64() % 13) : 1;
            if (one_row) k = 1;
            k = std::min({k, left, 64 - rows});
            if (k == 0) break;
            const bool want = rng.next_u64() % 4 != 0;
            batch.push_back(
                {caches[s].get(), seqs[s].data() + fed[s], k, want ? logits[s].data() : nullptr});
            who.push_back(s);
            rows += k;
          }
          if (batch.empty()) break;
          model::ForwardOptions fo;
          fo.prefill = attn::PrefillMode::kStream;  // bit for bit with decoding
          fwd.run(m, batch.data(), static_cast<int>(batch.size()), &tp, fo);
          for (size_t j = 0; j < batch.size(); ++j) {
            const int s = who[j];
            fed[s] += batch[j].n;
            if (!batch[j].logits) continue;
            const float* r = &ref[s][static_cast<size_t>(fed[s] - 1) * V];
            ASSERT_EQ(std::memcmp(logits[s].data(), r, V * sizeof(float)), 0)
                << cc.name << " threads " << threads << (shared ? " shared pool" : " own caches")
                << " seq " << s << " position " << fed[s] - 1;
            ++checked;
          }
        }
        for (int s = 0; s < S; ++s) ASSERT_EQ(fed[s], static_cast<int>(seqs[s].size()));
        EXPECT_GT(checked, 50);
      }
    }
  }
}

// A sequence that maps another's published prompt blocks gets its own logits.
TEST(BatchForward, MappedPrefixBlocksGiveTheSameLogits) {
  KIVI_REQUIRE_MODEL();
  const auto& m = stories();
  const auto& tk = m.tokenizer();
  const int V = m.config().vocab_size;
  std::string common;
  for (int i = 0; i < 10; ++i) common += std::string(kTexts[i]) + " ";
  const std::vector<int> ta = tk.encode(common + kTexts[10], true),
                         tb = tk.encode(common + kTexts[11], true);
  for (const auto& cc : cache_cases()) {
    const std::vector<float> ref = alone_logits(m, cc.cache, tb, 1);
    kv::CacheConfig shaped = cc.cache;
    shaped.n_layers = m.config().n_layers;
    shaped.n_kv_heads = m.config().n_kv_heads;
    shaped.head_dim = m.config().head_dim();
    shaped.ctx = 512;
    kv::BlockPool pool(shaped, 16);
    kv::KvCache a(pool, 512), b(pool, 512);
    model::BatchForward fwd(m.config(), 1, 1, 512, 1, shaped.block());
    std::vector<float> logits(V);
    for (size_t i = 0; i < ta.size(); ++i) {
      model::BatchSequence q{&a, &ta[i], 1, nullptr};
      fwd.run(m, &q, 1, nullptr, {});
      a.publish(ta.data());
    }
    const int mapped = b.share_prefix(tb.data(), static_cast<int>(tb.size()));
    if (pool.prefix_sharing()) {
      EXPECT_GE(mapped, 1) << cc.name;
    }
    for (size_t i = 0; i < tb.size(); ++i) {
      model::BatchSequence q{&b, &tb[i], 1, logits.data()};
      fwd.run(m, &q, 1, nullptr, {});
      b.publish(tb.data());
      ASSERT_EQ(std::memcmp(logits.data(), &ref[i * V], V * sizeof(float)), 0)
          << cc.name << " position " << i;
    }
  }
}

TEST(BatchForward, BadBatchesAreErrorsBeforeAnyCacheChanges) {
  KIVI_REQUIRE_MODEL();
  const auto& m = stories();
  kv::CacheConfig c;
  c.n_layers = m.config().n_layers;
  c.n_kv_heads = m.config().n_kv_heads;
  c.head_dim = m.config().head_dim();
  c.ctx = 16;
  kv::KvCache a(c), b(c);
  model::BatchForward fwd(m.config(), 8, 2, 16, 1, c.block());
  std::vector<int> ok = {1, 5, 6}, bad = {1, 100000};
  std::vector<model::BatchSequence> batch = {{&a, ok.data(), 3, nullptr},
                                             {&b, bad.data(), 2, nullptr}};
  EXPECT_THROW(fwd.run(m, batch.data(), 2, nullptr, {}), Error);
  EXPECT_EQ(a.n_tokens(0), 0);
  std::vector<int> many(9, 5);
  batch = {{&a, many.data(), 9, nullptr}};
  EXPECT_THROW(fwd.run(m, batch.data(), 1, nullptr, {}), Error);
  batch = {{&a, ok.data(), 3, nullptr}, {&b, ok.data(), 3, nullptr}, {&a, ok.data(), 1, nullptr}};
  EXPECT_THROW(fwd.run(m, batch.data(), 3, nullptr, {}), Error);
  std::vector<int> full(16, 5);
  batch = {{&a, full.data(), 8, nullptr}};
  fwd.run(m, batch.data(), 1, nullptr, {});
  fwd.run(m, batch.data(), 1, nullptr, {});
  EXPECT_THROW(fwd.run(m, batch.data(), 1, nullptr, {}), Error);  // the context is full
}

// What `kivi generate` does for one prompt: prefill, then sample and decode one token
// at a time until EOS/BOS or n tokens.
std::vector<int> generate_alone(const model::Model& m, const kv::CacheConfig& cc,
                                const std::vector<int>& prompt, int n,
                                const runtime::SamplerOptions& so) {
  runtime::SessionOptions o;
  o.threads = 1;
  o.cache = cc;
  o.ctx = 512;
  runtime::Session s(m, o);
  runtime::Sampler sampler(so, m.config().vocab_size);
  std::vector<int> out;
  const float* logits = s.prefill(prompt);
  for (int i = 0; i < n; ++i) {
    const int next = sampler.sample(logits);
    if (next == m.tokenizer().eos_id() || next == m.tokenizer().bos_id()) break;
    out.push_back(next);
    if (i + 1 == n) break;
    logits = s.decode(next);
  }
  return out;
}

// generate_alone for a request with ignore_eos: the end tokens are never sampled.
std::vector<int> generate_alone_ignoring_eos(const model::Model& m, const kv::CacheConfig& cc,
                                             const std::vector<int>& prompt, int n,
                                             const runtime::SamplerOptions& so) {
  runtime::SessionOptions o;
  o.forward.prefill = attn::PrefillMode::kStream;
  o.threads = 1;
  o.cache = cc;
  o.ctx = 512;
  runtime::Session s(m, o);
  runtime::Sampler sampler(so, m.config().vocab_size);
  sampler.ban({m.tokenizer().eos_id(), m.tokenizer().bos_id()});
  std::vector<int> out;
  const float* logits = s.prefill(prompt);
  for (int i = 0; i < n; ++i) {
    out.push_back(sampler.sample(logits));
    if (i + 1 < n) logits = s.decode(out.back());
  }
  return out;
}

struct Outcome {
  std::vector<int> tokens;
  std::string text;
  FinishReason reason = FinishReason::kNone;
  int completion_tokens = 0;
  int shared_prompt_tokens = 0;
};

Outcome follow(const std::shared_ptr<RequestHandle>& h, int cancel_after = -1) {
  Outcome o;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  for (;;) {
    auto u = h->wait(std::chrono::milliseconds(100));
    o.tokens.insert(o.tokens.end(), u.tokens.begin(), u.tokens.end());
    o.text += u.text;
    o.shared_prompt_tokens = u.shared_prompt_tokens;
    if (cancel_after >= 0 && static_cast<int>(o.tokens.size()) >= cancel_after) h->cancel();
    if (u.finished) {
      o.reason = u.reason;
      o.completion_tokens = u.completion_tokens;
      return o;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "request did not finish";
      return o;
    }
  }
}

// Submits every request while the scheduler is held, so that they start together, and
// follows each from a thread of its own.
std::vector<Outcome> run_together(Scheduler& sched, const std::vector<GenerationRequest>& rs) {
  sched.pause();
  std::vector<Outcome> got(rs.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < rs.size(); ++i) {
    std::shared_ptr<RequestHandle> h;
    EXPECT_EQ(sched.submit(rs[i], &h), Scheduler::Submit::kQueued) << "request " << i;
    if (h) clients.emplace_back([&got, i, h] { got[i] = follow(h); });
  }
  sched.resume();
  for (auto& t : clients) t.join();
  return got;
}

void wait_for_empty_pool(const Scheduler& s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < end) {
    const auto st = s.stats();
    if (st.active == 0 && st.queued == 0 && st.blocks_used == 0 && st.blocks_reserved == 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const auto st = s.stats();
  ADD_FAILURE() << "pool not empty: " << st.blocks_used << " used, " << st.blocks_reserved
                << " reserved, " << st.active << " active, " << st.queued << " queued";
}

// 16 concurrent requests with different prompts, 6 decoded together: each gets exactly
// the tokens it gets alone.
TEST(Scheduler, ConcurrentRequestsGiveTheTokensEachGivesAlone) {
  KIVI_REQUIRE_MODEL();
  const auto& m = stories();
  const auto& tk = m.tokenizer();
  for (const auto& cc : cache_cases()) {
    for (bool sampled : {false, true}) {
      runtime::SamplerOptions so;
      if (sampled) {
        so.temperature = 0.8f;
        so.top_k = 40;
        so.top_p = 0.95f;
      }
      SchedulerOptions o;
      o.parallel = 6;
      o.ctx = 512;
      o.queue = 16;
      o.prefill_chunk = 16;
      o.cache = cc.cache;
      o.threads = cc.name == "f32" || cc.name == "kivi2 G32 R32"
                      ? 2
                      : 1;  // 2 workers: slow on a busy machine
      Scheduler sched(m, o);
      std::vector<std::vector<int>> expected;
      std::vector<std::shared_ptr<RequestHandle>> handles(16);
      std::vector<std::thread> clients;
      std::vector<Outcome> got(16);
      for (int i = 0; i < 16; ++i) {
        GenerationRequest r;
        r.prompt = tk.encode(kTexts[i], true);
        r.max_tokens = 40 + 7 * i;
        r.sampling = so;
        r.sampling.seed = 1000 + i;
        expected.push_back(generate_alone(m, cc.cache, r.prompt, r.max_tokens, r.sampling));
        clients.emplace_back([&, i, r]() mutable {
          ASSERT_EQ(sched.submit(std::move(r), &handles[i]), Scheduler::Submit::kQueued);
          got[i] = follow(handles[i]);
        });
      }
      for (auto& t : clients) t.join();
      for (int i = 0; i < 16; ++i) {
        EXPECT_EQ(got[i].tokens, expected[i])
            << cc.name << (sampled ? " sampled" : " greedy") << " request " << i;
        EXPECT_EQ(got[i].completion_tokens, static_cast<int>(expected[i].size()));
        EXPECT_EQ(got[i].reason, static_cast<int>(expected[i].size()) == 40 + 7 * i
                                     ? FinishReason::kLength
                                     : FinishReason::kStop);
        std::vector<int> full = tk.encode(kTexts[i], true);
        EXPECT_EQ(got[i].text, tk.decode_all(expected[i], full.back()));
      }
      wait_for_empty_pool(sched);
      const auto st = sched.stats();
      EXPECT_EQ(st.completed, 16u);
      EXPECT_EQ(st.generated_tokens, [&] {
        uint64_t n = 0;
        for (auto& e : expected) n += e.size();
        return n;
      }());
    }
  }
}

// Speculative decoding in the steps, by prompt lookup and with a draft model: prompts the
// model copies from, decoded together with drafts, give exactly the tokens each gives
// alone without them (greedy and sampled, every cache format).
TEST(Scheduler, DraftsLeaveTheTokensAlone) {
  KIVI_REQUIRE_MODEL();
  const auto& m = stories();
  const auto& tk = m.tokenizer();
  // The draft model: stories260K itself from a kivi2 cache (it mostly agrees).
  runtime::SessionOptions dso;
  dso.threads = 1;
  dso.ctx = 512;
  dso.cache.k = dso.cache.v = {kv::Format::kKivi2};
  dso.cache.residual = 32;
  const auto draft = std::make_shared<const runtime::DraftModel>(
      model::Model::load(test::model_path(), test::tokenizer_path()), m, dso, 4);
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 4; ++i) {
    const std::string t = std::string(kTexts[i]) + " " + kTexts[i + 4];
    prompts.push_back(tk.encode(t + " " + t + " " + kTexts[i], true));
  }
  uint64_t accepted = 0;
  for (const auto& cc : scheduler_cases()) {
    for (const bool with_model : {false, true}) {
      if (cc.cache.share_every > 1 && cc.cache.has_residual()) continue;  // refused below
      SchedulerOptions o;
      o.parallel = 4;
      o.ctx = 512;
      o.queue = 8;
      o.prefill_chunk = 32;
      o.cache = cc.cache;
      o.threads = 1;
      if (with_model) {
        o.draft = draft;
      } else {
        o.lookup = 5;
      }
      Scheduler sched(m, o);
      const int n = static_cast<int>(prompts.size());
      std::vector<std::vector<int>> expected(n);
      std::vector<GenerationRequest> rs(n);
      for (int i = 0; i < n; ++i) {
        rs[i].prompt = prompts[i];
        rs[i].max_tokens = 90;
        if (i % 2 == 1) {
          rs[i].sampling.temperature = 0.8f;
          rs[i].sampling.seed = 40 + i;
        }
        expected[i] = generate_alone(m, cc.cache, rs[i].prompt, rs[i].max_tokens, rs[i].sampling);
      }
      const std::vector<Outcome> got = run_together(sched, rs);
      for (int i = 0; i < n; ++i) {
        EXPECT_EQ(got[i].tokens, expected[i])
            << cc.name << (with_model ? " draft model" : " lookup") << " request " << i;
      }
      wait_for_empty_pool(sched);
      const auto st = sched.stats();
      EXPECT_GT(st.spec_verifications, 0u) << cc.name;
      EXPECT_LE(st.spec_accepted, st.spec_drafted) << cc.name;
      if (with_model) {
        EXPECT_GT(st.spec_accepted, 0u) << cc.name;  // the same model drafts
      }
      accepted += st.spec_accepted;
    }
  }
  EXPECT_GT(accepted, 0u);
  SchedulerOptions shared;
  shared.ctx = 512;
  shared.cache.k = shared.cache.v = {kv::Format::kKivi2};
  shared.cache.residual = 32;
  shared.cache.share_every = 2;
  shared.lookup = 4;
  EXPECT_THROW(Scheduler(m, shared), Error);
}

// A shared prompt prefix is stored once, and the outputs do not change.
// Requests with one prompt arriving together (an n > 1 request's choices): the first
// prefills it, the others wait for its blocks and map them, and each gives the tokens it
// gives alone with its own seed.
TEST(Scheduler, ChoicesOfOnePromptShareItsBlocks) {
  KIVI_REQUIRE_MODEL();
  const auto& m = stories();
  const auto& tk = m.tokenizer();
  std::string text;
  for (int i = 0; i < 14; ++i) text += std::string(kTexts[i]) + " ";
  for (const auto& cc : cache_cases()) {
    SchedulerOptions o;
    o.parallel = 3;
    o.ctx = 512;
    o.prefill_chunk = 32;
    o.cache = cc.cache;
    o.threads = 1;
    Scheduler sched(m, o);
    const int block = sched.cache_config().block();
    GenerationRequest r;
    r.prompt = tk.encode(text, true);
    r.max_tokens = 12;
    r.sampling.temperature = 1.0f;
    ASSERT_GT(static_cast<int>(r.prompt.size()), 2 * block);
    sched.pause();  // all three in the queue before the first step
    std::vector<std::shared_ptr<RequestHandle>> hs(3);
    for (int i = 0; i < 3; ++i) {
      GenerationRequest q = r;
      q.sampling.seed = 40 + static_cast<uint64_t>(i);
      ASSERT_EQ(sched.submit(q, &hs[i]), Scheduler::Submit::kQueued);
    }
    sched.resume();
    for (int i = 0; i < 3; ++i) {
      const Outcome out = follow(hs[i]);
      runtime::SamplerOptions so = r.sampling;
      so.seed = 40 + static_cast<uint64_t>(i);
      EXPECT_EQ(out.tokens, generate_alone(m, cc.cache, r.prompt, r.max_tokens, so)) << cc.name;
      if (i == 0) {
        EXPECT_EQ(out.shared_prompt_tokens, 0) << cc.name;
      } else {  // at least the blocks the first had published when its prefill ended
        EXPECT_GE(out.shared_prompt_tokens, block) << cc.name << " choice " << i;
      }
    }
    wait_for_empty_pool(sched);
  }
}

TEST(Scheduler, CommonPrefixIsStoredOnce) {
  KIVI_REQUIRE_MODEL();
  const auto& m = stories();
  const auto& tk = m.tokenizer();
  std::string system;
  for (int i = 0; i < 10; ++i) system += std::string(kTexts[i]) + " ";
  for (const auto& cc : cache_cases()) {
    SchedulerOptions o;
    o.parallel = 4;
    o.ctx = 512;
    o.prefill_chunk = 32;
    o.cache = cc.cache;
    o.threads = 1;
    Scheduler sched(m, o);
    const int block = sched.cache_config().block();
    std::vector<int> first = tk.encode(system + kTexts[10], true);
    ASSERT_GT(static_cast<int>(first.size()), 2 * block);
    GenerationRequest r;
    r.prompt = first;
    r.max_tokens = o.ctx - static_cast<int>(first.size());
    r.ignore_eos = true;  // it must still hold its blocks when the others arrive
    std::shared_ptr<RequestHandle> h0;
    ASSERT_EQ(sched.submit(r, &h0), Scheduler::Submit::kQueued);
    // Wait until the first request is decoding: its prompt blocks are published.
    for (;;) {
      auto u = h0->wait(std::chrono::milliseconds(100));
      if (!u.tokens.empty() || u.finished) break;
    }
    // The others join while it runs (held, so it cannot end first on a busy machine).
    sched.pause();
    // The blocks the first sequence has published: those complete in its storage.
    const int published = sched.stats().blocks_published;
    ASSERT_GT(published, 0) << cc.name;
    std::vector<std::shared_ptr<RequestHandle>> hs(3);
    std::vector<std::vector<int>> prompts;
    for (int i = 0; i < 3; ++i) {
      GenerationRequest q;
      q.prompt = tk.encode(system + kTexts[11 + i], true);
      q.max_tokens = 30;
      prompts.push_back(q.prompt);
      ASSERT_EQ(sched.submit(q, &hs[i]), Scheduler::Submit::kQueued);
    }
    ASSERT_FALSE(h0->finished());
    sched.resume();
    for (int i = 0; i < 3; ++i) {
      const Outcome out = follow(hs[i]);
      EXPECT_EQ(out.tokens, generate_alone(m, cc.cache, prompts[i], 30, {})) << cc.name;
      // Every full block of the common prefix that the first sequence had published is
      // mapped, not stored again: exactly those (the three join in one admission, so
      // none maps another's blocks).
      size_t common = 0;
      while (common < first.size() && first[common] == prompts[i][common]) ++common;
      const int full_common = static_cast<int>(common) / block * block;
      EXPECT_EQ(out.shared_prompt_tokens, std::min(full_common, published * block)) << cc.name;
    }
    h0->cancel();
    follow(h0);
    wait_for_empty_pool(sched);
  }
}

// A scheduler for `parallel` sequences of up to 512 tokens, kivi2 caches with R = 32,
// `queue` places in its queue, one worker thread.
SchedulerOptions kivi2_options(int parallel, int queue) {
  SchedulerOptions o;
  o.parallel = parallel;
  o.ctx = 512;
  o.queue = queue;
  o.cache.k = o.cache.v = {kv::Format::kKivi2};
  o.cache.residual = 32;
  o.threads = 1;
  return o;
}

// Blocks on demand: admission takes a prompt's blocks, each step the blocks the next
// tokens need; the pool is never overcommitted and a full one preempts the newest
// sequence, which comes back later and still reaches max_tokens.
TEST(Scheduler, ThePoolIsNeverOvercommittedAndTheQueueIsBounded) {
  KIVI_REQUIRE_MODEL();
  const auto& m = stories();
  const auto& tk = m.tokenizer();
  SchedulerOptions o = kivi2_options(4, 3);
  o.kv_budget_tokens = 5 * 128;  // 5 blocks
  Scheduler sched(m, o);
  EXPECT_EQ(sched.stats().blocks_total, 5);
  GenerationRequest r;
  r.prompt = tk.encode(kTexts[0], true);
  // 2 blocks each at the end: three at once do not fit (different prompts: no shared
  // blocks), so one is preempted.
  r.ignore_eos = true;
  r.max_tokens = 200;
  std::shared_ptr<RequestHandle> h;
  GenerationRequest too_long = r;
  too_long.max_tokens = 512;
  EXPECT_EQ(sched.submit(too_long, &h), Scheduler::Submit::kTooLong);
  EXPECT_EQ(sched.submit(GenerationRequest{}, &h), Scheduler::Submit::kTooLong);
  std::vector<std::shared_ptr<RequestHandle>> hs;
  int full = 0;
  sched.pause();  // nothing leaves the queue while it fills
  for (int i = 0; i < 8; ++i) {
    std::shared_ptr<RequestHandle> x;
    GenerationRequest q = r;
    q.prompt = tk.encode(kTexts[i], true);
    const auto st = sched.submit(q, &x);
    if (st == Scheduler::Submit::kQueued) hs.push_back(x);
    if (st == Scheduler::Submit::kQueueFull) ++full;
  }
  EXPECT_EQ(full, 5);
  EXPECT_EQ(hs.size(), 3u);
  EXPECT_EQ(sched.stats().queued, 3);
  sched.resume();
  int max_active = 0;
  std::atomic<bool> done{false};
  std::thread watch([&] {
    while (!done) {
      const auto st = sched.stats();
      max_active = std::max(max_active, st.active);
      EXPECT_LE(st.blocks_used + st.blocks_reserved, 5);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  for (auto& x : hs) {
    const Outcome out = follow(x);
    EXPECT_EQ(out.reason, FinishReason::kLength);
    EXPECT_EQ(out.completion_tokens, 200);
  }
  done = true;
  watch.join();
  EXPECT_EQ(max_active, 3);  // each prompt takes one block at first
  wait_for_empty_pool(sched);
  const auto st = sched.stats();
  EXPECT_EQ(st.rejected_queue_full, static_cast<uint64_t>(full));
  EXPECT_GE(st.preemptions, 1u);
  EXPECT_GT(st.recomputed_tokens, 0u);
  EXPECT_EQ(st.admitted, 3u);  // a preempted sequence is not admitted twice
  // A request that could never fit the pool is refused at once.
  SchedulerOptions tiny = o;
  tiny.kv_budget_tokens = 128;
  Scheduler t(m, tiny);
  EXPECT_EQ(t.submit(r, &h), Scheduler::Submit::kOverBudget);
}

// Preempted sequences come back with their sampler and tokens: with the token-by-token
// prefill (which rebuilds the cache decoding built, bit for bit) every request gives
// exactly what it gives alone, greedy and sampled, in every cache format.
TEST(Scheduler, PreemptedSequencesGiveTheTokensTheyGiveAlone) {
  KIVI_REQUIRE_MODEL();
  const auto& m = stories();
  const auto& tk = m.tokenizer();
  for (const auto& cc : scheduler_cases()) {
    SchedulerOptions o;
    o.forward.prefill = attn::PrefillMode::kStream;
    o.parallel = 4;
    o.ctx = 512;
    o.queue = 8;
    o.prefill_chunk = 32;
    o.cache = cc.cache;
    o.threads = 1;
    o.kv_budget_tokens = 3 * 128;  // what one sequence needs: the others are preempted
    Scheduler sched(m, o);
    const int n = 4;
    std::vector<std::vector<int>> expected(n);
    std::vector<GenerationRequest> rs(n);
    for (int i = 0; i < n; ++i) {
      GenerationRequest& r = rs[i];
      r.prompt = tk.encode(kTexts[i], true);
      r.max_tokens = 300 - 40 * i;
      r.ignore_eos = true;
      if (i % 2 == 1) {
        r.sampling.temperature = 0.9f;
        r.sampling.top_k = 40;
        r.sampling.seed = 77 + i;
      }
      expected[i] = generate_alone_ignoring_eos(m, cc.cache, r.prompt, r.max_tokens, r.sampling);
    }
    const std::vector<Outcome> got = run_together(sched, rs);
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(got[i].tokens, expected[i]) << cc.name << " request " << i;
      EXPECT_EQ(got[i].reason, FinishReason::kLength) << cc.name;
    }
    wait_for_empty_pool(sched);
    EXPECT_GE(sched.stats().preemptions, 1u) << cc.name << ": " << sched.stats().blocks_total
                                             << " blocks of " << sched.stats().block_tokens;
  }
}

TEST(Scheduler, CancelledRequestsFreeTheirBlocksAtOnce) {
  KIVI_REQUIRE_MODEL();
  const auto& m = stories();
  const auto& tk = m.tokenizer();
  const SchedulerOptions o = kivi2_options(2, 8);
  Scheduler sched(m, o);
  std::vector<std::shared_ptr<RequestHandle>> hs(5);
  for (int i = 0; i < 5; ++i) {
    GenerationRequest r;
    r.prompt = tk.encode(kTexts[i], true);
    r.max_tokens = 450;
    r.ignore_eos = true;  // none ends before it is cancelled
    r.sampling.temperature = 1.0f;
    r.sampling.seed = i;
    ASSERT_EQ(sched.submit(r, &hs[i]), Scheduler::Submit::kQueued);
  }
  hs[4]->cancel();  // still queued
  const Outcome a = follow(hs[0], 5);
  EXPECT_EQ(a.reason, FinishReason::kCancelled);
  EXPECT_LT(a.completion_tokens, 450);
  sched.pause();  // the one running beside it cannot reach max_tokens meanwhile
  EXPECT_FALSE(hs[1]->finished());
  for (int i = 1; i < 4; ++i) hs[i]->cancel();
  EXPECT_EQ(sched.stats().cancelling, 4);  // 1..3, and 4 (still queued)
  sched.resume();
  for (int i = 1; i < 5; ++i) EXPECT_EQ(follow(hs[i]).reason, FinishReason::kCancelled);
  wait_for_empty_pool(sched);
  EXPECT_EQ(sched.stats().cancelled, 5u);
}

TEST(Scheduler, StopStringsEndGenerationAndAreNotReturned) {
  KIVI_REQUIRE_MODEL();
  const auto& m = stories();
  const auto& tk = m.tokenizer();
  SchedulerOptions o;
  o.parallel = 2;
  o.ctx = 512;
  o.threads = 1;
  Scheduler sched(m, o);
  GenerationRequest r;
  r.prompt = tk.encode(kTexts[0], true);
  r.max_tokens = 100;
  const std::vector<int> alone = generate_alone(m, o.cache, r.prompt, 100, {});
  const std::string text = tk.decode_all(alone, r.prompt.back());
  // A stop string from the middle of the greedy text.
  const size_t at = text.size() / 2;
  const std::string stop = text.substr(at, 5);
  r.stop = {"zzzz-not-there", stop};
  std::shared_ptr<RequestHandle> h;
  ASSERT_EQ(sched.submit(r, &h), Scheduler::Submit::kQueued);
  const Outcome out = follow(h);
  EXPECT_EQ(out.reason, FinishReason::kStop);
  EXPECT_EQ(out.text, text.substr(0, text.find(stop)));
  wait_for_empty_pool(sched);
}

TEST(TextStream, HoldsBackStopPrefixes) {
  runtime::TextStream a({"END", "\n\n", "\xC3\xA9t\xC3\xA9"});
  EXPECT_EQ(a.push("Hello E"), "Hello ");
  EXPECT_EQ(a.push("N"), "");
  EXPECT_EQ(a.push("x"), "ENx");
  EXPECT_EQ(a.push("\n"), "");
  EXPECT_EQ(a.push("\xC3\xA9"), "\n");  // a possible start of the third stop string
  EXPECT_EQ(a.push("!"), "\xC3\xA9!");
  EXPECT_EQ(a.push("ab EN"), "ab ");
  EXPECT_EQ(a.push("Dtrailing"), "");
  EXPECT_TRUE(a.stopped());
  EXPECT_EQ(a.text(), "Hello ENx\n\xC3\xA9!ab ");
  EXPECT_EQ(a.push("more"), "");
  EXPECT_EQ(a.finish(), "");
  runtime::TextStream b({"stop"});
  EXPECT_EQ(b.push("a st"), "a ");
  EXPECT_EQ(b.finish(), "st");  // the end: a stop string cannot complete now
  EXPECT_FALSE(b.stopped());
  runtime::TextStream c({"ab", "b"});
  EXPECT_EQ(c.push("xxab"), "xx");  // the earliest stop string wins
  EXPECT_TRUE(c.stopped());
  runtime::TextStream d({""});  // an empty stop string is ignored
  EXPECT_EQ(d.push("text"), "text");
}

}  // namespace
}  // namespace kivi
