#include "runtime/chat.h"

#include <algorithm>
#include <ctime>

#include "core/error.h"

namespace kivi::runtime {

namespace {

std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

std::string local_date() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

}  // namespace

std::string harmony_system_message(const std::string& yyyy_mm_dd, bool tools) {
  return "You are ChatGPT, a large language model trained by OpenAI.\n"
         "Knowledge cutoff: 2024-06\n"
         "Current date: " +
         yyyy_mm_dd +
         "\n\n"
         "Reasoning: medium\n\n"
         "# Valid channels: analysis, commentary, final. Channel must be included for every "
         "message." +
         std::string(
             tools ? "\nCalls to these tools must go to the commentary channel: 'functions'." : "");
}

const char* chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::kLlama3:
      return "llama3";
    case ChatFormat::kChatMl:
      return "chatml";
    case ChatFormat::kGemma:
      return "gemma";
    case ChatFormat::kPhi3:
      return "phi3";
    case ChatFormat::kHarmony:
      return "harmony";
    case ChatFormat::kPlain:
      break;
  }
  return "plain";
}

ChatFormat parse_chat_format(const std::string& name) {
  if (name == "llama3") return ChatFormat::kLlama3;
  if (name == "chatml") return ChatFormat::kChatMl;
  if (name == "gemma") return ChatFormat::kGemma;
  if (name == "phi3") return ChatFormat::kPhi3;
  if (name == "harmony") return ChatFormat::kHarmony;
  if (name == "plain") return ChatFormat::kPlain;
  fail("--chat-template: unknown format '%s' (known: llama3, chatml, gemma, phi3, harmony, plain)",
       name.c_str());
}

std::optional<ChatFormat> detect_chat_format(const std::string& t) {
  if (t.find("<|start_header_id|>") != std::string::npos &&
      t.find("<|end_header_id|>") != std::string::npos) {
    return ChatFormat::kLlama3;
  }
  if (t.find("<|im_start|>") != std::string::npos) return ChatFormat::kChatMl;
  if (t.find("<start_of_turn>") != std::string::npos) return ChatFormat::kGemma;
  // Before phi3: gpt-oss's template also writes <|end|>.
  if (t.find("<|start|>") != std::string::npos && t.find("<|message|>") != std::string::npos &&
      t.find("<|channel|>") != std::string::npos) {
    return ChatFormat::kHarmony;
  }
  if (t.find("<|end|>") != std::string::npos &&
      (t.find("<|user|>") != std::string::npos ||
       t.find("'<|' + message['role']") != std::string::npos)) {
    return ChatFormat::kPhi3;
  }
  return std::nullopt;
}

ChatPrompt::ChatPrompt(const tok::Tokenizer& tk, const std::string& override_name) : tk_(tk) {
  if (!override_name.empty()) {
    format_ = parse_chat_format(override_name);
  } else if (tk.chat_template().empty()) {
    fail(
        "the model has no chat template (tokenizer.chat_template); give one with --chat-template "
        "llama3|chatml|gemma|phi3|harmony (plain: User:/Assistant: lines, for any model)");
  } else if (auto f = detect_chat_format(tk.chat_template())) {
    format_ = *f;
  } else {
    fail(
        "the model's chat template is not one of the known formats (llama3, chatml, gemma, "
        "phi3, harmony); choose one with --chat-template llama3|chatml|gemma|phi3|harmony|plain");
  }
  if (format_ == ChatFormat::kPlain) return;
  // The format's special tokens; the last ones (one, or harmony's two) end a reply.
  std::vector<const char*> needed;
  size_t n_end = 1;
  switch (format_) {
    case ChatFormat::kLlama3:
      needed = {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
      break;
    case ChatFormat::kGemma:
      needed = {"<start_of_turn>", "<end_of_turn>"};
      break;
    case ChatFormat::kPhi3:
      needed = {"<|system|>", "<|user|>", "<|assistant|>", "<|end|>"};
      break;
    case ChatFormat::kHarmony:
      needed = {"<|start|>", "<|message|>", "<|channel|>", "<|end|>", "<|return|>", "<|call|>"};
      n_end = 2;
      break;
    default:
      needed = {"<|im_start|>", "<|im_end|>"};
      break;
  }
  for (const char* t : needed) {
    if (tk.find_special(t) < 0) {
      fail("chat format %s needs the special token '%s', which the vocabulary does not have",
           chat_format_name(format_), t);
    }
  }
  for (size_t i = needed.size() - n_end; i < needed.size(); ++i)
    end_ids_.push_back(tk.find_special(needed[i]));
}

std::vector<std::string> ChatPrompt::stop_strings() const {
  if (format_ == ChatFormat::kPlain) return {"\nUser:"};
  return {};
}

std::vector<int> ChatPrompt::user_turn(const std::string& text, const std::string& system,
                                       bool first, bool after_marker,
                                       const std::string& tools) const {
  // Markup strings live here so the segments' views stay valid until encoding.
  std::vector<std::string> keep;
  keep.reserve(16);
  std::vector<tok::TextSegment> seg;
  auto markup = [&](std::string s) {
    keep.push_back(std::move(s));
    seg.push_back({keep.back(), true});
  };
  auto message = [&](std::string s) {
    keep.push_back(std::move(s));
    seg.push_back({keep.back(), false});
  };
  std::vector<int> out;
  if (format_ == ChatFormat::kPlain) {
    // As the server writes a plain conversation (server/messages.cpp); no markup tokens.
    if (first && tk_.add_bos() && tk_.bos_id() >= 0) out.push_back(tk_.bos_id());
    std::string s = first          ? (system.empty() ? "" : system + "\n\n") + "User: "
                    : after_marker ? " "
                                   : "\nUser: ";
    message(s + text + "\nAssistant:");
  } else if (format_ == ChatFormat::kLlama3) {
    if (first && tk_.bos_id() >= 0)
      out.push_back(tk_.bos_id());  // the template writes bos_token itself
    if (!first) markup("<|eot_id|>");
    auto turn = [&](const char* role, const std::string& content) {
      markup(std::string("<|start_header_id|>") + role + "<|end_header_id|>\n\n");
      message(trim(content));
      markup("<|eot_id|>");
    };
    if (first && !system.empty()) turn("system", system);
    turn("user", text);
    markup("<|start_header_id|>assistant<|end_header_id|>\n\n");
  } else if (format_ == ChatFormat::kGemma) {
    // The template writes bos_token itself and puts the system message at the head of
    // the first user turn.
    if (first && tk_.bos_id() >= 0) out.push_back(tk_.bos_id());
    if (!first) markup("<end_of_turn>\n");
    markup("<start_of_turn>user\n");
    message((first && !system.empty() ? trim(system) + "\n\n" : "") + trim(text));
    markup("<end_of_turn>\n<start_of_turn>model\n");
  } else if (format_ == ChatFormat::kPhi3) {
    if (first && tk_.add_bos() && tk_.bos_id() >= 0) out.push_back(tk_.bos_id());
    if (!first) markup("<|end|>\n");
    auto turn = [&](const char* role, const std::string& content) {
      markup(std::string("<|") + role + "|>\n");
      message(content);
      markup("<|end|>\n");
    };
    if (first && !system.empty()) turn("system", system);
    turn("user", text);
    markup("<|assistant|>\n");
  } else if (format_ == ChatFormat::kHarmony) {
    // gpt-oss's template: no bos_token; the system message is the model's preamble, the
    // user's system message becomes the developer's instructions. A reply ended at the
    // <|return|> it sampled (not in the cache); in the history it ends with <|end|>.
    if (first && tk_.add_bos() && tk_.bos_id() >= 0) out.push_back(tk_.bos_id());
    if (!first) markup("<|end|>");
    if (first) {
      markup("<|start|>system<|message|>" +
             harmony_system_message(date_.empty() ? local_date() : date_, !tools.empty()) +
             "<|end|>");
      if (!system.empty() || !tools.empty()) markup("<|start|>developer<|message|>");
      if (!system.empty()) {
        markup("# Instructions\n\n");
        message(system);
        markup("\n\n");
      }
      if (!tools.empty()) message(tools);
      if (!system.empty() || !tools.empty()) markup("<|end|>");
    }
    markup("<|start|>user<|message|>");
    message(text);
    markup("<|end|><|start|>assistant");
  } else {
    if (first && tk_.add_bos() && tk_.bos_id() >= 0) out.push_back(tk_.bos_id());
    if (!first) markup("<|im_end|>\n");
    auto turn = [&](const char* role, const std::string& content) {
      markup(std::string("<|im_start|>") + role + "\n");
      message(content);
      markup("<|im_end|>\n");
    };
    if (first && !system.empty()) turn("system", system);
    turn("user", text);
    markup("<|im_start|>assistant\n");
  }
  const std::vector<int> body = tk_.encode_segments(seg);
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

std::vector<int> ChatPrompt::ipython_turn(const std::vector<std::string>& results) const {
  if (format_ != ChatFormat::kLlama3) fail("internal: ipython turns are llama3's");
  std::vector<std::string> keep;
  keep.reserve(results.size());
  std::vector<tok::TextSegment> seg = {{"<|eot_id|>", true}};
  for (const std::string& r : results) {
    keep.push_back(trim(r));
    seg.push_back({"<|start_header_id|>ipython<|end_header_id|>\n\n", true});
    seg.push_back({keep.back(), false});
    seg.push_back({"<|eot_id|>", true});
  }
  seg.push_back({"<|start_header_id|>assistant<|end_header_id|>\n\n", true});
  return tk_.encode_segments(seg);
}

std::vector<int> ChatPrompt::history_reply(const std::string& text) const {
  if (format_ == ChatFormat::kHarmony) {
    return tk_.encode_segments({{"<|channel|>final<|message|>", true}, {text, false}});
  }
  const bool trimmed = format_ == ChatFormat::kLlama3 || format_ == ChatFormat::kGemma;
  return tk_.encode_segments({{trimmed ? trim(text) : text, false}});
}

bool ChatPrompt::ends_reply(int token) const {
  return std::find(end_ids_.begin(), end_ids_.end(), token) != end_ids_.end() ||
         tk_.is_end_of_generation(token);
}

// HarmonyReplyParser

namespace {

constexpr std::string_view kMarkers[] = {"<|start|>", "<|channel|>", "<|message|>", "<|constrain|>",
                                         "<|end|>",   "<|return|>",  "<|call|>"};

}  // namespace

void HarmonyReplyParser::emit(std::string_view text, ReplyParts& out) {
  if (text.empty()) return;
  if (state_ == State::kHeader) {
    header_ += text;
    return;
  }
  std::string& part = to_reasoning_ ? out.reasoning : out.content;
  bool& any = to_reasoning_ ? any_reasoning_ : any_content_;
  if (!message_started_ && any) part += '\n';  // a second message of the same part
  part += text;
  message_started_ = any = true;
}

void HarmonyReplyParser::open_message() {
  // The header: [role][ to=recipient]<|channel|>channel[ to=recipient][ type][<|constrain|>type]
  const size_t c = header_.rfind("<|channel|>");
  std::string channel;
  if (c != std::string::npos) {
    const size_t b = c + std::string_view("<|channel|>").size();
    channel = header_.substr(b, header_.find_first_of(" <", b) - b);
  }
  to_reasoning_ = channel == "analysis" || header_.find("to=") != std::string::npos;
  message_started_ = false;
  header_.clear();
  state_ = State::kBody;
}

ReplyParts HarmonyReplyParser::push(std::string_view text) {
  ReplyParts out;
  held_ += text;
  size_t i = 0;  // held_[0, i) is processed
  for (;;) {
    const size_t lt = held_.find("<|", i);
    if (lt == std::string::npos) {
      // A last '<' may start a marker.
      const size_t keep = !held_.empty() && held_.back() == '<' && held_.size() > i ? 1 : 0;
      emit(std::string_view(held_).substr(i, held_.size() - keep - i), out);
      i = held_.size() - keep;
      break;
    }
    emit(std::string_view(held_).substr(i, lt - i), out);
    i = lt;
    const std::string_view rest = std::string_view(held_).substr(lt);
    std::string_view hit;
    bool partial = false;
    for (std::string_view m : kMarkers) {
      if (rest.substr(0, m.size()) == m) {
        hit = m;
        break;
      }
      if (rest.size() < m.size() && m.substr(0, rest.size()) == rest) partial = true;
    }
    if (hit.empty()) {
      if (partial) break;  // wait for the rest of the marker
      emit("<", out);      // "<|" that starts no marker is text
      i = lt + 1;
      continue;
    }
    i = lt + hit.size();
    if (hit == "<|message|>") {
      open_message();
    } else if (hit == "<|start|>") {
      header_.clear();
      state_ = State::kHeader;
    } else if (hit == "<|channel|>" || hit == "<|constrain|>") {
      if (state_ == State::kBody) header_.clear();  // a reply opens with its channel
      state_ = State::kHeader;
      header_ += hit;
    } else {  // <|end|>, <|return|>, <|call|>: the message ends
      state_ = State::kBody;
      to_reasoning_ = false;
      message_started_ = false;
      header_.clear();
    }
  }
  held_.erase(0, i);
  return out;
}

ReplyParts HarmonyReplyParser::finish() {
  ReplyParts out;
  emit(held_, out);
  held_.clear();
  return out;
}

ReplyParts split_harmony_reply(std::string_view text) {
  HarmonyReplyParser p;
  ReplyParts a = p.push(text);
  const ReplyParts b = p.finish();
  a.reasoning += b.reasoning;
  a.content += b.content;
  return a;
}

}  // namespace kivi::runtime
