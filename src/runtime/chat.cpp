#include "runtime/chat.h"

#include "core/error.h"

namespace kivi::runtime {

namespace {

std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

}  // namespace

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
  if (name == "plain") return ChatFormat::kPlain;
  fail("--chat-template: unknown format '%s' (known: llama3, chatml, gemma, phi3, plain)",
       name.c_str());
}

std::optional<ChatFormat> detect_chat_format(const std::string& t) {
  if (t.find("<|start_header_id|>") != std::string::npos &&
      t.find("<|end_header_id|>") != std::string::npos) {
    return ChatFormat::kLlama3;
  }
  if (t.find("<|im_start|>") != std::string::npos) return ChatFormat::kChatMl;
  if (t.find("<start_of_turn>") != std::string::npos) return ChatFormat::kGemma;
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
        "llama3|chatml|gemma|phi3 (plain: User:/Assistant: lines, for any model)");
  } else if (auto f = detect_chat_format(tk.chat_template())) {
    format_ = *f;
  } else {
    fail(
        "the model's chat template is not one of the known formats (llama3, chatml, gemma, "
        "phi3); choose one with --chat-template llama3|chatml|gemma|phi3|plain");
  }
  if (format_ == ChatFormat::kPlain) return;
  const std::vector<const char*> needed =
      format_ == ChatFormat::kLlama3
          ? std::vector<const char*>{"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}
      : format_ == ChatFormat::kGemma ? std::vector<const char*>{"<start_of_turn>", "<end_of_turn>"}
      : format_ == ChatFormat::kPhi3
          ? std::vector<const char*>{"<|system|>", "<|user|>", "<|assistant|>", "<|end|>"}
          : std::vector<const char*>{"<|im_start|>", "<|im_end|>"};
  for (const char* t : needed) {
    if (tk.find_special(t) < 0) {
      fail("chat format %s needs the special token '%s', which the vocabulary does not have",
           chat_format_name(format_), t);
    }
  }
  end_id_ = tk.find_special(needed.back());
}

std::vector<std::string> ChatPrompt::stop_strings() const {
  if (format_ == ChatFormat::kPlain) return {"\nUser:"};
  return {};
}

std::vector<int> ChatPrompt::user_turn(const std::string& text, const std::string& system,
                                       bool first, bool after_marker) const {
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

bool ChatPrompt::ends_reply(int token) const {
  return token == end_id_ || tk_.is_end_of_generation(token);
}

}  // namespace kivi::runtime
