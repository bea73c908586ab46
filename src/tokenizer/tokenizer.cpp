#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <queue>

#include "core/error.h"
#include "io/gguf.h"
#include "io/llama2c.h"

namespace kivi::tok {

std::string to_sentencepiece(std::string_view s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    if (c == ' ') {
      o += kSpaceMark;
    } else {
      o += c;
    }
  }
  return o;
}

std::string from_sentencepiece(std::string_view s) {
  std::string o;
  o.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, 3, kSpaceMark) == 0) {
      o += ' ';
      i += 3;
    } else {
      o += s[i++];
    }
  }
  return o;
}

// "<0xAB>" -> 0xAB, else -1.
static int parse_byte_piece(const std::string& p) {
  if (p.size() != 6 || p[0] != '<' || p[1] != '0' || p[2] != 'x' || p[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(p[3]), lo = hex(p[4]);
  return (hi < 0 || lo < 0) ? -1 : hi * 16 + lo;
}

Tokenizer::Tokenizer(std::vector<std::string> pieces, std::vector<float> scores,
                     std::vector<TokenType> types, int bos_id, int eos_id, int unk_id)
    : pieces_(std::move(pieces)), scores_(std::move(scores)), types_(std::move(types)),
      bos_id_(bos_id), eos_id_(eos_id), unk_id_(unk_id) {
  const int n = static_cast<int>(pieces_.size());
  if (n == 0) fail("tokenizer has no tokens");
  if (scores_.size() != pieces_.size() || types_.size() != pieces_.size()) {
    fail("tokenizer: %zu pieces but %zu scores and %zu types", pieces_.size(), scores_.size(),
         types_.size());
  }
  auto check_id = [n](const char* what, int id) {
    if (id < -1 || id >= n) fail("tokenizer: %s id %d is outside the vocabulary (0 to %d)", what, id, n - 1);
  };
  check_id("BOS", bos_id_);
  check_id("EOS", eos_id_);
  check_id("unknown-token", unk_id_);
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
  index_.reserve(n * 2);
  for (int i = 0; i < n; ++i) {
    if (types_[i] == TokenType::kByte || types_[i] == TokenType::kNormal ||
        types_[i] == TokenType::kUndefined) {
      const int b = parse_byte_piece(pieces_[i]);
      if (b >= 0 && types_[i] != TokenType::kNormal && byte_ids_[b] < 0) {
        byte_ids_[b] = i;
        continue;
      }
    }
    if (types_[i] == TokenType::kControl || types_[i] == TokenType::kUnknown ||
        types_[i] == TokenType::kUnused) {
      continue;  // never produced by the merge of text
    }
    index_.emplace(pieces_[i], i);  // first id wins for duplicate pieces
  }
}

int Tokenizer::find(std::string_view piece) const {
  auto it = index_.find(std::string(piece));
  return it == index_.end() ? -1 : it->second;
}

int Tokenizer::n_byte_pieces() const {
  int c = 0;
  for (int b = 0; b < 256; ++b) c += byte_ids_[b] >= 0;
  return c;
}

// llama2.c vocabularies carry no token types: 0 is <unk>, 1 BOS, 2 EOS, <0xNN> are
// byte pieces, everything else is normal.
static Tokenizer from_llama2c_vocab(io::Llama2cVocab v) {
  const int n = static_cast<int>(v.pieces.size());
  std::vector<TokenType> types(n, TokenType::kNormal);
  std::vector<std::string> pieces(n);
  for (int i = 0; i < n; ++i) {
    if (parse_byte_piece(v.pieces[i]) >= 0) types[i] = TokenType::kByte;
    pieces[i] = to_sentencepiece(v.pieces[i]);
  }
  if (n > 0) types[0] = TokenType::kUnknown;
  if (n > 1) types[1] = TokenType::kControl;
  if (n > 2) types[2] = TokenType::kControl;
  return Tokenizer(std::move(pieces), std::move(v.scores), std::move(types), n > 1 ? 1 : -1,
                   n > 2 ? 2 : -1, 0);
}

Tokenizer Tokenizer::from_llama2c(const std::string& path, int vocab_size) {
  return from_llama2c_vocab(io::read_llama2c_tokenizer(path, vocab_size));
}

Tokenizer Tokenizer::from_llama2c_memory(const uint8_t* data, size_t size, int vocab_size,
                                         const std::string& name) {
  return from_llama2c_vocab(io::parse_llama2c_tokenizer(data, size, vocab_size, name));
}

Tokenizer Tokenizer::from_gguf(const io::GgufFile& f, int vocab_size) {
  const auto model = f.get_string_opt("tokenizer.ggml.model");
  if (!model) fail("%s: no tokenizer in the file (missing 'tokenizer.ggml.model')", f.path().c_str());
  if (*model != "llama") {
    fail("%s: unsupported tokenizer '%s' (supported: 'llama', SentencePiece BPE with scores; "
         "byte-level BPE ('gpt2') is not implemented yet)", f.path().c_str(), model->c_str());
  }
  auto pieces = f.get_string_array("tokenizer.ggml.tokens");
  const int n = static_cast<int>(pieces.size());
  if (n != vocab_size) {
    fail("%s: tokenizer has %d tokens but the model's vocabulary size is %d", f.path().c_str(), n,
         vocab_size);
  }
  std::vector<float> scores(n, 0.0f);
  if (f.has("tokenizer.ggml.scores")) {
    scores = f.get_f32_array("tokenizer.ggml.scores");
    if (static_cast<int>(scores.size()) != n) {
      fail("%s: tokenizer.ggml.scores has %zu entries, expected %d", f.path().c_str(), scores.size(), n);
    }
  }
  std::vector<TokenType> types(n, TokenType::kNormal);
  if (f.has("tokenizer.ggml.token_type")) {
    auto t = f.get_i32_array("tokenizer.ggml.token_type");
    if (static_cast<int>(t.size()) != n) {
      fail("%s: tokenizer.ggml.token_type has %zu entries, expected %d", f.path().c_str(), t.size(), n);
    }
    for (int i = 0; i < n; ++i) {
      if (t[i] < 0 || t[i] > 6) fail("%s: token %d has unknown type %d", f.path().c_str(), i, t[i]);
      types[i] = static_cast<TokenType>(t[i]);
    }
  }
  auto id = [&](const char* key, int def) -> int {
    auto v = f.get_uint_opt(key);
    if (!v) return def;
    if (*v >= static_cast<uint64_t>(n)) {
      fail("%s: %s = %llu is outside the vocabulary (0 to %d)", f.path().c_str(), key,
           static_cast<unsigned long long>(*v), n - 1);
    }
    return static_cast<int>(*v);
  };
  Tokenizer tk(std::move(pieces), std::move(scores), std::move(types),
               id("tokenizer.ggml.bos_token_id", n > 1 ? 1 : -1),
               id("tokenizer.ggml.eos_token_id", n > 2 ? 2 : -1),
               id("tokenizer.ggml.unknown_token_id", 0));
  if (auto p = f.get_bool_opt("tokenizer.ggml.add_space_prefix")) tk.set_add_dummy_prefix(*p);
  return tk;
}

// Length of the UTF-8 sequence starting with byte c (1 for invalid lead bytes).
static int utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return 4;
  return 1;
}

std::vector<int> Tokenizer::encode(std::string_view text, bool add_bos, bool add_eos) const {
  std::vector<int> out;
  if (add_bos && bos_id_ >= 0) out.push_back(bos_id_);
  if (text.empty()) {
    if (add_eos && eos_id_ >= 0) out.push_back(eos_id_);
    return out;
  }
  std::string norm = to_sentencepiece(text);
  if (add_dummy_prefix_) norm.insert(0, kSpaceMark);

  // Symbols as a doubly linked list over the normalized text.
  struct Sym {
    int prev, next;
    int id;        // piece id
    size_t start;  // byte offset in norm (for piece lookup and leftmost ties)
    size_t len;
  };
  std::vector<Sym> syms;
  syms.reserve(norm.size());
  for (size_t i = 0; i < norm.size();) {
    int len = utf8_len(static_cast<unsigned char>(norm[i]));
    if (i + len > norm.size()) len = 1;
    const int id = find(std::string_view(norm).substr(i, len));
    if (id >= 0) {
      syms.push_back({0, 0, id, i, static_cast<size_t>(len)});
    } else {
      // Byte fallback: one symbol per byte, never merged further.
      for (int k = 0; k < len; ++k) {
        const int b = byte_ids_[static_cast<unsigned char>(norm[i + k])];
        syms.push_back({0, 0, b >= 0 ? b : unk_id_, i + k, 0});  // len 0 marks "no merge"
      }
    }
    i += len;
  }
  const int n = static_cast<int>(syms.size());
  for (int i = 0; i < n; ++i) {
    syms[i].prev = i - 1;
    syms[i].next = i + 1 < n ? i + 1 : -1;
  }

  // Candidate merges ordered by score, then by leftmost position.
  struct Cand {
    float score;
    size_t start;
    int left, right;
    size_t left_len, right_len;  // to detect stale candidates
    bool operator<(const Cand& o) const {
      if (score != o.score) return score < o.score;
      return start > o.start;
    }
  };
  std::priority_queue<Cand> heap;
  auto try_add = [&](int l) {
    if (l < 0) return;
    const int r = syms[l].next;
    if (r < 0 || syms[l].len == 0 || syms[r].len == 0) return;
    const int id = find(std::string_view(norm).substr(syms[l].start, syms[l].len + syms[r].len));
    if (id < 0) return;
    heap.push({scores_[id], syms[l].start, l, r, syms[l].len, syms[r].len});
  };
  for (int i = 0; i < n; ++i) try_add(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& L = syms[c.left];
    if (L.len != c.left_len || L.next != c.right) continue;  // stale
    Sym& R = syms[c.right];
    if (R.len != c.right_len) continue;
    L.len += R.len;
    L.id = find(std::string_view(norm).substr(L.start, L.len));
    L.next = R.next;
    if (R.next >= 0) syms[R.next].prev = c.left;
    R.len = 0;
    R.prev = R.next = -2;  // removed
    R.start = static_cast<size_t>(-1);
    try_add(L.prev);
    try_add(c.left);
  }
  for (int i = n > 0 ? 0 : -1; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
  if (add_eos && eos_id_ >= 0) out.push_back(eos_id_);
  return out;
}

std::string Tokenizer::decode(int prev, int token) const {
  if (token < 0 || token >= vocab_size()) return std::string();
  const TokenType t = types_[token];
  if (t == TokenType::kControl || t == TokenType::kUnknown || t == TokenType::kUnused) return {};
  if (t == TokenType::kByte) {
    const int b = parse_byte_piece(pieces_[token]);
    if (b >= 0) return std::string(1, static_cast<char>(b));
  }
  std::string s = from_sentencepiece(pieces_[token]);
  if ((prev == bos_id_ || prev < 0) && !s.empty() && s[0] == ' ' && add_dummy_prefix_) s.erase(0, 1);
  return s;
}

std::string Tokenizer::decode_all(const std::vector<int>& tokens, int prev) const {
  std::string s;
  for (int t : tokens) {
    s += decode(prev, t);
    prev = t;
  }
  return s;
}

}  // namespace kivi::tok
