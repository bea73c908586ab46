#include "grammar/token_mask.h"

#include <algorithm>
#include <map>

namespace kivi::grammar {

namespace {
constexpr size_t kCacheEntries = 8;
}

VocabTrie::VocabTrie(const tok::Tokenizer& tk) : vocab_(tk.vocab_size()) {
  texts_.resize(vocab_);
  std::vector<int32_t> order;
  for (int t = 0; t < vocab_; ++t) {
    texts_[t] = tk.token_text(t);
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
}

TokenMask::TokenMask(std::shared_ptr<const Grammar> g, std::shared_ptr<const VocabTrie> trie,
                     std::vector<int> end_tokens)
    : m_(std::move(g)), trie_(std::move(trie)), end_(std::move(end_tokens)) {
  std::sort(end_.begin(), end_.end());
}

bool TokenMask::is_end(int token) const {
  return std::binary_search(end_.begin(), end_.end(), token);
}

bool TokenMask::allows(int token) {
  if (token < 0 || token >= trie_->vocab()) return false;
  if (is_end(token)) return m_.accepting();
  const std::string& s = trie_->text(token);
  if (s.empty()) return false;
  Matcher::Stacks cur = m_.stacks();
  Matcher::Partial p = m_.partial();
  for (char c : s) {
    Matcher::Partial q;
    if (!m_.step_byte(cur, p, static_cast<uint8_t>(c), tmp_, q)) return false;
    cur.swap(tmp_);
    p = q;
  }
  return true;
}

const std::vector<char>& TokenMask::mask() {
  for (size_t i = 0; i < cache_.size(); ++i) {
    if (cache_[i].partial == m_.partial() && cache_[i].stacks == m_.stacks()) {
      ++cached_;
      return cache_[i].mask;
    }
  }
  if (cache_.size() == kCacheEntries) cache_.erase(cache_.begin());
  cache_.push_back({m_.stacks(), m_.partial(), {}});
  compute(cache_.back().mask);
  ++computed_;
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
  // Depth-first over the trie; level_[d] holds the stacks after the first d bytes.
  struct Frame {
    uint32_t node;
    uint32_t next_child;
  };
  std::vector<Frame> path;
  path.reserve(64);
  if (level_.empty()) level_.resize(1);
  level_[0] = m_.stacks();
  if (part_.empty()) part_.resize(1);
  part_[0] = m_.partial();
  path.push_back({0, t.nodes_[0].child_begin});
  while (!path.empty()) {
    Frame& f = path.back();
    const size_t d = path.size() - 1;
    if (f.next_child == t.nodes_[f.node].child_end) {
      path.pop_back();
      continue;
    }
    const VocabTrie::Edge e = t.children_[f.next_child++];
    if (level_.size() <= d + 1) {
      level_.resize(d + 2);
      part_.resize(d + 2);
    }
    if (!m_.step_byte(level_[d], part_[d], e.byte, level_[d + 1], part_[d + 1])) continue;
    const VocabTrie::Node& n = t.nodes_[e.node];
    for (uint32_t k = n.token_begin; k < n.token_end; ++k) {
      if (!is_end(t.tokens_[k])) out[t.tokens_[k]] = 1;
    }
    if (n.child_begin != n.child_end) path.push_back({e.node, n.child_begin});
  }
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
  // A compacted arena renames the stacks: the cached masks' keys are stale.
  if (m_.epoch() != epoch_) {
    cache_.clear();
    epoch_ = m_.epoch();
  }
}

}  // namespace kivi::grammar
