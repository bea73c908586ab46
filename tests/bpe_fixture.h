// A tiny byte-level BPE vocabulary for tests, as a Hugging Face tokenizer.json text:
// ids 0-255 are the bytes in order (in GPT-2's byte-level alphabet), then one token per
// merge in rank order, then the added tokens. Written here by hand, independent of the
// code under test.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/hf_tokenizer.h"

namespace kivi::test {

// The GPT-2 alphabet written out independently of tokenizer/unicode.cpp.
inline std::string gpt2_char(int b) {
  static std::vector<std::string> table = [] {
    std::vector<int> bs;
    for (int c = '!'; c <= '~'; ++c) bs.push_back(c);
    for (int c = 0xA1; c <= 0xAC; ++c) bs.push_back(c);
    for (int c = 0xAE; c <= 0xFF; ++c) bs.push_back(c);
    std::vector<int> cs = bs;
    int n = 0;
    for (int c = 0; c < 256; ++c) {
      bool in = false;
      for (int x : bs) in = in || x == c;
      if (!in) {
        bs.push_back(c);
        cs.push_back(256 + n++);
      }
    }
    std::vector<std::string> t(256);
    for (size_t i = 0; i < bs.size(); ++i) {
      const int cp = cs[i];
      std::string s;
      if (cp < 0x80) {
        s += static_cast<char>(cp);
      } else {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      }
      t[bs[i]] = s;
    }
    return t;
  }();
  return table[static_cast<unsigned char>(b)];
}

inline std::string gpt2_text(const std::string& bytes) {
  std::string s;
  for (char c : bytes) s += gpt2_char(static_cast<unsigned char>(c));
  return s;
}

struct AddedToken {
  std::string content;
  bool special;
};

// merges: pairs of plain-text pieces, e.g. {"h", "e"}, {"he", "llo"}.
inline nlohmann::json tiny_tokenizer_json(
    const std::vector<std::pair<std::string, std::string>>& merges,
    const std::vector<AddedToken>& added, const std::string& regex, bool array_merges = false) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[gpt2_char(b)] = b;
  nlohmann::json m = nlohmann::json::array();
  int id = 256;
  for (const auto& [l, r] : merges) {
    const std::string L = gpt2_text(l), R = gpt2_text(r);
    if (!vocab.contains(L + R)) vocab[L + R] = id++;
    if (array_merges) {
      m.push_back({L, R});
    } else {
      m.push_back(L + " " + R);
    }
  }
  nlohmann::json adds = nlohmann::json::array();
  for (const auto& a : added)
    adds.push_back({{"id", id++}, {"content", a.content}, {"special", a.special}});
  nlohmann::json pre;
  if (regex.empty()) {
    pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  } else {
    pre = {{"type", "Sequence"},
           {"pretokenizers",
            {{{"type", "Split"},
              {"pattern", {{"Regex", regex}}},
              {"behavior", "Isolated"},
              {"invert", false}},
             {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  }
  return {{"version", "1.0"},
          {"added_tokens", adds},
          {"pre_tokenizer", pre},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}}};
}

inline const char* kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
inline const char* kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

// o200k's (GPT-4o, gpt-oss), as tokenizer.json spells it.
inline const char* kGpt4oRegex =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// A harmony vocabulary (gpt-oss's o200k_harmony in small): o200k's expression, a few
// merges and harmony's special tokens.
inline nlohmann::json harmony_tokenizer_json() {
  return tiny_tokenizer_json({{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"u", "s"}},
                             {{"<|startoftext|>", true},
                              {"<|endoftext|>", true},
                              {"<|return|>", true},
                              {"<|constrain|>", true},
                              {"<|channel|>", true},
                              {"<|start|>", true},
                              {"<|end|>", true},
                              {"<|message|>", true},
                              {"<|call|>", true}},
                             kGpt4oRegex);
}

// That vocabulary as a tokenizer, with `config` as its tokenizer_config.json.
inline tok::Tokenizer harmony_tokenizer(
    const std::string& config = R"({"eos_token": "<|return|>"})") {
  return tok::parse_hf_tokenizer(harmony_tokenizer_json().dump(), config, "harmony.json")
      .tokenizer("harmony.json");
}

// The chat vocabulary of the chat tests: a few merges and both formats' special tokens.
inline nlohmann::json chat_tokenizer_json() {
  return tiny_tokenizer_json({{"h", "e"},
                              {"l", "l"},
                              {"he", "ll"},
                              {"hell", "o"},
                              {"u", "s"},
                              {"us", "e"},
                              {"use", "r"},
                              {"\n", "\n"},
                              {" ", "w"}},
                             {{"<|begin_of_text|>", true},
                              {"<|end_of_text|>", true},
                              {"<|start_header_id|>", true},
                              {"<|end_header_id|>", true},
                              {"<|eot_id|>", true},
                              {"<|im_start|>", true},
                              {"<|im_end|>", true},
                              {"<start_of_turn>", true},
                              {"<end_of_turn>", true},
                              {"<think>", false}},
                             kLlama3Regex);
}

}  // namespace kivi::test
