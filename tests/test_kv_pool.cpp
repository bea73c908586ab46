// The shared block pool: caches drawing blocks from one pool hold exactly what caches
// with their own storage hold (attention over them gives the same bits), blocks and
// reservations return to the pool, and identical prefixes are stored once.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "attn/attention.h"
#include "core/error.h"
#include "core/rng.h"
#include "kv/block_pool.h"
#include "kv/kv_cache.h"
#include "test_util.h"

namespace kivi {
namespace {

using kv::CacheConfig;
using kv::Format;
using kv::Int8Granularity;

CacheConfig config(Format f, Int8Granularity g = Int8Granularity::kHead, int G = 8, int R = 16) {
  CacheConfig c;
  c.n_layers = 2;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.ctx = 200;
  c.k = {f, g};
  c.v = {f, g};
  c.group_size = G;
  c.residual = R;
  c.block_tokens = 16;
  return c;
}

// Keys and values of token `tok` at position `pos` of a sequence: a deterministic
// function of both, like the forward pass's (given the same prefix).
void kv_of(int tok, int pos, int layer, int n, float* k, float* v) {
  Rng r(static_cast<uint64_t>(tok) * 1000003u + static_cast<uint64_t>(pos) * 7919u + layer);
  for (int i = 0; i < n; ++i) {
    k[i] = r.normal() * ((i % 16 == 3) ? 6.0f : 1.0f);
    v[i] = r.normal();
  }
}

void feed(kv::KvCache& c, const std::vector<int>& tokens, int from, int to) {
  const auto& cfg = c.config();
  const int n = cfg.n_kv_heads * cfg.head_dim;
  std::vector<float> k(n), v(n);
  for (int p = from; p < to; ++p) {
    for (int l = 0; l < cfg.n_layers; ++l) {
      if (c.borrows(l)) continue;
      kv_of(tokens[p], p, l, n, k.data(), v.data());
      c.append(l, k.data(), v.data());
    }
  }
}

// Attention of a fixed query over every layer: the same bits for two caches that hold
// the same tokens.
std::vector<float> attend(const kv::KvCache& c) {
  const auto& cfg = c.config();
  const int n_heads = cfg.n_kv_heads * 2;
  attn::Workspace ws(1, n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.block(), cfg.ctx);
  std::vector<float> q(static_cast<size_t>(n_heads) * cfg.head_dim), out(q.size()), all;
  Rng r(99);
  for (auto& x : q) x = r.normal();
  attn::Params p;
  p.n_heads = n_heads;
  p.scale = 0.25f;
  for (int l = 0; l < cfg.n_layers; ++l) {
    attn::decode(c.view(l), q.data(), out.data(), p, nullptr, ws);
    all.insert(all.end(), out.begin(), out.end());
  }
  return all;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<int> random_tokens(uint64_t seed, int n) {
  Rng r(seed);
  std::vector<int> t(n);
  for (auto& x : t) x = static_cast<int>(r.next_u64() % 500);
  return t;
}

const std::vector<CacheConfig> kConfigs = {config(Format::kF32),
                                           config(Format::kF16),
                                           config(Format::kInt8, Int8Granularity::kToken),
                                           config(Format::kInt8, Int8Granularity::kGroup),
                                           config(Format::kKivi2),
                                           config(Format::kKivi4, {}, 8, 0),
                                           config(Format::kKivi2, {}, 16, 32),
                                           [] {
                                             CacheConfig c = config(Format::kKivi2);
                                             c.n_layers = 3;
                                             c.share_every = 2;  // layer 1 reads layer 0's cache
                                             return c;
                                           }()};

TEST(BlockPool, BytesPerBlockMatchesTheCacheFormulas) {
  for (CacheConfig c : kConfigs) {
    c.ctx = c.block() * 5;
    const kv::BlockPool pool(c, 5);
    EXPECT_EQ(pool.bytes_reserved(), 5 * kv::BlockPool::bytes_per_block(c)) << kv::describe(c.k);
    // An own pool of the same blocks is what a single cache reserves, minus rings and tables.
    const kv::KvCache cache(c);
    const uint64_t stored = kv::stored_layers(c);
    const uint64_t rings =
        static_cast<uint64_t>(kv::key_ring_capacity(c) + kv::value_ring_capacity(c)) *
        c.n_kv_heads * c.head_dim * sizeof(float) * stored;
    EXPECT_EQ(cache.bytes_reserved(), pool.bytes_reserved() + rings + 5 * sizeof(int32_t) * stored);
  }
}

// Sequences growing in turns on one pool get scattered physical blocks; each holds the
// same bits as a cache of its own.
TEST(BlockPool, InterleavedSequencesMatchPrivateCaches) {
  for (const CacheConfig& c : kConfigs) {
    kv::BlockPool pool(c, 40);
    const int n_seq = 3;
    std::vector<std::unique_ptr<kv::KvCache>> shared, own;
    std::vector<std::vector<int>> toks;
    for (int s = 0; s < n_seq; ++s) {
      shared.push_back(std::make_unique<kv::KvCache>(pool, c.ctx));
      own.push_back(std::make_unique<kv::KvCache>(c));
      toks.push_back(random_tokens(10 + s, c.ctx));
      ASSERT_TRUE(shared.back()->reserve(150));
    }
    const int steps[] = {5, 1, 17, 3, 30, 1, 1, 20, 9, 40};
    std::vector<int> pos(n_seq, 0);
    for (int round = 0; round < 10; ++round) {
      for (int s = 0; s < n_seq; ++s) {
        const int to = std::min(150, pos[s] + steps[(round + s) % 10]);
        feed(*shared[s], toks[s], pos[s], to);
        feed(*own[s], toks[s], pos[s], to);
        pos[s] = to;
        ASSERT_TRUE(same_bits(attend(*shared[s]), attend(*own[s])))
            << kv::describe(c.k) << " seq " << s;
        ASSERT_EQ(shared[s]->bytes_used(), own[s]->bytes_used());
      }
    }
    // Blocks were drawn from the reservations only; everything returns on clear.
    EXPECT_EQ(pool.used_blocks() + pool.reserved_blocks(), n_seq * ((150 + 15) / 16));
    for (auto& s : shared) s->clear();
    EXPECT_EQ(pool.used_blocks(), 0);
    EXPECT_EQ(pool.reserved_blocks(), 0);
    EXPECT_EQ(pool.free_blocks(), 40);
  }
}

TEST(BlockPool, ReservationsNeverOvercommit) {
  const CacheConfig c = config(Format::kKivi2);
  kv::BlockPool pool(c, 10);
  kv::KvCache a(pool, c.ctx), b(pool, c.ctx), d(pool, c.ctx);
  EXPECT_TRUE(a.reserve(100));  // 7 blocks
  EXPECT_FALSE(b.reserve(64));  // 4 blocks: only 3 left
  EXPECT_EQ(pool.available_blocks(), 3);
  EXPECT_TRUE(b.reserve(48));
  EXPECT_EQ(pool.available_blocks(), 0);
  EXPECT_FALSE(d.reserve(1));
  EXPECT_FALSE(a.reserve(c.ctx + 1));  // beyond the context
  // Without a reservation, growth fails cleanly once nothing is available.
  std::vector<int> t = random_tokens(1, 20);
  EXPECT_THROW(feed(d, t, 0, 1), Error);
  feed(a, random_tokens(2, 100), 0, 100);
  EXPECT_EQ(a.blocks_mapped(), 7);
  EXPECT_EQ(a.blocks_reserved(), 0);
  a.clear();
  EXPECT_EQ(pool.available_blocks(), 7);
  EXPECT_TRUE(d.reserve(100));
}

// A prefix published by one sequence is mapped by the next, which stores only what
// follows; both attend exactly as private caches do.
TEST(BlockPool, IdenticalPrefixesAreStoredOnce) {
  for (const CacheConfig& c : kConfigs) {
    kv::BlockPool pool(c, 60);
    const std::vector<int> prefix = random_tokens(7, 100);  // 6 full blocks of 16 and 4 tokens
    auto prompt = [&](uint64_t seed) {
      std::vector<int> t = prefix;
      const auto tail = random_tokens(seed, 60);
      t.insert(t.end(), tail.begin(), tail.end());
      return t;
    };
    const std::vector<int> ta = prompt(1), tb = prompt(2);
    kv::KvCache a(pool, c.ctx), b(pool, c.ctx), ra(c), rb(c);
    ASSERT_EQ(a.share_prefix(ta.data(), 160), 0);
    ASSERT_TRUE(a.reserve(160));
    feed(a, ta, 0, 160);
    a.publish(ta.data());
    feed(ra, ta, 0, 160);
    const int used_a = pool.used_blocks();
    EXPECT_EQ(used_a, 10);
    // b finds the 6 full blocks of the common prefix.
    EXPECT_EQ(b.share_prefix(tb.data(), 160), 6) << kv::describe(c.k);
    ASSERT_TRUE(b.reserve(160));
    EXPECT_EQ(b.blocks_reserved(), 4);
    feed(b, tb, 0, 160);
    b.publish(tb.data());
    feed(rb, tb, 0, 160);
    EXPECT_EQ(pool.used_blocks(), used_a + 4);
    EXPECT_EQ(pool.shared_blocks(), 6);
    EXPECT_EQ(b.blocks_shared(), 6);
    EXPECT_TRUE(same_bits(attend(a), attend(ra))) << kv::describe(c.k);
    EXPECT_TRUE(same_bits(attend(b), attend(rb))) << kv::describe(c.k);
    // The first sequence leaves; the second keeps the shared blocks.
    a.clear();
    EXPECT_EQ(pool.used_blocks(), 10);
    EXPECT_EQ(pool.shared_blocks(), 0);
    EXPECT_TRUE(same_bits(attend(b), attend(rb)));
    b.clear();
    EXPECT_EQ(pool.used_blocks(), 0);
    EXPECT_EQ(pool.published_blocks(), 0);
  }
}

// A block's contents depend on every token before it, so it is published under its
// parent block too: the same 16 tokens after a different first block are not shared,
// and the chain stops at the first block that differs.
TEST(BlockPool, ABlockRecursOnlyAfterTheSamePrefix) {
  const CacheConfig c = config(Format::kKivi2);
  kv::BlockPool pool(c, 60);
  const std::vector<int> x = random_tokens(1, 16), y = random_tokens(2, 16),
                         z = random_tokens(3, 16);
  auto cat = [](std::initializer_list<const std::vector<int>*> parts) {
    std::vector<int> t;
    for (const auto* p : parts) t.insert(t.end(), p->begin(), p->end());
    return t;
  };
  const std::vector<int> ta = cat({&x, &y, &z}), tb = cat({&z, &y, &z}), tc = cat({&x, &y, &y});
  kv::KvCache a(pool, c.ctx), b(pool, c.ctx), cc(pool, c.ctx), rb(c), rc(c);
  ASSERT_TRUE(a.reserve(48));
  feed(a, ta, 0, 48);
  a.publish(ta.data());
  const int published = pool.published_blocks();
  EXPECT_GE(published, 2);
  // b's second and third blocks hold y and z as a's do, after another first block.
  EXPECT_EQ(b.share_prefix(tb.data(), 48), 0);
  ASSERT_TRUE(b.reserve(48));
  feed(b, tb, 0, 48);
  feed(rb, tb, 0, 48);
  EXPECT_EQ(b.blocks_shared(), 0);
  EXPECT_TRUE(same_bits(attend(b), attend(rb)));
  // c shares x and y, then differs.
  EXPECT_EQ(cc.share_prefix(tc.data(), 48), 2);
  ASSERT_TRUE(cc.reserve(48));
  feed(cc, tc, 0, 48);
  feed(rc, tc, 0, 48);
  EXPECT_EQ(cc.blocks_shared(), 2);
  EXPECT_TRUE(same_bits(attend(cc), attend(rc)));
  a.clear();
  b.clear();
  cc.clear();
  EXPECT_EQ(pool.used_blocks(), 0);
}

// Two sequences with the same prompt fed side by side: neither can map the other's
// blocks at the start, but once complete blocks are published the copies are
// replaced by one block.
TEST(BlockPool, ConcurrentIdenticalPrefixesAreMerged) {
  for (const CacheConfig& c : kConfigs) {
    kv::BlockPool pool(c, 60);
    const std::vector<int> t = random_tokens(3, 120);
    kv::KvCache a(pool, c.ctx), b(pool, c.ctx), r(c);
    ASSERT_TRUE(a.reserve(120));
    ASSERT_TRUE(b.reserve(120));
    for (int p = 0; p < 120; p += 8) {
      feed(a, t, p, p + 8);
      a.publish(t.data());
      feed(b, t, p, p + 8);
      b.publish(t.data());
    }
    feed(r, t, 0, 120);
    const int stored = kv::values_quantized_after(c, 120) < kv::keys_quantized_after(c, 120)
                           ? kv::values_quantized_after(c, 120)
                           : kv::keys_quantized_after(c, 120);
    const int complete = stored / 16;
    EXPECT_EQ(b.blocks_shared(), complete) << kv::describe(c.k);
    EXPECT_EQ(pool.used_blocks(), 2 * 8 - complete);
    EXPECT_TRUE(same_bits(attend(a), attend(r)));
    EXPECT_TRUE(same_bits(attend(b), attend(r)));
    a.clear();
    b.clear();
    EXPECT_EQ(pool.used_blocks(), 0);
    EXPECT_EQ(pool.reserved_blocks(), 0);
  }
}

TEST(BlockPool, SharingIsOffWhereContentsDependOnMoreThanThePrefix) {
  const CacheConfig c = config(Format::kInt8, Int8Granularity::kTensor);
  kv::BlockPool pool(c, 20);
  EXPECT_FALSE(pool.prefix_sharing());
  kv::KvCache a(pool, c.ctx);
  const auto t = random_tokens(5, 64);
  ASSERT_TRUE(a.reserve(64));
  feed(a, t, 0, 64);
  a.publish(t.data());
  EXPECT_EQ(pool.published_blocks(), 0);
  kv::KvCache b(pool, c.ctx);
  EXPECT_EQ(b.share_prefix(t.data(), 64), 0);
}

// A layer reading another layer's KIVI cache sees its stored blocks and its residual
// ring, as the owner does.
TEST(KvCacheSharing, BorrowersSeeTheResidualWindow) {
  CacheConfig c = config(Format::kKivi2);
  c.n_layers = 2;
  c.share_every = 2;
  kv::KvCache cache(c);
  feed(cache, random_tokens(4, 50), 0, 50);
  const kv::LayerView own = cache.view(0), borrowed = cache.view_prefix(1, 50);
  EXPECT_EQ(borrowed.n_tokens, 50);
  EXPECT_EQ(borrowed.k.n_stored, own.k.n_stored);
  EXPECT_EQ(borrowed.v.n_stored, own.v.n_stored);
  EXPECT_LT(borrowed.k.n_stored, 50);
  EXPECT_THROW(cache.view_prefix(1, 49), Error);
}

TEST(BlockPool, BadUseIsAnError) {
  const CacheConfig c = config(Format::kF16);
  EXPECT_THROW(kv::BlockPool(c, 0), Error);
  kv::BlockPool pool(c, 4);
  EXPECT_THROW(pool.unreserve(1), Error);
  EXPECT_THROW(pool.release(0), Error);
  EXPECT_THROW(pool.allocate(true), Error);
  for (int i = 0; i < 4; ++i) pool.allocate(false);
  EXPECT_THROW(pool.allocate(false), Error);
  kv::KvCache a(pool, c.ctx);
  const auto t = random_tokens(5, 64);
  EXPECT_THROW(feed(a, t, 0, 1), Error);  // no block left to map
}

}  // namespace
}  // namespace kivi
