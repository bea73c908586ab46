#include "common.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "core/cpu.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/sysinfo.h"
#include "core/threadpool.h"
#include "dist/dist.h"
#include "io/mapped_file.h"
#include "kv/format.h"
#include "model/finite.h"
#include "model/tensor_parallel.h"
#include "runtime/engine_options.h"

namespace kivi::tools {

namespace {

// Declares a session option from the library's table; metavar and help may be replaced
// (a command that reads the option as a list).
void add_spec(Args& a, const char* name, const char* metavar = nullptr,
              const std::string& help = "", const char* def = nullptr) {
  const runtime::OptionSpec* s = runtime::find_session_option(name);
  if (!s) fail("internal: no session option '%s'", name);
  if (s->is_flag()) {
    a.add_flag(s->name, s->short_name, s->help);
  } else {
    a.add(s->name, s->short_name, metavar ? metavar : s->metavar, help.empty() ? s->help : help,
          def ? def : s->def);
  }
}

void add_section(Args& a, const char* section) {
  a.section(section);
  for (const auto& s : runtime::session_option_specs()) {
    if (std::string(s.section) == section) add_spec(a, s.name);
  }
}

// The session options given on the command line, as name=value pairs for the library's
// parser. `sections` limits them (null: all).
runtime::OptionValues given_values(const Args& a, std::initializer_list<const char*> sections) {
  runtime::OptionValues v;
  for (const auto& s : runtime::session_option_specs()) {
    bool wanted = sections.size() == 0;
    for (const char* sec : sections) wanted |= std::string(s.section) == sec;
    if (!wanted || !a.declared(s.name) || !a.given(s.name)) continue;
    v[s.name] = s.is_flag() ? "1" : a.str(s.name);
  }
  return v;
}

constexpr const char* kKvSection = "KV cache";
constexpr const char* kSparseSection = "Sparse attention";

}  // namespace

void add_model_options(Args& a, const char* ctx_help) {
  a.section("Model");
  a.add("model", 'm', "FILE",
        "Model file: a llama2.c checkpoint (.bin) or GGUF. Default: $KIVI_MODEL, then "
        "models/stories260K.bin, then ../shared/models/stories260K.bin.");
  a.add("tokenizer", 't', "FILE",
        "llama2.c tokenizer file. Default for .bin models: tok<vocab>.bin or tokenizer.bin beside "
        "the model; GGUF models use their embedded tokenizer.");
  add_spec(a, "ctx", ctx_help ? "LIST" : nullptr, ctx_help ? ctx_help : "");
  a.alias("--ctx-size", "ctx");
  add_threads_options(a);
  a.add_flag(
      "alibi", 0,
      "Use ALiBi attention biases instead of RoPE (changes the model; for testing the kernels).");
  a.add(
      "simd", 0, "TARGET",
      "Force a SIMD target (e.g. avx3, avx2, sse4, scalar). Default: the best this CPU supports.");
  a.add_flag("copy-weights", 0,
             "Copy the weights from the file into memory backed by 2 MiB pages at load (about "
             "0.3 s per GiB; more when the kernel must first compact memory). Float weights "
             "decode up to ~1.2x faster than from the file's 4 KiB page-cache pages.");
  a.add(
      "dist", 0, "LAYOUT",
      "Under mpirun (generate, chat, perplexity, logits): how the ranks share the job. 'tp' splits "
      "every layer over the ranks (attention heads, FFN channels, vocabulary: each rank holds "
      "1/N of the weights and of the KV cache); 'cp' splits the context (each rank holds the "
      "model and the keys and values of 1/N of the positions); 'tp=A,cp=B' both, over A x B "
      "ranks. Required with more than one rank. See docs/DISTRIBUTED.md.",
      "");
  a.add_flag("check-weights", 0,
             "Scan every weight for NaN and Inf at load and name the first tensor holding one "
             "(reads the whole file once). Without it, non-finite values are still an error, at "
             "the first layer they reach.");
}

void add_kv_options(Args& a, bool allow_list) {
  add_section(a, kKvSection);
  // llama.cpp's spellings.
  a.alias("-ctk", "kv-cache-k");
  a.alias("--cache-type-k", "kv-cache-k");
  a.alias("-ctv", "kv-cache-v");
  a.alias("--cache-type-v", "kv-cache-v");
  if (allow_list) {
    a.replace("kv-cache", "LIST",
              "Comma-separated cache formats. Formats: f32, f16, int8, kivi2, kivi4, kivi8, tq2, "
              "tq2.5, tq3, tq3.5, tq4.",
              "");
  }
}

void add_sparse_options(Args& a, bool lists) {
  add_section(a, kSparseSection);
  if (lists) {
    a.replace("sparse", "KINDS",
              std::string("Comma-separated selection kinds; each is ") +
                  runtime::find_session_option("sparse")->help,
              "off");
    a.replace("sparse-budget", "LIST",
              "Tokens of selected blocks per KV head and step (comma-separated list; k = 1024).",
              "4096");
  }
}

sparse::Options sparse_options(const Args& a, sparse::Kind default_kind) {
  runtime::OptionValues v = given_values(a, {kSparseSection});
  if (!v.count("sparse") && default_kind != sparse::Kind::kOff)
    v["sparse"] = sparse::kind_name(default_kind);
  return runtime::parse_session_options(v).sparse;
}

namespace {

// A fingerprint of a model file: its size and its first and last MiB (header, tokenizer,
// the first and last tensors), enough to tell two different files apart.
uint64_t file_fingerprint(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) return 0;
  const uint64_t size = static_cast<uint64_t>(f.tellg());
  uint64_t h = 1469598103934665603ull ^ size;
  std::vector<char> buf(1 << 20);
  for (uint64_t at : {uint64_t{0}, size > buf.size() ? size - buf.size() : uint64_t{0}}) {
    f.seekg(static_cast<std::streamoff>(at));
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    for (std::streamsize i = 0; i < f.gcount(); ++i)
      h = (h ^ static_cast<unsigned char>(buf[i])) * 1099511628211ull;
    f.clear();
  }
  return h;
}

}  // namespace

// Under mpirun: every rank loads the model and keeps its slice; a failure on any rank
// (a missing file, a split that does not fit) ends every rank with one message.
static std::unique_ptr<model::Model> load_model_distributed(const Args& a,
                                                            const std::string& path) {
  const std::string layout_text = a.given("dist") ? a.str("dist") : "";
  if (dist::size() > 1 && layout_text.empty()) {
    throw dist::CollectiveError(
        strfmt("started on %d ranks without --dist: pass --dist tp to split the model over them",
               dist::size()));
  }
  const dist::Layout layout =
      on_every_rank([&] { return dist::parse_layout(layout_text, dist::size()); });
  dist::setup(layout);
  dist::check_same(file_fingerprint(path), "model files");
  std::unique_ptr<model::Model> m = on_every_rank([&] {
    std::unique_ptr<model::Model> loaded = model::Model::load(path, a.str("tokenizer"));
    model::shard_tensor_parallel(*loaded, dist::tp_comm());
    return loaded;
  });
  return m;
}

std::unique_ptr<model::Model> load_model(const Args& a) {
  const std::string path = model::default_model_path(a.str("model"));
  if (path.empty()) {
    fail(
        "no model given and none found: pass -m FILE, set $KIVI_MODEL, or run scripts/get-model.sh "
        "(looked for models/stories260K.bin and ../shared/models/stories260K.bin)");
  }
  std::unique_ptr<model::Model> m = dist::size() > 1 || a.given("dist")
                                        ? load_model_distributed(a, path)
                                        : model::Model::load(path, a.str("tokenizer"));
  if (a.flag("alibi")) m->mutable_config().alibi = true;
  if (a.flag("copy-weights") && !m->copy_weights_to_memory())
    std::fprintf(
        stderr,
        "warning: could not copy the weights into memory; reading them from the file's map\n");
  if (a.flag("check-weights")) model::check_finite_weights(*m);
  return m;
}

void note_if_synthetic(const model::Model& m, const char* what) {
  if (!m.config().synthetic) return;
  std::fprintf(stderr, "note: %s has random weights (written by 'kivi synth'); %s\n",
               m.path().c_str(), what);
}

std::vector<std::string> model_input_paths(const Args& a) {
  const std::string path = model::default_model_path(a.str("model"));
  return {path, a.given("tokenizer") ? a.str("tokenizer") : model::default_tokenizer_path(path)};
}

std::vector<std::string> kv_format_list(const Args& a, const std::vector<std::string>& def) {
  if (!a.given("kv-cache")) return def;
  const std::string s = a.str("kv-cache");
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = s.find(',', start);
    const std::string item =
        s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item.empty()) {
      fail(
          "--kv-cache: empty format in the list '%s' (formats: f32, f16, int8, kivi2, kivi4, "
          "kivi8)",
          s.c_str());
    }
    out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

void refuse_kv_options(const Args& a, const char* why) {
  for (const auto& o : runtime::kv_option_names()) {
    if (a.declared(o) && a.given(o))
      fail("--%s has no effect with %s; leave it out", o.c_str(), why);
  }
}

bool parse_command_line(Args& a, int argc, char** argv) {
  if (!a.parse(argc, argv)) {
    std::fputs(a.help().c_str(), stdout);
    return false;
  }
  if (a.declared("simd") && a.given("simd")) cpu::force_target(a.str("simd"));
  return true;
}

void add_threads_options(Args& a) {
  add_spec(a, "threads");
  add_spec(a, "threads-force");
}

int threads_option(const Args& a) {
  const int requested = static_cast<int>(a.integer("threads", 0, 1024));
  const ThreadCount tc = resolve_thread_count(requested, a.flag("threads-force"));
  if (tc.capped) {
    std::fprintf(
        stderr,
        "kivi: warning: --threads %d is more than the %d hardware thread%s this process may use; "
        "using %d (--threads-force keeps %d)\n",
        requested, tc.threads, tc.threads == 1 ? "" : "s", tc.threads, requested);
  }
  return tc.threads;
}

std::string read_text_file(const std::string& path) {
  io::check_regular_file(path, "text");
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot read text file '%s'", path.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

kv::CacheConfig cache_config(const Args& a, const std::string& format) {
  runtime::OptionValues v = given_values(a, {kKvSection});
  if (!format.empty()) v["kv-cache"] = format;
  return runtime::parse_session_options(v).cache;
}

runtime::SessionOptions session_options(const Args& a, const model::Model& m,
                                        const std::string& format, int ctx, bool read_sparse) {
  runtime::OptionValues v = given_values(a, {});
  if (!format.empty()) v["kv-cache"] = format;
  if (ctx > 0) v["ctx"] = std::to_string(ctx);
  if (ctx == 0) v.erase("ctx");
  if (!read_sparse) {
    for (auto it = v.begin(); it != v.end();) {
      it = it->first.rfind("sparse", 0) == 0 ? v.erase(it) : std::next(it);
    }
  }
  runtime::SessionOptions o = runtime::parse_session_options(v);
  o.threads = threads_option(a);  // with its warning when capped
  o.cp = dist::cp_comm();         // --dist cp: this rank's shard of the positions
  const runtime::ContextChoice c = runtime::resolve_context(m, o);
  if (!c.note.empty()) std::fprintf(stderr, "note: %s\n", c.note.c_str());
  o.ctx = c.ctx;
  return o;
}

std::string describe_cache(const kv::CacheConfig& c) { return runtime::describe_cache(c); }

void add_generation_options(Args& a, bool ignore_eos) {
  for (const auto& s : runtime::generation_option_specs()) {
    if (!ignore_eos && std::string(s.name) == "ignore-eos") continue;
    if (s.is_flag()) {
      a.add_flag(s.name, s.short_name, s.help);
    } else {
      a.add(s.name, s.short_name, s.metavar, s.help, s.def);
    }
  }
  a.alias("--n-predict", "max-tokens");
  a.alias("--n", "max-tokens");
  a.alias("--temperature", "temp");
}

void add_draft_options(Args& a) {
  a.section("Speculative decoding with a draft model");
  a.add("draft-model", 0, "FILE",
        "A smaller model of the same vocabulary whose greedy continuation is drafted and checked "
        "by the model in one batched step; the text is the one plain decoding gives (the "
        "server gives each slot a session of it).",
        "");
  a.add("draft-max", 0, "N",
        "Tokens drafted per step at most (1 to 64; the length adapts to what is accepted).", "8");
  a.add("draft-kv-cache", 0, "FORMAT",
        "The draft model's cache format (f32, f16, int8, kivi2, kivi4, kivi8).", "f16");
}

std::unique_ptr<runtime::DraftModel> draft_model_option(const Args& a, const model::Model& target,
                                                        const runtime::SessionOptions& so,
                                                        runtime::GenerationOptions& go) {
  if (!a.given("draft-model")) {
    for (const char* o : {"draft-max", "draft-kv-cache"}) {
      if (a.given(o)) fail("--%s: needs --draft-model", o);
    }
    return nullptr;
  }
  if (go.lookup > 0) fail("--draft-model and --lookup: choose one source of drafts");
  if (dist::size() > 1 || a.given("dist"))
    fail("--draft-model: not under --dist (the draft model runs in one process)");
  const int max = static_cast<int>(a.integer("draft-max", 1, 64));
  std::unique_ptr<model::Model> d = model::Model::load(a.str("draft-model"), "");
  runtime::OptionValues v = {{"kv-cache", a.str("draft-kv-cache")},
                             {"ctx", std::to_string(so.ctx)}};
  runtime::SessionOptions o = runtime::parse_session_options(v);
  o.threads = so.threads;
  auto draft = std::make_unique<runtime::DraftModel>(std::move(d), target, o, max);
  go.lookup = max;
  go.draft_model = draft.get();
  return draft;
}

runtime::GenerationOptions generation_options(const Args& a) {
  runtime::OptionValues v;
  for (const auto& s : runtime::generation_option_specs()) {
    if (!a.declared(s.name)) continue;
    if (s.is_flag()) {
      if (a.given(s.name)) v[s.name] = "1";
    } else {
      v[s.name] = a.str(s.name);  // the command's default where it has its own (chat's -n)
    }
  }
  runtime::GenerationOptions go = runtime::parse_generation_options(v);
  // Every rank samples with rank 0's seed (a random one differs between processes).
  dist::broadcast(go.sampler.seed);
  return go;
}

std::vector<std::string> data_file_candidates(const std::string& name) {
  std::vector<std::string> c = {"data/" + name, "../shared/data/" + name};
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    std::string dir(exe, static_cast<size_t>(n));
    dir = dir.substr(0, dir.find_last_of('/'));
    c.push_back(dir + "/../share/kivi/" + name);
    c.push_back(dir + "/../../../shared/data/" + name);
  }
  return c;
}

// Rank 0 alone runs `read` (mpirun gives standard input to rank 0 only; a file need not
// exist on every machine); every rank gets its text, or every rank throws its error.
template <typename F>
static std::string read_on_root(F&& read) {
  if (dist::size() == 1) return read();
  std::string text, error;
  if (dist::is_root()) {
    try {
      text = read();
    } catch (const Error& e) {
      error = e.what();
    }
  }
  dist::agree(error);
  dist::broadcast(text);
  return text;
}

std::string text_everywhere(const std::string& path) {
  return read_on_root([&] { return read_text_file(path); });
}

void refuse_distributed(const Args& a, std::initializer_list<const char*> options) {
  if (dist::size() == 1) return;
  for (const char* o : options) {
    if (a.declared(o) && a.given(o)) {
      throw dist::CollectiveError(
          strfmt("--%s runs in one process only; leave it out under mpirun --dist", o));
    }
  }
}

std::string rank_file(const std::string& path) {
  if (path.empty() || dist::size() == 1 || dist::rank() == 0) return path;
  return path + ".rank" + std::to_string(dist::rank());
}

std::string prompt_option(const Args& a) {
  return read_on_root([&] {
    if (a.declared("file") && a.given("file")) {
      if (a.given("prompt")) fail("give the prompt with -p or -f, not both");
      return read_text_file(a.str("file"));
    }
    std::string p = a.str("prompt");
    if (p == "-") {
      std::stringstream ss;
      ss << std::cin.rdbuf();
      p = ss.str();
    }
    return p;
  });
}

}  // namespace kivi::tools
