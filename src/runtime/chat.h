// Chat formats: how a conversation is written as tokens for an instruction-tuned model.
// Four are known, detected from the model's tokenizer.chat_template (Jinja source):
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
#include <vector>

#include "tokenizer/tokenizer.h"

namespace kivi::runtime {

enum class ChatFormat { kLlama3, kChatMl, kGemma, kPhi3, kPlain };

const char* chat_format_name(ChatFormat f);
// "llama3", "chatml", "gemma", "phi3" or "plain"; anything else is a kivi::Error listing them.
ChatFormat parse_chat_format(const std::string& name);
// The format a Jinja chat template writes, if it is one of the known ones.
std::optional<ChatFormat> detect_chat_format(const std::string& chat_template);

class ChatPrompt {
 public:
  // `override_name` ("llama3", "chatml", "gemma", "phi3", "plain" or empty) wins over the
  // tokenizer's template; with neither, or when the vocabulary lacks the format's special tokens,
  // throws kivi::Error saying what is missing.
  ChatPrompt(const tok::Tokenizer& tk, const std::string& override_name);

  ChatFormat format() const { return format_; }
  // Tokens of the next user turn, up to the assistant's header. The first turn starts
  // the conversation (BOS as the format or vocabulary wants, then the system message
  // if `system` is not empty); later turns first close the previous reply.
  // plain: `after_marker` says the previous reply ended by writing "\nUser:" itself, so
  // the turn goes on after it.
  std::vector<int> user_turn(const std::string& text, const std::string& system, bool first,
                             bool after_marker = false) const;
  // Stop strings that end a reply ("\nUser:" for plain; none for the others).
  std::vector<std::string> stop_strings() const;
  // Whether `token` ends the assistant's reply (the format's end marker, EOS, EOT).
  bool ends_reply(int token) const;
  // The format's end marker, for the stop rule (runtime/generation.h).
  std::vector<int> end_tokens() const {
    return end_id_ >= 0 ? std::vector<int>{end_id_} : std::vector<int>{};
  }

 private:
  const tok::Tokenizer& tk_;
  ChatFormat format_;
  int end_id_ = -1;  // <|eot_id|>, <|im_end|>, <end_of_turn> or <|end|>; -1 for plain
};

}  // namespace kivi::runtime
