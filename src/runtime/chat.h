// Chat formats: how a conversation is written as tokens for an instruction-tuned model.
// Five are known, detected from the model's tokenizer.chat_template (Jinja source):
//
//   llama3  <|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>
//           <|start_header_id|>user<|end_header_id|>\n\n{user}<|eot_id|>
//           <|start_header_id|>assistant<|end_header_id|>\n\n{reply}<|eot_id|>...
//           (message text trimmed of surrounding whitespace, as Meta's template does)
//   chatml  <|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n
//           <|im_start|>assistant\n{reply}<|im_end|>\n...   (Qwen2, Qwen2.5, Qwen3)
//   gemma   <bos><start_of_turn>user\n{system}\n\n{user}<end_of_turn>\n
//           <start_of_turn>model\n{reply}<end_of_turn>\n...   (Gemma 2, Gemma 3: the system
//           message opens the first user turn; messages trimmed)
//   phi3    <|system|>\n{system}<|end|>\n<|user|>\n{user}<|end|>\n<|assistant|>\n{reply}<|end|>\n
//           ...   (Phi-3, Phi-4)
//   harmony <|start|>system<|message|>{preamble}<|end|>
//           <|start|>developer<|message|># Instructions\n\n{system}\n\n<|end|>
//           <|start|>user<|message|>{user}<|end|><|start|>assistant{reply}<|end|>...
//           (gpt-oss: OpenAI's harmony format, as gpt-oss's template writes it; the
//           preamble is the template's "You are ChatGPT, ... Current date: YYYY-MM-DD ...
//           Reasoning: medium ... # Valid channels: ...", the developer message only with a
//           system message.) The model writes its reasoning and then its answer as two
//           messages, <|channel|>analysis<|message|>...<|end|><|start|>assistant
//           <|channel|>final<|message|>...<|return|>: a reply ends at <|return|> (or <|call|>),
//           not at <|end|>, and the next turn closes it with <|end|>, as the template
//           writes a reply in the history. HarmonyReplyParser tells the reasoning from the
//           answer.
//   plain   {system}\n\nUser: {user}\nAssistant: {reply}\nUser: ...   (any model, chosen by
//           name only; the reply ends at "\nUser:" or an end token)
//
// The markup is encoded with special tokens recognized, the messages without: text a
// user types that looks like "<|eot_id|>" stays text. A conversation grows by turns:
// each turn's tokens close the previous reply (the end marker the model sampled, which
// the cache has not seen yet) and open the next one, so history is never encoded again.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace kivi::runtime {

enum class ChatFormat { kLlama3, kChatMl, kGemma, kPhi3, kHarmony, kPlain };

const char* chat_format_name(ChatFormat f);
// "llama3", "chatml", "gemma", "phi3", "harmony" or "plain"; anything else is a kivi::Error
// listing them.
ChatFormat parse_chat_format(const std::string& name);
// The format a Jinja chat template writes, if it is one of the known ones.
std::optional<ChatFormat> detect_chat_format(const std::string& chat_template);

class ChatPrompt {
 public:
  // `override_name` ("llama3", "chatml", "gemma", "phi3", "harmony", "plain" or empty) wins
  // over the tokenizer's template; with neither, or when the vocabulary lacks the format's
  // special tokens, throws kivi::Error saying what is missing.
  ChatPrompt(const tok::Tokenizer& tk, const std::string& override_name);

  ChatFormat format() const { return format_; }
  // Tokens of the next user turn, up to the assistant's header. The first turn starts
  // the conversation (BOS as the format or vocabulary wants, then the system message
  // if `system` is not empty); later turns first close the previous reply.
  // plain: `after_marker` says the previous reply ended by writing "\nUser:" itself, so
  // the turn goes on after it. harmony: `tools` (runtime/tool_calls.h's tools section)
  // ends the first turn's developer message, and the system message names the channel
  // of calls.
  std::vector<int> user_turn(const std::string& text, const std::string& system, bool first,
                             bool after_marker = false, const std::string& tools = "") const;
  // llama3: tokens of tool results after a reply that called tools: the reply closed,
  // each result in an ipython turn (trimmed), then the assistant's header.
  std::vector<int> ipython_turn(const std::vector<std::string>& results) const;
  // Tokens of an assistant reply in the history (a conversation written whole, as the
  // server does): its text as the model would have written it after the assistant's
  // header (harmony: as the final channel's message); the next user turn closes it.
  std::vector<int> history_reply(const std::string& text) const;
  // Stop strings that end a reply ("\nUser:" for plain; none for the others).
  std::vector<std::string> stop_strings() const;
  // Whether `token` ends the assistant's reply (the format's end markers, EOS, EOT).
  bool ends_reply(int token) const;
  // The format's end markers, for the stop rule (runtime/generation.h): harmony's
  // <|return|> and <|call|>, the others' end-of-turn token, none for plain.
  const std::vector<int>& end_tokens() const { return end_ids_; }
  // Whether replies carry reasoning apart from the answer (harmony's analysis channel:
  // HarmonyReplyParser splits them).
  bool has_reasoning() const { return format_ == ChatFormat::kHarmony; }
  // harmony: the "Current date" of the system message, YYYY-MM-DD. Empty (the default):
  // the local date when a first turn is written, as the template's strftime_now.
  void set_date(std::string yyyy_mm_dd) { date_ = std::move(yyyy_mm_dd); }

 private:
  const tok::Tokenizer& tk_;
  ChatFormat format_;
  // <|eot_id|>, <|im_end|>, <end_of_turn> or <|end|>; <|return|> and <|call|> for harmony;
  // none for plain
  std::vector<int> end_ids_;
  std::string date_;
};

// harmony's system message (the template's build_system_message) for a date, with or
// without function tools.
std::string harmony_system_message(const std::string& yyyy_mm_dd, bool tools = false);

// A reply split into what the model reasoned and what it answers.
struct ReplyParts {
  std::string reasoning;
  std::string content;
};

// Splits a harmony reply into reasoning and answer as its text arrives, with the markup
// rendered (tok::Tokenizer decodes it in a harmony vocabulary):
//   <|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant<|channel|>final
//   <|message|>{answer}
// The bodies of analysis messages, and of messages to a recipient ("to=": tool calls),
// are reasoning; those of other messages (final, commentary without a recipient) and text
// outside any header are the answer. Headers (roles, channels, recipients, <|constrain|>
// types) and the markup itself are dropped; the bodies of two messages of the same part are
// joined by a newline. A marker split across pushes is held until it is whole.
class HarmonyReplyParser {
 public:
  // The reasoning and answer text this piece releases.
  ReplyParts push(std::string_view text);
  // Releases what is held (a partial marker is text).
  ReplyParts finish();

 private:
  enum class State { kBody, kHeader };
  void emit(std::string_view text, ReplyParts& out);
  void open_message();
  std::string held_;    // unprocessed text: a possible marker's start
  std::string header_;  // the current header's text
  State state_ = State::kBody;
  bool to_reasoning_ = false;     // the current message's part
  bool message_started_ = false;  // the current message has released text
  bool any_reasoning_ = false, any_content_ = false;
};

// The whole reply at once.
ReplyParts split_harmony_reply(std::string_view text);

}  // namespace kivi::runtime
