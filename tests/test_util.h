// Helpers shared by the tests: paths to the shared model, temporary files, running
// the CLI, every cache format, stories260K and greedy decoding, and model files written
// for a test.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <ctime>
#include <string>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include "core/cpu.h"
#include "core/error.h"
#include "io/gguf_writer.h"
#include "kv/format.h"
#include "model/config.h"
#include "model/convert.h"
#include "model/model.h"
#include "model/synth.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

namespace kivi::test {

// The SIMD targets a kernel test compares against its reference: every one this binary
// and CPU have. Under sanitizers (some 10x slower) the best, AVX2 and the last (the
// portable one): the widest, the common and the scalar code paths; the release tests
// cover the rest.
inline std::vector<cpu::Target> simd_targets() {
  std::vector<cpu::Target> all = cpu::available_targets();
#ifdef KIVI_SANITIZE
  std::vector<cpu::Target> some;
  for (size_t i = 0; i < all.size(); ++i) {
    if (i == 0 || i + 1 == all.size() || all[i].name == "AVX2") some.push_back(all[i]);
  }
  return some;
#else
  return all;
#endif
}

inline std::string shared_dir() {
  const char* env = std::getenv("KIVI_SHARED_DIR");
  return env && *env ? env : KIVI_SHARED_DIR;
}
inline std::string model_path() { return shared_dir() + "/models/stories260K.bin"; }
inline std::string tokenizer_path() { return shared_dir() + "/models/tok512.bin"; }
inline std::string text_path() { return shared_dir() + "/data/tinytales.txt"; }
inline std::string cli_path() { return KIVI_CLI; }

inline bool file_exists(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0;
}

// Fails the test if the shared model is missing (run scripts/get-model.sh or set
// KIVI_SHARED_DIR).
#define KIVI_REQUIRE_MODEL()                                         \
  ASSERT_TRUE(::kivi::test::file_exists(::kivi::test::model_path())) \
      << "missing " << ::kivi::test::model_path()                    \
      << " (run scripts/get-model.sh, or set KIVI_SHARED_DIR to a folder with models/)"

// A fresh temporary directory, removed with its files when the object dies.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kivi-test-XXXXXX";
    const char* d = mkdtemp(tmpl);
    path_ = d ? d : "/tmp";
  }
  ~TempDir() {
    const std::string cmd = "rm -rf '" + path_ + "'";
    if (std::system(cmd.c_str()) != 0) {
    }
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::vector<uint8_t> read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)),
                              std::istreambuf_iterator<char>());
}
inline void write_file(const std::string& p, const std::vector<uint8_t>& d) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(d.data()), static_cast<std::streamsize>(d.size()));
}
inline void write_text(const std::string& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

struct RunResult {
  int exit_code = -1;
  std::string out, err;
};

// Runs a shell command line, capturing stdout and stderr.
inline RunResult run(const std::string& cmdline) {
  TempDir t;
  const std::string o = t.file("out"), e = t.file("err");
  const std::string full = cmdline + " >'" + o + "' 2>'" + e + "'";
  const int status = std::system(full.c_str());
  RunResult r;
  if (WIFEXITED(status)) {
    r.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    r.exit_code = 128 + WTERMSIG(status);
  }
  auto slurp = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  r.out = slurp(o);
  r.err = slurp(e);
  return r;
}

inline std::string kivi_cmd(const std::string& args) { return "'" + cli_path() + "' " + args; }

// The text llama2.c publishes for stories260K, greedy from "Once upon a time".
inline const char* kPublishedText =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
    "One day, she saw a big, red ball. She wanted to play with it, but it was too high";

// "-m MODEL -t TOKENIZER" for the CLI: stories260K and its tokenizer.
inline std::string model_args() {
  return "-m '" + model_path() + "' -t '" + tokenizer_path() + "'";
}

// A CLI error: exit code 1 and one line on stderr, "kivi: error: ..." containing `needle`.
inline void expect_cli_error(const RunResult& r, const std::string& needle,
                             const std::string& what = "") {
  EXPECT_EQ(r.exit_code, 1) << what << ": " << r.err;
  EXPECT_EQ(r.err.rfind("kivi: error: ", 0), 0u) << what << ": " << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos)
      << what << ": expected '" << needle << "' in: " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << what << ": " << r.err;
}

// Arguments the CLI refuses and words of the error line they give.
struct BadArgs {
  std::string args, message;
};

// Runs `kivi <command> <args>` for each of `bad`; each is a CLI error naming its message.
inline void expect_cli_errors(const std::string& command, const std::vector<BadArgs>& bad) {
  for (const auto& b : bad)
    expect_cli_error(run(kivi_cmd(command + " " + b.args)), b.message, b.args);
}

// Largest |a - ref| over the largest |ref|: the relative error of a result against its
// reference.
template <typename T>
inline double rel_error(const std::vector<float>& a, const std::vector<T>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - static_cast<double>(ref[i])));
    den = std::max(den, std::fabs(static_cast<double>(ref[i])));
  }
  return num / std::max(den, 1e-30);
}

// --- Cache formats -------------------------------------------------------------------------

// A cache format for keys and one for values, with the name the tests print.
struct FormatCase {
  std::string name;
  kv::StreamFormat k, v;
  kv::KvRotate rotate = kv::KvRotate::kNone;  // --kv-rotate
};

// Every cache format on both streams (each int8 granularity apart), then keys and
// values in different formats.
inline std::vector<FormatCase> all_formats() {
  using kv::Format;
  using kv::Int8Granularity;
  auto sf = [](Format f, Int8Granularity g = Int8Granularity::kHead) {
    return kv::StreamFormat{f, g};
  };
  return {
      {"f32", sf(Format::kF32), sf(Format::kF32)},
      {"f16", sf(Format::kF16), sf(Format::kF16)},
      {"int8/tensor", sf(Format::kInt8, Int8Granularity::kTensor),
       sf(Format::kInt8, Int8Granularity::kTensor)},
      {"int8/token", sf(Format::kInt8, Int8Granularity::kToken),
       sf(Format::kInt8, Int8Granularity::kToken)},
      {"int8/head", sf(Format::kInt8), sf(Format::kInt8)},
      {"int8/group", sf(Format::kInt8, Int8Granularity::kGroup),
       sf(Format::kInt8, Int8Granularity::kGroup)},
      {"kivi8", sf(Format::kKivi8), sf(Format::kKivi8)},
      {"kivi4", sf(Format::kKivi4), sf(Format::kKivi4)},
      {"kivi2", sf(Format::kKivi2), sf(Format::kKivi2)},
      {"K kivi4 / V kivi2", sf(Format::kKivi4), sf(Format::kKivi2)},
      {"K int8 / V kivi4", sf(Format::kInt8), sf(Format::kKivi4)},
      {"K f16 / V kivi2", sf(Format::kF16), sf(Format::kKivi2)},
      {"tq3", sf(Format::kTq3), sf(Format::kTq3)},
      {"K tq4 / V tq2", sf(Format::kTq4), sf(Format::kTq2)},
      {"K kivi2 / V tq2.5", sf(Format::kKivi2), sf(Format::kTq25)},
      {"int8/head rotated", sf(Format::kInt8), sf(Format::kInt8), kv::KvRotate::kHadamard},
      {"int8/group rotated", sf(Format::kInt8, Int8Granularity::kGroup),
       sf(Format::kInt8, Int8Granularity::kGroup), kv::KvRotate::kHadamard},
      {"kivi2, values rotated", sf(Format::kKivi2), sf(Format::kKivi2), kv::KvRotate::kHadamard},
      {"K int8 / V kivi4, rotated", sf(Format::kInt8), sf(Format::kKivi4), kv::KvRotate::kHadamard},
  };
}

// The case of all_formats() called `name`.
inline const FormatCase& format_named(const std::string& name) {
  static const std::vector<FormatCase> all = all_formats();
  for (const auto& c : all)
    if (c.name == name) return c;
  fail("no format %s", name.c_str());
}

// --- Models --------------------------------------------------------------------------------

// stories260K with its tokenizer, loaded once.
inline const model::Model& stories() {
  static auto m = model::Model::load(model_path(), tokenizer_path());
  return *m;
}

// Prefills `prompt`, then decodes n tokens greedily (ties to the lowest id).
inline std::vector<int> greedy(runtime::Session& s, const std::vector<int>& prompt, int n) {
  std::vector<int> out;
  const float* logits = s.prefill(prompt);
  for (int i = 0; i < n; ++i) {
    const int t = runtime::argmax(logits, s.vocab());
    out.push_back(t);
    if (i + 1 < n) logits = s.decode(t);
  }
  return out;
}

// The kivi::Error message of loading `path` ("" when it loads).
inline std::string load_error(const std::string& path) {
  try {
    model::Model::load(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A GGUF of shape `c` with random f32 weights (model/synth.h), as `dir`/`name`.gguf.
inline std::string synth_model(const TempDir& dir, const std::string& name,
                               const model::ModelConfig& c, uint64_t seed) {
  model::SynthSpec s;
  s.config = c;
  s.label = name;
  s.outtype = "f32";
  s.seed = seed;
  const std::string path = dir.file(name + ".gguf");
  model::write_synthetic_gguf(s, path);
  return path;
}

// Today's local date as YYYY-MM-DD (what a chat template's strftime_now writes), computed
// here apart from the engine's.
inline std::string local_date() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

// A GGUF of shape `c` written by hand as `dir`/`name`.gguf: `edit` may change the
// tensor list (drop or reshape tensors), `meta` may add keys. Matrices hold 0.01,
// vectors 1, rope_freqs.weight the config's factors.
inline std::string write_model(const TempDir& dir, const std::string& name,
                               const model::ModelConfig& c,
                               const std::function<void(std::vector<model::TensorSpec>&)>& edit,
                               const std::function<void(io::GgufWriter&)>& meta = {}) {
  io::GgufWriter w;
  model::add_llama_metadata(w, c, name, 0);
  if (meta) meta(w);
  model::add_tokenizer_metadata(w, model::synthetic_tokenizer(c.vocab_size));
  auto specs = model::llama_tensor_specs(c);
  if (edit) edit(specs);
  for (const auto& s : specs) {
    const float v = s.is_vector() ? 1.0f : 0.01f;
    const std::vector<uint64_t> dims = s.is_vector() ? std::vector<uint64_t>{s.rows}
                                       : s.experts > 0
                                           ? std::vector<uint64_t>{s.cols, s.rows, s.experts}
                                           : std::vector<uint64_t>{s.cols, s.rows};
    if (s.role == model::TensorRole::kRopeFreqs) {
      w.add_tensor(s.name, dims, io::GgmlType::kF32,
                   io::GgufWriter::Generator(
                       [f = c.rope_freq_factors](uint64_t first, uint64_t count, void* dst) {
                         std::copy_n(f.data() + first, count, static_cast<float*>(dst));
                       }));
      continue;
    }
    w.add_tensor(s.name, dims, io::GgmlType::kF32,
                 io::GgufWriter::Generator([v](uint64_t, uint64_t count, void* dst) {
                   std::fill_n(static_cast<float*>(dst), count, v);
                 }));
  }
  const std::string path = dir.file(name + ".gguf");
  w.write(path);
  return path;
}

}  // namespace kivi::test
