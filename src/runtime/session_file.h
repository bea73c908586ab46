// Saving a session's KV cache after a prefill and continuing from it in other
// sessions: `kivi generate --kv-save FILE` / `--kv-load FILE` (runtime/kv_file.h has
// the format).
//
// Loading maps the file, checks all of it (header, checksums, configuration, model,
// context, layer states) and only then restores the session's cache from it: the blocks'
// codes and parameters are mapped into the cache's buffers in place (private,
// copy-on-write maps of the file's pages, kv::KvCache::restore), so the loaded cache
// shares memory with the page cache and with every other session that loaded the same
// file; the small parts (residual window, summaries, the tail of each head's region)
// are copied.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/mapped_file.h"
#include "runtime/kv_file.h"
#include "runtime/session.h"

namespace kivi::runtime {

// The model a cache file belongs to: runtime::model_fingerprint (the shape and norm
// weights) with the weight type and the first row of the token embedding and of every
// layer's K and V projections mixed in (random-weight models of one shape share their
// norms, and the same model in another weight type computes other keys and values).
uint64_t cache_model_fingerprint(const model::Model& m);

// The configuration record of a session (what its cache's bits depend on).
KvFileConfig session_file_config(const Session& s);

// Saves the session's cache (any number of tokens, typically right after a prefill)
// to `path`, atomically. `tokens`: the token ids fed so far (kept for the text);
// prefill_tokens and prefill_seconds: what producing the cache cost, reported by
// loaders. Returns the bytes written.
// A conversation's state beside its cache (kivi chat): the turns so far and the
// sampler's random state, so that a resumed chat replies as the uninterrupted one would.
struct ChatRecord {
  int turns = 0;
  uint64_t rng[4] = {};
};
uint64_t save_session(const Session& s, const std::vector<int>& tokens, int64_t prefill_tokens,
                      double prefill_seconds, const std::string& path,
                      const ChatRecord* chat = nullptr);

struct LoadedSession {
  std::vector<int> tokens;  // the token ids the saved session had fed
  int n_tokens = 0;         // tokens in the cache
  int64_t prefill_tokens = 0;
  double prefill_seconds = 0.0;  // what the saving session spent on its prefill
  double load_seconds = 0.0;     // map, check and restore
  uint64_t bytes = 0;
  uint64_t mapped_bytes = 0;  // of the file's bytes, mapped in place rather than copied
  bool is_chat = false;       // saved by kivi chat: `chat` holds its record
  ChatRecord chat;
};

// A cache outside a session (a server slot's, in a shared block pool): saved with the
// stop policy and no sparse summaries, `tokens` being exactly the tokens it holds, so
// that a session or another slot continues it. Returns the bytes written.
uint64_t save_cache(const model::Model& m, const kv::KvCache& cache, const std::vector<int>& tokens,
                    const std::string& path);
// A KV file opened, parsed and checked against a model and a cache configuration (the
// stop policy, the whole context, its tokens all in the cache) before anything is
// restored from it.
struct CacheFile {
  std::unique_ptr<io::MappedFile> map;
  KvFile file;
  int n_tokens() const { return file.n_tokens; }
};
CacheFile open_cache_file(const model::Model& m, const kv::CacheConfig& here,
                          const std::string& path);
// Restores an opened file into an empty cache (in a shared pool: with the file's blocks
// reserved). Returns its tokens.
std::vector<int> restore_cache(kv::KvCache& cache, const CacheFile& f);

// Resets the session and loads the cache saved in `path`. Throws kivi::Error with one
// line naming the file and the problem (another model, configuration or version, a
// context larger than the session's, a truncated or corrupted file).
LoadedSession load_session(Session& s, const std::string& path);

}  // namespace kivi::runtime
