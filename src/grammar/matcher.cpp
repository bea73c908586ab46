#include "grammar/matcher.h"

#include <algorithm>

namespace kivi::grammar {

namespace {
constexpr size_t kMaxStacks = 1 << 16;  // live stacks at most (an ambiguous grammar)
constexpr int kMaxDepth = 1 << 14;      // nested expansions at most
constexpr size_t kCompactAt = 1 << 20;  // arena nodes before a compaction
}  // namespace

Matcher::Matcher(std::shared_ptr<const Grammar> g) : g_(std::move(g)) {
  for (uint32_t alt : g_->rules()[g_->root()]) expand(alt, -1, stacks_, 0);
  normalize(stacks_);
}

int32_t Matcher::intern(uint32_t pos, int32_t parent) {
  const uint64_t key = (static_cast<uint64_t>(pos) << 32) | static_cast<uint32_t>(parent);
  auto [it, fresh] = index_.try_emplace(key, static_cast<int32_t>(nodes_.size()));
  if (fresh) nodes_.push_back({pos, parent});
  return it->second;
}

// Pushes onto `out` every stack whose top is a class, reached from element `pos` with
// `parent` below it: a reference opens each alternative of its rule (the element after
// it becomes the return point, unless the reference ends its alternative: then the
// parent is returned to directly, so right recursion does not grow the stack); the end
// of an alternative returns to the parent.
void Matcher::expand(uint32_t pos, int32_t parent, Stacks& out, int depth) {
  if (depth > kMaxDepth) throw Error("grammar: expansion nests too deep");
  const Element& e = g_->elements()[pos];
  switch (e.kind) {
    case Element::kEnd:
      if (parent < 0) {
        out.push_back(kAccept);
      } else {
        const Node n = nodes_[parent];
        expand(n.pos, n.parent, out, depth + 1);
      }
      break;
    case Element::kRule: {
      const uint32_t ret = pos + 1;
      const int32_t below =
          g_->elements()[ret].kind == Element::kEnd ? parent : intern(ret, parent);
      for (uint32_t alt : g_->rules()[e.value]) expand(alt, below, out, depth + 1);
      break;
    }
    default:
      out.push_back(intern(pos, parent));
      break;
  }
  if (out.size() > kMaxStacks) throw Error("grammar: too many parses at once (ambiguous grammar)");
}

void Matcher::normalize(Stacks& s) {
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
}

void Matcher::advance(const Stacks& in, uint32_t cp, Stacks& out) {
  out.clear();
  for (int32_t id : in) {
    if (id == kAccept) continue;
    const Node n = nodes_[id];
    if (g_->matches(n.pos, cp)) expand(n.pos + 1, n.parent, out, 0);
  }
  normalize(out);
}

bool Matcher::takes_some(const Stacks& in, uint32_t lo, uint32_t hi) const {
  for (int32_t id : in) {
    if (id != kAccept && g_->matches_some(nodes_[id].pos, lo, hi)) return true;
  }
  return false;
}

// UTF-8 as the standard has it: no overlong forms (a code point in more bytes than it
// needs), no surrogates, nothing above U+10FFFF; a byte sequence that breaks these is
// refused as soon as its bytes show it.
bool Matcher::step_byte(const Stacks& in, const Partial& p, uint8_t b, Stacks& out, Partial& q) {
  static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (p.left == 0) {
    if (b < 0x80) {
      q = {};
      advance(in, b, out);
      return !out.empty();
    }
    int len = b >= 0xF8 ? 0 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 0;
    if (len == 0) return false;
    q = {static_cast<uint32_t>(b & (0x3F >> (len - 1))), len - 1, len};
  } else {
    if ((b & 0xC0) != 0x80) return false;
    q = {(p.cp << 6) | (b & 0x3Fu), p.left - 1, p.len};
    if (q.left == 0) {
      if (q.cp < kMin[q.len] || q.cp > 0x10FFFF || (q.cp >= 0xD800 && q.cp <= 0xDFFF)) return false;
      advance(in, q.cp, out);
      return !out.empty();
    }
  }
  // Inside a character: some stack must take a valid code point that starts this way.
  const int shift = 6 * q.left;
  const uint32_t lo = std::max(q.cp << shift, kMin[q.len]);
  const uint32_t hi = std::min((q.cp << shift) | ((1u << shift) - 1), 0x10FFFFu);
  if (lo > hi || !takes_some(in, lo, hi)) return false;
  out = in;
  return true;
}

bool Matcher::accept(std::string_view utf8) {
  Stacks cur = stacks_;
  Partial p = partial_;
  for (char c : utf8) {
    Partial q;
    if (!step_byte(cur, p, static_cast<uint8_t>(c), scratch_, q)) return false;
    cur.swap(scratch_);
    p = q;
  }
  stacks_.swap(cur);
  partial_ = p;
  if (nodes_.size() > kCompactAt) compact();
  return true;
}

bool Matcher::accepting() const {
  return partial_.left == 0 && !stacks_.empty() && stacks_.front() == kAccept;
}

bool Matcher::can_continue() const { return !stacks_.empty() && stacks_.back() != kAccept; }

// Copies the nodes the live stacks use into a fresh arena (without recursion: a stack
// may be as deep as the text is nested).
void Matcher::compact() {
  ++epoch_;
  std::vector<Node> old;
  old.swap(nodes_);
  index_.clear();
  std::unordered_map<int32_t, int32_t> moved;
  std::vector<int32_t> chain;
  for (int32_t& id : stacks_) {
    if (id < 0) continue;
    // The nodes from id down to the first one already copied (or the bottom).
    chain.clear();
    for (int32_t at = id; at >= 0 && !moved.count(at); at = old[at].parent) chain.push_back(at);
    for (size_t k = chain.size(); k-- > 0;) {
      const Node& n = old[chain[k]];
      const int32_t parent = n.parent < 0 ? n.parent : moved.at(n.parent);
      moved.emplace(chain[k], intern(n.pos, parent));
    }
    id = moved.at(id);
  }
  normalize(stacks_);
}

}  // namespace kivi::grammar
