#include "runtime/session_file.h"

#include <cstring>
#include <memory>

#include "core/checksum.h"
#include "core/error.h"
#include "core/timer.h"
#include "io/mapped_file.h"
#include "runtime/perplexity.h"

namespace kivi::runtime {

uint64_t cache_model_fingerprint(const model::Model& m) {
  Checksum c;
  const uint64_t base = model_fingerprint(m);
  c.update(&base, sizeof base);
  auto row = [&](const ops::Matrix& w) {
    const uint32_t type = static_cast<uint32_t>(w.dtype);
    c.update(&type, sizeof type);
    if (w.data && w.rows > 0) c.update(w.row(0), w.row_bytes());
  };
  const model::Weights& w = m.weights();
  row(w.token_embd);
  for (const model::LayerWeights& L : w.layers) {
    row(L.wk);
    row(L.wv);
  }
  return c.digest();
}

KvFileConfig session_file_config(const Session& s) {
  const SessionOptions& o = s.options();
  KvFileConfig c;
  c.cache = s.cache().config();
  c.overflow = static_cast<int>(o.overflow);
  c.sinks = o.sinks;
  c.window = o.overflow == ContextOverflow::kWindow ? o.forward.window : 0;
  if (s.sparse()) {
    const sparse::BlockSummaries& b = s.sparse()->summaries();
    c.summary_kind = static_cast<int>(b.kind());
    c.summary_block = c.summary_kind != 0 ? b.block() : 0;
  }
  return c;
}

// Sliding-window layers evict blocks as they go (their caches hold fewer blocks than the
// context and count the evicted tokens); the file format does not record that yet.
static void refuse_sliding_windows(const Session& s, const char* option) {
  const auto& c = s.model().config();
  if (c.sliding_window > 0) {
    fail(
        "%s: models with sliding-window layers (attention.sliding_window = %d) cannot be saved "
        "to or loaded from KV files yet",
        option, c.sliding_window);
  }
}

namespace {

using Sections = std::vector<KvSectionSource>;

// A section whose bytes are at hand.
void add_bytes(Sections& sec, KvSection kind, int layer, std::vector<uint8_t> b) {
  auto data = std::make_shared<std::vector<uint8_t>>(std::move(b));
  sec.push_back({static_cast<uint32_t>(kind), layer, data->size(),
                 [data](const ByteSink& f) { f(data->data(), data->size()); }});
}

// The sections every file starts with: the configuration, the session record (position
// offset, dropped tokens, overflows) and the token ids.
void add_head_sections(Sections& sec, const KvFileConfig& fc, int64_t position_offset,
                       int64_t dropped, int32_t overflows, const std::vector<int>& tokens) {
  add_bytes(sec, KvSection::kConfig, -1, encode_config(fc));
  std::vector<uint8_t> session(24, 0);
  std::memcpy(session.data(), &position_offset, 8);
  std::memcpy(session.data() + 8, &dropped, 8);
  std::memcpy(session.data() + 16, &overflows, 4);
  add_bytes(sec, KvSection::kSession, -1, std::move(session));
  std::vector<uint8_t> tok(tokens.size() * 4);
  if (!tokens.empty()) std::memcpy(tok.data(), tokens.data(), tok.size());
  add_bytes(sec, KvSection::kTokens, -1, std::move(tok));
}

// Each stored layer's state and parts, and its block-sparse summaries when the file
// records them.
void add_layer_sections(Sections& sec, const kv::KvCache& cache, const KvFileConfig& fc, int nb,
                        const sparse::BlockSummaries* summ) {
  const kv::CacheConfig& cc = cache.config();
  for (int l = 0; l < cc.n_layers; ++l) {
    if (cache.borrows(l)) continue;
    std::vector<uint8_t> st(kv::kLayerStateBytes);
    kv::encode_layer_state(cache.layer_state(l), st.data());
    add_bytes(sec, KvSection::kLayer, l, std::move(st));
    for (int w = 0; w < 2; ++w) {
      for (int q = 0; q < kv::kNumParts; ++q) {
        const auto stream = static_cast<kv::Stream>(w);
        const auto part = static_cast<kv::Part>(q);
        const size_t bytes = kv::part_bytes(cc.at_layer(l), stream, part, nb);
        if (bytes == 0) continue;
        sec.push_back({static_cast<uint32_t>(KvSection::kPart) + 8 * w + q, l, bytes,
                       [&cache, l, stream, part, nb](const ByteSink& f) {
                         cache.read_part(l, stream, part, nb,
                                         [&](const uint8_t* p, size_t b) { f(p, b); });
                       }});
      }
    }
    if (summ && fc.summary_kind != 0 && summ->has(l)) {
      const int done = summ->summarized(l);
      const size_t per_head =
          static_cast<size_t>(done / summ->block()) * summ->vectors() * cc.head_dim;
      sec.push_back({static_cast<uint32_t>(KvSection::kSparse), l,
                     8 + per_head * cc.n_kv_heads * sizeof(f16_t),
                     [summ, l, done, per_head, H = cc.n_kv_heads](const ByteSink& f) {
                       const int32_t head[2] = {done, 0};
                       f(head, sizeof head);
                       for (int h = 0; h < H; ++h) f(summ->head(l, h), per_head * sizeof(f16_t));
                     }});
    }
  }
}

}  // namespace

uint64_t save_session(const Session& s, const std::vector<int>& tokens, int64_t prefill_tokens,
                      double prefill_seconds, const std::string& path, const ChatRecord* chat) {
  refuse_sliding_windows(s, "--kv-save");
  const kv::KvCache& cache = s.cache();
  const kv::CacheConfig& cc = cache.config();
  const KvFileConfig fc = session_file_config(s);
  // A context shard (--dist cp) saves the tokens it holds; the shard record says which.
  const model::CpShard* cp = s.cp_shard();
  const int n = cp ? cache.position(0) : s.pos(), B = cc.block(), nb = (n + B - 1) / B;

  Sections sec;
  add_head_sections(sec, fc, s.position_offset(), s.dropped(), s.overflows(), tokens);
  if (chat) {
    std::vector<uint8_t> c(40, 0);
    const int32_t turns = chat->turns;
    std::memcpy(c.data(), &turns, 4);
    std::memcpy(c.data() + 8, chat->rng, 32);
    add_bytes(sec, KvSection::kChat, -1, std::move(c));
  }
  if (cp) {
    std::vector<uint8_t> b(24, 0);
    const int32_t v[4] = {cp->comm->size(), cp->comm->rank(), cp->start, cp->size};
    const int64_t positions = s.pos();
    std::memcpy(b.data(), v, 16);
    std::memcpy(b.data() + 16, &positions, 8);
    add_bytes(sec, KvSection::kShard, -1, std::move(b));
  }

  const sparse::BlockSummaries* summ = s.sparse() ? &s.sparse()->summaries() : nullptr;
  add_layer_sections(sec, cache, fc, nb, summ);
  KvFileHeader h;
  h.fingerprint = cache_model_fingerprint(s.model());
  h.n_tokens = n;
  h.prefill_tokens = prefill_tokens;
  h.prefill_seconds = prefill_seconds;
  return write_kv_file(path, h, sec);
}

// A context shard's file continues only in the same shard of the same layout.
static void check_shard(const KvFile& f, const model::CpShard* cp, const std::string& path) {
  const KvFile::Shard& sh = f.shard;
  if (!cp && sh.ranks > 0) {
    fail(
        "%s: saved by rank %d of --dist cp=%d (a shard of the context); load it under the same "
        "layout",
        path.c_str(), sh.rank, sh.ranks);
  }
  if (!cp) return;
  const int ranks = cp->comm->size(), rank = cp->comm->rank();
  if (sh.ranks == 0) {
    fail("%s: saved with the whole context in one cache; this rank of --dist cp=%d holds a shard",
         path.c_str(), ranks);
  }
  if (sh.ranks != ranks || sh.rank != rank || sh.start != cp->start || sh.size != cp->size) {
    fail(
        "%s: saved by rank %d of --dist cp=%d (positions %d + %d); this is rank %d of cp=%d "
        "(positions %d + %d)",
        path.c_str(), sh.rank, sh.ranks, sh.start, sh.size, rank, ranks, cp->start, cp->size);
  }
}

LoadedSession load_session(Session& s, const std::string& path) {
  refuse_sliding_windows(s, "--kv-load");
  const double t0 = now_seconds();
  io::MappedFile map(path);
  const KvFile f = parse_kv_file(map.data(), map.size(), path);
  const KvFileConfig here = session_file_config(s);
  check_kv_file(f, cache_model_fingerprint(s.model()), here, s.ctx(), s.vocab());
  check_shard(f, s.cp_shard(), path);

  s.reset();
  kv::KvCache& cache = s.cache();
  const kv::KvCache::FileSource source{map.fd(), map.data()};
  uint64_t mapped = 0;
  for (const KvFileLayer& L : f.layers) mapped += cache.restore(L.layer, L.state, L.parts, &source);
  s.restore_counters(f.position_offset, f.dropped, f.overflows);
  if (f.shard.ranks > 0) s.restore_cp_position(f.shard.positions);
  // Block-sparse summaries: taken when this session keeps the same kind, else
  // recomputed from the cache on the first sparse step (they are a function of it).
  if (s.sparse() && here.summary_kind == f.config.summary_kind &&
      here.summary_block == f.config.summary_block) {
    sparse::BlockSummaries& b = s.sparse()->summaries();
    for (const KvFileLayer& L : f.layers) {
      if (L.sparse_done > 0 && b.has(L.layer)) b.restore(L.layer, L.sparse_done, L.sparse);
    }
  }
  LoadedSession r;
  r.tokens = f.tokens;
  r.n_tokens = f.shard.ranks > 0 ? static_cast<int>(f.shard.positions) : f.n_tokens;
  r.prefill_tokens = f.prefill_tokens;
  r.prefill_seconds = f.prefill_seconds;
  r.bytes = f.bytes;
  r.mapped_bytes = mapped;
  r.is_chat = f.chat;
  r.chat.turns = f.chat_turns;
  for (int i = 0; i < 4; ++i) r.chat.rng[i] = f.chat_rng[i];
  r.load_seconds = now_seconds() - t0;
  return r;
}

uint64_t save_cache(const model::Model& m, const kv::KvCache& cache, const std::vector<int>& tokens,
                    const std::string& path) {
  const kv::CacheConfig& cc = cache.config();
  int first = 0;
  while (first < cc.n_layers && cache.borrows(first)) ++first;
  const int n = cache.n_tokens(first), B = cc.block(), nb = (n + B - 1) / B;
  if (static_cast<int>(tokens.size()) != n)
    fail("internal: %zu tokens saved with a cache of %d", tokens.size(), n);
  KvFileConfig fc;
  fc.cache = cc;
  Sections sec;
  add_head_sections(sec, fc, 0, 0, 0, tokens);
  add_layer_sections(sec, cache, fc, nb, nullptr);
  KvFileHeader h;
  h.fingerprint = cache_model_fingerprint(m);
  h.n_tokens = n;
  return write_kv_file(path, h, sec);
}

CacheFile open_cache_file(const model::Model& m, const kv::CacheConfig& here,
                          const std::string& path) {
  CacheFile c;
  c.map = std::make_unique<io::MappedFile>(path);
  c.file = parse_kv_file(c.map->data(), c.map->size(), path);
  const KvFile& f = c.file;
  KvFileConfig h;
  h.cache = here;
  check_kv_file(f, cache_model_fingerprint(m), h, here.ctx, m.config().vocab_size);
  const char* nm = path.c_str();
  if (f.shard.ranks > 0)
    fail("%s: a shard of --dist cp=%d, not a whole context", nm, f.shard.ranks);
  if (f.position_offset != 0 || f.dropped != 0)
    fail(
        "%s: saved after its context shifted (%lld tokens dropped); it continues only in a session "
        "with the same policy",
        nm, static_cast<long long>(f.dropped));
  if (f.n_tokens < 1) fail("%s: holds no tokens", nm);
  if (static_cast<int>(f.tokens.size()) != f.n_tokens)
    fail("%s: %d tokens in its cache but %zu token ids", nm, f.n_tokens, f.tokens.size());
  return c;
}

std::vector<int> restore_cache(kv::KvCache& cache, const CacheFile& c) {
  const kv::KvCache::FileSource source{c.map->fd(), c.map->data()};
  for (const KvFileLayer& L : c.file.layers) cache.restore(L.layer, L.state, L.parts, &source);
  return c.file.tokens;
}

}  // namespace kivi::runtime
