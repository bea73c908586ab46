#include "runtime/kv_file.h"

#include <algorithm>
#include <cinttypes>
#include <cstring>

#include "core/checksum.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "kv/block_pool.h"
#include "kv/tq.h"
#include "sparse/options.h"

namespace kivi::runtime {

namespace {

const char kMagic[8] = {'K', 'I', 'V', 'I', 'K', 'V', 'C', '\0'};
constexpr int kConfigFields = 27;

// One i32 field of the config section: its name, its value and how to print it.
struct Field {
  std::string name;
  int32_t value;
  std::string (*show)(int32_t);
  bool compared;  // part of the cache's identity (the context is checked on its own)
};

std::string show_int(int32_t v) { return std::to_string(v); }
std::string show_format(int32_t v) {
  return v >= 0 && v < kv::kNumFormats ? kv::format_name(static_cast<kv::Format>(v)) : "?";
}
std::string show_granularity(int32_t v) {
  return v >= 0 && v < 4 ? kv::granularity_name(static_cast<kv::Int8Granularity>(v)) : "-";
}
std::string show_flush(int32_t v) {
  return v >= 0 && v < 2 ? kv::key_flush_name(static_cast<kv::KeyFlush>(v)) : "-";
}
std::string show_param(int32_t v) {
  return v >= 0 && v < 2 ? kv::param_type_name(static_cast<kv::ParamType>(v)) : "?";
}
std::string show_rope(int32_t v) {
  return v >= 0 && v < 2 ? kv::key_rope_name(static_cast<kv::KeyRope>(v)) : "?";
}
std::string show_rotate(int32_t v) { return kv::kv_rotate_name(static_cast<kv::KvRotate>(v)); }
std::string show_hex(int32_t v) { return strfmt("0x%08x", static_cast<uint32_t>(v)); }
std::string show_overflow(int32_t v) {
  static const char* names[] = {"stop", "shift", "window"};
  return v >= 0 && v < 3 ? names[v] : "?";
}

// The fields, normalized: options a format does not use are written as 0, so that
// they never make two equal caches differ.
// A cache configuration with per-layer formats written as it reads: one format pair for
// every layer (a map that gives every layer the same pair) becomes the uniform
// configuration; a true mix keeps its layers and neutral (f32) stream fields.
kv::CacheConfig normalized(kv::CacheConfig c) {
  if (!c.mixed()) return c;
  const auto& f = c.layer_formats;
  if (std::all_of(f.begin(), f.end(), [&](const auto& x) { return x == f[0]; })) {
    c.k = f[0].k;
    c.v = f[0].v;
    c.layer_formats.clear();
  } else {
    c.k = c.v = {kv::Format::kF32, kv::Int8Granularity::kHead};
  }
  c.layer_map.clear();
  return c;
}

int32_t granularity_field(const kv::StreamFormat& s) {
  return s.format == kv::Format::kInt8 ? static_cast<int32_t>(s.granularity) : 0;
}

// A stream's tq codebooks by their fingerprints (kv/tq.h) over the layers, 0 without tq.
int32_t codebook_field(const kv::CacheConfig& c, bool key) {
  uint32_t h = 0;
  for (const auto& f : c.formats()) {
    const kv::TqCodec* t = kv::tq_codec((key ? f.k : f.v).format, c.head_dim);
    if (t) h = (h * 31u + t->fingerprint()) & 0x7fffffffu;
  }
  return static_cast<int32_t>(h);
}

// The fields, normalized: options a format does not use are written as 0, so that
// they never make two equal caches differ.
std::vector<Field> fields(const KvFileConfig& f) {
  const kv::CacheConfig c = normalized(f.cache);
  const bool stop = f.overflow == 0;
  const bool tq = c.any_stream([](const kv::StreamFormat& s, bool) { return kv::is_tq(s.format); });
  // --kv-rotate, where some stream other than tq's is rotated (0 otherwise).
  const bool rotates = c.rotates(true) || c.rotates(false);
  const bool kivi_keys = c.any_stream(
      [](const kv::StreamFormat& s, bool key) { return key && kv::is_kivi(s.format); });
  const uint64_t seed = tq || rotates ? c.rotation_seed : 0;
  std::vector<Field> v = {
      {"layers", c.n_layers, show_int, true},
      {"KV heads", c.n_kv_heads, show_int, true},
      {"head dim", c.head_dim, show_int, true},
      {"context", c.ctx, show_int, false},
      {"key format", static_cast<int32_t>(c.k.format), show_format, true},
      {"key int8 granularity", granularity_field(c.k), show_granularity, true},
      {"value format", static_cast<int32_t>(c.v.format), show_format, true},
      {"value int8 granularity", granularity_field(c.v), show_granularity, true},
      {"group size", c.group_size, show_int, true},
      {"residual", c.has_residual() ? c.residual : 0, show_int, true},
      {"key flush", kivi_keys ? static_cast<int32_t>(c.key_flush) : 0, show_flush, true},
      {"parameter type", static_cast<int32_t>(c.param_type), show_param, true},
      {"block tokens", c.block(), show_int, true},
      {"key RoPE", static_cast<int32_t>(c.key_rope), show_rope, true},
      {"share every", c.share_every, show_int, true},
      {"context overflow", f.overflow, show_overflow, true},
      {"sinks", stop ? 0 : f.sinks, show_int, true},
      {"window", f.overflow == 2 ? f.window : 0, show_int, true},
      {"sparse summary kind", f.summary_kind, show_int, false},
      {"sparse summary block", f.summary_block, show_int, false},
      {"share map pairs", static_cast<int32_t>(c.share_map.size()), show_int, true},
      {"rotation seed (low half)", static_cast<int32_t>(static_cast<uint32_t>(seed)), show_hex,
       true},
      {"rotation seed (high half)", static_cast<int32_t>(static_cast<uint32_t>(seed >> 32)),
       show_hex, true},
      {"key codebook", codebook_field(c, true), show_hex, true},
      {"value codebook", codebook_field(c, false), show_hex, true},
      {"per-layer formats", static_cast<int32_t>(c.layer_formats.size()), show_int, true},
      {"rotation", rotates ? static_cast<int32_t>(c.rotate) : 0, show_rotate, true},
  };
  for (const auto& [b, o] : c.share_map) {
    v.push_back({"share map borrower", b, show_int, true});
    v.push_back({"share map owner", o, show_int, true});
  }
  for (size_t l = 0; l < c.layer_formats.size(); ++l) {
    const auto& lf = c.layer_formats[l];
    v.push_back(
        {strfmt("layer %zu key format", l), static_cast<int32_t>(lf.k.format), show_format, true});
    v.push_back({strfmt("layer %zu key int8 granularity", l), granularity_field(lf.k),
                 show_granularity, true});
    v.push_back({strfmt("layer %zu value format", l), static_cast<int32_t>(lf.v.format),
                 show_format, true});
    v.push_back({strfmt("layer %zu value int8 granularity", l), granularity_field(lf.v),
                 show_granularity, true});
  }
  return v;
}

int32_t get_i32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

std::string section_name(uint32_t kind, int32_t layer) {
  std::string s;
  if (kind == static_cast<uint32_t>(KvSection::kConfig)) {
    s = "config";
  } else if (kind == static_cast<uint32_t>(KvSection::kSession)) {
    s = "session";
  } else if (kind == static_cast<uint32_t>(KvSection::kTokens)) {
    s = "tokens";
  } else if (kind == static_cast<uint32_t>(KvSection::kChat)) {
    s = "chat";
  } else if (kind == static_cast<uint32_t>(KvSection::kShard)) {
    s = "shard";
  } else if (kind == static_cast<uint32_t>(KvSection::kLayer)) {
    s = "layer state";
  } else if (kind >= 16 && kind < 16 + 8 * 2 && (kind - 16) % 8 < kv::kNumParts) {
    s = std::string((kind - 16) / 8 ? "value " : "key ") +
        kv::part_name(static_cast<kv::Part>((kind - 16) % 8));
  } else if (kind == static_cast<uint32_t>(KvSection::kSparse)) {
    s = "sparse summaries";
  } else {
    s = strfmt("kind %u", kind);
  }
  if (layer >= 0) s += strfmt(" of layer %d", layer);
  return s;
}

struct Entry {
  uint32_t kind;
  int32_t layer;
  uint64_t offset, bytes, checksum;
};

// Decodes and checks the config section.
KvFileConfig decode_config(const uint8_t* p, size_t n, const std::string& name) {
  if (n < kConfigFields * 4 || n % 4 != 0)
    fail("%s: the config section has %zu bytes, expected %d or more", name.c_str(), n,
         kConfigFields * 4);
  int32_t v[kConfigFields];
  for (int i = 0; i < kConfigFields; ++i) v[i] = get_i32(p + 4 * i);
  auto range = [&](int i, const char* what, int32_t lo, int32_t hi) {
    if (v[i] < lo || v[i] > hi)
      fail("%s: %s = %d in the config, expected %d to %d", name.c_str(), what, v[i], lo, hi);
    return v[i];
  };
  KvFileConfig f;
  kv::CacheConfig& c = f.cache;
  c.n_layers = range(0, "layers", 1, 65536);
  c.n_kv_heads = range(1, "KV heads", 1, 65536);
  c.head_dim = range(2, "head dim", 1, 1024);
  c.ctx = range(3, "context", 1, 1 << 28);
  c.k.format = static_cast<kv::Format>(range(4, "key format", 0, kv::kNumFormats - 1));
  c.k.granularity = static_cast<kv::Int8Granularity>(range(5, "key granularity", 0, 3));
  c.v.format = static_cast<kv::Format>(range(6, "value format", 0, kv::kNumFormats - 1));
  c.v.granularity = static_cast<kv::Int8Granularity>(range(7, "value granularity", 0, 3));
  c.group_size = range(8, "group size", 1, 65536);
  c.residual = range(9, "residual", 0, 1 << 28);
  c.key_flush = static_cast<kv::KeyFlush>(range(10, "key flush", 0, 1));
  c.param_type = static_cast<kv::ParamType>(range(11, "parameter type", 0, 1));
  c.block_tokens = range(12, "block tokens", 1, 1 << 20);
  c.key_rope = static_cast<kv::KeyRope>(range(13, "key RoPE", 0, 1));
  c.share_every = range(14, "share every", 1, c.n_layers);
  f.overflow = range(15, "context overflow", 0, 2);
  f.sinks = range(16, "sinks", 0, 1 << 20);
  f.window = range(17, "window", 0, c.ctx);
  f.summary_kind =
      range(18, "sparse summary kind", 0, static_cast<int>(sparse::SummaryKind::kFixed));
  f.summary_block = range(19, "sparse summary block", 0, 1 << 20);
  const int pairs = range(20, "share map pairs", 0, c.n_layers);
  c.rotation_seed = static_cast<uint64_t>(static_cast<uint32_t>(v[21])) |
                    static_cast<uint64_t>(static_cast<uint32_t>(v[22])) << 32;
  if (f.summary_kind != 0 && f.summary_block < 1)
    fail("%s: sparse summaries of blocks of %d tokens", name.c_str(), f.summary_block);
  const int per_layer = range(25, "per-layer formats", 0, c.n_layers);
  c.rotate = static_cast<kv::KvRotate>(range(26, "rotation", 0, 1));
  if (per_layer != 0 && per_layer != c.n_layers)
    fail("%s: per-layer formats for %d of %d layers", name.c_str(), per_layer, c.n_layers);
  const int words = kConfigFields + 2 * pairs + 4 * per_layer;
  if (n != static_cast<size_t>(words) * 4) {
    fail("%s: the config section has %zu bytes, %d share map pairs and %d layers' formats need %d",
         name.c_str(), n, pairs, per_layer, words * 4);
  }
  for (int i = 0; i < pairs; ++i) {
    c.share_map.emplace_back(get_i32(p + 4 * (kConfigFields + 2 * i)),
                             get_i32(p + 4 * (kConfigFields + 2 * i + 1)));
  }
  for (int l = 0; l < per_layer; ++l) {
    const uint8_t* q = p + 4 * (kConfigFields + 2 * pairs + 4 * l);
    auto field = [&](int j, const char* what, int32_t hi) {
      const int32_t x = get_i32(q + 4 * j);
      if (x < 0 || x > hi)
        fail("%s: layer %d's %s = %d in the config, expected 0 to %d", name.c_str(), l, what, x,
             hi);
      return x;
    };
    kv::CacheConfig::LayerFormats lf;
    lf.k.format = static_cast<kv::Format>(field(0, "key format", kv::kNumFormats - 1));
    lf.k.granularity = static_cast<kv::Int8Granularity>(field(1, "key granularity", 3));
    lf.v.format = static_cast<kv::Format>(field(2, "value format", kv::kNumFormats - 1));
    lf.v.granularity = static_cast<kv::Int8Granularity>(field(3, "value granularity", 3));
    c.layer_formats.push_back(lf);
  }
  try {
    c.validate();
  } catch (const Error& e) {
    fail("%s: the stored cache configuration is invalid: %s", name.c_str(), e.what());
  }
  if (c.block() != c.block_tokens)
    fail("%s: block of %d tokens is not valid for this configuration", name.c_str(),
         c.block_tokens);
  // tq codes index this build's codebooks: a file written with others would read as noise.
  for (int s = 0; s < 2; ++s) {
    const uint32_t want = static_cast<uint32_t>(codebook_field(c, s == 0)),
                   got = static_cast<uint32_t>(v[23 + s]);
    if (got != want) {
      fail("%s: the %s codebook fingerprint is 0x%08x in the file, 0x%08x in this build",
           name.c_str(), s ? "value" : "key", got, want);
    }
  }
  return f;
}

}  // namespace

std::vector<std::string> config_differences(const KvFileConfig& file, const KvFileConfig& here) {
  const std::vector<Field> a = fields(file), b = fields(here);
  std::vector<std::string> out;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (!a[i].compared || a[i].value == b[i].value) continue;
    std::string d = strfmt("%s: %s in the file, %s here", a[i].name.c_str(),
                           a[i].show(a[i].value).c_str(), b[i].show(b[i].value).c_str());
    // Per-layer formats or a rotation on one side only: named first (the stream fields or
    // the seed then differ too).
    if (a[i].name == "per-layer formats" || a[i].name == "rotation")
      out.insert(out.begin(), std::move(d));
    else
      out.push_back(std::move(d));
  }
  return out;
}

std::vector<uint8_t> encode_config(const KvFileConfig& c) {
  const std::vector<Field> f = fields(c);
  std::vector<uint8_t> out(f.size() * 4);
  for (size_t i = 0; i < f.size(); ++i) std::memcpy(out.data() + 4 * i, &f[i].value, 4);
  return out;
}

KvFile parse_kv_file(const uint8_t* data, size_t size, const std::string& name) {
  const char* nm = name.c_str();
  if (size < 8 || std::memcmp(data, kMagic, 8) != 0)
    fail("%s: not a kivi KV cache file (no KIVIKVC magic)", nm);
  if (size < kKvFileHeaderBytes)
    fail("%s: truncated: %zu bytes, the header alone is %zu", nm, size, kKvFileHeaderBytes);
  KvFile f;
  f.name = name;
  f.bytes = size;
  f.version = get_u32(data + 8);
  if (f.version != kKvFileVersion)
    fail("%s: KV file version %u; this build reads version %u", nm, f.version, kKvFileVersion);
  const uint32_t n_sections = get_u32(data + 12);
  f.fingerprint = get_u64(data + 16);
  const int64_t n_tokens = static_cast<int64_t>(get_u64(data + 24));
  f.prefill_tokens = static_cast<int64_t>(get_u64(data + 32));
  std::memcpy(&f.prefill_seconds, data + 40, 8);
  const uint64_t file_bytes = get_u64(data + 48);
  if (file_bytes != size) {
    fail("%s: %s: the header says %" PRIu64 " bytes, the file has %zu", nm,
         file_bytes > size ? "truncated" : "trailing bytes", file_bytes, size);
  }
  if (n_sections > (size - kKvFileHeaderBytes) / kKvFileTableEntryBytes)
    fail("%s: truncated: %u sections do not fit in %zu bytes", nm, n_sections, size);
  const size_t table_end = kKvFileHeaderBytes + n_sections * kKvFileTableEntryBytes;
  Checksum hc;
  hc.update(data, 56);
  hc.update(data + kKvFileHeaderBytes, table_end - kKvFileHeaderBytes);
  if (hc.digest() != get_u64(data + 56))
    fail("%s: the header or the section table is corrupted (checksum mismatch)", nm);

  // Every section: in bounds, aligned, after the previous one, intact.
  std::vector<Entry> e(n_sections);
  uint64_t end = table_end;
  for (uint32_t i = 0; i < n_sections; ++i) {
    const uint8_t* t = data + kKvFileHeaderBytes + i * kKvFileTableEntryBytes;
    e[i] = {get_u32(t), get_i32(t + 4), get_u64(t + 8), get_u64(t + 16), get_u64(t + 24)};
    const std::string sn = section_name(e[i].kind, e[i].layer);
    if (e[i].offset % kKvFileAlign != 0 || e[i].offset < end || e[i].offset > size ||
        e[i].bytes > size - e[i].offset) {
      fail("%s: section %s at [%" PRIu64 ", +%" PRIu64
           ") is misplaced or past the end of the file (%zu bytes)",
           nm, sn.c_str(), e[i].offset, e[i].bytes, size);
    }
    end = e[i].offset + e[i].bytes;
    if (Checksum::of(data + e[i].offset, e[i].bytes) != e[i].checksum)
      fail("%s: section %s is corrupted (checksum mismatch)", nm, sn.c_str());
  }

  // The sections in their order.
  uint32_t cur = 0;
  auto expect = [&](uint32_t kind, int32_t layer, uint64_t bytes) -> const uint8_t* {
    const std::string want = section_name(kind, layer);
    if (cur >= n_sections) fail("%s: section %s is missing", nm, want.c_str());
    const Entry& x = e[cur];
    if (x.kind != kind || x.layer != layer) {
      fail("%s: section %s where %s belongs", nm, section_name(x.kind, x.layer).c_str(),
           want.c_str());
    }
    if (bytes != UINT64_MAX && x.bytes != bytes) {
      fail("%s: section %s has %" PRIu64 " bytes, expected %" PRIu64, nm, want.c_str(), x.bytes,
           bytes);
    }
    ++cur;
    return data + x.offset;
  };
  const uint8_t* p = expect(static_cast<uint32_t>(KvSection::kConfig), -1, UINT64_MAX);
  f.config = decode_config(p, e[cur - 1].bytes, name);
  const kv::CacheConfig& c = f.config.cache;
  if (n_tokens < 0 || n_tokens > c.ctx)
    fail("%s: %" PRId64 " tokens in a context of %d", nm, n_tokens, c.ctx);
  f.n_tokens = static_cast<int>(n_tokens);
  if (f.prefill_tokens < 0 || !(f.prefill_seconds >= 0.0) || f.prefill_seconds > 1e12) {
    fail("%s: prefill of %" PRId64 " tokens in %g s is not a valid record", nm, f.prefill_tokens,
         f.prefill_seconds);
  }

  p = expect(static_cast<uint32_t>(KvSection::kSession), -1, 24);
  f.position_offset = static_cast<int64_t>(get_u64(p));
  f.dropped = static_cast<int64_t>(get_u64(p + 8));
  f.overflows = get_i32(p + 16);
  if (f.position_offset < 0 || f.dropped < 0 || f.overflows < 0 ||
      f.position_offset > (int64_t{1} << 40) || f.dropped > (int64_t{1} << 40)) {
    fail("%s: the session record (position offset %" PRId64 ", %" PRId64
         " dropped tokens, %d overflows) is not valid",
         nm, f.position_offset, f.dropped, f.overflows);
  }

  p = expect(static_cast<uint32_t>(KvSection::kTokens), -1, UINT64_MAX);
  const uint64_t tb = e[cur - 1].bytes;
  if (tb % 4 != 0) fail("%s: the tokens section has %" PRIu64 " bytes, not whole i32", nm, tb);
  f.tokens.resize(tb / 4);
  for (size_t i = 0; i < f.tokens.size(); ++i) f.tokens[i] = get_i32(p + 4 * i);

  if (cur < n_sections && e[cur].kind == static_cast<uint32_t>(KvSection::kChat)) {
    p = expect(static_cast<uint32_t>(KvSection::kChat), -1, 40);
    f.chat = true;
    f.chat_turns = get_i32(p);
    for (int i = 0; i < 4; ++i) f.chat_rng[i] = get_u64(p + 8 + 8 * i);
  }
  int64_t positions = f.n_tokens;  // of the whole context
  if (cur < n_sections && e[cur].kind == static_cast<uint32_t>(KvSection::kShard)) {
    p = expect(static_cast<uint32_t>(KvSection::kShard), -1, 24);
    KvFile::Shard& sh = f.shard;
    sh.ranks = get_i32(p);
    sh.rank = get_i32(p + 4);
    sh.start = get_i32(p + 8);
    sh.size = get_i32(p + 12);
    sh.positions = static_cast<int64_t>(get_u64(p + 16));
    const int64_t held = std::clamp<int64_t>(sh.positions - sh.start, 0, sh.size);
    if (sh.ranks < 2 || sh.ranks > 65536 || sh.rank < 0 || sh.rank >= sh.ranks ||
        sh.size != c.ctx || static_cast<int64_t>(sh.rank) * sh.size != sh.start ||
        sh.positions < 0 || sh.positions > static_cast<int64_t>(sh.ranks) * sh.size ||
        held != f.n_tokens) {
      fail("%s: the shard record (rank %d of %d, positions %d + %d, %" PRId64
           " filled, %d here) is not valid",
           nm, sh.rank, sh.ranks, sh.start, sh.size, sh.positions, f.n_tokens);
    }
    positions = sh.positions;
  }
  if (f.chat && (f.chat_turns < 1 || f.chat_turns > positions))
    fail("%s: a conversation of %d turns in %" PRId64 " tokens is not valid", nm, f.chat_turns,
         positions);

  const std::vector<int> owners = kv::layer_owners(c);
  const int B = c.block(), nb = (f.n_tokens + B - 1) / B;
  const int vecs = sparse::summary_vectors(static_cast<sparse::SummaryKind>(f.config.summary_kind));
  for (int l = 0; l < c.n_layers; ++l) {
    if (owners[l] != l) continue;
    KvFileLayer L;
    L.layer = l;
    L.state = kv::decode_layer_state(
        expect(static_cast<uint32_t>(KvSection::kLayer), l, kv::kLayerStateBytes));
    if (L.state.n != f.n_tokens)
      fail("%s: layer %d holds %d tokens, the header says %d", nm, l, L.state.n, f.n_tokens);
    const kv::CacheConfig lc = c.at_layer(l);  // this layer's formats
    kv::check_layer_state(lc, L.state, strfmt("%s: layer %d", nm, l));
    for (int s = 0; s < 2; ++s) {
      for (int q = 0; q < kv::kNumParts; ++q) {
        const size_t bytes =
            kv::part_bytes(lc, static_cast<kv::Stream>(s), static_cast<kv::Part>(q), nb);
        if (bytes == 0) continue;
        L.parts[s][q] = expect(static_cast<uint32_t>(KvSection::kPart) + 8 * s + q, l, bytes);
      }
    }
    if (cur < n_sections && e[cur].kind == static_cast<uint32_t>(KvSection::kSparse) &&
        e[cur].layer == l) {
      if (vecs == 0) fail("%s: sparse summaries of layer %d without a summary kind", nm, l);
      const uint8_t* sp = data + e[cur].offset;
      if (e[cur].bytes < 8) fail("%s: the sparse summaries of layer %d are truncated", nm, l);
      const int done = get_i32(sp);
      const int sb = f.config.summary_block;
      if (done < 0 || done > f.n_tokens || done % sb != 0) {
        fail("%s: %d summarized tokens of layer %d, expected a multiple of %d up to %d", nm, done,
             l, sb, f.n_tokens);
      }
      const uint64_t want =
          8 + static_cast<uint64_t>(c.n_kv_heads) * (done / sb) * vecs * c.head_dim * 2;
      expect(static_cast<uint32_t>(KvSection::kSparse), l, want);
      L.sparse_done = done;
      L.sparse = sp + 8;
    }
    f.layers.push_back(L);
  }
  if (cur != n_sections) {
    fail("%s: unexpected section %s after the last layer", nm,
         section_name(e[cur].kind, e[cur].layer).c_str());
  }
  return f;
}

void check_kv_file(const KvFile& f, uint64_t fingerprint, const KvFileConfig& here, int ctx,
                   int vocab) {
  const char* nm = f.name.c_str();
  if (f.fingerprint != fingerprint) {
    fail("%s: saved from another model (fingerprint %016" PRIx64 ", this model %016" PRIx64 ")", nm,
         f.fingerprint, fingerprint);
  }
  const std::vector<std::string> d = config_differences(f.config, here);
  if (!d.empty()) {
    fail("%s: saved with another cache configuration (%s%s)", nm, d[0].c_str(),
         d.size() > 1 ? strfmt(", and %zu more", d.size() - 1).c_str() : "");
  }
  if (f.config.cache.ctx > ctx) {
    fail("%s: saved with a context of %d tokens, larger than this session's %d (--ctx)", nm,
         f.config.cache.ctx, ctx);
  }
  if (here.overflow != 0 && f.config.cache.ctx != ctx) {
    fail("%s: saved with a context of %d tokens; the %s policy needs the same --ctx, not %d", nm,
         f.config.cache.ctx, show_overflow(here.overflow).c_str(), ctx);
  }
  for (int t : f.tokens) {
    if (t < 0 || t >= vocab) fail("%s: token id %d outside the vocabulary of %d", nm, t, vocab);
  }
}

uint64_t write_kv_file(const std::string& path, const KvFileHeader& h,
                       const std::vector<KvSectionSource>& sections) {
  // Pass 1: the layout and the checksums.
  const size_t n = sections.size();
  std::vector<Entry> e(n);
  uint64_t off = kKvFileHeaderBytes + n * kKvFileTableEntryBytes;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t align = sections[i].bytes >= kKvFilePagedMin ? kKvFilePageAlign : kKvFileAlign;
    off = (off + align - 1) / align * align;
    Checksum c;
    uint64_t got = 0;
    sections[i].emit([&](const void* p, size_t b) {
      c.update(p, b);
      got += b;
    });
    if (got != sections[i].bytes) {
      fail("%s: section %s: %" PRIu64 " bytes emitted, %" PRIu64 " declared", path.c_str(),
           section_name(sections[i].kind, sections[i].layer).c_str(), got, sections[i].bytes);
    }
    e[i] = {sections[i].kind, sections[i].layer, off, got, c.digest()};
    off += got;
  }
  const uint64_t file_bytes = off;
  std::vector<uint8_t> head(kKvFileHeaderBytes + n * kKvFileTableEntryBytes, 0);
  std::memcpy(head.data(), kMagic, 8);
  const uint32_t version = kKvFileVersion, ns = static_cast<uint32_t>(n);
  std::memcpy(head.data() + 8, &version, 4);
  std::memcpy(head.data() + 12, &ns, 4);
  std::memcpy(head.data() + 16, &h.fingerprint, 8);
  std::memcpy(head.data() + 24, &h.n_tokens, 8);
  std::memcpy(head.data() + 32, &h.prefill_tokens, 8);
  std::memcpy(head.data() + 40, &h.prefill_seconds, 8);
  std::memcpy(head.data() + 48, &file_bytes, 8);
  for (size_t i = 0; i < n; ++i) {
    uint8_t* t = head.data() + kKvFileHeaderBytes + i * kKvFileTableEntryBytes;
    std::memcpy(t, &e[i].kind, 4);
    std::memcpy(t + 4, &e[i].layer, 4);
    std::memcpy(t + 8, &e[i].offset, 8);
    std::memcpy(t + 16, &e[i].bytes, 8);
    std::memcpy(t + 24, &e[i].checksum, 8);
  }
  Checksum hc;
  hc.update(head.data(), 56);
  hc.update(head.data() + kKvFileHeaderBytes, n * kKvFileTableEntryBytes);
  const uint64_t hsum = hc.digest();
  std::memcpy(head.data() + 56, &hsum, 8);

  // Pass 2: the bytes.
  io::AtomicFile out(path);
  out.write(head.data(), head.size());
  static const uint8_t zeros[kKvFilePageAlign] = {};
  uint64_t pos = head.size();
  for (size_t i = 0; i < n; ++i) {
    out.write(zeros, e[i].offset - pos);
    sections[i].emit([&](const void* p, size_t b) { out.write(p, b); });
    pos = e[i].offset + e[i].bytes;
  }
  out.commit();
  return file_bytes;
}

}  // namespace kivi::runtime
