// Tool calls (OpenAI `tools`): how a chat format shows the model its functions, how the
// model writes a call and how a call and its result appear in the history, the grammar
// that holds a call to its function's JSON schema, and the parser that reads calls out
// of a reply. Two syntaxes, as the models' own chat templates write them:
//
//   hermes  (chatml: Qwen2.5, Qwen3; also gemma, phi3 and plain, which bring none of
//           their own) the system message ends with "# Tools" and the functions as JSON
//           lines in <tools></tools>; a reply holds text, then calls
//             <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>
//           separated by newlines; results return in a user turn, each as
//           <tool_response>\n{result}\n</tool_response>.
//   llama3  (Llama 3.1+) "Environment: ipython" in the system message, the functions
//           (indented JSON) and the instructions at the head of the first user message;
//           a reply that is a call is the JSON {"name": NAME, "parameters": {...}} alone;
//           each result returns in an ipython turn.
//   harmony (gpt-oss) the system message adds "Calls to these tools must go to the
//           commentary channel: 'functions'.", the developer message ends with the
//           functions as a TypeScript namespace (gpt-oss's template's
//           render_tool_namespace); a call is a message to a recipient
//             <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}
//           ended by <|call|> (the reply's end: one call per reply; several calls in the
//           history are several messages), and each result returns as a message from
//             <|start|>functions.NAME to=assistant<|channel|>commentary<|message|>"..."<|end|>
//           with the result's text as a JSON string. Calls and results are written in the
//           history as the model writes them, so a conversation's prompt starts with the
//           tokens the server's cache holds (the template writes the recipient before the
//           channel; both are harmony).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/chat.h"
#include "runtime/generation.h"

namespace kivi::runtime {

enum class ToolSyntax { kHermes, kLlama3, kHarmony };

// The syntax of a chat format.
ToolSyntax tool_syntax(ChatFormat f);
// Plain transcripts (no chat format) use hermes.
inline ToolSyntax plain_tool_syntax() { return ToolSyntax::kHermes; }

struct ToolFunction {
  std::string name;
  nlohmann::ordered_json tool;        // the tool object as the client sent it
  nlohmann::ordered_json parameters;  // the function's JSON schema
};

struct ToolCall {
  std::string id;  // chosen by the server ("call_...")
  std::string name;
  std::string arguments;  // JSON text, as the model wrote it
};

// A function name a call may use: 1 to 64 letters, digits, '_', '-' or '.'.
bool valid_function_name(std::string_view name);

// hermes: the text the system message ends with (after the client's system message and
// a blank line, or alone). llama3: the text the first user message starts with.
// harmony: the developer message's "# Tools" section (ChatPrompt::user_turn's `tools`).
std::string tools_instructions(ToolSyntax s, const std::vector<ToolFunction>& tools);
// harmony: a function's parameters as gpt-oss's template writes them, "(_: {...}) => any"
// ("() => any" without properties); a schema's type as TypeScript ("string", "number[]",
// "\"c\" | \"f\"", ...).
std::string harmony_function_type(const nlohmann::ordered_json& parameters);
std::string typescript_type(const nlohmann::ordered_json& schema);
// harmony: the tokens of a reply with calls in the history, after the assistant's header
// (the content, if any, as an analysis message first; each call a commentary message to
// its function; the last one's <|call|> is the next turn's).
std::vector<int> harmony_reply_with_calls(const tok::Tokenizer& tk, const std::string& content,
                                          const std::vector<ToolCall>& calls);
// harmony: the tokens of the results of `calls` (result i from calls[i], or from the last
// call): the reply closed with <|call|>, a message from each function, the assistant's
// header.
std::vector<int> harmony_tool_results(const tok::Tokenizer& tk, const std::vector<ToolCall>& calls,
                                      const std::vector<std::string>& results);
// llama3: the system message's head when tools are offered.
inline const char* llama3_tools_system() { return "Environment: ipython\n"; }
// A reply in the history with its calls, as the model writes them after the assistant's
// header (llama3 writes only the first call, as its template does).
std::string reply_with_calls(ToolSyntax s, const std::string& content,
                             const std::vector<ToolCall>& calls);
// hermes: the text of a user turn that returns results.
std::string tool_results_text(const std::vector<std::string>& results);

// GBNF whose sentences are calls in the syntax: to `only` (a name) or any function when
// empty, one call or (`parallel`, hermes) several. Arguments follow each function's JSON
// schema; throws grammar::SchemaError (its pointer inside the parameters) for a schema
// the converter cannot honour.
std::string tool_calls_gbnf(ToolSyntax s, const std::vector<ToolFunction>& tools,
                            const std::string& only, bool parallel);
// Where calls start in free text (tool_choice "auto"): "<tool_call>" anywhere (hermes),
// "{" as the reply's first text (llama3), " to=functions." anywhere (harmony, whose
// grammar writes markup tokens: GenerationOptions::grammar_markup).
GrammarTrigger tool_call_trigger(ToolSyntax s);

// Reads a reply as it arrives: text is released as content until a call may start, and
// from there held to the end, when the calls are parsed. Text that turns out not to be
// calls (bad JSON, an unknown function, text after the calls) is content after all.
// harmony: the reply's text with its markup rendered; each message's header is held
// until its <|message|>, and a header with the recipient "to=functions.NAME" starts the
// call. What is released is harmony text still (HarmonyReplyParser splits it).
class ToolCallParser {
 public:
  ToolCallParser(ToolSyntax s, std::vector<std::string> names);
  // Content this piece releases.
  std::string push(std::string_view text);
  // Content still held; calls() is complete after it.
  std::string finish();
  const std::vector<ToolCall>& calls() const { return calls_; }

 private:
  bool parse_calls(std::string_view text);
  bool parse_harmony_call(std::string_view text);
  std::string push_harmony();
  bool known(const std::string& name) const;

  ToolSyntax s_;
  std::vector<std::string> names_;
  std::string held_;
  bool in_calls_ = false;  // a call has started: everything is held
  bool decided_ = false;   // llama3: the reply's first text has been seen
  // harmony: held_ starts with a message's header (a reply starts inside the assistant's).
  bool in_header_ = false;
  std::vector<ToolCall> calls_;
};

struct ReplyWithCalls {
  std::string content;
  std::vector<ToolCall> calls;
};
// The whole reply at once.
ReplyWithCalls parse_tool_calls(ToolSyntax s, std::vector<std::string> names,
                                std::string_view reply);

// JSON as Python's json.dumps writes it (", " and ": " between items, UTF-8 kept), which
// the chat templates' tojson filter uses.
std::string python_json(const nlohmann::ordered_json& v);

}  // namespace kivi::runtime
