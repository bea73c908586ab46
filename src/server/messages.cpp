#include "server/messages.h"

#include <algorithm>

#include "core/error.h"
#include "server/api_error.h"

namespace kivi::server {

namespace {

bool is_system(const std::string& role) { return role == "system" || role == "developer"; }

// One side's turn: a user's text, an assistant's reply (and calls), or tool results.
struct Turn {
  enum Kind { kUser, kAssistant, kTool } kind;
  std::string text;
  std::vector<runtime::ToolCall> calls;
  std::vector<std::string> results;
};

// The system prompt and the turns: user first, then an assistant's after each user's or
// results; results after an assistant's calls; the last a user's or results.
struct Turns {
  std::string system;
  std::vector<Turn> turns;
};

[[noreturn]] void bad(const std::string& what) {
  throw ApiError(400, "messages: " + what, "messages");
}

Turns to_turns(const std::vector<ChatMessage>& messages) {
  Turns t;
  size_t i = 0;
  for (; i < messages.size() && is_system(messages[i].role); ++i) {
    t.system += (t.system.empty() ? "" : "\n\n") + messages[i].content;
  }
  for (; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (is_system(m.role)) bad("a " + m.role + " message must come before the conversation");
    const Turn::Kind kind = m.role == "user"        ? Turn::kUser
                            : m.role == "assistant" ? Turn::kAssistant
                                                    : Turn::kTool;
    Turn* last = t.turns.empty() ? nullptr : &t.turns.back();
    if (last && last->kind == kind) {  // one role twice: one turn
      if (kind == Turn::kTool) {
        last->results.push_back(m.content);
      } else {
        if (!m.content.empty()) last->text += (last->text.empty() ? "" : "\n\n") + m.content;
        last->calls.insert(last->calls.end(), m.tool_calls.begin(), m.tool_calls.end());
      }
      continue;
    }
    if (!last && kind != Turn::kUser) bad("the conversation must start with a user message");
    if (kind == Turn::kTool && last->calls.empty())
      bad("a tool message must follow an assistant message with tool_calls");
    if (kind == Turn::kUser && last && last->kind == Turn::kTool)
      bad("a user message cannot follow tool results; the assistant answers them first");
    Turn turn{kind, m.content, m.tool_calls, {}};
    if (kind == Turn::kTool) turn = Turn{kind, "", {}, {m.content}};
    t.turns.push_back(std::move(turn));
  }
  if (t.turns.empty()) bad("there is no user message");
  if (t.turns.back().kind == Turn::kAssistant) {
    bad(t.turns.back().calls.empty()
            ? "the last message must be the user's"
            : "the assistant's tool_calls need their results (tool messages) after them");
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

runtime::ToolSyntax ChatFormatter::tool_syntax() const {
  if (!chat_) return runtime::plain_tool_syntax();
  try {
    return runtime::tool_syntax(chat_->format());
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "tools");
  }
}

ChatFormatter::Prompt ChatFormatter::format(const std::vector<ChatMessage>& messages,
                                            const std::vector<runtime::ToolFunction>* tools) const {
  Turns t = to_turns(messages);
  const bool any_calls = std::any_of(t.turns.begin(), t.turns.end(), [](const Turn& x) {
    return x.kind != Turn::kUser && !x.calls.empty();
  });
  const bool offer = tools && !tools->empty();
  const runtime::ToolSyntax syntax =
      offer || any_calls ? tool_syntax() : runtime::ToolSyntax::kHermes;
  const bool llama3 = syntax == runtime::ToolSyntax::kLlama3 && (offer || any_calls);
  const bool harmony = syntax == runtime::ToolSyntax::kHarmony;
  std::string first_user_head;  // llama3: the tools, at the head of the first user message
  std::string harmony_tools;    // harmony: the developer message's tools section
  if (offer) {
    const std::string tools_text = runtime::tools_instructions(syntax, *tools);
    if (harmony) {
      harmony_tools = tools_text;
    } else if (syntax == runtime::ToolSyntax::kLlama3) {
      t.system = runtime::llama3_tools_system() + (t.system.empty() ? "" : "\n" + t.system);
      first_user_head = tools_text;
    } else {
      t.system += (t.system.empty() ? "" : "\n\n") + tools_text;
    }
  }
  // A turn's text as the format writes it: replies with their calls, results as a user
  // turn (hermes).
  auto text_of = [&](const Turn& x, size_t i) {
    if (x.kind == Turn::kAssistant) return runtime::reply_with_calls(syntax, x.text, x.calls);
    if (x.kind == Turn::kTool) return runtime::tool_results_text(x.results);
    return i == 0 ? first_user_head + x.text : x.text;
  };
  Prompt p;
  if (!chat_) {
    std::string text = t.system.empty() ? "" : t.system + "\n\n";
    for (size_t i = 0; i < t.turns.size(); ++i) {
      const std::string x = text_of(t.turns[i], i);
      if (t.turns[i].kind != Turn::kAssistant) {
        text += "User: " + x + "\n";
        continue;
      }
      // A reply as the model wrote it after "Assistant:" (usually from a space), so that
      // the next turn's prompt starts with the tokens the server's cache holds.
      const bool spaced = !x.empty() && (x[0] == ' ' || x[0] == '\n');
      text += (spaced ? "Assistant:" : "Assistant: ") + x + "\n";
    }
    text += "Assistant:";
    p.tokens = tk_.encode(text, tk_.add_bos());
    p.stop = {"\nUser:"};
    return p;
  }
  for (size_t i = 0; i < t.turns.size(); ++i) {
    const Turn& x = t.turns[i];
    std::vector<int> part;
    if (x.kind == Turn::kAssistant && harmony && !x.calls.empty()) {
      part = runtime::harmony_reply_with_calls(tk_, x.text, x.calls);
    } else if (x.kind == Turn::kAssistant) {
      // A reply in the history: its text as the model would have written it (the next
      // turn closes it with the end marker).
      part = chat_->history_reply(text_of(x, i));
    } else if (x.kind == Turn::kTool && llama3) {
      part = chat_->ipython_turn(x.results);
    } else if (x.kind == Turn::kTool && harmony) {
      part = runtime::harmony_tool_results(tk_, t.turns[i - 1].calls, x.results);
    } else {
      part = chat_->user_turn(text_of(x, i), t.system, i == 0, false, harmony_tools);
    }
    p.tokens.insert(p.tokens.end(), part.begin(), part.end());
  }
  p.end_tokens = end_tokens_;
  return p;
}

}  // namespace kivi::server
