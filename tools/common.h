// Options and helpers shared by the `kivi` commands.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "args.h"
#include "dist/dist.h"
#include "model/model.h"
#include "runtime/generation.h"
#include "runtime/perplexity.h"
#include "runtime/session.h"
#include "runtime/speculative.h"

namespace kivi::tools {

// -m/--model, -t/--tokenizer, --ctx, --threads, --threads-force, --alibi, --simd,
// --copy-weights, --check-weights.
// ctx_help replaces the help of --ctx for a command that reads it its own way (eval: a list
// of prompt lengths).
void add_model_options(Args& a, const char* ctx_help = nullptr);
// --threads N and --threads-force (part of add_model_options).
void add_threads_options(Args& a);
// --kv-cache, --kv-cache-k, --kv-cache-v, --int8-granularity, --group-size, --residual,
// --key-flush, --scale-dtype, --attn-precision, --window
void add_kv_options(Args& a, bool allow_list = false);
// --sparse, --sparse-block, --sparse-budget, --sparse-sinks, --sparse-local,
// --sparse-dense-layers, --sparse-heads, --sparse-reselect, --sparse-reuse-layers,
// --sparse-preselect, --sparse-candidates (commands whose sessions honour them). lists:
// --sparse and --sparse-budget take comma-separated lists (eval's attn-recall measures
// several).
void add_sparse_options(Args& a, bool lists = false);
// The --sparse options, validated. Without --sparse: `default_kind`, and when that is off
// the other --sparse-* options are an error. session_options() reads them.
sparse::Options sparse_options(const Args& a, sparse::Kind default_kind = sparse::Kind::kOff);

// Resolves the model path (-m, $KIVI_MODEL, models/stories260K.bin,
// ../shared/models/stories260K.bin) and loads it, applying --alibi.
std::unique_ptr<model::Model> load_model(const Args& a);
// "note: M has random weights ...; <what>" on stderr for a synthetic model (kivi synth).
void note_if_synthetic(const model::Model& m, const char* what);
// The files a model run reads: the model (resolved as load_model does) and its tokenizer
// (given, or the default beside a llama2.c model; "" when there is none). For refusing an
// output that is one of them (io/atomic_file.h).
std::vector<std::string> model_input_paths(const Args& a);
// --kv-cache as a comma-separated list (`def` when not given); an empty entry is an error.
std::vector<std::string> kv_format_list(const Args& a, const std::vector<std::string>& def);
// Throws naming the first KV cache option given, which would have no effect: `why` says
// why, e.g. "--no-kv-cache".
void refuse_kv_options(const Args& a, const char* why);
// Parses the command line and applies --simd if given. Returns false when --help was asked
// for (the help is then printed to stdout); throws on a bad option.
bool parse_command_line(Args& a, int argc, char** argv);

// Cache configuration from the KV options; `format` overrides --kv-cache when set.
// The cache options; `format` (default: --kv-cache) may carry policies:
// FORMAT[+shareN][+pre] (cross-layer sharing every N layers, keys before RoPE).
kv::CacheConfig cache_config(const Args& a, const std::string& format = "");
// The whole of a text file (a regular file), or an error naming it.
std::string read_text_file(const std::string& path);
// read_text_file on rank 0, whose text every rank gets (under mpirun the file need exist
// on rank 0's machine only).
std::string text_everywhere(const std::string& path);
// Under mpirun: a collective error naming the first of `options` given (what does not
// run over several processes yet).
void refuse_distributed(const Args& a, std::initializer_list<const char*> options);
// Under --dist every rank keeps its own share of a KV cache file (its heads under tp, its
// positions under cp): rank 0 `path`, rank r `path.rank<r>` ("" stays "").
std::string rank_file(const std::string& path);
// Runs f on every rank; when it fails on any rank, every rank throws that error and rank
// 0 alone prints it (a file missing on one machine ends the job with one line).
template <typename F>
auto on_every_rank(F&& f) -> decltype(f()) {
  if (dist::size() == 1) return f();
  std::string error;
  decltype(f()) r{};
  try {
    r = f();
  } catch (const Error& e) {
    error = e.what();
  }
  dist::agree(error);
  return r;
}
// The session options given, parsed by the library (runtime/engine_options.h), with the
// context resolved and checked against memory (runtime::resolve_context).
// ctx >= 0 replaces --ctx (0: the default context) for a command whose --ctx means
// something else; read_sparse = false leaves the session dense (a command that reads the
// --sparse options its own way).
runtime::SessionOptions session_options(const Args& a, const model::Model& m,
                                        const std::string& format = "", int ctx = -1,
                                        bool read_sparse = true);
// The thread count from --threads and --threads-force: 0 = hardware_threads(); above that,
// capped with a warning on stderr unless forced.
int threads_option(const Args& a);
// A one-line description of the cache configuration: "kivi2 (G=32, R=128, batch flush, f16
// scales)".
std::string describe_cache(const kv::CacheConfig& c);

// The generation options of the library's table (runtime/engine_options.h): -n/--max-tokens,
// --temp, --top-k, --top-p, --seed, and --ignore-eos where `ignore_eos`.
void add_generation_options(Args& a, bool ignore_eos);
// The generation options given, parsed by the library.
runtime::GenerationOptions generation_options(const Args& a);
// Speculative decoding with a draft model: --draft-model FILE, --draft-max N,
// --draft-kv-cache FORMAT.
void add_draft_options(Args& a);
// The draft model --draft-model names, loaded and checked against the model's
// vocabulary, with a session of the target's context (`so`) in its own cache format; it
// sets go.lookup (the draft length) and go.draft_model. Null without --draft-model.
std::unique_ptr<runtime::DraftModel> draft_model_option(const Args& a, const model::Model& target,
                                                        const runtime::SessionOptions& so,
                                                        runtime::GenerationOptions& go);
// Where a data file that ships beside kivi (e.g. tinytales.txt) is looked for, in order:
// data/ and ../shared/data/ from the working directory, then relative to the binary:
// ../share/kivi/ (installed) and ../../../shared/data/ (build/bin/kivi in a checkout).
std::vector<std::string> data_file_candidates(const std::string& name);
// The prompt: -p TEXT, -p - (standard input) or -f FILE.
std::string prompt_option(const Args& a);

// Command entry points: return the exit code.
int cmd_generate(int argc, char** argv);
int cmd_info(int argc, char** argv);
int cmd_convert(int argc, char** argv);
int cmd_logits(int argc, char** argv);
int cmd_perplexity(int argc, char** argv);
// kivi perplexity --kv-sensitivity (perplexity_sensitivity.cpp): its options, and the sweep.
void add_kv_sensitivity_options(Args& a);
int report_kv_sensitivity(const Args& a, const model::Model& m, const runtime::SessionOptions& opt,
                          const std::vector<int>& tokens, runtime::EvalMode mode, bool json);
int cmd_bench(int argc, char** argv);
int cmd_bench_attn(int argc, char** argv);
int cmd_bench_batch(int argc, char** argv);
int cmd_synth(int argc, char** argv);
int cmd_chat(int argc, char** argv);
int cmd_quantize(int argc, char** argv);
int cmd_bench_matvec(int argc, char** argv);
int cmd_bench_sparse(int argc, char** argv);
int cmd_serve(int argc, char** argv);
int cmd_bench_serve(int argc, char** argv);
int cmd_bench_comm(int argc, char** argv);
int cmd_bench_grammar(int argc, char** argv);
int cmd_eval(int argc, char** argv);

}  // namespace kivi::tools
