#include "tokenizer/bpe.h"

#include <queue>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace kivi::tok {

BpeModel::BpeModel(const std::vector<std::string>& pieces, const std::vector<bool>& mergeable,
                   const std::vector<std::string>& merges, const std::string& pre,
                   const std::string& source)
    : pre_(pre) {
  const int n = static_cast<int>(pieces.size());
  index_.reserve(static_cast<size_t>(n) * 2);
  for (int i = 0; i < n; ++i) {
    if (mergeable[i]) index_.emplace(pieces[i], i);  // the first id wins for duplicates
  }
  for (int b = 0; b < 256; ++b) {
    auto it = index_.find(byte_to_unicode(static_cast<uint8_t>(b)));
    if (it == index_.end()) {
      fail("%s: byte-level vocabulary has no token for byte 0x%02X ('%s')", source.c_str(), b,
           byte_to_unicode(static_cast<uint8_t>(b)).c_str());
    }
    byte_id_[b] = it->second;
  }
  if (merges.empty())
    fail("%s: byte-level BPE vocabulary has no merges (tokenizer.ggml.merges)", source.c_str());
  merges_.reserve(merges.size() * 2);
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string& m = merges[r];
    const size_t sp = m.find(' ', 1);
    if (sp == std::string::npos || sp + 1 >= m.size() || m.find(' ', sp + 1) != std::string::npos) {
      fail("%s: merge %zu '%s' is not two tokens separated by one space", source.c_str(), r,
           m.c_str());
    }
    const std::string left = m.substr(0, sp), right = m.substr(sp + 1);
    auto l = index_.find(left), rt = index_.find(right), mg = index_.find(left + right);
    if (l == index_.end())
      fail("%s: merge %zu '%s' names unknown token '%s'", source.c_str(), r, m.c_str(),
           left.c_str());
    if (rt == index_.end())
      fail("%s: merge %zu '%s' names unknown token '%s'", source.c_str(), r, m.c_str(),
           right.c_str());
    if (mg == index_.end()) {
      fail("%s: merge %zu '%s' makes '%s', which is not in the vocabulary", source.c_str(), r,
           m.c_str(), (left + right).c_str());
    }
    merges_.emplace(pair_key(l->second, rt->second),
                    Merge{static_cast<int32_t>(r), mg->second});  // first rank wins
  }
  n_merges_ = static_cast<int>(merges.size());
}

void BpeModel::encode(std::string_view text, std::vector<int>& out) const {
  std::string clean = utf8_is_valid(text) ? std::string(text) : utf8_sanitize(text);
  if (pre_.nfc()) clean = utf8_nfc(clean);
  std::vector<std::string_view> pieces;
  pre_.split(clean, pieces);
  for (std::string_view p : pieces) encode_piece(p, out);
}

void BpeModel::encode_piece(std::string_view piece, std::vector<int>& out) const {
  if (piece.empty()) return;
  if (pre_.ignore_merges()) {
    auto it = index_.find(byte_level_encode(piece));
    if (it != index_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const int n = static_cast<int>(piece.size());
  if (n == 1) {
    out.push_back(byte_id_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  // Symbols: one per byte, as a linked list; merged symbols take over their right
  // neighbour, which is unlinked (id -1).
  struct Sym {
    int id, prev, next;
  };
  std::vector<Sym> s(n);
  for (int i = 0; i < n; ++i)
    s[i] = {byte_id_[static_cast<uint8_t>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1};
  struct Cand {
    int32_t rank;
    int left, right;
    int left_id, right_id;
    bool operator<(
        const Cand& o) const {  // std::priority_queue pops the largest: lowest rank, then leftmost
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Cand> heap;
  auto consider = [&](int l) {
    if (l < 0) return;
    const int r = s[l].next;
    if (r < 0) return;
    auto it = merges_.find(pair_key(s[l].id, s[r].id));
    if (it != merges_.end()) heap.push({it->second.rank, l, r, s[l].id, s[r].id});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& L = s[c.left];
    if (L.id != c.left_id || L.next != c.right || s[c.right].id != c.right_id) continue;  // stale
    Sym& R = s[c.right];
    L.id = merges_.at(pair_key(c.left_id, c.right_id)).id;
    L.next = R.next;
    if (R.next >= 0) s[R.next].prev = c.left;
    R.id = -1;
    R.prev = R.next = -1;
    consider(L.prev);
    consider(c.left);
  }
  for (int i = 0; i >= 0; i = s[i].next) out.push_back(s[i].id);
}

}  // namespace kivi::tok
