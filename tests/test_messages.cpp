// Messages and docs that agree with the program: usage lines list every option the
// command takes, one context limit and one wording of a range across commands, "n/a"
// where nothing was measured, progress lines when stderr is not a terminal, and the
// README's commands point at files that exist from the repository root.
#include <fstream>
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
  for (const char* c : {"generate", "perplexity", "info", "convert", "bench", "bench-attn",
                        "bench-batch", "synth", "logits"}) {
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
  int checked = 0;
  std::istringstream lines(readme);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("build/bin/kivi ", 0) != 0) continue;
    std::istringstream words(line);
    std::string w, prev;
    while (words >> w) {
      const bool named =
          w.size() > 4 && (w.substr(w.size() - 4) == ".bin" || w.substr(w.size() - 4) == ".txt");
      if (named && prev != "-o") {
        EXPECT_TRUE(test::file_exists(std::string(KIVI_SOURCE_DIR) + "/" + w))
            << w << " in: " << line;
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
  // "perplexity: 305/935 tok (33%), 60.9 tok/s, ETA 10 s" lines, then
  // "perplexity: 935/935 tok (100%), 67.7 tok/s, took 14 s".
  std::istringstream lines(r.err);
  std::string line, last;
  int periodic = 0;
  while (std::getline(lines, line)) {
    EXPECT_EQ(line.rfind("perplexity: ", 0), 0u) << line;
    EXPECT_NE(line.find(" tok ("), std::string::npos) << line;
    EXPECT_NE(line.find("%), "), std::string::npos) << line;
    if (line.find(" tok/s, ETA ") != std::string::npos) ++periodic;
    last = line;
  }
  EXPECT_GT(periodic, 10) << r.err;
  const size_t slash = last.find('/');
  ASSERT_NE(slash, std::string::npos) << last;
  const std::string done = last.substr(12, slash - 12);
  EXPECT_EQ(last.rfind("perplexity: " + done + "/" + done + " tok (100%), ", 0), 0u) << last;
  EXPECT_NE(last.find(" tok/s, took "), std::string::npos) << last;
  EXPECT_EQ(last.substr(last.size() - 2), " s") << last;
  // Nothing before the interval has passed, and nothing with --json.
  EXPECT_EQ(run("KIVI_PROGRESS_SECONDS=1000 " + cmd).err, "");
  EXPECT_EQ(run("KIVI_PROGRESS_SECONDS=0 " + cmd + " --json").err, "");
}

}  // namespace
}  // namespace kivi
