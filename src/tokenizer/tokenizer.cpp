#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <queue>

#include "core/error.h"
#include "io/gguf.h"
#include "io/llama2c.h"
#include "tokenizer/bpe.h"
#include "tokenizer/unicode.h"

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
    : pieces_(std::move(pieces)),
      scores_(std::move(scores)),
      types_(std::move(types)),
      bos_id_(bos_id),
      eos_id_(eos_id),
      unk_id_(unk_id) {
  const int n = static_cast<int>(pieces_.size());
  if (n == 0) fail("tokenizer has no tokens");
  if (scores_.size() != pieces_.size() || types_.size() != pieces_.size()) {
    fail("tokenizer: %zu pieces but %zu scores and %zu types", pieces_.size(), scores_.size(),
         types_.size());
  }
  auto check_id = [n](const char* what, int id) {
    if (id < -1 || id >= n)
      fail("tokenizer: %s id %d is outside the vocabulary (0 to %d)", what, id, n - 1);
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
  index_specials();
}

Tokenizer Tokenizer::byte_level_bpe(std::vector<std::string> pieces, std::vector<TokenType> types,
                                    const std::vector<std::string>& merges, const std::string& pre,
                                    int bos_id, int eos_id, const std::string& source) {
  const int n = static_cast<int>(pieces.size());
  if (n == 0) fail("%s: tokenizer has no tokens", source.c_str());
  if (types.size() != pieces.size()) {
    fail("%s: %zu tokens but %zu token types", source.c_str(), pieces.size(), types.size());
  }
  auto check_id = [&](const char* what, int id) {
    if (id < -1 || id >= n)
      fail("%s: %s id %d is outside the vocabulary (0 to %d)", source.c_str(), what, id, n - 1);
  };
  check_id("BOS", bos_id);
  check_id("EOS", eos_id);
  std::vector<bool> mergeable(n);
  for (int i = 0; i < n; ++i) {
    const TokenType t = types[i];
    mergeable[i] = t == TokenType::kNormal || t == TokenType::kByte || t == TokenType::kUndefined;
  }
  Tokenizer tk;
  tk.bpe_ = std::make_shared<const BpeModel>(pieces, mergeable, merges, pre, source);
  tk.pieces_ = std::move(pieces);
  tk.types_ = std::move(types);
  tk.scores_.assign(n, 0.0f);
  std::fill(std::begin(tk.byte_ids_), std::end(tk.byte_ids_), -1);
  tk.bos_id_ = bos_id;
  tk.eos_id_ = eos_id;
  tk.unk_id_ = -1;
  tk.add_dummy_prefix_ = false;
  tk.add_bos_ =
      tk.bpe_->pre().ignore_merges();  // llama.cpp's default: Llama 3 wants BOS, others not
  tk.index_specials();
  return tk;
}

// End-of-generation markers recognized by their text (llama.cpp's list, the common ones;
// <|return|> and <|call|> end a harmony reply).
static const char* const kEndMarkers[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>",         "<end_of_turn>", "<|endoftext|>",
    "<|eom_id|>", "<EOT>",      "<|end_of_text|>", "<|return|>",    "<|call|>"};
// The harmony markup a reply writes between its messages (see the header).
static const char* const kHarmonyMarkup[] = {"<|start|>", "<|channel|>", "<|message|>",
                                             "<|constrain|>", "<|end|>"};

void Tokenizer::index_specials() {
  const int n = vocab_size();
  special_by_byte_.assign(256, {});
  for (int i = 0; i < n; ++i) {
    if ((types_[i] == TokenType::kControl || types_[i] == TokenType::kUserDefined) &&
        !pieces_[i].empty()) {
      special_by_byte_[static_cast<uint8_t>(pieces_[i][0])].push_back(i);
    }
  }
  for (auto& v : special_by_byte_) {
    std::stable_sort(v.begin(), v.end(),
                     [&](int a, int b) { return pieces_[a].size() > pieces_[b].size(); });
  }
  auto control = [&](const char* text) {
    const int id = find_special(text);
    return id >= 0 && types_[id] == TokenType::kControl ? id : -1;
  };
  // A harmony vocabulary (o200k_harmony) ends replies with <|return|> or <|call|>; its
  // <|end|> only ends a message inside the reply (llama.cpp's rule in llama-vocab.cpp).
  const int harmony_end =
      control("<|return|>") >= 0 && control("<|call|>") >= 0 ? control("<|end|>") : -1;
  if (eot_id_ < 0) {
    for (const char* m : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>"}) {
      const int id = control(m);
      if (id >= 0 && id != harmony_end) {
        eot_id_ = id;
        break;
      }
    }
  }
  eog_.clear();
  for (int id : {eos_id_, eot_id_, eom_id_}) {
    if (id >= 0) eog_.push_back(id);
  }
  for (const char* m : kEndMarkers) {
    const int id = control(m);
    if (id >= 0) eog_.push_back(id);
  }
  std::sort(eog_.begin(), eog_.end());
  eog_.erase(std::unique(eog_.begin(), eog_.end()), eog_.end());
  rendered_.clear();
  if (harmony_end >= 0) {
    eog_.erase(std::remove(eog_.begin(), eog_.end(), harmony_end), eog_.end());
    for (const char* m : kHarmonyMarkup) {
      const int id = control(m);
      if (id >= 0) rendered_.push_back(id);
    }
    std::sort(rendered_.begin(), rendered_.end());
  }
}

void Tokenizer::set_eot_id(int id) {
  if (id < -1 || id >= vocab_size())
    fail("tokenizer: EOT id %d is outside the vocabulary (0 to %d)", id, vocab_size() - 1);
  eot_id_ = id;
  index_specials();
}

void Tokenizer::set_eom_id(int id) {
  if (id < -1 || id >= vocab_size())
    fail("tokenizer: EOM id %d is outside the vocabulary (0 to %d)", id, vocab_size() - 1);
  eom_id_ = id;
  index_specials();
}

std::string Tokenizer::describe() const {
  if (bpe_) {
    return strfmt(
        "byte-level BPE (gpt2), %d tokens, %d merges, pre-tokenizer %s, BOS %d%s, EOS %d, EOT %d%s",
        vocab_size(), bpe_->n_merges(), bpe_->pre().name().c_str(), bos_id_,
        add_bos_ ? " (added)" : "", eos_id_, eot_id_,
        chat_template_.empty() ? "" : ", chat template");
  }
  return strfmt("SentencePiece BPE, %d pieces, BOS %d, EOS %d, %d byte pieces, dummy prefix %s",
                vocab_size(), bos_id_, eos_id_, n_byte_pieces(), add_dummy_prefix_ ? "on" : "off");
}

bool Tokenizer::is_end_of_generation(int token) const {
  return std::binary_search(eog_.begin(), eog_.end(), token);
}

int Tokenizer::find_special(std::string_view text) const {
  if (text.empty() || special_by_byte_.empty()) return -1;
  for (int id : special_by_byte_[static_cast<uint8_t>(text[0])]) {
    if (pieces_[id] == text) return id;
  }
  return -1;
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
  const char* path = f.path().c_str();
  const auto model = f.get_string_opt("tokenizer.ggml.model");
  if (!model) fail("%s: no tokenizer in the file (missing 'tokenizer.ggml.model')", path);
  if (*model != "llama" && *model != "gpt2") {
    fail(
        "%s: unsupported tokenizer '%s' (supported: 'llama', SentencePiece BPE with scores; "
        "'gpt2', byte-level BPE)",
        path, model->c_str());
  }
  auto pieces = f.get_string_array("tokenizer.ggml.tokens");
  const int n = static_cast<int>(pieces.size());
  if (n != vocab_size) {
    fail("%s: tokenizer has %d tokens but the model's vocabulary size is %d", path, n, vocab_size);
  }
  std::vector<TokenType> types(n, TokenType::kNormal);
  if (f.has("tokenizer.ggml.token_type")) {
    auto t = f.get_i32_array("tokenizer.ggml.token_type");
    if (static_cast<int>(t.size()) != n) {
      fail("%s: tokenizer.ggml.token_type has %zu entries, expected %d", path, t.size(), n);
    }
    for (int i = 0; i < n; ++i) {
      if (t[i] < 0 || t[i] > 6) fail("%s: token %d has unknown type %d", path, i, t[i]);
      types[i] = static_cast<TokenType>(t[i]);
    }
  }
  auto id = [&](const char* key, int def) -> int {
    auto v = f.get_uint_opt(key);
    if (!v) return def;
    if (*v >= static_cast<uint64_t>(n)) {
      fail("%s: %s = %llu is outside the vocabulary (0 to %d)", path, key,
           static_cast<unsigned long long>(*v), n - 1);
    }
    return static_cast<int>(*v);
  };
  Tokenizer tk;
  if (*model == "gpt2") {
    if (!f.has("tokenizer.ggml.merges"))
      fail("%s: byte-level BPE vocabulary has no merges (missing 'tokenizer.ggml.merges')", path);
    const auto merges = f.get_string_array("tokenizer.ggml.merges");
    // A file without tokenizer.ggml.pre gets llama.cpp's "default" expressions, as llama.cpp does.
    const std::string pre = f.get_string_opt("tokenizer.ggml.pre").value_or("default");
    tk = byte_level_bpe(std::move(pieces), std::move(types), merges, pre,
                        id("tokenizer.ggml.bos_token_id", -1),
                        id("tokenizer.ggml.eos_token_id", -1), f.path());
  } else {
    std::vector<float> scores(n, 0.0f);
    if (f.has("tokenizer.ggml.scores")) {
      scores = f.get_f32_array("tokenizer.ggml.scores");
      if (static_cast<int>(scores.size()) != n) {
        fail("%s: tokenizer.ggml.scores has %zu entries, expected %d", path, scores.size(), n);
      }
    }
    tk = Tokenizer(std::move(pieces), std::move(scores), std::move(types),
                   id("tokenizer.ggml.bos_token_id", n > 1 ? 1 : -1),
                   id("tokenizer.ggml.eos_token_id", n > 2 ? 2 : -1),
                   id("tokenizer.ggml.unknown_token_id", 0));
    if (auto p = f.get_bool_opt("tokenizer.ggml.add_space_prefix")) tk.set_add_dummy_prefix(*p);
  }
  if (auto p = f.get_bool_opt("tokenizer.ggml.add_bos_token")) tk.set_add_bos(*p);
  if (auto p = f.get_bool_opt("tokenizer.ggml.add_eos_token")) tk.set_add_eos(*p);
  const int eot = id("tokenizer.ggml.eot_token_id", -1),
            eom = id("tokenizer.ggml.eom_token_id", -1);
  if (eot >= 0) tk.set_eot_id(eot);
  if (eom >= 0) tk.set_eom_id(eom);
  if (auto t = f.get_string_opt("tokenizer.chat_template")) tk.set_chat_template(*t);
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

std::vector<int> Tokenizer::encode(std::string_view text, bool add_bos, bool add_eos,
                                   bool parse_special) const {
  std::vector<int> out;
  if (add_bos && bos_id_ >= 0) out.push_back(bos_id_);
  const std::vector<int> body = encode_segments({TextSegment{text, parse_special}});
  out.insert(out.end(), body.begin(), body.end());
  if (add_eos && eos_id_ >= 0) out.push_back(eos_id_);
  return out;
}

std::vector<int> Tokenizer::encode_segments(const std::vector<TextSegment>& segments) const {
  // Cut the joined text at special tokens (the longest at the leftmost position wins;
  // control tokens only inside segments that allow them), and encode each run of text
  // between them as a whole.
  std::vector<int> out;
  std::string run;
  bool first = true;
  auto flush = [&]() {
    if (!run.empty()) encode_text(run, first, out);
    first = false;
    run.clear();
  };
  for (const TextSegment& seg : segments) {
    const std::string_view t = seg.text;
    size_t i = 0;
    while (i < t.size()) {
      int hit = -1;
      for (int id : special_by_byte_[static_cast<uint8_t>(t[i])]) {
        if (types_[id] == TokenType::kControl && !seg.parse_special) continue;
        if (t.compare(i, pieces_[id].size(), pieces_[id]) == 0) {
          hit = id;
          break;
        }
      }
      if (hit < 0) {
        run += t[i++];
        continue;
      }
      flush();
      out.push_back(hit);
      i += pieces_[hit].size();
    }
  }
  flush();
  return out;
}

std::vector<int> Tokenizer::encode_continuation(std::string_view text) const {
  if (!bpe_ && add_dummy_prefix_ && !text.empty() && text[0] == ' ') text.remove_prefix(1);
  return encode(text, false);
}

void Tokenizer::encode_text(std::string_view text, bool first, std::vector<int>& out) const {
  if (bpe_) {
    bpe_->encode(text, out);
  } else {
    encode_spm(text, add_dummy_prefix_ && first,
               out);  // the dummy prefix goes before the text only
  }
}

void Tokenizer::encode_spm(std::string_view text, bool dummy_prefix, std::vector<int>& out) const {
  std::string norm = to_sentencepiece(text);
  if (dummy_prefix) norm.insert(0, kSpaceMark);

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
}

std::string Tokenizer::decode(int prev, int token) const {
  if (token < 0 || token >= vocab_size()) return std::string();
  const TokenType t = types_[token];
  if (t == TokenType::kControl && std::binary_search(rendered_.begin(), rendered_.end(), token))
    return pieces_[token];
  if (t == TokenType::kControl || t == TokenType::kUnknown || t == TokenType::kUnused) return {};
  if (bpe_) return token_text(token);
  if (t == TokenType::kByte) {
    const int b = parse_byte_piece(pieces_[token]);
    if (b >= 0) return std::string(1, static_cast<char>(b));
  }
  std::string s = from_sentencepiece(pieces_[token]);
  if ((prev == bos_id_ || prev < 0) && !s.empty() && s[0] == ' ' && add_dummy_prefix_)
    s.erase(0, 1);
  return s;
}

bool Tokenizer::renders(int token) const {
  return std::binary_search(rendered_.begin(), rendered_.end(), token);
}

std::string Tokenizer::token_text(int token, bool special) const {
  if (token < 0 || token >= vocab_size()) return std::string();
  const TokenType t = types_[token];
  if (t == TokenType::kControl || t == TokenType::kUnknown || t == TokenType::kUnused) {
    return special ? pieces_[token] : std::string();
  }
  if (t == TokenType::kUserDefined) return pieces_[token];  // stored as plain text
  if (bpe_) return byte_level_decode(pieces_[token]);
  if (t == TokenType::kByte) {
    const int b = parse_byte_piece(pieces_[token]);
    if (b >= 0) return std::string(1, static_cast<char>(b));
  }
  return from_sentencepiece(pieces_[token]);
}

std::string Tokenizer::decode_all(const std::vector<int>& tokens, int prev) const {
  std::string s;
  for (int t : tokens) {
    s += decode(prev, t);
    prev = t;
  }
  return s;
}

std::string StreamDecoder::push(int token) {
  pending_ += tk_.decode(prev_, token);
  prev_ = token;
  const size_t keep = utf8_incomplete_tail(pending_);
  std::string out = utf8_sanitize(std::string_view(pending_).substr(0, pending_.size() - keep));
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8_sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace kivi::tok
