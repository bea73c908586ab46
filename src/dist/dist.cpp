#include "dist/dist.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "model/context_parallel.h"
#include "model/tensor_parallel.h"
#include "runtime/step_link.h"

#ifdef KIVI_HAVE_MPI
#include <mpi.h>
#endif

namespace kivi::dist {

namespace {

int g_rank = 0, g_size = 1;
bool g_started = false;
int g_stderr = 2;  // the stderr the process started with
std::unique_ptr<model::TpComm> g_tp;
std::unique_ptr<model::CpComm> g_cp;
std::unique_ptr<runtime::StepLink> g_link;

// Reads "N" from s[pos...] up to a comma or the end.
int parse_count(const std::string& s, const std::string& item, size_t eq) {
  const std::string n = item.substr(eq + 1);
  char* end = nullptr;
  const long v = std::strtol(n.c_str(), &end, 10);
  if (n.empty() || *end != '\0' || v < 1 || v > 65536)
    fail("--dist %s: '%s' needs a rank count from 1 to 65536", s.c_str(), item.c_str());
  return static_cast<int>(v);
}

#ifdef KIVI_HAVE_MPI
// A communicator with this rank's place in it; frees it unless it is the world.
struct Group {
  explicit Group(MPI_Comm c) : comm(c) {
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
  }
  ~Group() {
    if (comm != MPI_COMM_WORLD) MPI_Comm_free(&comm);
  }
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  MPI_Comm comm;
  int rank = 0, size = 1;
};

// Tensor-parallel collectives over an MPI communicator.
class MpiTpComm final : public model::TpComm {
 public:
  explicit MpiTpComm(MPI_Comm comm) : g_(comm) {}
  int rank() const override { return g_.rank; }
  int size() const override { return g_.size; }
  void sum(float* x, size_t n) override {
    // Gathering every part and adding them in rank order on every rank gives the same
    // bits everywhere and every time (an MPI_Allreduce may add in any order).
    buf_.resize(n * static_cast<size_t>(g_.size));
    MPI_Allgather(x, static_cast<int>(n), MPI_FLOAT, buf_.data(), static_cast<int>(n), MPI_FLOAT,
                  g_.comm);
    std::memcpy(x, buf_.data(), n * sizeof(float));
    for (int r = 1; r < g_.size; ++r) {
      const float* p = buf_.data() + static_cast<size_t>(r) * n;
      for (size_t i = 0; i < n; ++i) x[i] += p[i];
    }
  }
  void gather(const float* part, const std::vector<int>& counts, float* out) override {
    displs_.assign(counts.size(), 0);
    for (size_t r = 1; r < counts.size(); ++r) displs_[r] = displs_[r - 1] + counts[r - 1];
    MPI_Allgatherv(part, counts[g_.rank], MPI_FLOAT, out, counts.data(), displs_.data(), MPI_FLOAT,
                   g_.comm);
  }
  float max(float x) override {
    float out = x;
    MPI_Allreduce(&x, &out, 1, MPI_FLOAT, MPI_MAX, g_.comm);
    return out;
  }

 private:
  Group g_;
  std::vector<float> buf_;  // every rank's partial sums
  std::vector<int> displs_;
};

// Context-parallel collectives over an MPI communicator.
class MpiCpComm final : public model::CpComm {
 public:
  explicit MpiCpComm(MPI_Comm comm) : g_(comm) {}
  int rank() const override { return g_.rank; }
  int size() const override { return g_.size; }
  void gather(const float* mine, size_t n, float* out) override {
    MPI_Allgather(mine, static_cast<int>(n), MPI_FLOAT, out, static_cast<int>(n), MPI_FLOAT,
                  g_.comm);
  }

 private:
  Group g_;
};

// A serving scheduler's step records, broadcast from rank 0 on a communicator of their
// own. A follower polls for the next record: spinning (yielding) for the first 20 ms
// after a record, then sleeping 0.5 ms between polls, so an idle server costs the
// followers almost nothing and a busy one adds no sleep to a step.
class MpiStepLink final : public runtime::StepLink {
 public:
  explicit MpiStepLink(MPI_Comm comm) : g_(comm) {}
  bool leader() const override { return g_.rank == 0; }
  void exchange(std::vector<int32_t>& w) override {
    int64_t n = static_cast<int64_t>(w.size());
    MPI_Request req;
    MPI_Ibcast(&n, 1, MPI_INT64_T, 0, g_.comm, &req);
    if (leader()) {
      MPI_Wait(&req, MPI_STATUS_IGNORE);
    } else {
      const auto since = std::chrono::steady_clock::now() - last_;
      const bool spin = since < std::chrono::milliseconds(20);
      for (int done = 0;;) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (done) break;
        if (spin && std::chrono::steady_clock::now() - last_ < std::chrono::milliseconds(20)) {
          sched_yield();
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(500));
        }
      }
      w.resize(static_cast<size_t>(n));
    }
    size_t off = 0;  // in pieces MPI's int counts can hold
    while (off < w.size()) {
      const size_t piece = std::min<size_t>(w.size() - off, size_t{1} << 30);
      MPI_Bcast(w.data() + off, static_cast<int>(piece), MPI_INT32_T, 0, g_.comm);
      off += piece;
    }
    last_ = std::chrono::steady_clock::now();
  }

 private:
  Group g_;
  std::chrono::steady_clock::time_point last_{};
};
#endif

}  // namespace

Layout parse_layout(const std::string& s, int world) {
  Layout l;
  bool tp_all = false, cp_all = false, seen_tp = false, seen_cp = false;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const std::string item =
        s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    if (key != "tp" && key != "cp") {
      fail("--dist %s: unknown part '%s' (expected tp, cp, tp=N, cp=N or tp=A,cp=B)", s.c_str(),
           item.c_str());
    }
    bool& seen = key == "tp" ? seen_tp : seen_cp;
    if (seen) fail("--dist %s: '%s' given twice", s.c_str(), key.c_str());
    seen = true;
    int& n = key == "tp" ? l.tp : l.cp;
    if (eq == std::string::npos) {
      (key == "tp" ? tp_all : cp_all) = true;
    } else {
      n = parse_count(s, item, eq);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (tp_all && cp_all)
    fail("--dist %s: give the count of one of them (tp=A,cp=B or tp=A,cp)", s.c_str());
  if (tp_all) {
    if (world % l.cp != 0)
      fail("--dist %s: %d ranks do not split into cp=%d groups", s.c_str(), world, l.cp);
    l.tp = world / l.cp;
  }
  if (cp_all) {
    if (world % l.tp != 0)
      fail("--dist %s: %d ranks do not split into tp=%d groups", s.c_str(), world, l.tp);
    l.cp = world / l.tp;
  }
  if (l.tp * l.cp != world) {
    fail("--dist %s: tp=%d x cp=%d = %d ranks, but the job has %d (mpirun -np %d)", s.c_str(), l.tp,
         l.cp, l.tp * l.cp, world, l.tp * l.cp);
  }
  return l;
}

std::string layout_name(const Layout& l) {
  if (l.cp == 1) return "tp=" + std::to_string(l.tp);
  if (l.tp == 1) return "cp=" + std::to_string(l.cp);
  return "tp=" + std::to_string(l.tp) + ",cp=" + std::to_string(l.cp);
}

bool built_with_mpi() {
#ifdef KIVI_HAVE_MPI
  return true;
#else
  return false;
#endif
}

void init(int* argc, char*** argv) {
#ifdef KIVI_HAVE_MPI
  // Launched by Open MPI's mpirun (or another PMIx launcher): start MPI. A plain run
  // stays one process without touching MPI at all.
  const bool launched =
      std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") || std::getenv("PMI_SIZE");
  if (!launched) return;
  int provided = 0;
  // Serialized: the serving scheduler's thread makes the calls, one thread at a time.
  MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  g_started = true;
#else
  (void)argc;
  (void)argv;
#endif
}

void finalize() {
  g_link.reset();
  g_tp.reset();
  g_cp.reset();
#ifdef KIVI_HAVE_MPI
  if (g_started) MPI_Finalize();
#endif
  g_started = false;
}

int rank() { return g_rank; }
int size() { return g_size; }
bool is_root() { return g_rank == 0; }

void silence_other_ranks() {
  if (g_rank == 0) return;
  std::fflush(stdout);
  std::fflush(stderr);
  g_stderr = dup(2);
  const int null = open("/dev/null", O_WRONLY);
  if (null >= 0) {
    dup2(null, 1);
    dup2(null, 2);
    close(null);
  }
}

void agree(const std::string& error) {
#ifdef KIVI_HAVE_MPI
  if (!g_started) {
    if (!error.empty()) throw CollectiveError(error);
    return;
  }
  int failed = error.empty() ? g_size : g_rank;  // the lowest failing rank, or size
  int first = g_size;
  MPI_Allreduce(&failed, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (first == g_size) return;
  std::string msg = first == g_rank ? error : std::string();
  uint64_t len = msg.size();
  MPI_Bcast(&len, 1, MPI_UINT64_T, first, MPI_COMM_WORLD);
  msg.resize(len);
  MPI_Bcast(msg.data(), static_cast<int>(len), MPI_CHAR, first, MPI_COMM_WORLD);
  if (first != 0) msg = "rank " + std::to_string(first) + ": " + msg;
  throw CollectiveError(msg);
#else
  if (!error.empty()) throw CollectiveError(error);
#endif
}

void check_same(uint64_t value, const char* what) {
#ifdef KIVI_HAVE_MPI
  if (!g_started) return;
  std::vector<uint64_t> all(g_size);
  MPI_Allgather(&value, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  for (int r = 1; r < g_size; ++r) {
    if (all[r] != all[0]) {
      throw CollectiveError(strfmt(
          "the ranks were started with different %s: rank %d differs from rank 0 (every rank "
          "must run the same command on the same model)",
          what, r));
    }
  }
#else
  (void)value;
  (void)what;
#endif
}

void broadcast(std::string& s) {
#ifdef KIVI_HAVE_MPI
  if (!g_started) return;
  uint64_t len = s.size();
  MPI_Bcast(&len, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  s.resize(len);
  MPI_Bcast(s.data(), static_cast<int>(len), MPI_CHAR, 0, MPI_COMM_WORLD);
#else
  (void)s;
#endif
}

void broadcast(uint64_t& v) {
#ifdef KIVI_HAVE_MPI
  if (g_started) MPI_Bcast(&v, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
#else
  (void)v;
#endif
}

void setup(const Layout& layout) {
  if (layout.tp * layout.cp != g_size) {
    throw CollectiveError(strfmt("--dist %s needs %d ranks; the job has %d",
                                 layout_name(layout).c_str(), layout.tp * layout.cp, g_size));
  }
#ifdef KIVI_HAVE_MPI
  if (g_size == 1) return;
  // World rank w is tensor-parallel rank w % tp of context shard w / tp: a TP group holds
  // one shard's ranks, a CP group the same slice of the model on every shard.
  auto split = [](int color) {
    MPI_Comm c;
    MPI_Comm_split(MPI_COMM_WORLD, color, g_rank, &c);
    return c;
  };
  if (layout.tp > 1) g_tp = std::make_unique<MpiTpComm>(split(g_rank / layout.tp));
  if (layout.cp > 1) g_cp = std::make_unique<MpiCpComm>(split(g_rank % layout.tp));
#endif
}

model::TpComm* tp_comm() { return g_tp.get(); }
model::CpComm* cp_comm() { return g_cp.get(); }

runtime::StepLink* step_link() {
#ifdef KIVI_HAVE_MPI
  if (g_size > 1 && !g_link) {
    MPI_Comm c;
    MPI_Comm_dup(MPI_COMM_WORLD, &c);
    g_link = std::make_unique<MpiStepLink>(c);
  }
#endif
  return g_link.get();
}

void exit_on_error(const char* message, bool collective, int code) {
  if (g_rank == 0) {
    std::fprintf(stderr, "kivi: error: %s\n", message);
    std::fflush(stderr);
  }
  if (!g_started || collective) {
    finalize();
    std::exit(code);
  }
#ifdef KIVI_HAVE_MPI
  // An error this rank may meet alone: the others may be waiting for it in a collective.
  // Rank 0 ends the job at once; another rank leaves rank 0 two seconds to do so (when it
  // met the same error), then says what happened and ends the job itself. Errors every
  // rank meets at once go through agree() instead and never race.
  if (g_rank != 0) {
    sleep(2);
    dprintf(g_stderr, "kivi: error (rank %d): %s\n", g_rank, message);
  }
  MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::exit(code);
}

}  // namespace kivi::dist
