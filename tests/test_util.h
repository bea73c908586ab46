// Helpers shared by the tests: paths to the shared model, temporary files, running
// the CLI.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace kivi::test {

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

}  // namespace kivi::test
