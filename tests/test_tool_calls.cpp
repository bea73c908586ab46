// Tool calls: the prompt each syntax writes (goldens written by hand from Qwen2.5's and
// Llama 3.1's chat templates), the grammar of calls (sentences the matcher takes and
// refuses), the reply parser (whole, and streamed at every split) and the lazy grammar a
// Continuation starts at a call's first text.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <random>

#include "bpe_fixture.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/token_mask.h"
#include "runtime/generation.h"
#include "runtime/tool_calls.h"
#include "server/api_error.h"
#include "server/messages.h"
#include "test_util.h"
#include "tokenizer/hf_tokenizer.h"

namespace kivi::runtime {
namespace {

using nlohmann::ordered_json;

std::vector<ToolFunction> weather_tools() {
  const ordered_json weather = ordered_json::parse(R"({"type": "function", "function": {
      "name": "get_weather", "description": "Weather of a city",
      "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"], "additionalProperties": false}}})");
  const ordered_json time = ordered_json::parse(R"({"type": "function", "function": {
      "name": "now", "parameters": {"type": "object", "properties": {}, "additionalProperties": false}}})");
  return {{"get_weather", weather, weather["function"]["parameters"]},
          {"now", time, time["function"]["parameters"]}};
}

bool sentence(const std::string& gbnf, const std::string& text) {
  const auto g = std::make_shared<const grammar::Grammar>(grammar::Grammar::parse(gbnf));
  grammar::Matcher m(g);
  return m.accept(text) && m.accepting();
}

TEST(ToolGrammar, PrefixedRulesKeepTheLanguage) {
  const std::string g =
      "root ::= item (\",\" item)* # root item\n"
      "item ::= \"root\" | [a-z] \"item\"{1,2} | ws\nws ::= [ \\]root]?\n";
  const std::string p = grammar::prefix_rule_names(g, "x-");
  EXPECT_NE(p.find("x-root ::= x-item"), std::string::npos) << p;
  EXPECT_NE(p.find("\"root\" | [a-z] \"item\"{1,2} | x-ws"), std::string::npos) << p;
  EXPECT_NE(p.find("[ \\]root]?"), std::string::npos) << p;
  const std::string joined = "root ::= x-root\n" + p;
  for (const char* ok : {"root", "aitem,root", "bitemitem", " ", "]"}) {
    EXPECT_TRUE(sentence(g, ok)) << ok;
    EXPECT_TRUE(sentence(joined, ok)) << ok;
  }
  for (const char* no : {"item", "aitemitemitem", "root,x"})
    EXPECT_FALSE(sentence(joined, no)) << no;
}

TEST(ToolGrammar, CallsFollowTheirSchemas) {
  const auto tools = weather_tools();
  const std::string h = tool_calls_gbnf(ToolSyntax::kHermes, tools, "", true);
  const std::string one =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": "
      "\"c\"}}\n</tool_call>";
  const std::string now = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
  EXPECT_TRUE(sentence(h, one));
  EXPECT_TRUE(sentence(h, now));
  EXPECT_TRUE(sentence(h, one + "\n" + now));
  EXPECT_FALSE(sentence(h, "<tool_call>\n{\"name\": \"later\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(sentence(h,
                        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                        "\"Paris\", \"unit\": \"k\"}}\n</tool_call>"));
  EXPECT_FALSE(sentence(h,
                        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                        "\"Paris and far beyond\", \"unit\": \"c\"}}\n</tool_call>"));
  EXPECT_FALSE(sentence(h, "hello " + now));
  // One call only, and only the named function.
  const std::string single = tool_calls_gbnf(ToolSyntax::kHermes, tools, "", false);
  EXPECT_TRUE(sentence(single, now));
  EXPECT_FALSE(sentence(single, one + "\n" + now));
  const std::string named = tool_calls_gbnf(ToolSyntax::kHermes, tools, "now", true);
  EXPECT_TRUE(sentence(named, now + "\n" + now));
  EXPECT_FALSE(sentence(named, one));
  EXPECT_THROW(tool_calls_gbnf(ToolSyntax::kHermes, tools, "later", true), Error);
  // llama3: the call alone, "parameters".
  const std::string l = tool_calls_gbnf(ToolSyntax::kLlama3, tools, "", true);
  EXPECT_TRUE(sentence(l, "{\"name\": \"now\", \"parameters\": {}}"));
  EXPECT_FALSE(sentence(l, "{\"name\": \"now\", \"arguments\": {}}"));
  EXPECT_FALSE(sentence(l,
                        "{\"name\": \"now\", \"parameters\": {}}{\"name\": \"now\", "
                        "\"parameters\": {}}"));
  // A schema the converter cannot honour names the tool and the keyword.
  auto bad = tools;
  bad[1].parameters = ordered_json::parse(R"({"type": "string", "pattern": "a+"})");
  try {
    tool_calls_gbnf(ToolSyntax::kHermes, bad, "", true);
    FAIL() << "no error";
  } catch (const grammar::SchemaError& e) {
    EXPECT_EQ(e.pointer(), "/1/function/parameters/pattern");
  }
}

// The reply parser gives the same content and calls whole and streamed, whatever the split.
ReplyWithCalls streamed(ToolSyntax s, const std::vector<std::string>& names, const std::string& t,
                        size_t a, size_t b) {
  ToolCallParser p(s, names);
  ReplyWithCalls r;
  r.content = p.push(t.substr(0, a));
  r.content += p.push(t.substr(a, b - a));
  r.content += p.push(t.substr(b));
  r.content += p.finish();
  r.calls = p.calls();
  return r;
}

void check_splits(ToolSyntax s, const std::string& text, const std::string& content,
                  const std::vector<std::pair<std::string, std::string>>& calls) {
  const std::vector<std::string> names = {"get_weather", "now"};
  const ReplyWithCalls whole = parse_tool_calls(s, names, text);
  EXPECT_EQ(whole.content, content) << text;
  ASSERT_EQ(whole.calls.size(), calls.size()) << text;
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(whole.calls[i].name, calls[i].first);
    EXPECT_EQ(whole.calls[i].arguments, calls[i].second);
  }
  for (size_t a = 0; a <= text.size(); a += 3) {
    for (size_t b = a; b <= text.size(); b += 5) {
      const ReplyWithCalls r = streamed(s, names, text, a, b);
      EXPECT_EQ(r.content, whole.content) << a << " " << b;
      ASSERT_EQ(r.calls.size(), whole.calls.size()) << a << " " << b;
      for (size_t i = 0; i < calls.size(); ++i) EXPECT_EQ(r.calls[i].arguments, calls[i].second);
    }
  }
}

TEST(ToolParser, HermesCallsAfterText) {
  const std::string args = "{\"city\": \"Paris\",\n \"unit\": \"c\"}";
  check_splits(ToolSyntax::kHermes,
               "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + args +
                   "}\n</tool_call>\n<tool_call>\n{\"arguments\": {}, \"name\": \"now\"}\n"
                   "</tool_call>\n",
               "Let me look.", {{"get_weather", args}, {"now", "{}"}});
  check_splits(ToolSyntax::kHermes, "<tool_call>{\"name\":\"now\",\"arguments\":{}}</tool_call>",
               "", {{"now", "{}"}});
  // Not calls: everything is content, as written.
  for (const char* text :
       {"no calls here, a < b and <tool",
        "x <tool_call>\n{\"name\": \"later\", \"arguments\": {}}"
        "\n</tool_call>",
        "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call> and more",
        "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}",
        "<tool_call>\n{\"name\": \"now\", "
        "\"arguments\": [1]}\n</tool_call>",
        "<tool_call>\n{\"name\": \"now\" \"arguments\": {}}\n</tool_call>", "trailing space \n "}) {
    check_splits(ToolSyntax::kHermes, text, text, {});
  }
}

TEST(ToolParser, Llama3CallIsTheWholeReply) {
  const std::string args = "{\"city\": \"Oslo\", \"unit\": \"f\"}";
  check_splits(ToolSyntax::kLlama3, " \n{\"name\": \"get_weather\", \"parameters\": " + args + "}",
               "", {{"get_weather", args}});
  for (const char* text : {"It is {\"name\": \"now\", \"parameters\": {}}",
                           "{\"name\": \"now\", \"parameters\": {}} done", "{not json", "  "}) {
    check_splits(ToolSyntax::kLlama3, text, text, {});
  }
}

TEST(ToolParser, HistoryRepliesParseBackToTheirCalls) {
  const std::vector<ToolCall> calls = {{"", "get_weather", "{\"city\": \"Rome\", \"unit\": \"c\"}"},
                                       {"", "now", "{}"}};
  const auto h = parse_tool_calls(ToolSyntax::kHermes, {"get_weather", "now"},
                                  reply_with_calls(ToolSyntax::kHermes, "Checking.", calls));
  EXPECT_EQ(h.content, "Checking.");
  ASSERT_EQ(h.calls.size(), 2u);
  EXPECT_EQ(h.calls[0].arguments, calls[0].arguments);
  EXPECT_EQ(h.calls[1].name, "now");
  const auto l = parse_tool_calls(ToolSyntax::kLlama3, {"get_weather", "now"},
                                  reply_with_calls(ToolSyntax::kLlama3, "", {calls[0]}));
  ASSERT_EQ(l.calls.size(), 1u);
  EXPECT_EQ(l.calls[0].arguments, calls[0].arguments);
  // Python's separators, UTF-8 kept (what json.dumps(x, ensure_ascii=False) writes).
  EXPECT_EQ(python_json(ordered_json::parse(R"({"b": [1, 2.5, "é\n"], "a": {"x": null}})")),
            "{\"b\": [1, 2.5, \"é\\n\"], \"a\": {\"x\": null}}");
}

// A vocabulary with both formats' markup and Qwen's tool tags as added (non-special)
// tokens.
tok::Tokenizer tool_tokenizer() {
  const nlohmann::json j = test::tiny_tokenizer_json({{"h", "e"}, {"l", "l"}, {"\n", "\n"}},
                                                     {{"<|begin_of_text|>", true},
                                                      {"<|start_header_id|>", true},
                                                      {"<|end_header_id|>", true},
                                                      {"<|eot_id|>", true},
                                                      {"<|im_start|>", true},
                                                      {"<|im_end|>", true},
                                                      {"<tool_call>", false},
                                                      {"</tool_call>", false},
                                                      {"<tool_response>", false},
                                                      {"</tool_response>", false}},
                                                     test::kLlama3Regex);
  return tok::parse_hf_tokenizer(
             j.dump(), R"({"bos_token": "<|begin_of_text|>", "add_bos_token": false})", "tools")
      .tokenizer("tools");
}

std::vector<server::ChatMessage> round_trip() {
  return {{"system", "Be brief."},
          {"user", "Weather in Paris?"},
          {"assistant", "", {{"call_1", "get_weather", "{\"city\": \"Paris\", \"unit\": \"c\"}"}}},
          {"tool", "{\"temp\": 21}"},
          {"assistant", "It is 21 C."},
          {"user", "And now?"}};
}

TEST(ToolPrompt, ChatMlWritesQwenToolTurns) {
  const tok::Tokenizer tk = tool_tokenizer();
  const server::ChatFormatter chat(tk, "chatml");
  const auto tools = weather_tools();
  const auto p = chat.format(round_trip(), &tools);
  // Qwen2.5's template, written out by hand for this conversation.
  const std::string want =
      "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist "
      "with the user query.\n\nYou are provided with function signatures within <tools></tools> "
      "XML tags:\n<tools>\n"
      "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
      "\"Weather of a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "
      "{\"type\": \"string\", \"maxLength\": 12}, \"unit\": {\"enum\": [\"c\", \"f\"]}}, "
      "\"required\": [\"city\", \"unit\"], \"additionalProperties\": false}}}\n"
      "{\"type\": \"function\", \"function\": {\"name\": \"now\", \"parameters\": {\"type\": "
      "\"object\", \"properties\": {}, \"additionalProperties\": false}}}\n</tools>\n\n"
      "For each function call, return a json object with function name and arguments within "
      "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
      "<args-json-object>}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
      "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"unit\": \"c\"}}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n"
      "<|im_start|>assistant\nIt is 21 C.<|im_end|>\n"
      "<|im_start|>user\nAnd now?<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(p.tokens, tk.encode(want, false, false, true));
  EXPECT_EQ(tk.decode_all(p.tokens), tk.decode_all(tk.encode(want, false, false, true)));
}

TEST(ToolPrompt, Llama3WritesIpythonTurns) {
  const tok::Tokenizer tk = tool_tokenizer();
  const server::ChatFormatter chat(tk, "llama3");
  auto tools = weather_tools();
  tools.pop_back();
  auto messages = round_trip();
  messages.resize(4);  // ends with the tool's result
  const auto p = chat.format(messages, &tools);
  // Llama 3.1's template (tools in the first user message; no date lines, as kivi's
  // llama3 format writes the system message as given).
  const std::string want =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n\n"
      "Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
      "Given the following functions, please respond with a JSON for a function call with its "
      "proper arguments that best answers the given prompt.\n\nRespond in the format {\"name\": "
      "function name, \"parameters\": dictionary of argument name and its value}.Do not use "
      "variables.\n\n" +
      tools[0].tool.dump(4) +
      "\n\nWeather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
      "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"c\"}}"
      "<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n{\"temp\": 21}<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n";
  EXPECT_EQ(tk.decode_all(p.tokens), tk.decode_all(tk.encode(want, false, false, true)));
  EXPECT_EQ(p.tokens, tk.encode(want, false, false, true));
}

TEST(ToolPrompt, ConversationsOutOfOrderAreRefused) {
  const tok::Tokenizer tk = tool_tokenizer();
  const server::ChatFormatter chat(tk, "chatml");
  const std::vector<std::vector<server::ChatMessage>> bad = {
      {{"user", "a"}, {"tool", "r"}},                           // no calls before the result
      {{"user", "a"}, {"assistant", "", {{"", "now", "{}"}}}},  // calls without results
      {{"user", "a"}, {"assistant", "", {{"", "now", "{}"}}}, {"tool", "r"}, {"user", "b"}},
      {{"tool", "r"}},
  };
  for (const auto& m : bad) EXPECT_THROW(chat.format(m), server::ApiError) << m.size();
}

// A lazy grammar: free text until the trigger, then only what the grammar allows, and the
// reply ends when the grammar is complete. The logits always favour `want[i]`.
TEST(LazyGrammar, StartsAtTheTriggerAndEndsWithTheGrammar) {
  const tok::Tokenizer tk = tool_tokenizer();
  const int V = tk.vocab_size();
  const int call_open = tk.find_special("<tool_call>");
  ASSERT_GE(call_open, 0);
  auto run = [&](const GrammarTrigger& trigger, const std::vector<int>& want) {
    GenerationOptions o;
    o.max_tokens = 40;
    o.sampler.temperature = 0.0f;
    o.grammar = std::make_shared<const grammar::Grammar>(
        grammar::Grammar::parse("root ::= \"<tool_call>\" \"hello\"+"));
    o.trigger = trigger;
    Continuation c(tk, o, -1);
    std::string text;
    std::vector<float> logits(V);
    for (size_t i = 0; !c.done(); ++i) {
      std::fill(logits.begin(), logits.end(), 0.0f);
      logits[want[std::min(i, want.size() - 1)]] = 10.0f;
      text += c.next(logits.data()).text;
    }
    return text;
  };
  const std::vector<int> hi = tk.encode("hi ", false);
  // Free text, then the trigger; from there the wanted "hi" is refused and the text
  // follows the grammar ("hello" repeated, while the logits favour "hi").
  auto follows_grammar = [](const std::string& t, const std::string& head) {
    if (t.rfind(head, 0) != 0) return false;
    const std::string rest = t.substr(head.size());
    std::string hellos;
    while (hellos.size() < rest.size()) hellos += "hello";
    return !rest.empty() && hellos.compare(0, rest.size(), rest) == 0;
  };
  std::vector<int> want = hi;
  want.push_back(call_open);
  want.insert(want.end(), hi.begin(), hi.end());
  const std::string t = run({"<tool_call>", false}, want);
  EXPECT_TRUE(follows_grammar(t, "hi <tool_call>")) << t;
  // at_start: text before the trigger leaves the reply free ("hi" repeats).
  const std::string free = run({"<tool_call>", true}, want);
  EXPECT_EQ(free.rfind("hi <tool_call>hi", 0), 0u) << free;
  // at_start, first: the grammar holds.
  std::vector<int> first = {call_open};
  first.insert(first.end(), hi.begin(), hi.end());
  const std::string held = run({"<tool_call>", true}, first);
  EXPECT_TRUE(follows_grammar(held, "<tool_call>")) << held;
}

// harmony (gpt-oss): the goldens are the text gpt-oss's chat template writes
// (build_system_message with tools, the developer message's render_tool_namespace, tool
// messages as "functions.NAME to=assistant" with the result |tojson), written out by hand;
// a call in the history is written as the model writes it (OpenAI's harmony guide).
using test::harmony_tokenizer;

TEST(ToolPrompt, HarmonyWritesTheNamespaceAndCallMessages) {
  const tok::Tokenizer tk = harmony_tokenizer();
  const server::ChatFormatter chat(tk, "harmony");
  const auto tools = weather_tools();
  const auto p = chat.format(round_trip(), &tools);
  const std::string want =
      "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
      "Knowledge cutoff: 2024-06\nCurrent date: " +
      test::local_date() +
      "\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be "
      "included for every message.\nCalls to these tools must go to the commentary channel: "
      "'functions'.<|end|>"
      "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\n"
      "namespace functions {\n\n// Weather of a city\ntype get_weather = (_: {\ncity: string,\n"
      "unit: any,\n}) => any;\n\ntype now = () => any;\n\n} // namespace functions<|end|>"
      "<|start|>user<|message|>Weather in Paris?<|end|>"
      "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
      "<|message|>{\"city\": \"Paris\", \"unit\": \"c\"}<|call|>"
      "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
      "\"{\\\"temp\\\": 21}\"<|end|>"
      "<|start|>assistant<|channel|>final<|message|>It is 21 C.<|end|>"
      "<|start|>user<|message|>And now?<|end|><|start|>assistant";
  EXPECT_EQ(tk.decode_all(p.tokens), tk.decode_all(tk.encode(want, false, false, true)));
  EXPECT_EQ(p.tokens, tk.encode(want, false, false, true));
  // Without a system message the developer message holds the tools alone; two calls in
  // one assistant message are two call messages, and each result comes from its call.
  std::vector<server::ChatMessage> two = {
      {"user", "Go"},
      {"assistant", "Both.", {{"a", "now", "{}"}, {"b", "get_weather", "{\"city\": \"Rome\"}"}}},
      {"tool", "12:00"},
      {"tool", "sun"}};
  const auto q = chat.format(two, &tools);
  const std::string head =
      "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {";
  const std::string tail =
      "<|start|>user<|message|>Go<|end|><|start|>assistant<|channel|>analysis<|message|>Both."
      "<|end|><|start|>assistant<|channel|>commentary to=functions.now <|constrain|>json"
      "<|message|>{}<|call|><|start|>assistant<|channel|>commentary to=functions.get_weather "
      "<|constrain|>json<|message|>{\"city\": \"Rome\"}<|call|>"
      "<|start|>functions.now to=assistant<|channel|>commentary<|message|>\"12:00\"<|end|>"
      "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"sun\"<|end|>"
      "<|start|>assistant";
  EXPECT_NE(tk.decode_all(q.tokens).find(head), std::string::npos) << tk.decode_all(q.tokens);
  const std::vector<int> want_tail = tk.encode(tail, false, false, true);
  ASSERT_GE(q.tokens.size(), want_tail.size());
  EXPECT_EQ(std::vector<int>(q.tokens.end() - static_cast<long>(want_tail.size()), q.tokens.end()),
            want_tail);
  // A user's text that looks like markup stays text.
  std::vector<server::ChatMessage> sneaky = {{"user", "<|call|>"}};
  const auto r = chat.format(sneaky, &tools);
  EXPECT_EQ(std::count(r.tokens.begin(), r.tokens.end(), tk.find_special("<|call|>")), 0);
}

TEST(ToolPrompt, HarmonyTypesFollowTheTemplate) {
  const ordered_json params = ordered_json::parse(R"({"type": "object", "properties": {
      "q": {"type": "string", "description": "What to find"},
      "tags": {"type": "array", "items": {"type": "string"}},
      "n": {"type": "integer", "default": 10},
      "mode": {"type": "string", "enum": ["fast", "slow"], "default": "fast"},
      "note": {"type": "string", "nullable": true},
      "pos": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
              "required": ["x"]},
      "id": {"oneOf": [{"type": "number"}, {"type": "string"}]},
      "any": {"type": ["string", "null"]},
      "flags": {"type": "array", "items": {"type": "boolean"}, "nullable": true},
      "rows": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
      "free": {}, "odd": {"type": "string", "nullable": "yes"}},
    "required": ["q"]})");
  EXPECT_EQ(harmony_function_type(params),
            "(_: {\n// What to find\nq: string,\ntags?: string[],\nn?: number, // default: 10,\n"
            "mode?: \"fast\" | \"slow\", // default: fast,\nnote?: string | null,\n"
            "pos?: {\nx: number, y?: number},\nid?: number | string,\nany?: string | null,\n"
            "flags?: boolean[] | null,\nrows?: number[][],\nfree?: any,\nodd?: string,\n}) => any");
  EXPECT_EQ(harmony_function_type(ordered_json::parse(R"({"type": "object"})")), "() => any");
  EXPECT_EQ(typescript_type(
                ordered_json::parse(R"({"oneOf": [{"type": "object"}, {"type": "string"}]})")),
            "any");
}

TEST(ToolGrammar, HarmonyCallsAreCommentaryMessagesToAFunction) {
  const auto tools = weather_tools();
  const std::string g = tool_calls_gbnf(ToolSyntax::kHarmony, tools, "", true);
  const std::string args = "{\"city\": \"Paris\", \"unit\": \"c\"}";
  for (const std::string& ok : std::vector<std::string>{
           "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" + args,
           " to=functions.get_weather <|constrain|>json<|message|>" + args,
           " to=functions.now<|channel|>commentary json<|message|>{}",
           " to=functions.now<|message|>{}"}) {
    EXPECT_TRUE(sentence(g, ok)) << ok;
  }
  for (const std::string& no : std::vector<std::string>{
           "<|channel|>commentary to=functions.later <|constrain|>json<|message|>{}",
           "<|channel|>final<|message|>{}",
           " to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}",
           " to=functions.now<|message|>{}<|call|>"}) {
    EXPECT_FALSE(sentence(g, no)) << no;
  }
  const std::string named = tool_calls_gbnf(ToolSyntax::kHarmony, tools, "now", true);
  EXPECT_TRUE(sentence(named, " to=functions.now<|message|>{}"));
  EXPECT_FALSE(sentence(named, " to=functions.get_weather<|message|>" + args));
  EXPECT_EQ(tool_call_trigger(ToolSyntax::kHarmony).word, " to=functions.");
}

TEST(ToolParser, HarmonyCallIsAMessageToAFunction) {
  const std::string args = "{\"city\": \"Oslo\", \"unit\": \"f\"}";
  const std::string analysis = "<|channel|>analysis<|message|>Need the weather.<|end|>";
  check_splits(ToolSyntax::kHarmony,
               analysis +
                   "<|start|>assistant<|channel|>commentary to=functions.get_weather "
                   "<|constrain|>json<|message|>" +
                   args,
               analysis, {{"get_weather", args}});
  check_splits(ToolSyntax::kHarmony, " to=functions.now<|channel|>commentary json<|message|> {} ",
               "", {{"now", "{}"}});
  // Not calls: the text is released as written (HarmonyReplyParser reads it after).
  for (const char* text :
       {"<|channel|>final<|message|>It is <|sunny|> and <|chan",
        "<|channel|>commentary to=functions.later <|constrain|>json<|message|>{}",
        "<|channel|>commentary to=functions.now <|constrain|>json<|message|>[1]",
        "<|channel|>commentary to=functions.now <|constrain|>json<|message|>{} and more",
        "<|channel|>commentary to=functions.now json", "plain text, no markup"}) {
    check_splits(ToolSyntax::kHarmony, text, text, {});
  }
  // A history reply parses back to its call.
  const std::vector<ToolCall> call = {{"", "get_weather", args}};
  const auto h = parse_tool_calls(ToolSyntax::kHarmony, {"get_weather", "now"},
                                  reply_with_calls(ToolSyntax::kHarmony, "", call));
  ASSERT_EQ(h.calls.size(), 1u);
  EXPECT_EQ(h.calls[0].arguments, args);
  EXPECT_EQ(h.content, "");
}

// tool_choice "auto" in harmony: the reasoning is free, the grammar starts at the
// recipient " to=functions." and holds the rest of the call; the logits favour the text
// `want` token by token, and a call to an unknown function is turned into a known one.
TEST(LazyGrammar, HarmonyStartsAtTheRecipient) {
  const tok::Tokenizer tk = harmony_tokenizer();
  const auto tools = weather_tools();
  auto run = [&](const std::string& want_text) {
    const std::vector<int> want = tk.encode(want_text, false, false, true);
    GenerationOptions o;
    o.max_tokens = 400;
    o.sampler.temperature = 0.0f;
    o.grammar = std::make_shared<const grammar::Grammar>(
        grammar::Grammar::parse(tool_calls_gbnf(ToolSyntax::kHarmony, tools, "", false)));
    o.trigger = tool_call_trigger(ToolSyntax::kHarmony);
    o.grammar_markup = true;
    o.end_tokens = {tk.find_special("<|call|>")};
    Continuation c(tk, o, -1);
    std::string text;
    std::vector<float> logits(static_cast<size_t>(tk.vocab_size()));
    for (size_t i = 0; !c.done(); ++i) {
      std::fill(logits.begin(), logits.end(), 0.0f);
      logits[want[std::min(i, want.size() - 1)]] = 10.0f;
      text += c.next(logits.data()).text;
    }
    return text;
  };
  const std::string head =
      "<|channel|>analysis<|message|>use a tool<|end|><|start|>assistant<|channel|>commentary "
      "to=functions.";
  const std::string ok = run(head + "now <|constrain|>json<|message|>{}<|call|>");
  EXPECT_EQ(ok, head + "now <|constrain|>json<|message|>{}");
  const ReplyWithCalls r = parse_tool_calls(ToolSyntax::kHarmony, {"get_weather", "now"}, ok);
  ASSERT_EQ(r.calls.size(), 1u) << ok;
  EXPECT_EQ(r.calls[0].name, "now");
  EXPECT_EQ(split_harmony_reply(r.content).reasoning, "use a tool");
  // Before the recipient the text is free ("later" is no function: the grammar refuses it).
  const std::string other = run(head + "later<|message|>{}<|call|>");
  EXPECT_EQ(other.rfind(head, 0), 0u) << other;
  EXPECT_EQ(other.find("later"), std::string::npos) << other;
  EXPECT_EQ(parse_tool_calls(ToolSyntax::kHarmony, {"get_weather", "now"}, other).calls.size(), 1u)
      << other;
  EXPECT_EQ(run("<|channel|>final<|message|>no tools, to=function<|return|>"),
            "<|channel|>final<|message|>no tools, to=function");
}

// Random logits through harmony's call grammar on a byte-level vocabulary with harmony's
// markup: every reply that ends by itself is one call whose arguments follow the schema,
// and the grammar writes the markup with the control tokens as well as spelled out.
TEST(ToolGrammar, HarmonySampledRepliesAreWholeCalls) {
  const tok::Tokenizer tk = harmony_tokenizer();
  const auto tools = weather_tools();
  const auto g = std::make_shared<const grammar::Grammar>(
      grammar::Grammar::parse(tool_calls_gbnf(ToolSyntax::kHarmony, tools, "", false)));
  const auto trie = std::make_shared<const grammar::VocabTrie>(tk, true);
  const int message = tk.find_special("<|message|>");
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(tk.vocab_size()));
  int ended = 0, with_control = 0;
  for (int run = 0; run < 60; ++run) {
    GenerationOptions o;
    o.max_tokens = 300;
    o.sampler.temperature = 1.0f;
    o.sampler.seed = static_cast<uint64_t>(run);
    o.grammar = g;
    o.vocab_trie = trie;
    o.grammar_markup = true;
    o.end_tokens = {tk.find_special("<|call|>")};
    Continuation c(tk, o, -1);
    std::string text;
    bool control = false;
    while (!c.done()) {
      for (float& x : logits) x = normal(rng);
      const Continuation::Step st = c.next(logits.data());
      control = control || st.token == message;
      text += st.text;
    }
    if (c.reason() == StopReason::kLength) continue;
    ++ended;
    with_control += control ? 1 : 0;
    const auto r = parse_tool_calls(ToolSyntax::kHarmony, {"get_weather", "now"}, text);
    ASSERT_EQ(r.calls.size(), 1u) << run << ": " << text;
    EXPECT_EQ(r.content, "") << run;
    const ordered_json a = ordered_json::parse(r.calls[0].arguments);
    if (r.calls[0].name == "get_weather") {
      const std::string city = a["city"].get<std::string>();  // 12 characters at most
      EXPECT_LE(
          std::count_if(city.begin(), city.end(), [](char ch) { return (ch & 0xC0) != 0x80; }), 12)
          << text;
      EXPECT_TRUE(a["unit"] == "c" || a["unit"] == "f") << text;
    } else {
      EXPECT_TRUE(a.empty()) << text;
    }
  }
  EXPECT_GE(ended, 20);
  EXPECT_GE(with_control, 1);
  // The plain trie has no markup: the grammar cannot start there.
  GenerationOptions plain;
  plain.grammar = g;
  plain.vocab_trie = std::make_shared<const grammar::VocabTrie>(tk);
  EXPECT_FALSE(plain.vocab_trie->markup());
  EXPECT_EQ(plain.vocab_trie->text(message), "");
  EXPECT_EQ(trie->text(message), "<|message|>");
}

}  // namespace
}  // namespace kivi::runtime

namespace kivi::runtime {
namespace {

// Random logits through the tool grammar on stories260K's vocabulary (SentencePiece,
// byte tokens): a reply that ends by itself is always whole calls.
TEST(ToolGrammar, SampledRepliesAreWholeCalls) {
  KIVI_REQUIRE_MODEL();
  const tok::Tokenizer tk = tok::Tokenizer::from_llama2c(test::tokenizer_path(), 512);
  const auto tools = weather_tools();
  for (const bool parallel : {false, true}) {
    const auto g = std::make_shared<const grammar::Grammar>(
        grammar::Grammar::parse(tool_calls_gbnf(ToolSyntax::kHermes, tools, "", parallel)));
    const auto trie = std::make_shared<const grammar::VocabTrie>(tk);
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> logits(512);
    for (int run = 0; run < 60; ++run) {
      GenerationOptions o;
      o.max_tokens = 400;
      o.sampler.temperature = 1.0f;
      o.sampler.seed = static_cast<uint64_t>(run);
      o.grammar = g;
      o.vocab_trie = trie;
      Continuation c(tk, o, 1);
      std::string text;
      while (!c.done()) {
        for (float& x : logits) x = normal(rng);
        text += c.next(logits.data()).text;
      }
      if (c.reason() == StopReason::kLength) continue;
      ASSERT_EQ(c.reason(), StopReason::kEnd) << text;
      const auto r = parse_tool_calls(ToolSyntax::kHermes, {"get_weather", "now"}, text);
      EXPECT_FALSE(r.calls.empty()) << run << ": " << text;
      EXPECT_EQ(r.content, "") << run;
    }
  }
}

}  // namespace
}  // namespace kivi::runtime
