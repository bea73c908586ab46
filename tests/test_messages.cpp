// Messages and docs that agree with the program: usage lines list every option the
// command takes, one context limit and one wording of a range across commands, "n/a"
// where nothing was measured, progress lines when stderr is not a terminal, and the
// README's commands point at files that exist from the repository root.
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace kivi {
namespace {

using test::kivi_cmd;
using test::run;

// One thread: these runs check messages, not speed, and stay quick on a busy machine.
std::string model_args() {
  return "-m '" + test::model_path() + "' -t '" + test::tokenizer_path() + "' --threads 1";
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string usage_line(const std::string& command) {
  const auto r = run(kivi_cmd(command + " --help"));
  EXPECT_EQ(r.exit_code, 0) << command;
  return r.out.substr(0, r.out.find('\n'));
}

TEST(Messages, UsageLinesListTheOptions) {
  const std::string ba = usage_line("bench-attn");
  for (const char* o :
       {"--reps", "--no-probe", "--simd", "--ctx", "--kv-cache", "--threads", "--json"}) {
    EXPECT_NE(ba.find(o), std::string::npos) << o << " missing from: " << ba;
  }
  // An empty prompt generates from BOS: -p is optional.
  for (const char* c : {"generate", "logits"}) {
    const std::string u = usage_line(c);
    EXPECT_NE(u.find("[-p PROMPT]"), std::string::npos) << u;
  }
  KIVI_REQUIRE_MODEL();
  const auto r = run(kivi_cmd("generate " + model_args() + " --temp 0 -n 5"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(Messages, CliDocDescribesEveryCommand) {
  const std::string doc = slurp(std::string(KIVI_SOURCE_DIR) + "/docs/CLI.md");
  ASSERT_FALSE(doc.empty());
  for (const char* c :
       {"generate", "perplexity", "info", "convert", "bench", "bench-attn", "synth", "logits"}) {
    EXPECT_NE(doc.find(std::string("- `kivi ") + c + " "), std::string::npos) << c;
  }
  const size_t ba = doc.find("- `kivi bench-attn ");
  ASSERT_NE(ba, std::string::npos);
  const std::string line = doc.substr(ba, doc.find('`', ba + 3) - ba);
  for (const char* o : {"--reps", "--no-probe", "--simd"})
    EXPECT_NE(line.find(o), std::string::npos) << o;
  EXPECT_EQ(doc.find("- `kivi generate -p PROMPT"), std::string::npos) << "-p is optional";
}

// Every file a README command names (models, tokenizers, texts) exists when the command
// runs from the repository root, as the README says it should.
TEST(Messages, ReadmeCommandsNameFilesThatExist) {
  const std::string readme = slurp(std::string(KIVI_SOURCE_DIR) + "/README.md");
  ASSERT_FALSE(readme.empty());
  const std::regex input(R"(build/bin/kivi (convert|perplexity|generate|bench|info|logits)[^\n]*)");
  int checked = 0;
  for (auto it = std::sregex_iterator(readme.begin(), readme.end(), input);
       it != std::sregex_iterator(); ++it) {
    std::istringstream words(it->str());
    std::string w, prev;
    while (words >> w) {
      const bool is_input =
          w.size() > 4 && (w.substr(w.size() - 4) == ".bin" || w.substr(w.size() - 4) == ".txt") &&
          prev != "-o";
      if (is_input) {
        EXPECT_TRUE(test::file_exists(std::string(KIVI_SOURCE_DIR) + "/" + w))
            << w << " in: " << it->str();
        ++checked;
      }
      prev = w;
    }
  }
  EXPECT_GE(checked, 3);
}

// One context limit for every command, in the same words.
TEST(Messages, OneContextLimit) {
  KIVI_REQUIRE_MODEL();
  const std::string limit = "16777216";  // model::kMaxContext
  const std::string over = " --ctx 16777217";
  for (const std::string& c :
       {"generate " + model_args() + " -p hi" + over,
        "perplexity " + model_args() + " -f '" + test::text_path() + "'" + over,
        "logits " + model_args() + " -p hi" + over, "info " + model_args() + over,
        "bench " + model_args() + over, "bench-attn" + over,
        "synth --layers 1 --dim 64 --heads 8 --kv-heads 4 --ffn 64 --vocab 512 -o "
        "/nonexistent/x.gguf" +
            over}) {
    const auto r = run(kivi_cmd(c));
    EXPECT_EQ(r.exit_code, 1) << c;
    EXPECT_NE(r.err.find("--ctx = 16777217 is out of range (valid: 1 to " + limit + ")"),
              std::string::npos)
        << c << ": " << r.err;
  }
}

TEST(Messages, OneWordingOfTheTopPRange) {
  KIVI_REQUIRE_MODEL();
  std::vector<std::string> messages;
  for (const char* p : {"0", "-0.5", "1.5"}) {
    const auto r = run(kivi_cmd("generate " + model_args() + " -p hi --top-p " + p));
    EXPECT_EQ(r.exit_code, 1) << p;
    // "kivi: error: --top-p = 1.5 is out of range (...)": everything after the value.
    const size_t at = r.err.find(" is out of range");
    EXPECT_NE(at, std::string::npos) << r.err;
    messages.push_back(at == std::string::npos ? r.err : r.err.substr(at));
  }
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_EQ(messages[0], messages[2]);
  EXPECT_NE(messages[0].find("greater than 0"), std::string::npos) << messages[0];
}

TEST(Messages, NoProbeSaysNotAvailable) {
  const std::string cmd =
      "bench-attn --ctx 128 --reps 1 --heads 2 --kv-heads 1 --head-dim 64 --kv-cache f16 "
      "--threads 1 --no-probe";
  const auto t = run(kivi_cmd(cmd));
  ASSERT_EQ(t.exit_code, 0) << t.err;
  // The f16 row: floor and % of floor are "n/a", not 0.0 and 0%.
  const size_t row = t.out.find("\nf16");
  ASSERT_NE(row, std::string::npos) << t.out;
  const std::string line = t.out.substr(row + 1, t.out.find('\n', row + 1) - row - 1);
  EXPECT_NE(line.find("n/a"), std::string::npos) << line;
  EXPECT_EQ(line.find(" 0.0 "), std::string::npos) << line;
  EXPECT_EQ(line.find(" 0%"), std::string::npos) << line;
  const auto j = run(kivi_cmd(cmd + " --json"));
  ASSERT_EQ(j.exit_code, 0) << j.err;
  EXPECT_NE(j.out.find("\"probe_gbps\":null"), std::string::npos) << j.out;
  EXPECT_NE(j.out.find("\"floor_us\":null"), std::string::npos) << j.out;
}

// With stderr not a terminal, long runs print plain progress lines (no carriage returns)
// every KIVI_PROGRESS_SECONDS (default 5), and a last line when they end.
TEST(Messages, ProgressLinesWhenStderrIsNotATerminal) {
  KIVI_REQUIRE_MODEL();
  test::TempDir t;
  const std::string text = slurp(test::text_path()).substr(0, 2000);
  test::write_text(t.file("t.txt"), text);
  const std::string cmd =
      kivi_cmd("perplexity " + model_args() + " -f '" + t.file("t.txt") + "' --ctx 128");
  const auto r = run("KIVI_PROGRESS_SECONDS=0 " + cmd);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos);
  const std::regex line(R"(perplexity: (\d+)/(\d+) tok \((\d+)%\), [0-9.]+ tok/s, ETA \d+ s\n)");
  EXPECT_GT(
      std::distance(std::sregex_iterator(r.err.begin(), r.err.end(), line), std::sregex_iterator()),
      10)
      << r.err;
  const std::regex last(R"(perplexity: (\d+)/\1 tok \(100%\), [0-9.]+ tok/s, took \d+ s\n$)");
  EXPECT_TRUE(std::regex_search(r.err, last)) << r.err;
  // Nothing before the interval has passed, and nothing with --json.
  EXPECT_EQ(run("KIVI_PROGRESS_SECONDS=1000 " + cmd).err, "");
  EXPECT_EQ(run("KIVI_PROGRESS_SECONDS=0 " + cmd + " --json").err, "");
}

}  // namespace
}  // namespace kivi
