#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"

namespace kivi::tok {

namespace {

// Unicode White_Space, and the classes built on it (see the header).
#define WS "\\t\\n\\x0B\\f\\r\\x{85}\\p{Z}"

// Llama 3 (tokenizer.json of Meta-Llama-3): contractions in any case, letters with at
// most one leading non-letter, numbers of 1-3 digits, punctuation runs with trailing
// newlines, newline runs, and the `\s+(?!\S)` rule that leaves the last space of a run
// to the next word.
constexpr const char* kLlama3 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^" WS
    "\\p{L}\\p{N}]+[\\r\\n]*|"
    "[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+";
// Qwen2, Qwen2.5, Qwen3: Llama 3's expression with single digits.
constexpr const char* kQwen2 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^" WS
    "\\p{L}\\p{N}]+[\\r\\n]*|"
    "[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+";
// GPT-4o and gpt-oss (tiktoken's o200k_base and o200k_harmony; tokenizer.json of
// Xenova/gpt-4o and openai/gpt-oss): a word is a run of letters, upper or title case
// first then lower case (so "HelloWorld" splits before the W; marks go with either),
// with at most one leading non-letter and a contraction of any case; numbers of 1-3
// digits; punctuation runs with trailing newlines or slashes; then Llama 3's whitespace
// rules.
constexpr const char* kGpt4o =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "\\p{N}{1,3}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n/]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS
    "]+";
// GPT-2 (openai/gpt-2 encoder.py; tokenizer.json's ByteLevel with use_regex).
constexpr const char* kGpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS
                              "\\p{L}\\p{N}]+|[" WS "]+(?![^" WS "])|[" WS "]+";
// llama.cpp's "default" (a GGUF without tokenizer.ggml.pre, or with "default"): four
// expressions applied in turn, each splitting the pieces of the one before.
constexpr const char* kDefault1 = "[\\p{P}\\$\\+<=>\\^~\\|]+";
constexpr const char* kDefault2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|[" WS "]+(?![^" WS "])";
constexpr const char* kDefault3 = "\\p{N}+";
constexpr const char* kDefault4 = "[0-9][0-9][0-9]";

#undef WS

struct Known {
  const char* name;
  const char* what;
  std::vector<const char*> patterns;
  bool ignore_merges, nfc;
};

const std::vector<Known>& known() {
  static const std::vector<Known> k = {
      {"llama-bpe", "Llama 3", {kLlama3}, true, false},
      {"llama3", "alias of llama-bpe", {kLlama3}, true, false},
      {"llama-v3", "alias of llama-bpe", {kLlama3}, true, false},
      {"qwen2", "Qwen2, Qwen2.5, Qwen3", {kQwen2}, false, true},
      {"gpt-4o", "GPT-4o, gpt-oss (o200k)", {kGpt4o}, false, false},
      {"gpt-2", "GPT-2", {kGpt2}, false, false},
      {"default",
       "llama.cpp's default for byte-level BPE",
       {kDefault1, kDefault2, kDefault3, kDefault4},
       false,
       false},
  };
  return k;
}

struct Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

}  // namespace

struct PreTokenizer::Impl {
  std::string name;
  bool ignore_merges = false, nfc = false;
  std::vector<std::unique_ptr<Code>> codes;
};

PreTokenizer::PreTokenizer(const std::string& name) {
  const Known* k = nullptr;
  for (const auto& c : known()) {
    if (name == c.name) k = &c;
  }
  if (!k) fail("unknown pre-tokenizer '%s' (known: %s)", name.c_str(), known_names().c_str());
  auto impl = std::make_shared<Impl>();
  impl->name = k->name;
  impl->ignore_merges = k->ignore_merges;
  impl->nfc = k->nfc;
  for (const char* p : k->patterns) {
    int err = 0;
    PCRE2_SIZE at = 0;
    auto c = std::make_unique<Code>();
    c->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p), PCRE2_ZERO_TERMINATED,
                            PCRE2_UTF | PCRE2_UCP, &err, &at, nullptr);
    if (!c->code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      fail("pre-tokenizer '%s': expression does not compile at %zu: %s", name.c_str(),
           static_cast<size_t>(at), reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(c->code,
                      PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable
    impl->codes.push_back(std::move(c));
  }
  impl_ = std::move(impl);
}

PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(const PreTokenizer&) = default;
PreTokenizer& PreTokenizer::operator=(const PreTokenizer&) = default;

std::string PreTokenizer::known_names() {
  std::string s;
  for (const auto& c : known())
    s += std::string(s.empty() ? "" : ", ") + c.name + " (" + c.what + ")";
  return s;
}

const std::string& PreTokenizer::name() const { return impl_->name; }
bool PreTokenizer::ignore_merges() const { return impl_->ignore_merges; }
bool PreTokenizer::nfc() const { return impl_->nfc; }

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& out) const {
  std::vector<std::string_view> cur{text}, next;
  if (text.empty()) return;
  for (const auto& c : impl_->codes) {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(c->code, nullptr);
    if (!md) fail("out of memory");
    next.clear();
    for (std::string_view piece : cur) {
      // Each piece is matched on its own, so lookahead stops at its end (as llama.cpp's
      // sequential splits do).
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      size_t pos = 0, last = 0;
      while (pos < piece.size()) {
        const int rc =
            pcre2_match(c->code, subject, piece.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
        if (rc < 0) {
          if (rc == PCRE2_ERROR_NOMATCH) break;
          pcre2_match_data_free(md);
          fail("pre-tokenizer '%s': match error %d", impl_->name.c_str(), rc);
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        const size_t b = ov[0], e = ov[1];
        if (b > last) next.push_back(piece.substr(last, b - last));
        if (e > b) {
          next.push_back(piece.substr(b, e - b));
          pos = last = e;
        } else {  // an empty match (no expression here has one): step one character
          pos = b + 1;
          while (pos < piece.size() && (static_cast<uint8_t>(piece[pos]) & 0xC0) == 0x80) ++pos;
          last = b;
        }
      }
      if (last < piece.size()) next.push_back(piece.substr(last));
    }
    pcre2_match_data_free(md);
    cur.swap(next);
  }
  out.insert(out.end(), cur.begin(), cur.end());
}

}  // namespace kivi::tok
