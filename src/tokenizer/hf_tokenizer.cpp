#include "tokenizer/hf_tokenizer.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "io/gguf_writer.h"
#include "tokenizer/pretokenizer.h"

namespace kivi::tok {

namespace {

using json = nlohmann::json;

// Pre-tokenizer expressions as tokenizer.json spells them, and the GGUF names llama.cpp
// gives them.
struct KnownSplit {
  const char* regex;
  const char* pre;
};
const KnownSplit kKnownSplits[] = {
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
     "\\s+(?!\\S)|\\s+",
     "llama-bpe"},
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
     "\\s+(?!\\S)|\\s+",
     "qwen2"},
    {"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", "gpt-2"},
    // o200k (GPT-4o's Xenova/gpt-4o, gpt-oss's o200k_harmony)
    {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"
     "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| "
     "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     "gpt-4o"},
};

json parse_json(std::string_view text, const std::string& name) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    fail("%s: malformed JSON: %s", name.c_str(), e.what());
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read '%s'", path.c_str());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("cannot read '%s'", path.c_str());
  return ss.str();
}

// llama.cpp's does_token_look_special.
bool looks_special(const std::string& t) {
  auto starts = [&](const char* p) { return t.rfind(p, 0) == 0; };
  auto ends = [&](const char* s) {
    const size_t n = std::char_traits<char>::length(s);
    return t.size() >= n && t.compare(t.size() - n, n, s) == 0;
  };
  if (t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]") return true;
  if (t.size() >= 4 && starts("<|") && ends("|>")) return true;
  if (starts("<\xEF\xBD\x9C") && ends("\xEF\xBD\x9C>")) return true;  // <｜...｜> (DeepSeek)
  if ((starts("<start_of_") || starts("<end_of_")) && ends(">")) return true;
  return false;
}

// The text of a special token entry in tokenizer_config.json: a string, or an object
// with "content"; null or absent gives nothing.
std::optional<std::string> token_text(const json& cfg, const char* key, const std::string& name) {
  if (!cfg.is_object() || !cfg.contains(key) || cfg[key].is_null()) return std::nullopt;
  const json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  fail("%s: '%s' is neither a string nor an object with a string 'content'", name.c_str(), key);
}

std::string choose_pre(const json& root, const std::string& name) {
  if (!root.contains("pre_tokenizer") || root["pre_tokenizer"].is_null()) {
    fail("%s: no pre_tokenizer (byte-level BPE needs one; known: %s)", name.c_str(),
         PreTokenizer::known_names().c_str());
  }
  const json& p = root["pre_tokenizer"];
  std::vector<const json*> parts;
  if (p.is_object() && p.value("type", "") == "Sequence" && p.contains("pretokenizers") &&
      p["pretokenizers"].is_array()) {
    for (const json& q : p["pretokenizers"]) parts.push_back(&q);
  } else {
    parts.push_back(&p);
  }
  bool byte_level = false, byte_level_regex = false;
  std::string regex;
  int n_split = 0;
  for (const json* q : parts) {
    if (!q->is_object()) fail("%s: pre_tokenizer entry is not an object", name.c_str());
    const std::string type = q->value("type", "");
    if (type == "ByteLevel") {
      byte_level = true;
      byte_level_regex = byte_level_regex || q->value("use_regex", true);
    } else if (type == "Split") {
      ++n_split;
      const json* pat = q->contains("pattern") ? &(*q)["pattern"] : nullptr;
      if (!pat || !pat->is_object() || !pat->contains("Regex") || !(*pat)["Regex"].is_string()) {
        fail("%s: Split pre-tokenizer without a 'pattern' {'Regex': ...}", name.c_str());
      }
      regex = (*pat)["Regex"].get<std::string>();
    } else {
      fail(
          "%s: unsupported pre-tokenizer type '%s' (supported: Split with a known expression, "
          "ByteLevel)",
          name.c_str(), type.c_str());
    }
  }
  if (!byte_level)
    fail("%s: the pre-tokenizer has no ByteLevel step: not a byte-level BPE tokenizer",
         name.c_str());
  if (n_split > 1 || (n_split == 1 && byte_level_regex)) {
    fail("%s: pre-tokenizer combination not supported (one Split, or ByteLevel with use_regex)",
         name.c_str());
  }
  if (n_split == 0) return "gpt-2";  // ByteLevel's own expression is GPT-2's
  for (const auto& k : kKnownSplits) {
    if (regex == k.regex) return k.pre;
  }
  fail("%s: unknown pre-tokenizer expression '%s' (known: %s)", name.c_str(), regex.c_str(),
       PreTokenizer::known_names().c_str());
}

}  // namespace

GgufVocab parse_hf_tokenizer(std::string_view text, std::string_view config_text,
                             const std::string& name, int vocab_size) {
  const json root = parse_json(text, name);
  const std::string cfg_name = name + " (tokenizer_config)";
  const json cfg = config_text.empty() ? json::object() : parse_json(config_text, cfg_name);
  if (!root.is_object()) fail("%s: the top level is not a JSON object", name.c_str());
  if (!cfg.is_object()) fail("%s: the top level is not a JSON object", cfg_name.c_str());
  if (!root.contains("model") || !root["model"].is_object())
    fail("%s: no 'model' object", name.c_str());
  const json& model = root["model"];
  const std::string type = model.value("type", "BPE");
  if (type != "BPE")
    fail("%s: model type '%s' is not supported (only byte-level 'BPE')", name.c_str(),
         type.c_str());
  if (!model.contains("vocab") || !model["vocab"].is_object())
    fail("%s: model.vocab is missing or not an object", name.c_str());

  constexpr int64_t kMaxId = (1 << 24) - 1;
  std::unordered_map<int64_t, std::pair<std::string, TokenType>> by_id;
  int64_t max_id = -1;
  auto put = [&](int64_t id, const std::string& tok, TokenType t, const char* where) {
    if (id < 0 || id > kMaxId) {
      fail("%s: %s token '%s' has id %lld (valid: 0 to %lld)", name.c_str(), where, tok.c_str(),
           static_cast<long long>(id), static_cast<long long>(kMaxId));
    }
    by_id[id] = {tok, t};
    max_id = std::max(max_id, id);
  };
  for (const auto& [tok, idv] : model["vocab"].items()) {
    if (!idv.is_number_integer())
      fail("%s: model.vocab['%s'] is not an integer id", name.c_str(), tok.c_str());
    const int64_t id = idv.get<int64_t>();
    if (by_id.count(id))
      fail("%s: model.vocab gives id %lld to two tokens", name.c_str(), static_cast<long long>(id));
    put(id, tok, TokenType::kNormal, "model.vocab");
  }
  if (root.contains("added_tokens") && !root["added_tokens"].is_null()) {
    if (!root["added_tokens"].is_array()) fail("%s: added_tokens is not an array", name.c_str());
    for (const json& a : root["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string()) {
        fail("%s: an added_tokens entry lacks an integer 'id' or a string 'content'", name.c_str());
      }
      const std::string content = a["content"].get<std::string>();
      const bool special = a.value("special", false);
      put(a["id"].get<int64_t>(), content,
          special || looks_special(content) ? TokenType::kControl : TokenType::kUserDefined,
          "added");
    }
  }
  if (max_id < 0) fail("%s: the vocabulary is empty", name.c_str());
  const int64_t n_file = max_id + 1;
  if (vocab_size > 0 && vocab_size < n_file) {
    fail("%s: the tokenizer has ids up to %lld, more than the vocabulary size %d", name.c_str(),
         static_cast<long long>(max_id), vocab_size);
  }
  const int64_t n = vocab_size > 0 ? vocab_size : n_file;
  GgufVocab v;
  v.tokens.resize(n);
  v.types.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    auto it = by_id.find(i);
    if (it == by_id.end()) {
      v.tokens[i] = "[PAD" + std::to_string(i) + "]";
      v.types[i] = TokenType::kUnused;
    } else {
      v.tokens[i] = it->second.first;
      v.types[i] = it->second.second;
    }
  }

  if (!model.contains("merges") || !model["merges"].is_array() || model["merges"].empty()) {
    fail("%s: model.merges is missing or empty (byte-level BPE needs merges)", name.c_str());
  }
  v.merges.reserve(model["merges"].size());
  size_t r = 0;
  for (const json& m : model["merges"]) {
    if (m.is_string()) {
      v.merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      const std::string a = m[0].get<std::string>(), b = m[1].get<std::string>();
      if (a.find(' ') != std::string::npos || b.find(' ') != std::string::npos) {
        fail("%s: merge %zu has a token with a space, which GGUF's 'left right' form cannot hold",
             name.c_str(), r);
      }
      v.merges.push_back(a + " " + b);
    } else {
      fail("%s: merge %zu is neither \"left right\" nor [\"left\", \"right\"]", name.c_str(), r);
    }
    ++r;
  }
  v.pre = choose_pre(root, name);

  // Special ids: tokenizer_config.json names the tokens by text.
  std::unordered_map<std::string, int> id_of;
  for (int64_t i = n - 1; i >= 0; --i) id_of[v.tokens[i]] = static_cast<int>(i);
  auto lookup = [&](const char* key) -> int {
    const auto t = token_text(cfg, key, cfg_name);
    if (!t) return -1;
    auto it = id_of.find(*t);
    if (it == id_of.end())
      fail("%s: %s '%s' is not in the vocabulary", cfg_name.c_str(), key, t->c_str());
    return it->second;
  };
  v.bos_id = lookup("bos_token");
  v.eos_id = lookup("eos_token");
  v.pad_id = lookup("pad_token");
  for (const char* m : {"<|eot_id|>", "<|im_end|>"}) {
    auto it = id_of.find(m);
    if (it != id_of.end() && v.types[it->second] == TokenType::kControl) {
      v.eot_id = it->second;
      break;
    }
  }
  // add_bos_token: the config's, else whether the post-processor's template starts with
  // BOS, else llama.cpp's default for the pre-tokenizer (only Llama 3 adds BOS).
  if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) {
    v.add_bos = cfg["add_bos_token"].get<bool>();
  } else if (root.contains("post_processor") && root["post_processor"].is_object() &&
             root["post_processor"].value("type", "") == "TemplateProcessing") {
    const json& pp = root["post_processor"];
    v.add_bos = false;
    if (pp.contains("single") && pp["single"].is_array() && !pp["single"].empty()) {
      const json& first = pp["single"][0];
      v.add_bos = first.is_object() && first.contains("SpecialToken") && v.bos_id >= 0;
    }
  } else {
    v.add_bos = v.pre == "llama-bpe";
  }
  if (cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean())
    v.add_eos = cfg["add_eos_token"].get<bool>();
  if (v.add_bos && v.bos_id < 0) {
    auto it = id_of.find("<|begin_of_text|>");
    if (it != id_of.end()) v.bos_id = it->second;
  }
  if (cfg.contains("chat_template")) {
    const json& t = cfg["chat_template"];
    if (t.is_string()) {
      v.chat_template = t.get<std::string>();
    } else if (t.is_array()) {  // [{"name": ..., "template": ...}]: the default one
      for (const json& e : t) {
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
            e["template"].is_string()) {
          v.chat_template = e["template"].get<std::string>();
        }
      }
    } else if (!t.is_null()) {
      fail("%s: chat_template is neither a string nor a list of named templates", cfg_name.c_str());
    }
  }
  return v;
}

GgufVocab read_hf_tokenizer(const std::string& path, const std::string& config_path,
                            int vocab_size) {
  std::string cfg_path = config_path;
  if (cfg_path.empty()) {
    const size_t slash = path.find_last_of('/');
    const std::string beside =
        (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) +
        "tokenizer_config.json";
    if (std::ifstream(beside).good()) cfg_path = beside;
  }
  const std::string text = read_file(path);
  const std::string cfg = cfg_path.empty() ? std::string() : read_file(cfg_path);
  GgufVocab v = parse_hf_tokenizer(text, cfg, path, vocab_size);
  v.tokenizer(path);  // validates the merges and the pre-tokenizer now, not when the model loads
  return v;
}

Tokenizer GgufVocab::tokenizer(const std::string& source) const {
  Tokenizer tk = Tokenizer::byte_level_bpe(tokens, types, merges, pre, bos_id, eos_id, source);
  tk.set_add_bos(add_bos);
  tk.set_add_eos(add_eos);
  if (eot_id >= 0) tk.set_eot_id(eot_id);
  tk.set_chat_template(chat_template);
  return tk;
}

uint64_t GgufVocab::metadata_bytes() const {
  uint64_t b = 4096 + chat_template.size() + pre.size();
  for (const auto& t : tokens) b += 8 + t.size() + 4;
  for (const auto& m : merges) b += 8 + m.size();
  return b;
}

void add_gguf_vocab_metadata(io::GgufWriter& w, const GgufVocab& v) {
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", v.pre);
  w.add_string_array("tokenizer.ggml.tokens", v.tokens);
  std::vector<int32_t> types(v.types.size());
  for (size_t i = 0; i < types.size(); ++i) types[i] = static_cast<int32_t>(v.types[i]);
  w.add_i32_array("tokenizer.ggml.token_type", types);
  w.add_string_array("tokenizer.ggml.merges", v.merges);
  if (v.bos_id >= 0) w.add_u32("tokenizer.ggml.bos_token_id", v.bos_id);
  if (v.eos_id >= 0) w.add_u32("tokenizer.ggml.eos_token_id", v.eos_id);
  if (v.eot_id >= 0) w.add_u32("tokenizer.ggml.eot_token_id", v.eot_id);
  if (v.pad_id >= 0) w.add_u32("tokenizer.ggml.padding_token_id", v.pad_id);
  w.add_bool("tokenizer.ggml.add_bos_token", v.add_bos);
  w.add_bool("tokenizer.ggml.add_eos_token", v.add_eos);
  if (!v.chat_template.empty()) w.add_string("tokenizer.chat_template", v.chat_template);
}

}  // namespace kivi::tok
