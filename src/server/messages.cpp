#include "server/messages.h"

#include "server/api_error.h"

namespace kivi::server {

namespace {

bool is_system(const std::string& role) { return role == "system" || role == "developer"; }

// The system prompt and the alternating turns, user first and last.
struct Turns {
  std::string system;
  std::vector<std::string> text;  // user, assistant, user, ..., user
};

Turns to_turns(const std::vector<ChatMessage>& messages) {
  Turns t;
  size_t i = 0;
  for (; i < messages.size() && is_system(messages[i].role); ++i) {
    t.system += (t.system.empty() ? "" : "\n\n") + messages[i].content;
  }
  std::string last_role;
  for (; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (is_system(m.role)) {
      throw ApiError(400, "messages: a " + m.role + " message must come before the conversation",
                     "messages");
    }
    if (m.role == last_role) {
      t.text.back() += "\n\n" + m.content;
      continue;
    }
    if (last_role.empty() && m.role != "user") {
      throw ApiError(400, "messages: the conversation must start with a user message", "messages");
    }
    t.text.push_back(m.content);
    last_role = m.role;
  }
  if (t.text.empty()) throw ApiError(400, "messages: there is no user message", "messages");
  if (last_role != "user") {
    throw ApiError(400, "messages: the last message must be the user's", "messages");
  }
  return t;
}

}  // namespace

ChatFormatter::ChatFormatter(const tok::Tokenizer& tk, const std::string& name) : tk_(tk) {
  if (name == "plain") return;
  if (!name.empty() ||
      (!tk.chat_template().empty() && runtime::detect_chat_format(tk.chat_template()))) {
    chat_ = std::make_unique<runtime::ChatPrompt>(tk, name);
    for (int id = 0; id < tk.vocab_size(); ++id) {
      if (chat_->ends_reply(id)) end_tokens_.push_back(id);
    }
  }
}

const char* ChatFormatter::name() const {
  return chat_ ? runtime::chat_format_name(chat_->format()) : "plain";
}

ChatFormatter::Prompt ChatFormatter::format(const std::vector<ChatMessage>& messages) const {
  const Turns t = to_turns(messages);
  Prompt p;
  if (!chat_) {
    std::string text = t.system.empty() ? "" : t.system + "\n\n";
    for (size_t i = 0; i < t.text.size(); ++i) {
      // A reply as the model wrote it after "Assistant:" (usually from a space), so that
      // the next turn's prompt starts with the tokens the server's cache holds.
      const bool spaced =
          i % 2 == 1 && !t.text[i].empty() && (t.text[i][0] == ' ' || t.text[i][0] == '\n');
      text += (i % 2 == 0 ? "User: " : spaced ? "Assistant:" : "Assistant: ") + t.text[i] + "\n";
    }
    text += "Assistant:";
    p.tokens = tk_.encode(text, tk_.add_bos());
    p.stop = {"\nUser:"};
    return p;
  }
  for (size_t i = 0; i < t.text.size(); ++i) {
    if (i % 2 == 0) {
      const std::vector<int> turn = chat_->user_turn(t.text[i], t.system, i == 0);
      p.tokens.insert(p.tokens.end(), turn.begin(), turn.end());
    } else {
      // A reply in the history: its text as the model would have written it (the next
      // user turn closes it with the end marker).
      const std::vector<int> r = chat_->history_reply(t.text[i]);
      p.tokens.insert(p.tokens.end(), r.begin(), r.end());
    }
  }
  p.end_tokens = end_tokens_;
  return p;
}

}  // namespace kivi::server
