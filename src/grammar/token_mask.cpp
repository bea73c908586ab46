#include "grammar/token_mask.h"

#include <algorithm>
#include <map>

namespace kivi::grammar {

namespace {
constexpr size_t kCacheEntries = 8;
constexpr size_t kMaxStates = 1 << 14;  // 16 MiB of transitions at most
}  // namespace

VocabTrie::VocabTrie(const tok::Tokenizer& tk, bool markup)
    : vocab_(tk.vocab_size()), markup_(markup) {
  texts_.resize(vocab_);
  std::vector<int32_t> order;
  for (int t = 0; t < vocab_; ++t) {
    texts_[t] = tk.token_text(t, markup && tk.renders(t));
    if (!texts_[t].empty()) order.push_back(t);
  }
  // Sorted texts make each node's subtree a contiguous run; the trie is built in one pass
  // with a stack of the open path.
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return texts_[a] != texts_[b] ? texts_[a] < texts_[b] : a < b;
  });
  // Build with per-node child maps first (simple), then flatten breadth-first order-free.
  struct Build {
    std::map<uint8_t, uint32_t> kids;
    std::vector<int32_t> toks;
  };
  std::vector<Build> b(1);
  for (int32_t t : order) {
    uint32_t cur = 0;
    for (char c : texts_[t]) {
      const uint8_t byte = static_cast<uint8_t>(c);
      auto it = b[cur].kids.find(byte);
      if (it == b[cur].kids.end()) {
        const uint32_t id = static_cast<uint32_t>(b.size());
        b[cur].kids.emplace(byte, id);
        b.emplace_back();
        cur = id;
      } else {
        cur = it->second;
      }
    }
    b[cur].toks.push_back(t);
  }
  nodes_.resize(b.size());
  for (size_t i = 0; i < b.size(); ++i) {
    nodes_[i].child_begin = static_cast<uint32_t>(children_.size());
    for (const auto& [byte, id] : b[i].kids) children_.push_back({byte, id});
    nodes_[i].child_end = static_cast<uint32_t>(children_.size());
    nodes_[i].token_begin = static_cast<uint32_t>(tokens_.size());
    tokens_.insert(tokens_.end(), b[i].toks.begin(), b[i].toks.end());
    nodes_[i].token_end = static_cast<uint32_t>(tokens_.size());
  }
  // The nodes are in depth-first preorder (the texts were sorted), so a subtree is a run
  // of nodes and of tokens; its summaries fold from the last node back.
  for (size_t i = nodes_.size(); i-- > 0;) {
    Node& n = nodes_[i];
    n.subtree_end = n.token_end;
    for (uint32_t c = n.child_begin; c < n.child_end; ++c) {
      const Node& k = nodes_[children_[c].node];
      const uint8_t b = children_[c].byte;
      n.subtree_end = std::max(n.subtree_end, k.subtree_end);
      n.ascii = n.ascii && k.ascii && b < 0x80;
      if (b < 0x80) n.below[b >> 6] |= 1ull << (b & 63);
      n.below[0] |= k.below[0];
      n.below[1] |= k.below[1];
    }
  }
}

TokenMask::TokenMask(std::shared_ptr<const Grammar> g, std::shared_ptr<const VocabTrie> trie,
                     std::vector<int> end_tokens)
    : m_(std::move(g)), trie_(std::move(trie)), end_(std::move(end_tokens)) {
  std::sort(end_.begin(), end_.end());
  end_flag_.assign(trie_->vocab(), 0);
  for (int e : end_) {
    if (e >= 0 && e < trie_->vocab()) end_flag_[e] = 1;
  }
}

bool TokenMask::is_end(int token) const {
  return token >= 0 && token < static_cast<int>(end_flag_.size()) && end_flag_[token];
}

size_t TokenMask::KeyHash::operator()(const std::vector<int32_t>& k) const {
  // FNV-style over the ids.
  uint64_t h = 0x9E3779B97F4A7C15ull;
  for (int32_t x : k) h = (h ^ static_cast<uint32_t>(x)) * 0x100000001B3ull + (h >> 29);
  return static_cast<size_t>(h);
}

void TokenMask::reset_tables() {
  states_.clear();
  trans_.clear();
  loops_.clear();
  char_trans_.clear();
  ids_.clear();
  cache_.clear();
  current_ = kUnknown;
  overflow_ = true;
}

const uint64_t* TokenMask::loops(int32_t state) {
  uint64_t* l = &loops_[static_cast<size_t>(state) * 3];
  if (l[2] == 0) {
    uint64_t bits[2] = {0, 0};
    for (int b = 0; b < 128; ++b) {
      const size_t slot = static_cast<size_t>(state) * 256 + b;
      if (trans_[slot] == kUnknown) {
        const int32_t t = first_byte(state, static_cast<uint8_t>(b));
        if (overflow_) return nullptr;
        trans_[slot] = t;
      }
      if (trans_[slot] == state) bits[b >> 6] |= 1ull << (b & 63);
    }
    l = &loops_[static_cast<size_t>(state) * 3];  // interning may have moved the table
    l[0] = bits[0];
    l[1] = bits[1];
    l[2] = 1;
  }
  return l;
}

int32_t TokenMask::intern(const Matcher::Stacks& stacks) {
  auto it = ids_.find(stacks);
  if (it != ids_.end()) return it->second;
  if (states_.size() >= kMaxStates) reset_tables();  // correct, only slower
  const int32_t id = static_cast<int32_t>(states_.size());
  states_.push_back(stacks);
  trans_.resize(trans_.size() + 256, kUnknown);
  loops_.resize(loops_.size() + 3, 0);
  ids_.emplace(stacks, id);
  return id;
}

namespace {
constexpr uint32_t kMinCodePoint[5] = {0, 0, 0x80, 0x800, 0x10000};
}

int32_t TokenMask::first_byte(int32_t state, uint8_t b) {
  if (b < 0x80) {
    m_.advance(states_[state], b, tmp_);
    return tmp_.empty() ? kDead : intern(tmp_);
  }
  const int len = b >= 0xF8 ? 0 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 0;
  if (len == 0) return kDead;
  const int shift = 6 * (len - 1);
  const uint32_t bits = b & (0x3Fu >> (len - 1));
  const uint32_t lo = std::max(bits << shift, kMinCodePoint[len]);
  const uint32_t hi = std::min((bits << shift) | ((1u << shift) - 1), 0x10FFFFu);
  return lo <= hi && m_.takes_some(states_[state], lo, hi) ? state : kDead;
}

bool TokenMask::step(Pos& pos, uint8_t b) {
  Matcher::Partial& p = pos.partial;
  if (p.left == 0) {
    const size_t slot = static_cast<size_t>(pos.state) * 256 + b;
    int32_t t = trans_[slot];
    if (t == kUnknown) {
      t = first_byte(pos.state, b);
      if (overflow_) return false;
      trans_[slot] = t;
    }
    if (t == kDead) return false;
    if (b < 0x80) {
      pos.state = t;
    } else {
      const int len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
      p = {b & (0x3Fu >> (len - 1)), len - 1, len};
    }
    return true;
  }
  if ((b & 0xC0) != 0x80) return false;
  const Matcher::Partial q = {(p.cp << 6) | (b & 0x3Fu), p.left - 1, p.len};
  if (q.left > 0) {
    const int shift = 6 * q.left;
    const uint32_t lo = std::max(q.cp << shift, kMinCodePoint[q.len]);
    const uint32_t hi = std::min((q.cp << shift) | ((1u << shift) - 1), 0x10FFFFu);
    if (lo > hi || !m_.takes_some(states_[pos.state], lo, hi)) return false;
    p = q;
    return true;
  }
  if (q.cp < kMinCodePoint[q.len] || q.cp > 0x10FFFF || (q.cp >= 0xD800 && q.cp <= 0xDFFF))
    return false;
  const uint64_t key = (static_cast<uint64_t>(pos.state) << 21) | q.cp;
  auto it = char_trans_.find(key);
  int32_t t;
  if (it != char_trans_.end()) {
    t = it->second;
  } else {
    m_.advance(states_[pos.state], q.cp, tmp_);
    t = tmp_.empty() ? kDead : intern(tmp_);
    if (overflow_) return false;
    char_trans_.emplace(key, t);
  }
  if (t == kDead) return false;
  pos = {t, {}};
  return true;
}

TokenMask::Pos TokenMask::current() {
  if (current_ == kUnknown) current_ = intern(m_.stacks());
  return {current_, m_.partial()};
}

bool TokenMask::allows(int token) {
  if (token < 0 || token >= trie_->vocab()) return false;
  if (is_end(token)) return m_.accepting();
  const std::string& s = trie_->text(token);
  if (s.empty()) return false;
  overflow_ = false;
  Pos pos = current();
  for (char c : s) {
    if (!step(pos, static_cast<uint8_t>(c))) {
      if (!overflow_) return false;
      Matcher copy = m_;  // the tables were reset mid-walk: the matcher alone
      return copy.accept(s);
    }
  }
  return true;
}

const std::vector<char>& TokenMask::mask() {
  // Mid-character masks are not kept: their key would need the bytes read so far.
  if (m_.partial().left != 0) {
    compute(scratch_);
    return scratch_;
  }
  const int32_t st = current().state;
  for (const Cached& c : cache_) {
    if (c.state == st) return c.mask;
  }
  std::vector<char> m;
  compute(m);
  // The walk may have reset the tables (and the cache with them): the state is renamed.
  const int32_t now = current().state;
  if (cache_.size() == kCacheEntries) cache_.erase(cache_.begin());
  cache_.push_back({now, std::move(m)});
  return cache_.back().mask;
}

void TokenMask::compute(std::vector<char>& out) {
  const VocabTrie& t = *trie_;
  out.assign(t.vocab(), 0);
  if (m_.accepting()) {
    for (int e : end_) {
      if (e >= 0 && e < t.vocab()) out[e] = 1;
    }
  }
  // Depth-first over the trie with the walk's position per depth. An ASCII byte from a
  // whole character is one table load; the rest goes through step().
  struct Frame {
    uint32_t node;
    uint32_t next_child;
    Pos pos;
  };
  std::vector<Frame> path;
  path.reserve(64);
  overflow_ = false;
  path.push_back({0, t.nodes_[0].child_begin, current()});
  const char* end_flag = end_flag_.data();
  while (!path.empty()) {
    Frame& f = path.back();
    if (f.next_child == t.nodes_[f.node].child_end) {
      path.pop_back();
      continue;
    }
    const VocabTrie::Edge e = t.children_[f.next_child++];
    Pos pos = f.pos;
    const int32_t direct = pos.partial.left == 0 && e.byte < 0x80
                               ? trans_[static_cast<size_t>(pos.state) * 256 + e.byte]
                               : kUnknown;
    if (direct >= 0) {
      pos.state = direct;
    } else if (direct == kDead) {
      continue;
    } else if (!step(pos, e.byte)) {
      if (overflow_) return compute_slow(out);
      continue;
    }
    const VocabTrie::Node& n = t.nodes_[e.node];
    if (n.child_begin != n.child_end && n.ascii && pos.partial.left == 0) {
      // Every byte below loops back to this state (text inside a string): the whole
      // subtree is allowed without walking it.
      const uint64_t* l = loops(pos.state);
      if (l == nullptr) return compute_slow(out);
      if ((n.below[0] & ~l[0]) == 0 && (n.below[1] & ~l[1]) == 0) {
        for (uint32_t k = n.token_begin; k < n.subtree_end; ++k) {
          const int32_t tok = t.tokens_[k];
          out[tok] = !end_flag[tok];
        }
        continue;
      }
    }
    for (uint32_t k = n.token_begin; k < n.token_end; ++k) {
      const int32_t tok = t.tokens_[k];
      out[tok] = !end_flag[tok];
    }
    if (n.child_begin != n.child_end) path.push_back({e.node, n.child_begin, pos});
  }
}

// The same walk with the matcher's stacks per depth and no tables, for a grammar whose
// states overflow them.
void TokenMask::compute_slow(std::vector<char>& out) {
  const VocabTrie& t = *trie_;
  struct Frame {
    uint32_t node;
    uint32_t next_child;
  };
  std::vector<Frame> path;
  std::vector<Matcher::Stacks> level(1, m_.stacks());
  std::vector<Matcher::Partial> part(1, m_.partial());
  path.push_back({0, t.nodes_[0].child_begin});
  while (!path.empty()) {
    Frame& f = path.back();
    const size_t d = path.size() - 1;
    if (f.next_child == t.nodes_[f.node].child_end) {
      path.pop_back();
      continue;
    }
    const VocabTrie::Edge e = t.children_[f.next_child++];
    if (level.size() <= d + 1) {
      level.resize(d + 2);
      part.resize(d + 2);
    }
    if (!m_.step_byte(level[d], part[d], e.byte, level[d + 1], part[d + 1])) continue;
    const VocabTrie::Node& n = t.nodes_[e.node];
    for (uint32_t k = n.token_begin; k < n.token_end; ++k) {
      if (!end_flag_[t.tokens_[k]]) out[t.tokens_[k]] = 1;
    }
    if (n.child_begin != n.child_end) path.push_back({e.node, n.child_begin});
  }
}

bool TokenMask::accept_text(std::string_view text) {
  if (!m_.accept(text)) return false;
  current_ = kUnknown;
  if (m_.epoch() != epoch_) {
    reset_tables();
    epoch_ = m_.epoch();
  }
  return true;
}

void TokenMask::accept(int token) {
  if (is_end(token)) {
    if (!m_.accepting()) fail("grammar: the reply ended before the grammar was complete");
    return;
  }
  if (token < 0 || token >= trie_->vocab() || trie_->text(token).empty() ||
      !m_.accept(trie_->text(token))) {
    fail("grammar: token %d is not allowed here", token);
  }
  current_ = kUnknown;
  // A compacted arena renames the stacks: the tables' keys are stale.
  if (m_.epoch() != epoch_) {
    reset_tables();
    epoch_ = m_.epoch();
  }
}

}  // namespace kivi::grammar
