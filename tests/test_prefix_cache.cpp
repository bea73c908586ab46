// The scheduler's prefix cache: a request that resumes a kept sequence (the next turn of
// a chat), or starts after the published blocks of a shared prompt prefix, gets the
// log-probabilities a cold prefill of its whole prompt gives, in every cache format: bit
// for bit with the token-by-token prefill (--prefill stream), within the tiled prefill's
// float bound with the tiled one (the kept tokens were decoded one at a time, a cold
// prefill reads them in tiles); kept sequences give their blocks and slots up, least
// recently used first.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "attn/prefill.h"

#include "kv/format.h"
#include "runtime/scheduler.h"
#include "test_util.h"

namespace kivi {
namespace {

using runtime::FinishReason;
using runtime::GenerationRequest;
using runtime::RequestHandle;
using runtime::Scheduler;
using runtime::SchedulerOptions;
using test::stories;

struct Case {
  std::string name;
  kv::CacheConfig cache;
  bool resumes_at_blocks;  // published blocks alone hold the state (no residual window)
  bool kivi = false;       // a stream in a KIVI format
};

std::vector<Case> cases() {
  auto make = [](const char* name, kv::Format k, kv::Format v, int G, int R, bool at_blocks,
                 kv::Int8Granularity g = kv::Int8Granularity::kHead) {
    Case c;
    c.name = name;
    c.cache.k = {k, g};
    c.cache.v = {v, g};
    c.cache.group_size = G;
    c.cache.residual = R;
    c.resumes_at_blocks = at_blocks;
    c.kivi = kv::is_kivi(k) || kv::is_kivi(v);
    return c;
  };
  std::vector<Case> out = {
      make("f32", kv::Format::kF32, kv::Format::kF32, 32, 0, true),
      make("f16", kv::Format::kF16, kv::Format::kF16, 32, 0, true),
      make("int8/token", kv::Format::kInt8, kv::Format::kInt8, 8, 0, true,
           kv::Int8Granularity::kToken),
      make("int8/group", kv::Format::kInt8, kv::Format::kInt8, 8, 0, true,
           kv::Int8Granularity::kGroup),
      make("kivi2 G32 R32", kv::Format::kKivi2, kv::Format::kKivi2, 32, 32, false),
      make("kivi2 R0", kv::Format::kKivi2, kv::Format::kKivi2, 32, 0, true),
  };
  Case g =
      make("kivi4/kivi2 G8 R24 group flush", kv::Format::kKivi4, kv::Format::kKivi2, 8, 24, false);
  g.cache.key_flush = kv::KeyFlush::kGroup;
  out.push_back(g);
  Case pre = make("kivi4 pre-RoPE keys", kv::Format::kKivi4, kv::Format::kKivi4, 32, 32, false);
  pre.cache.key_rope = kv::KeyRope::kPre;
  out.push_back(pre);
  Case sh = make("kivi2 layers share by 2", kv::Format::kKivi2, kv::Format::kKivi2, 32, 32, false);
  sh.cache.share_every = 2;
  out.push_back(sh);
  return out;
}

SchedulerOptions options(const Case& c, bool prefix_cache,
                         attn::PrefillMode prefill = attn::PrefillMode::kStream) {
  SchedulerOptions o;
  o.forward.prefill = prefill;
  o.parallel = 2;
  o.ctx = 512;
  o.prefill_chunk = 48;  // a resumed prompt's chunks fall elsewhere than a cold one's
  o.cache = c.cache;
  o.threads = 1;
  o.prefix_cache = prefix_cache;
  return o;
}

struct Outcome {
  std::vector<int> tokens;
  std::vector<runtime::TokenLogprob> logprobs;
  FinishReason reason = FinishReason::kNone;
  int cached = 0;
};

Outcome run(Scheduler& s, const std::vector<int>& prompt, int max_tokens) {
  GenerationRequest r;
  r.prompt = prompt;
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.logprobs = 3;
  std::shared_ptr<RequestHandle> h;
  Outcome o;
  if (s.submit(r, &h) != Scheduler::Submit::kQueued) {
    ADD_FAILURE() << "request refused";
    return o;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  for (;;) {
    auto u = h->wait(std::chrono::milliseconds(100));
    o.tokens.insert(o.tokens.end(), u.tokens.begin(), u.tokens.end());
    o.logprobs.insert(o.logprobs.end(), u.logprobs.begin(), u.logprobs.end());
    o.cached = u.cached_prompt_tokens;
    if (u.finished) {
      o.reason = u.reason;
      return o;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "request did not finish";
      return o;
    }
  }
}

// Same tokens, and the same log-probabilities: to the bit (tol = 0) or within tol.
void expect_same(const Outcome& got, const Outcome& cold, const std::string& what,
                 float tol = 0.0f) {
  EXPECT_EQ(got.tokens, cold.tokens) << what;
  ASSERT_EQ(got.logprobs.size(), cold.logprobs.size()) << what;
  for (size_t i = 0; i < got.logprobs.size(); ++i) {
    const auto &g = got.logprobs[i], &c = cold.logprobs[i];
    if (tol == 0.0f) {
      EXPECT_EQ(g.logprob, c.logprob) << what << " token " << i;
      EXPECT_EQ(g.top, c.top) << what << " token " << i;
      continue;
    }
    EXPECT_NEAR(g.logprob, c.logprob, tol) << what << " token " << i;
    ASSERT_EQ(g.top.size(), c.top.size()) << what;
    for (size_t k = 0; k < g.top.size(); ++k)
      EXPECT_NEAR(g.top[k].second, c.top[k].second, tol) << what << " token " << i;
  }
}

// Waits (bounded) until the scheduler's published counters show no sequence running.
runtime::SchedulerStats settled(const Scheduler& s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  auto st = s.stats();
  while ((st.active > 0 || st.queued > 0) && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    st = s.stats();
  }
  return st;
}

// The log-probability bound between a resumed and a cold tiled prefill on stories260K:
// the float differences of tiles and decoding (~3e-6 relative) round an int8 or KIVI code
// the other way now and then.
constexpr float kTiledTol = 1e-3f;
// Under the sanitizers the token-by-token prefill alone (test_prefill covers the tiles).
#ifdef KIVI_SANITIZE
constexpr attn::PrefillMode kModes[] = {attn::PrefillMode::kStream};
#else
constexpr attn::PrefillMode kModes[] = {attn::PrefillMode::kStream, attn::PrefillMode::kTiled};
#endif

int common_prefix(const std::vector<int>& a, const std::vector<int>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return static_cast<int>(n);
}

std::vector<int> concat(std::vector<int> a, const std::vector<int>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const char* kStory =
    "Once upon a time, there was a little girl named Lily. She liked to play in the park with "
    "her friend Tom. One day, they found a big red ball under a tree. Tom said, \"Let's play "
    "catch!\" Lily threw the ball and Tom ran to get it. They laughed and played until the sun "
    "went down. Then their moms called them home for dinner. ";

// The label of a case under a prefill mode.
std::string label(const Case& c, attn::PrefillMode mode) {
  return c.name + (mode == attn::PrefillMode::kTiled ? " tiled" : " stream");
}

// A shared system prompt of three stories (more than two blocks).
std::string system_prompt() { return std::string(kStory) + kStory + kStory; }

// `got` equals what a scheduler without the prefix cache gives for the same prompt.
void expect_as_cold(const Case& c, attn::PrefillMode mode, const Outcome& got,
                    const std::vector<int>& prompt, int max_tokens, const std::string& name) {
  Scheduler cold(stories(), options(c, false, mode));
  expect_same(got, run(cold, prompt, max_tokens), name,
              mode == attn::PrefillMode::kTiled ? kTiledTol : 0.0f);
}

// The next turn of a conversation resumes the kept sequence: only the new tokens are
// prefilled, and what comes out is what a cold prefill of the whole prompt gives.
TEST(PrefixCache, NextTurnResumesAndMatchesAColdPrefill) {
  KIVI_REQUIRE_MODEL();
  const auto& tk = stories().tokenizer();
  for (const attn::PrefillMode mode : kModes)
    for (const Case& c : cases()) {
      const std::string name = label(c, mode);
      Scheduler warm(stories(), options(c, true, mode));
      const std::vector<int> p1 = tk.encode(kStory, true);
      const Outcome t1 = run(warm, p1, 20);
      ASSERT_EQ(t1.reason, FinishReason::kLength) << c.name;
      EXPECT_EQ(t1.cached, 0) << c.name;
      const std::vector<int> p2 =
          concat(concat(p1, t1.tokens), tk.encode(" The next day, Lily saw a bird.", false));
      const Outcome t2 = run(warm, p2, 12);
      // The kept sequence held the first prompt and every generated token but the last.
      EXPECT_EQ(t2.cached, static_cast<int>(p1.size() + t1.tokens.size()) - 1) << c.name;
      // A third turn resumes the second.
      const std::vector<int> p3 = concat(concat(p2, t2.tokens), tk.encode(" She smiled.", false));
      const Outcome t3 = run(warm, p3, 12);
      EXPECT_EQ(t3.cached, static_cast<int>(p2.size() + t2.tokens.size()) - 1) << c.name;
      const auto st = settled(warm);
      EXPECT_EQ(st.prefix_queries, 3u) << c.name;
      EXPECT_EQ(st.prefix_hits, 2u) << c.name;
      EXPECT_EQ(st.prefill_tokens_saved, static_cast<uint64_t>(t2.cached + t3.cached)) << c.name;
      EXPECT_EQ(st.cached_sequences, 1) << c.name;
      EXPECT_EQ(st.cached_tokens, static_cast<int64_t>(p3.size() + t3.tokens.size()) - 1) << c.name;

      Scheduler cold(stories(), options(c, false, mode));
      const float tol = mode == attn::PrefillMode::kTiled ? kTiledTol : 0.0f;
      expect_same(t2, run(cold, p2, 12), name + " second turn", tol);
      expect_same(t3, run(cold, p3, 12), name + " third turn", tol);
      EXPECT_EQ(settled(cold).prefill_tokens_saved, 0u);
      EXPECT_EQ(settled(cold).cached_sequences, 0);
    }
}

// A kept sequence that shares a prefix with a new prompt is cut back to it when the
// prefix is at least half of what it holds: KIVI's rings keep rewind_tokens more rows,
// so every format cuts back exactly when the tokens to drop are that recent.
TEST(PrefixCache, AKeptSequenceIsCutBackToTheCommonPrefix) {
  KIVI_REQUIRE_MODEL();
  const auto& tk = stories().tokenizer();
  const std::string system = system_prompt();
  for (const attn::PrefillMode mode : kModes)
    for (const Case& c : cases()) {
      const std::string name = label(c, mode);
      Scheduler warm(stories(), options(c, true, mode));
      const std::vector<int> a = tk.encode(system + "Tom had a big red ball.", true);
      const std::vector<int> b = tk.encode(system + "The sun was hot and the sea was blue.", true);
      const int common = common_prefix(a, b);
      ASSERT_LT(static_cast<int>(a.size()) + 3 - common, 32) << name;  // within the rewind
      run(warm, a, 4);
      const Outcome got = run(warm, b, 10);
      EXPECT_EQ(got.cached, common) << name;
      const auto st = settled(warm);
      EXPECT_EQ(st.prefix_hits, 1u) << name;
      EXPECT_EQ(st.cached_sequences, 1) << name;  // b took a's slot
      EXPECT_EQ(st.blocks_used, st.cached_blocks) << name;
      expect_as_cold(c, mode, got, b, 10, name);
    }
}

// Tokens further back than the rewind have left KIVI's rings: such a prompt takes a fresh
// slot, which starts after the shared whole blocks where those hold the whole state (no
// residual window) and at token 0 otherwise. Formats without a residual cut back.
TEST(PrefixCache, BeyondTheRewindAFreshSlotMapsTheSharedBlocks) {
  KIVI_REQUIRE_MODEL();
  const auto& tk = stories().tokenizer();
  const std::string system = system_prompt();
  for (const attn::PrefillMode mode : kModes)
    for (const Case& c : cases()) {
      const std::string name = label(c, mode);
      Scheduler warm(stories(), options(c, true, mode));
      const int B = warm.cache_config().block();
      const std::vector<int> a =
          tk.encode(system +
                        "Tom had a big red ball. He liked to play with it in the park every "
                        "day. One day the ball rolled into the river and Tom was sad. His "
                        "dad helped him get it back. Then they went home and had a big "
                        "dinner with cake, and Tom slept with the ball next to his bed.",
                    true);
      const std::vector<int> b = tk.encode(system + "The sun was hot and the sea was blue.", true);
      const int common = common_prefix(a, b);
      ASSERT_GE(common, 2 * B) << name;
      ASSERT_GT(static_cast<int>(a.size()) - common, 64 + 32) << name;  // past the rewind
      ASSERT_GE(2 * common, static_cast<int>(a.size()) + 3) << name;    // worth cutting back
      run(warm, a, 4);
      const Outcome got = run(warm, b, 10);
      const int expected = !c.kivi ? common : c.resumes_at_blocks ? common / B * B : 0;
      EXPECT_EQ(got.cached, expected) << name;
      const auto st = settled(warm);
      EXPECT_EQ(st.prefix_hits, expected > 0 ? 1u : 0u) << name;
      EXPECT_EQ(st.cached_sequences, c.kivi ? 2 : 1) << name;
      expect_as_cold(c, mode, got, b, 10, name);
    }
}

// Concurrent requests with a common prefix (a shared system prompt): a joining request
// starts after the blocks the running one has published when those hold the state.
TEST(PrefixCache, AJoiningRequestStartsAfterPublishedBlocks) {
  KIVI_REQUIRE_MODEL();
  const auto& tk = stories().tokenizer();
  const std::string system = system_prompt();
  for (const Case& c : cases()) {
    Scheduler warm(stories(), options(c, true));
    const int B = warm.cache_config().block();
    const std::vector<int> a = tk.encode(system + "Tom had a big red ball.", true);
    const std::vector<int> b = tk.encode(system + "The sun was hot and the sea was blue.", true);
    const int common = common_prefix(a, b);
    GenerationRequest r;
    r.prompt = a;
    r.max_tokens = 512 - static_cast<int>(a.size());
    r.ignore_eos = true;
    std::shared_ptr<RequestHandle> h;
    ASSERT_EQ(warm.submit(r, &h), Scheduler::Submit::kQueued);
    for (;;) {  // decoding: its prompt's blocks are published
      const auto u = h->wait(std::chrono::milliseconds(100));
      if (!u.tokens.empty() || u.finished) break;
    }
    ASSERT_FALSE(h->finished());
    const Outcome got = run(warm, b, 10);
    EXPECT_EQ(got.cached, c.resumes_at_blocks ? common / B * B : 0) << c.name;
    h->cancel();
    expect_as_cold(c, attn::PrefillMode::kStream, got, b, 10, c.name);
  }
}

// Kept sequences give up their blocks, least recently used first, when a request needs
// memory, and their slots when every slot is taken; what comes after is unchanged.
TEST(PrefixCache, KeptSequencesAreEvictedLeastRecentlyUsedFirst) {
  KIVI_REQUIRE_MODEL();
  const auto& tk = stories().tokenizer();
  const Case c = cases()[4];  // kivi2 G32 R32
  const std::vector<int> a = tk.encode("Tom had a big red ball.", true);
  const std::vector<int> b = tk.encode("The sun was hot.", true);
  std::vector<int> long_prompt = tk.encode(std::string(kStory) + kStory, true);
  ASSERT_GT(static_cast<int>(long_prompt.size()), 200);
  long_prompt.resize(200);  // with its 20 tokens: 2 blocks
  Scheduler cold(stories(), options(c, false));
  const Outcome expected = run(cold, long_prompt, 20);
  {  // memory: three slots, a pool of three blocks
    SchedulerOptions o = options(c, true);
    o.parallel = 3;
    o.kv_budget_tokens = 3 * 128;
    Scheduler s(stories(), o);
    ASSERT_EQ(s.stats().blocks_total, 3);
    run(s, a, 150);  // 2 blocks, kept
    run(s, b, 4);    // 1 block, kept
    auto st = settled(s);
    EXPECT_EQ(st.cached_sequences, 2);
    EXPECT_EQ(st.blocks_used, 3);
    // 2 blocks for the prompt and its 20 tokens: the least recently used (a) goes.
    expect_same(run(s, long_prompt, 20), expected, "evicted for memory");
    st = settled(s);
    EXPECT_EQ(st.prefix_evictions, 1u);
    EXPECT_EQ(st.completed, 3u);
    EXPECT_EQ(st.cached_sequences, 2);
    EXPECT_EQ(st.blocks_reserved, 0);
    EXPECT_EQ(st.blocks_used, 3);
    EXPECT_EQ(st.cached_blocks, 3);
    EXPECT_EQ(st.cached_tokens, static_cast<int64_t>(b.size() + 3 + long_prompt.size() + 19));
  }
  {  // slots: one slot, a new prompt that does not extend the kept one takes it
    SchedulerOptions o = options(c, true);
    o.parallel = 1;
    Scheduler s(stories(), o);
    run(s, a, 10);
    expect_same(run(s, long_prompt, 20), expected, "evicted for a slot");
    const auto st = settled(s);
    EXPECT_EQ(st.prefix_evictions, 1u);
    EXPECT_EQ(st.prefix_hits, 0u);
    EXPECT_EQ(st.cached_sequences, 1);
  }
}

// With the prefix cache off an ended sequence keeps nothing.
TEST(PrefixCache, OffKeepsNothing) {
  KIVI_REQUIRE_MODEL();
  const auto& tk = stories().tokenizer();
  Scheduler s(stories(), options(cases()[1], false));
  run(s, tk.encode(kStory, true), 5);
  const auto st = settled(s);
  EXPECT_EQ(st.cached_sequences, 0);
  EXPECT_EQ(st.blocks_used, 0);
  EXPECT_EQ(st.prefix_queries, 0u);
}

}  // namespace
}  // namespace kivi
