// The CLI never destroys a user's file and refuses poisoned input: an output that is one
// of the command's inputs (same inode: name, hard link or symlink) is refused; outputs are
// written through a temporary file renamed into place when complete, so a failed run
// leaves the previous file and no temporary behind; GGUF tensors that overlap, weights
// that are not finite, and KV options that would be ignored are errors.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/gguf.h"
#include "io/llama2c.h"
#include "test_util.h"

namespace kivi {
namespace {

using test::kivi_cmd;
using test::run;

// An error is one line on stderr starting with "kivi: error:", exit code 1, and no
// sanitizer report.
void expect_error(const test::RunResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("kivi: error:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.find("AddressSanitizer"), std::string::npos);
  EXPECT_EQ(r.err.find("runtime error"), std::string::npos);
}

// The names in a directory (without . and ..), sorted.
std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// A private copy of the model, tokenizer and text: the tests try to destroy them.
struct Workdir {
  test::TempDir t;
  std::vector<uint8_t> model, tok, text;
  Workdir() {
    model = test::read_file(test::model_path());
    tok = test::read_file(test::tokenizer_path());
    text = test::read_file(test::text_path());
    test::write_file(t.file("m.bin"), model);
    test::write_file(t.file("tok.bin"), tok);
    test::write_file(t.file("t.txt"), text);
  }
  std::string f(const std::string& n) const { return "'" + t.file(n) + "'"; }
  // One thread: these runs check files and messages, not speed.
  std::string model_args() const {
    return "-m " + f("m.bin") + " -t " + f("tok.bin") + " --threads 1";
  }
  // Runs `kivi ARGS` inside the directory.
  test::RunResult kivi(const std::string& args) const {
    return run("cd '" + t.path() + "' && " + kivi_cmd(args));
  }
  void expect_inputs_intact() const {
    EXPECT_EQ(test::read_file(t.file("m.bin")), model);
    EXPECT_EQ(test::read_file(t.file("tok.bin")), tok);
    EXPECT_EQ(test::read_file(t.file("t.txt")), text);
  }
};

// --- outputs that are inputs ------------------------------------------------------

TEST(FileSafety, ConvertRefusesToOverwriteItsInputs) {
  KIVI_REQUIRE_MODEL();
  Workdir w;
  ASSERT_EQ(link(w.t.file("m.bin").c_str(), w.t.file("hard.bin").c_str()), 0);
  ASSERT_EQ(symlink("m.bin", w.t.file("soft.bin").c_str()), 0);
  for (const char* out : {"m.bin", "./m.bin", "hard.bin", "soft.bin", "tok.bin"}) {
    expect_error(w.kivi(std::string("convert m.bin -t tok.bin -o ") + out),
                 "is the same file as the input");
    w.expect_inputs_intact();
  }
  // The message names both paths.
  const auto r = w.kivi("convert m.bin -t tok.bin -o hard.bin");
  EXPECT_NE(r.err.find("'hard.bin'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'m.bin'"), std::string::npos) << r.err;
}

TEST(FileSafety, PerplexityRefusesToOverwriteItsInputs) {
  KIVI_REQUIRE_MODEL();
  Workdir w;
  const std::string base = "perplexity " + w.model_args() + " -f t.txt --ctx 64 ";
  for (const char* out : {"m.bin", "tok.bin", "t.txt"}) {
    expect_error(w.kivi(base + "--save-logits " + out), "is the same file as the input");
    w.expect_inputs_intact();
  }
  // The base a run compares against is an input too.
  ASSERT_EQ(w.kivi(base + "--save-logits base.lp").exit_code, 0);
  const auto lp = test::read_file(w.t.file("base.lp"));
  expect_error(w.kivi(base + "--kld-base base.lp --save-logits base.lp"),
               "is the same file as the input");
  EXPECT_EQ(test::read_file(w.t.file("base.lp")), lp);
}

TEST(FileSafety, LogitsRefusesToOverwriteItsInputs) {
  KIVI_REQUIRE_MODEL();
  Workdir w;
  for (const char* out : {"m.bin", "tok.bin"}) {
    expect_error(w.kivi("logits " + w.model_args() + " -p hi -o " + out),
                 "is the same file as the input");
    w.expect_inputs_intact();
  }
  // The default tokenizer (found beside the model) is an input as well.
  test::write_file(w.t.file("tok512.bin"), w.tok);
  expect_error(w.kivi("logits -m m.bin -p hi -o tok512.bin"), "is the same file as the input");
  EXPECT_EQ(test::read_file(w.t.file("tok512.bin")), w.tok);
}

TEST(FileSafety, QuantizeRefusesToOverwriteItsInput) {
  KIVI_REQUIRE_MODEL();
  Workdir w;
  ASSERT_EQ(w.kivi("convert m.bin -t tok.bin -o s.gguf").exit_code, 0);
  const auto gguf = test::read_file(w.t.file("s.gguf"));
  ASSERT_EQ(link(w.t.file("s.gguf").c_str(), w.t.file("hard.gguf").c_str()), 0);
  ASSERT_EQ(symlink("s.gguf", w.t.file("soft.gguf").c_str()), 0);
  for (const std::string& out : {std::string("s.gguf"), std::string("./s.gguf"), w.t.file("s.gguf"),
                                 std::string("hard.gguf"), std::string("soft.gguf")}) {
    expect_error(w.kivi("quantize s.gguf " + out + " q8_0"), "is the same file as the input");
    EXPECT_EQ(test::read_file(w.t.file("s.gguf")), gguf) << out;
  }
}

// --- writes through a temporary file ------------------------------------------------

// A run that fails after its output was opened leaves the previous file as it was, and
// no temporary file.
TEST(FileSafety, AFailedRunLeavesThePreviousOutput) {
  KIVI_REQUIRE_MODEL();
  Workdir w;
  const std::vector<uint8_t> old = {'o', 'l', 'd'};
  test::write_file(w.t.file("out.lp"), old);
  // A base of another text: the run stops at the first scored token, after the output is open.
  test::write_text(w.t.file("other.txt"),
                   "Tom had a small boat. He sailed it on the lake every day.");
  ASSERT_EQ(
      w.kivi("perplexity " + w.model_args() + " -f other.txt --save-logits other.lp").exit_code, 0);
  const auto before = listing(w.t.path());
  const auto r =
      w.kivi("perplexity " + w.model_args() + " -f t.txt --kld-base other.lp --save-logits out.lp");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(test::read_file(w.t.file("out.lp")), old);
  EXPECT_EQ(listing(w.t.path()), before);
}

// A write that fails half-way (the file-size limit stands in for a full disk) leaves the
// previous file whole and removes the temporary one.
TEST(FileSafety, AnInterruptedWriteLeavesThePreviousFile) {
  KIVI_REQUIRE_MODEL();
  Workdir w;
  const std::vector<uint8_t> old(1000, 'x');
  test::write_file(w.t.file("out.gguf"), old);
  test::write_file(w.t.file("synth.gguf"), old);
  const auto before = listing(w.t.path());
  // ulimit -f counts 512-byte blocks: 200 KB, less than the 1 MB the files need. With
  // SIGXFSZ ignored, the write fails with EFBIG instead of killing the process.
  const std::string limit = "trap '' XFSZ; ulimit -f 400; ";
  const auto c =
      run("cd '" + w.t.path() + "' && " + limit + kivi_cmd("convert m.bin -t tok.bin -o out.gguf"));
  expect_error(c, "cannot write");
  EXPECT_EQ(test::read_file(w.t.file("out.gguf")), old);
  const auto s =
      run("cd '" + w.t.path() + "' && " + limit + kivi_cmd("synth --preset tiny -o synth.gguf"));
  EXPECT_EQ(s.exit_code, 1) << s.err;
  EXPECT_NE(s.err.find("cannot write"), std::string::npos) << s.err;
  EXPECT_EQ(test::read_file(w.t.file("synth.gguf")), old);
  EXPECT_EQ(listing(w.t.path()), before);
}

// Successful writes replace the file, keep its permissions, write through a symlink to
// its target, and leave nothing else behind.
TEST(FileSafety, SuccessfulWritesLeaveOnlyTheOutput) {
  KIVI_REQUIRE_MODEL();
  Workdir w;
  test::write_text(w.t.file("s.gguf"), "old");
  ASSERT_EQ(chmod(w.t.file("s.gguf").c_str(), 0640), 0);
  ASSERT_EQ(w.kivi("convert m.bin -t tok.bin -o s.gguf").exit_code, 0);
  ASSERT_EQ(w.kivi("logits " + w.model_args() + " -p hi -o l.bin").exit_code, 0);
  ASSERT_EQ(
      w.kivi("perplexity " + w.model_args() + " -f t.txt --ctx 64 --save-logits p.lp").exit_code,
      0);
  ASSERT_EQ(symlink("target.gguf", w.t.file("link.gguf").c_str()), 0);
  ASSERT_EQ(w.kivi("synth --preset tiny -o link.gguf").exit_code, 0);
  EXPECT_EQ(listing(w.t.path()),
            (std::vector<std::string>{"l.bin", "link.gguf", "m.bin", "p.lp", "s.gguf", "t.txt",
                                      "target.gguf", "tok.bin"}));
  struct stat st;
  ASSERT_EQ(stat(w.t.file("s.gguf").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  ASSERT_EQ(lstat(w.t.file("link.gguf").c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  EXPECT_GT(test::read_file(w.t.file("target.gguf")).size(), 1000u);
  EXPECT_EQ(test::read_file(w.t.file("s.gguf")).size() % 32, 0u);
  EXPECT_EQ(w.kivi("generate -m s.gguf -p 'Once upon a time' --temp 0 -n 5 --threads 1").exit_code,
            0);
  w.expect_inputs_intact();
}

// The writer on its own: the target changes only at commit(); abort, an exception or
// destruction leave it and remove the temporary file; devices are written in place.
TEST(AtomicFile, ReplacesOnlyOnCommit) {
  test::TempDir t;
  const std::string p = t.file("out.bin");
  test::write_text(p, "old");
  {
    io::AtomicFile f(p);
    f.write("new!", 4);
    EXPECT_EQ(test::read_file(p).size(), 3u);  // not yet
    EXPECT_EQ(listing(t.path()).size(), 2u);   // out.bin and the temporary
    EXPECT_EQ(f.temp_path().rfind(t.file(".out.bin.tmp-"), 0), 0u) << f.temp_path();
    f.commit();
  }
  EXPECT_EQ(test::read_file(p), (std::vector<uint8_t>{'n', 'e', 'w', '!'}));
  EXPECT_EQ(listing(t.path()), std::vector<std::string>{"out.bin"});
  {
    io::AtomicFile f(p);
    std::vector<char> big(3 << 20, 'x');  // more than the buffer: written before commit
    f.write(big.data(), big.size());
  }  // destroyed without commit
  EXPECT_EQ(test::read_file(p).size(), 4u);
  EXPECT_EQ(listing(t.path()), std::vector<std::string>{"out.bin"});
  {
    io::AtomicFile f(t.file("new.bin"));
    f.write("x", 1);
    f.abort();
    EXPECT_THROW(f.write("y", 1), Error);
  }
  EXPECT_EQ(listing(t.path()), std::vector<std::string>{"out.bin"});
  {
    io::AtomicFile f("/dev/null");  // not a regular file: written in place, nothing renamed
    f.write("x", 1);
    f.commit();
  }
  EXPECT_THROW(io::AtomicFile f(t.path()), Error);                 // a directory
  EXPECT_THROW(io::AtomicFile f(t.file("no/such/dir/x")), Error);  // no folder
  // The input check: the same inode is refused, another file or a new path is not.
  ASSERT_EQ(link(p.c_str(), t.file("hard.bin").c_str()), 0);
  EXPECT_THROW(io::check_output_is_not_input(t.file("hard.bin"), {"", t.file("missing"), p}, "-o"),
               Error);
  EXPECT_NO_THROW(io::check_output_is_not_input(t.file("fresh.bin"), {p}, "-o"));
  test::write_text(t.file("other.bin"), "old");
  EXPECT_NO_THROW(io::check_output_is_not_input(t.file("other.bin"), {p}, "-o"));
}

// --- poisoned models ------------------------------------------------------------------

// Byte offset of tensor `name`'s u64 data offset in a GGUF image's tensor table.
size_t offset_field(const std::vector<uint8_t>& img, const std::string& name) {
  const auto it = std::search(img.begin(), img.end(), name.begin(), name.end());
  EXPECT_NE(it, img.end()) << name;
  size_t p = static_cast<size_t>(it - img.begin()) + name.size();
  uint32_t nd = 0;
  std::memcpy(&nd, &img[p], 4);
  return p + 4 + 8 * nd + 4;
}

TEST(PoisonedModels, OverlappingGgufTensorsAreRejected) {
  KIVI_REQUIRE_MODEL();
  Workdir w;
  ASSERT_EQ(w.kivi("convert m.bin -t tok.bin -o s.gguf").exit_code, 0);
  const auto img = test::read_file(w.t.file("s.gguf"));
  const io::GgufFile f(w.t.file("s.gguf"));
  const uint64_t q = f.find_tensor("blk.1.attn_q.weight")->offset;
  // attn_k of layer 1 moved onto the second half of attn_q (64 x 64 f32: 16 KiB).
  auto bad = img;
  const uint64_t inside = q + 8192;
  std::memcpy(&bad[offset_field(bad, "blk.1.attn_k.weight")], &inside, 8);
  test::write_file(w.t.file("overlap.gguf"), bad);
  expect_error(w.kivi("generate -m overlap.gguf -p hi --threads 1"), "overlap");
  const auto r = w.kivi("generate -m overlap.gguf -p hi --threads 1");
  EXPECT_NE(r.err.find("blk.1.attn_q.weight"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("blk.1.attn_k.weight"), std::string::npos) << r.err;
  // Two tensors at the same offset.
  bad = img;
  std::memcpy(&bad[offset_field(bad, "blk.2.ffn_up.weight")], &q, 8);
  test::write_file(w.t.file("same.gguf"), bad);
  expect_error(w.kivi("info same.gguf"), "overlap");
}

// A copy of the model with every float in [first, first + count) replaced by `v`.
void poison(const Workdir& w, const std::string& name, size_t first, size_t count, float v) {
  auto img = w.model;
  for (size_t i = 0; i < count; ++i) std::memcpy(&img[28 + 4 * (first + i)], &v, 4);
  test::write_file(w.t.file(name), img);
}

TEST(PoisonedModels, NonFiniteWeightsAreAnErrorNamingTheLayer) {
  KIVI_REQUIRE_MODEL();
  Workdir w;
  const auto ck = io::read_llama2c(w.t.file("m.bin"));
  const auto& h = ck->header;
  const size_t floats = (w.model.size() - 28) / 4;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  poison(w, "nan.bin", 0, floats, nan);
  // Layer 3's query projection only.
  const size_t dim = h.dim, wq3 = static_cast<size_t>(ck->wq - ck->token_embd) + 3 * dim * dim;
  poison(w, "layer3.bin", wq3, dim * dim, nan);
  // Layer 1's FFN down projection, +inf.
  const size_t hid = h.hidden_dim,
               w2_1 = static_cast<size_t>(ck->w2 - ck->token_embd) + 1 * dim * hid;
  poison(w, "inf1.bin", w2_1, dim * hid, std::numeric_limits<float>::infinity());

  const std::string tok = " -t tok.bin --threads 1";
  expect_error(w.kivi("generate -m nan.bin" + tok + " -p 'Once upon a time' -n 5"), "not finite");
  expect_error(w.kivi("generate -m nan.bin" + tok + " -p 'Once upon a time' -n 5"),
               "token embedding");
  expect_error(w.kivi("generate -m layer3.bin" + tok + " -p 'Once upon a time' -n 5"),
               "after layer 3");
  expect_error(w.kivi("generate -m layer3.bin" + tok + " -p 'Once upon a time' -n 5 --no-kv-cache"),
               "after layer 3");
  expect_error(
      w.kivi("generate -m inf1.bin" + tok + " -p 'Once upon a time' -n 5 --kv-cache kivi2"),
      "after layer 1");
  expect_error(w.kivi("perplexity -m layer3.bin" + tok + " -f t.txt --ctx 64"), "after layer 3");
  expect_error(w.kivi("perplexity -m nan.bin" + tok + " -f t.txt --ctx 64 --mode batched"),
               "not finite");
  expect_error(w.kivi("logits -m layer3.bin" + tok + " -p hi"), "after layer 3");
  expect_error(w.kivi("logits -m layer3.bin" + tok + " -p hi --mode no-cache"), "after layer 3");
  expect_error(w.kivi("bench -m layer3.bin" + tok + " -n 3 --kv-cache f16"), "after layer 3");
  // --check-weights scans every tensor at load and names the first one that is not finite.
  expect_error(w.kivi("generate -m layer3.bin" + tok + " -p hi --check-weights"),
               "blk.3.attn_q.weight");
  expect_error(w.kivi("generate -m inf1.bin" + tok + " -p hi --check-weights"),
               "blk.1.ffn_down.weight");
  EXPECT_EQ(w.kivi("generate " + w.model_args() + " -p hi -n 3 --check-weights").exit_code, 0);
  // The same through a GGUF with f16 matrices.
  ASSERT_EQ(w.kivi("convert layer3.bin -t tok.bin -o l3.gguf --outtype f16").exit_code, 0);
  expect_error(w.kivi("generate -m l3.gguf -p hi --threads 1"), "after layer 3");
  expect_error(w.kivi("generate -m l3.gguf -p hi --check-weights"), "blk.3.attn_q.weight");
}

// --- options that would be ignored or mean nothing --------------------------------------

TEST(BadOptions, EmptyKvCacheFormatIsAnError) {
  KIVI_REQUIRE_MODEL();
  Workdir w;
  expect_error(w.kivi("generate " + w.model_args() + " -p hi --kv-cache ''"), "--kv-cache");
  expect_error(w.kivi("generate " + w.model_args() + " -p hi --kv-cache=''"),
               "unknown KV cache format ''");
  expect_error(w.kivi("perplexity " + w.model_args() + " -f t.txt --kv-cache ''"), "--kv-cache");
  expect_error(w.kivi("bench " + w.model_args() + " -n 2 --kv-cache ''"), "--kv-cache");
  expect_error(w.kivi("bench " + w.model_args() + " -n 2 --kv-cache f16,,kivi2"), "--kv-cache");
  expect_error(w.kivi("bench-attn --ctx 64 --kv-cache ''"), "--kv-cache");
  expect_error(w.kivi("info " + w.model_args() + " --kv-cache ''"), "--kv-cache");
}

TEST(BadOptions, NoKvCacheWithACacheFormatIsRefused) {
  KIVI_REQUIRE_MODEL();
  Workdir w;
  const std::string g = "generate " + w.model_args() + " -p hi -n 3 --no-kv-cache ";
  expect_error(w.kivi(g + "--kv-cache kivi2"), "--no-kv-cache");
  expect_error(w.kivi(g + "--kv-cache-k kivi4"), "--kv-cache-k");
  expect_error(w.kivi(g + "-R 32"), "--residual");
  EXPECT_EQ(w.kivi(g).exit_code, 0);
}

TEST(BadOptions, KldBaseOfAnotherContextIsRefused) {
  KIVI_REQUIRE_MODEL();
  Workdir w;
  const std::string base = "perplexity " + w.model_args() + " -f t.txt ";
  ASSERT_EQ(w.kivi(base + "--ctx 128 --save-logits c128.lp").exit_code, 0);
  expect_error(w.kivi(base + "--ctx 256 --kld-base c128.lp"), "context of 128");
  // The same context is accepted, and gives KL 0 against itself.
  const auto r = w.kivi(base + "--ctx 128 --kld-base c128.lp --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"kld_max\":0,"), std::string::npos) << r.out;
  // Another model of the same vocabulary: the shape in the file differs.
  ASSERT_EQ(w.kivi("synth --layers 2 --dim 64 --heads 8 --kv-heads 4 --ffn 172 --vocab 512 --ctx "
                   "512 -o s.gguf")
                .exit_code,
            0);
  expect_error(
      w.kivi("perplexity -m s.gguf -t tok.bin -f t.txt --ctx 128 --kld-base c128.lp --threads 1"),
      "another model");
}

}  // namespace
}  // namespace kivi
