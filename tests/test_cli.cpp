// The command line: output of the happy path, and a clear one-line error with a
// non-zero exit (and no crash) for every kind of bad input.
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/threadpool.h"
#include "io/llama2c.h"
#include "test_util.h"

namespace kivi {
namespace {

using test::kivi_cmd;
using test::run;

using test::model_args;

// An error is one line on stderr starting with "kivi: error:", exit code 1 or 2.
void expect_error(const test::RunResult& r, const std::string& needle) {
  EXPECT_TRUE(r.exit_code == 1 || r.exit_code == 2) << "exit " << r.exit_code << "\n" << r.err;
  EXPECT_NE(r.err.find("kivi: error:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.find("AddressSanitizer"), std::string::npos);
  EXPECT_EQ(r.err.find("runtime error"), std::string::npos);
}

TEST(Cli, GenerateGreedyPrintsThePublishedText) {
  KIVI_REQUIRE_MODEL();
  const auto r =
      run(kivi_cmd("generate " + model_args() + " -p 'Once upon a time' --temp 0 -n 56"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, std::string(test::kPublishedText) + "\n");
  // One stats line with the counts, speeds and KV bytes.
  EXPECT_NE(r.err.find("prompt 5 tokens, generated 56 tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tok/s"), std::string::npos);
  EXPECT_NE(r.err.find("bytes used"), std::string::npos);
}

TEST(Cli, NoKvCacheAgreesWithTheCache) {
  KIVI_REQUIRE_MODEL();
  const auto a = run(kivi_cmd("generate " + model_args() + " -p 'Lily liked' --temp 0 -n 80"));
  const auto b =
      run(kivi_cmd("generate " + model_args() + " -p 'Lily liked' --temp 0 -n 80 --no-kv-cache"));
  ASSERT_EQ(a.exit_code, 0);
  ASSERT_EQ(b.exit_code, 0);
  EXPECT_EQ(a.out, b.out);
}

TEST(Cli, JsonOutputIsOneObject) {
  KIVI_REQUIRE_MODEL();
  const auto r =
      run(kivi_cmd("generate " + model_args() + " -p 'Once upon a time' --temp 0 -n 10 --json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.front(), '{');
  EXPECT_EQ(r.out.substr(r.out.size() - 2), "}\n");
  for (const char* key :
       {"\"text\":", "\"token_ids\":[", "\"prompt_tokens\":5", "\"generated_tokens\":10",
        "\"prefill_tps\":", "\"decode_tps\":", "\"kv_cache_bytes\":"}) {
    EXPECT_NE(r.out.find(key), std::string::npos) << key;
  }
  EXPECT_EQ(r.err, "");
}

// --threads above the hardware thread count is capped with a warning; --threads-force keeps
// it; 0 means every hardware thread. `bench --json` reports the count it used.
TEST(Cli, ThreadsAboveTheHardwareAreCappedUnlessForced) {
  KIVI_REQUIRE_MODEL();
  const int hw = hardware_threads();
  const std::string bench = "bench " + model_args() + " --kv-cache f32 -n 2 --json --threads ";
  auto threads_in = [](const std::string& json) {
    const size_t at = json.find("\"threads\":");
    return at == std::string::npos ? -1 : std::atoi(json.c_str() + at + 10);
  };
  const auto capped = run(kivi_cmd(bench + std::to_string(hw + 1)));
  ASSERT_EQ(capped.exit_code, 0) << capped.err;
  EXPECT_EQ(threads_in(capped.out), hw);
  EXPECT_NE(capped.err.find("kivi: warning: --threads " + std::to_string(hw + 1) +
                            " is more than the " + std::to_string(hw) + " hardware thread"),
            std::string::npos)
      << capped.err;
  const auto forced = run(kivi_cmd(bench + std::to_string(hw + 1) + " --threads-force"));
  ASSERT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_EQ(threads_in(forced.out), hw + 1);
  EXPECT_EQ(forced.err.find("warning"), std::string::npos) << forced.err;
  for (const std::string& t : {std::string("0"), std::to_string(hw)}) {
    const auto r = run(kivi_cmd(bench + t));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(threads_in(r.out), hw) << "--threads " << t;
    EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
  }
  expect_error(run(kivi_cmd(bench + "1025")), "--threads");
  expect_error(run(kivi_cmd(bench + "-1")), "--threads");
}

TEST(Cli, SameSeedSameText) {
  KIVI_REQUIRE_MODEL();
  const std::string cmd = "generate " + model_args() + " -p 'One day' --temp 1 --seed 5 -n 40";
  const auto a = run(kivi_cmd(cmd)), b = run(kivi_cmd(cmd));
  ASSERT_EQ(a.exit_code, 0);
  EXPECT_EQ(a.out, b.out);
}

TEST(Cli, HelpExplainsEveryOption) {
  const auto top = run(kivi_cmd("--help"));
  EXPECT_EQ(top.exit_code, 0);
  for (const char* c :
       {"generate", "perplexity", "bench", "bench-attn", "info", "convert", "synth"}) {
    EXPECT_NE(top.out.find(c), std::string::npos) << c;
  }
  for (const char* c : {"generate", "info", "convert", "logits"}) {
    const auto r = run(kivi_cmd(std::string(c) + " --help"));
    EXPECT_EQ(r.exit_code, 0) << c;
    EXPECT_NE(r.out.find("Usage: kivi " + std::string(c)), std::string::npos);
    // Every listed option line has a description after it.
    size_t pos = 0;
    while ((pos = r.out.find("\n  -", pos)) != std::string::npos) {
      const size_t eol = r.out.find('\n', pos + 1);
      const std::string line = r.out.substr(pos + 1, eol - pos - 1);
      EXPECT_GT(line.size(), 31u) << c << ": option without help: " << line;
      pos = eol;
    }
  }
  const auto g = run(kivi_cmd("generate --help"));
  for (const char* o :
       {"--model", "--tokenizer", "--prompt", "--temp", "--top-k", "--top-p", "--seed", "--threads",
        "--json", "--no-kv-cache", "--kv-cache", "--group-size", "--residual", "--key-flush",
        "--scale-dtype", "--int8-granularity", "--kv-cache-k", "--kv-cache-v"}) {
    EXPECT_NE(g.out.find(o), std::string::npos) << o;
  }
}

TEST(Cli, InfoDescribesTheModel) {
  KIVI_REQUIRE_MODEL();
  const auto r = run(kivi_cmd("info " + model_args()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* s : {"llama2.c", "dim              64", "8 query, 4 KV (GQA)",
                        "tokenizer: SentencePiece BPE, 512", "token_embedding",
                        "KV cache memory at 512 tokens", "kivi2", "tq3"}) {
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
  }
  // A per-layer map is one row, its bits the mean of the layers' (K: 5 and 4 x 3).
  const auto m = run(kivi_cmd("info " + model_args() + " --kv-cache-layers '0:kivi4;*:kivi2'"));
  ASSERT_EQ(m.exit_code, 0) << m.err;
  EXPECT_NE(m.out.find("layers 0 kivi4, 1-4 kivi2"), std::string::npos) << m.out;
  EXPECT_NE(m.out.find("3.400"), std::string::npos) << m.out;
  // Commands whose caches are not a model's take no map.
  expect_error(run(kivi_cmd("bench-attn --ctx 64 --kv-cache-layers '*:kivi2'")),
               "this command's caches take one format for every layer");
}

// stories260K converted to GGUF in t; its path.
std::string converted_gguf(const test::TempDir& t) {
  const auto c = run(kivi_cmd("convert '" + test::model_path() + "' -t '" + test::tokenizer_path() +
                              "' -o '" + t.file("s.gguf") + "'"));
  EXPECT_EQ(c.exit_code, 0) << c.err;
  return t.file("s.gguf");
}

TEST(Cli, ConvertedGgufGeneratesTheSameText) {
  KIVI_REQUIRE_MODEL();
  test::TempDir t;
  const std::string gguf = converted_gguf(t);
  const auto a = run(kivi_cmd("generate " + model_args() + " -p 'The cat' --temp 0 -n 100"));
  const auto b = run(kivi_cmd("generate -m '" + gguf + "' -p 'The cat' --temp 0 -n 100"));
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
  const auto i = run(kivi_cmd("info '" + gguf + "'"));
  EXPECT_NE(i.out.find("blk.4.ffn_up.weight"), std::string::npos);
  EXPECT_NE(i.out.find("tokenizer.ggml.tokens"), std::string::npos);
}

// --copy-weights moves the weights into memory at the same addresses: the same text from a
// llama2.c checkpoint and from a GGUF file.
TEST(Cli, CopiedWeightsGiveTheSameText) {
  KIVI_REQUIRE_MODEL();
  test::TempDir t;
  for (const std::string& m : {model_args(), "-m '" + converted_gguf(t) + "'"}) {
    const auto r =
        run(kivi_cmd("generate " + m + " -p 'Once upon a time' --temp 0 -n 56 --copy-weights"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, std::string(test::kPublishedText) + "\n") << m;
    EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
  }
}

// --- bad input -------------------------------------------------------------------

TEST(CliErrors, MissingFileAndDirectory) {
  expect_error(run(kivi_cmd("generate -m /nonexistent/m.bin -p hi")),
               "cannot open model file '/nonexistent/m.bin'");
  test::TempDir t;
  expect_error(run(kivi_cmd("generate -m '" + t.path() + "' -p hi")), "is a directory");
  expect_error(
      run(kivi_cmd("generate -m '" + test::model_path() + "' -t /nonexistent/tok.bin -p hi")),
      "cannot open tokenizer file");
}

TEST(CliErrors, TruncatedAndCorruptModels) {
  KIVI_REQUIRE_MODEL();
  test::TempDir t;
  const auto img = test::read_file(test::model_path());
  const std::string tok = " -t '" + test::tokenizer_path() + "' -p hi";
  test::write_file(t.file("trunc.bin"), std::vector<uint8_t>(img.begin(), img.begin() + 5000));
  expect_error(run(kivi_cmd("generate -m '" + t.file("trunc.bin") + "'" + tok)), "truncated");
  test::write_file(t.file("short.bin"), std::vector<uint8_t>(img.begin(), img.begin() + 20));
  expect_error(run(kivi_cmd("generate -m '" + t.file("short.bin") + "'" + tok)),
               "header alone needs 28");
  auto extra = img;
  extra.resize(img.size() + 100);
  test::write_file(t.file("extra.bin"), extra);
  expect_error(run(kivi_cmd("generate -m '" + t.file("extra.bin") + "'" + tok)), "trailing data");
  auto bad = img;
  const int32_t zero = 0, minus = -64, five = 5;
  std::memcpy(bad.data(), &zero, 4);  // dim = 0
  test::write_file(t.file("dim0.bin"), bad);
  expect_error(run(kivi_cmd("generate -m '" + t.file("dim0.bin") + "'" + tok)), "'dim' = 0");
  bad = img;
  std::memcpy(bad.data(), &minus, 4);  // dim < 0
  test::write_file(t.file("neg.bin"), bad);
  expect_error(run(kivi_cmd("generate -m '" + t.file("neg.bin") + "'" + tok)), "'dim' = -64");
  bad = img;
  std::memcpy(bad.data() + 12, &five, 4);  // n_heads = 5 does not divide 64
  test::write_file(t.file("heads.bin"), bad);
  expect_error(run(kivi_cmd("generate -m '" + t.file("heads.bin") + "'" + tok)),
               "n_heads = 5 does not divide dim = 64");
  // A GGUF with wrong magic / version / truncated tensor data.
  const auto c = run(kivi_cmd("convert '" + test::model_path() + "' -t '" + test::tokenizer_path() +
                              "' -o '" + t.file("s.gguf") + "'"));
  ASSERT_EQ(c.exit_code, 0);
  auto g = test::read_file(t.file("s.gguf"));
  auto gv = g;
  gv[4] = 9;  // version 9
  test::write_file(t.file("v9.gguf"), gv);
  expect_error(run(kivi_cmd("generate -m '" + t.file("v9.gguf") + "' -p hi")),
               "unsupported GGUF version 9");
  auto gm = g;
  gm[0] = 'X';  // not GGUF magic: read as llama2.c, whose header is then nonsense
  test::write_file(t.file("magic.gguf"), gm);
  expect_error(run(kivi_cmd("generate -m '" + t.file("magic.gguf") + "'" + tok)),
               "llama2.c header field");
  g.resize(g.size() - 1000);
  test::write_file(t.file("cut.gguf"), g);
  expect_error(run(kivi_cmd("generate -m '" + t.file("cut.gguf") + "' -p hi")),
               "runs past the end of the file");
}

TEST(CliErrors, TokenizerWithTheWrongVocabularySize) {
  KIVI_REQUIRE_MODEL();
  test::TempDir t;
  auto tok = test::read_file(test::tokenizer_path());
  tok.resize(tok.size() - 30);  // drops the last tokens
  test::write_file(t.file("tok.bin"), tok);
  expect_error(run(kivi_cmd("generate -m '" + test::model_path() + "' -t '" + t.file("tok.bin") +
                            "' -p hi")),
               "fewer tokens than the model's vocabulary size 512");
}

TEST(CliErrors, PromptLongerThanTheContext) {
  KIVI_REQUIRE_MODEL();
  std::string prompt;
  for (int i = 0; i < 300; ++i) prompt += "hello world ";
  expect_error(run(kivi_cmd("generate " + model_args() + " -p '" + prompt + "'")),
               "longer than the context");
  expect_error(run(kivi_cmd("generate " + model_args() +
                            " --ctx 8 -p 'Once upon a time there was a little girl named Lily'")),
               "longer than the context");
  expect_error(run(kivi_cmd("generate " + model_args() + " --ctx 4096 -p hi")),
               "larger than the model's context");
}

TEST(CliErrors, GenerationStopsAtTheContext) {
  KIVI_REQUIRE_MODEL();
  const auto r = run(
      kivi_cmd("generate " + model_args() + " --ctx 24 -p 'Once upon a time' --temp 0 -n 1000"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("stopped: the context of 24 tokens is full"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("generated 20 tokens"), std::string::npos) << r.err;
}

TEST(CliErrors, UnknownOptionsAndBadValues) {
  expect_error(run(kivi_cmd("generate --bogus 3")), "unknown option '--bogus'");
  expect_error(run(kivi_cmd("generate -Z")), "unknown option '-Z'");
  expect_error(run(kivi_cmd("nonsense")), "unknown command 'nonsense'");
  KIVI_REQUIRE_MODEL();
  expect_error(run(kivi_cmd("generate " + model_args() + " -p hi -n abc")),
               "--max-tokens: 'abc' is not an integer");
  expect_error(run(kivi_cmd("generate " + model_args() + " -p hi --temp -1")),
               "--temp = -1 is out of range");
  expect_error(run(kivi_cmd("generate " + model_args() + " -p hi --kv-cache q3")),
               "unknown KV cache format 'q3'");
  expect_error(run(kivi_cmd("generate " + model_args() + " -p hi --kv-cache kivi3")),
               "not in {2, 4, 8}");
  expect_error(run(kivi_cmd("generate " + model_args() + " -p hi --kv-cache kivi2 -G 32 -R 48")),
               "--residual = 48 must be a multiple of --group-size = 32");
  expect_error(run(kivi_cmd("generate " + model_args() + " -p hi --kv-cache kivi2 -G 1024 -R 0")),
               "--group-size = 1024 is larger than the context");
  expect_error(run(kivi_cmd("generate " + model_args() + " -p hi --key-flush lazy")),
               "--key-flush");
  expect_error(run(kivi_cmd("generate " + model_args() + " -p hi --simd avx9000")),
               "unknown or unsupported SIMD target");
  expect_error(run(kivi_cmd("generate " + model_args() + " -p")), "needs a value");
  expect_error(run(kivi_cmd("generate " + model_args() + " -p hi --draft-max 4")),
               "--draft-max: needs --draft-model");
  const std::string draft = " --draft-model '" + test::model_path() + "'";
  expect_error(run(kivi_cmd("generate " + model_args() + " -p hi --lookup 4" + draft)),
               "--draft-model and --lookup: choose one");
  expect_error(run(kivi_cmd("generate " + model_args() + " -p hi --draft-max 65" + draft)),
               "--draft-max");
  expect_error(run(kivi_cmd("generate " + model_args() + " -p hi --draft-model /nonexistent.gguf")),
               "/nonexistent.gguf");
}

TEST(CliErrors, SuggestionsAndLlamaCppSpellings) {
  expect_error(run(kivi_cmd("generate --kv-cach f16")), "did you mean '--kv-cache'?");
  expect_error(run(kivi_cmd("generat -p hi")), "did you mean 'generate'?");
  expect_error(run(kivi_cmd("generate -ngl 99")), "no GPU offload");
  KIVI_REQUIRE_MODEL();
  // llama.cpp's names for the cache types and the context; -fa is accepted with a note.
  const auto r = run(kivi_cmd("generate " + model_args() +
                              " -p hi -n 2 --temp 0 --json -ctk f16 -ctv int8 --ctx-size 128 -fa"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"kv_cache\":\"K f16 / V int8"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("-fa is accepted and ignored"), std::string::npos) << r.err;
  const auto same = run(kivi_cmd("generate " + model_args() +
                                 " -p hi -n 2 --temp 0 --json --cache-type-k f16 "
                                 "--cache-type-v=int8 --ctx 128"));
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_EQ(same.out.substr(0, same.out.find("prefill_tps")),
            r.out.substr(0, r.out.find("prefill_tps")));
  // -n -1: until an end token or the context; --seed -1: a random seed.
  const auto unlimited =
      run(kivi_cmd("generate " + model_args() + " -p hi -n -1 --seed -1 --ctx 64 --json"));
  ASSERT_EQ(unlimited.exit_code, 0) << unlimited.err;
  EXPECT_TRUE(unlimited.out.find("\"stop\":\"eos\"") != std::string::npos ||
              unlimited.out.find("\"stop\":\"context\"") != std::string::npos)
      << unlimited.out;
}

TEST(Cli, PromptFromAFileOrStandardInput) {
  KIVI_REQUIRE_MODEL();
  test::TempDir t;
  test::write_text(t.file("p.txt"), "Once upon a time");
  const std::string base = "generate " + model_args() + " -n 3 --temp 0 --json ";
  const auto p = run(kivi_cmd(base + "-p 'Once upon a time'"));
  const auto f = run(kivi_cmd(base + "-f '" + t.file("p.txt") + "'"));
  const auto in = run("printf 'Once upon a time' | " + kivi_cmd(base + "-p -"));
  ASSERT_EQ(p.exit_code, 0) << p.err;
  ASSERT_EQ(f.exit_code, 0) << f.err;
  ASSERT_EQ(in.exit_code, 0) << in.err;
  auto ids = [](const std::string& out) { return out.substr(0, out.find("\"prompt_tokens\"")); };
  EXPECT_EQ(ids(f.out), ids(p.out));
  EXPECT_EQ(ids(in.out), ids(p.out));
  expect_error(run(kivi_cmd(base + "-p x -f '" + t.file("p.txt") + "'")), "not both");
}

TEST(Cli, KvLoadFollowUpsContinueAfterOneSpace) {
  KIVI_REQUIRE_MODEL();
  test::TempDir t;
  const std::string kv = t.file("a.kv");
  ASSERT_EQ(run(kivi_cmd("generate " + model_args() + " -p 'Once upon a time' -n 0 --kv-save '" +
                         kv + "'"))
                .exit_code,
            0);
  const auto whole =
      run(kivi_cmd("generate " + model_args() + " -p 'Once upon a time there was' -n 0 --json"));
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  // SentencePiece begins every text at a word: written with or without its leading space,
  // the follow-up continues with the tokens the whole text has.
  for (const char* follow : {"' there was'", "'there was'"}) {
    const auto r = run(kivi_cmd("generate " + model_args() + " --kv-load '" + kv + "' -p " +
                                follow + " -n 0 --json"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto ids = [](const std::string& out) {
      const size_t a = out.find("\"prompt_token_ids\":[") + 20;
      return out.substr(a, out.find(']', a) - a);
    };
    const std::string w = ids(whole.out), got = ids(r.out);
    EXPECT_EQ(w.substr(w.size() - got.size()), got) << follow;
    EXPECT_EQ(got, "383,286") << follow;
  }
}

TEST(CliErrors, AContextThatDoesNotFitInMemoryIsRefused) {
  test::TempDir t;
  const std::string m = t.file("tiny.gguf");
  ASSERT_EQ(run(kivi_cmd("synth --preset tiny -o '" + m + "'")).exit_code, 0);
  // 16M tokens of a synthetic model's f32 cache: tens of GiB, more than any test machine.
  const auto r = run(kivi_cmd("generate -m '" + m + "' -c 16000000 -p hi -n 1"));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("a session of 16000000 tokens needs"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("pass a smaller --ctx"), std::string::npos) << r.err;
}

TEST(Cli, EvalFindsItsTextBesideTheBinary) {
  KIVI_REQUIRE_MODEL();
  // From a folder with no data/ nor ../shared/data/: the text is found from the binary.
  test::TempDir t;
  const auto r = run(
      "cd '" + t.path() + "' && " +
      kivi_cmd("eval --task needle --ctx 256 --depths 0.5 --trials 1 " + model_args() + " --json"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

}  // namespace
}  // namespace kivi
