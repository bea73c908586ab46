#include "model/tensor_parallel.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.h"
#include "ops/ops.h"

namespace kivi::model {

namespace {

// Rows [r0, r1) of a matrix, in place.
ops::Matrix row_slice(const ops::Matrix& w, int64_t r0, int64_t r1) {
  return ops::Matrix{w.row(r0), w.dtype, r1 - r0, w.cols};
}

// Drops the pages wholly inside [p, p + bytes) from this process's map of the file (the
// page cache keeps them): the columns copied out of a matrix leave the rest untouched.
void release_pages(const void* p, size_t bytes) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes) / page * page;
  if (e > b) madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
}

// Columns [c0, c1) of every row, copied into `buf`.
ops::Matrix column_slice(const ops::Matrix& w, int64_t c0, int64_t c1, const char* name, int layer,
                         AlignedBuffer<uint8_t>& buf) {
  const quant::TypeInfo& ti = quant::info(w.dtype);
  if (c0 % ti.block != 0 || c1 % ti.block != 0) {
    fail(
        "tensor parallelism: blk.%d.%s (%s) stores %d values per block, so a slice of its "
        "columns must start on a multiple of %d; this split gives columns %lld to %lld (use fewer "
        "ranks, or a model quantized with smaller blocks)",
        layer, name, ti.name, ti.block, ti.block, static_cast<long long>(c0),
        static_cast<long long>(c1));
  }
  const size_t off = quant::row_bytes(w.dtype, static_cast<uint64_t>(c0));
  const size_t len = quant::row_bytes(w.dtype, static_cast<uint64_t>(c1 - c0));
  buf.reset(len * static_cast<size_t>(w.rows), false);
  for (int64_t r = 0; r < w.rows; ++r)
    std::memcpy(buf.data() + static_cast<size_t>(r) * len, w.row(r) + off, len);
  release_pages(w.data, w.bytes());
  return ops::Matrix{buf.data(), w.dtype, w.rows, c1 - c0};
}

template <typename T>
std::vector<T> sub(const std::vector<T>& v, size_t b, size_t n) {
  if (v.empty()) return v;
  return std::vector<T>(v.begin() + static_cast<ptrdiff_t>(b),
                        v.begin() + static_cast<ptrdiff_t>(b + n));
}

// Boundary r of `total` split `size` ways on multiples of `align`.
int64_t split_point(int64_t total, int r, int size, int64_t align) {
  if (r >= size) return total;
  const int64_t units = total / align;
  return units * r / size * align;
}

}  // namespace

void shard_tensor_parallel(Model& m, TpComm* comm) {
  const int N = comm ? comm->size() : 1, r = comm ? comm->rank() : 0;
  if (N <= 1) return;
  ModelConfig& c = m.cfg_;
  if (c.tp.size > 1) fail("tensor parallelism: the model is split already");
  const int hd = c.head_dim();
  if (c.n_kv_heads % N != 0) {
    std::string fits;
    for (int k = 2; k <= c.n_kv_heads; ++k)
      if (c.n_kv_heads % k == 0) fits += (fits.empty() ? "" : ", ") + std::to_string(k);
    fail(
        "--dist tp=%d: the model has %d KV heads, and tensor parallelism gives each rank the same "
        "number of them (rank counts that divide %d: %s)",
        N, c.n_kv_heads, c.n_kv_heads, fits.empty() ? "none" : fits.c_str());
  }
  const int kvh = c.n_kv_heads / N, qh = c.n_heads / N;
  // FFN channels split on the largest block of any w_down (their columns).
  int64_t align = 1;
  for (const auto& L : m.w_.layers) {
    if (L.w_down.data) align = std::max<int64_t>(align, quant::info(L.w_down.dtype).block);
    for (const auto& d : L.down_exps) align = std::max<int64_t>(align, quant::info(d.dtype).block);
  }
  const int64_t f0 = split_point(c.hidden_dim, r, N, align),
                f1 = split_point(c.hidden_dim, r + 1, N, align);
  for (int k = 0; k < N; ++k) {
    if (split_point(c.hidden_dim, k + 1, N, align) <= split_point(c.hidden_dim, k, N, align)) {
      fail(
          "--dist tp=%d: the FFN width %d in blocks of %lld values leaves rank %d no channels (use "
          "fewer ranks)",
          N, c.hidden_dim, static_cast<long long>(align), k);
    }
  }
  TpSlice& t = c.tp;
  t.rank = r;
  t.size = N;
  t.head0 = r * qh;
  t.n_heads_total = c.n_heads;
  t.kv_head0 = r * kvh;
  t.n_kv_heads_total = c.n_kv_heads;
  t.ffn0 = static_cast<int>(f0);
  t.hidden_total = c.hidden_dim;
  t.vocab_counts.resize(N);
  for (int k = 0; k < N; ++k) {
    t.vocab_counts[k] = static_cast<int>(split_point(c.vocab_size, k + 1, N, 1) -
                                         split_point(c.vocab_size, k, N, 1));
  }
  t.vocab0 = static_cast<int>(split_point(c.vocab_size, r, N, 1));
  t.vocab1 = static_cast<int>(split_point(c.vocab_size, r + 1, N, 1));

  const int64_t q0 = static_cast<int64_t>(t.head0) * hd, qn = static_cast<int64_t>(qh) * hd;
  const int64_t k0 = static_cast<int64_t>(t.kv_head0) * hd, kn = static_cast<int64_t>(kvh) * hd;
  // Copied column slices: each layer's wo and w_down, then its experts' down projections.
  const size_t E = static_cast<size_t>(c.n_experts);
  m.owned_.resize((2 + E) * m.w_.layers.size());
  for (size_t l = 0; l < m.w_.layers.size(); ++l) {
    LayerWeights& L = m.w_.layers[l];
    const int li = static_cast<int>(l);
    L.wq = row_slice(L.wq, q0, q0 + qn);
    L.wk = row_slice(L.wk, k0, k0 + kn);
    L.wv = row_slice(L.wv, k0, k0 + kn);
    L.bq = sub(L.bq, q0, qn);
    L.bk = sub(L.bk, k0, kn);
    L.bv = sub(L.bv, k0, kn);
    L.wo = column_slice(L.wo, q0, q0 + qn, "attn_output", li, m.owned_[2 * l]);
    L.sinks = sub(L.sinks, static_cast<size_t>(t.head0), static_cast<size_t>(qh));
    if (E > 0) {
      // The experts' gate and up biases follow their channels; the down projection's
      // bias is whole (rank 0 adds it, model/ffn.cpp).
      const size_t H = static_cast<size_t>(c.hidden_dim), n = static_cast<size_t>(f1 - f0);
      for (std::vector<float>* b : {&L.gate_exps_bias, &L.up_exps_bias}) {
        if (b->empty()) continue;
        std::vector<float> s(E * n);
        for (size_t e = 0; e < E; ++e)
          std::copy_n(b->begin() + static_cast<ptrdiff_t>(e * H + f0), n, s.begin() + e * n);
        *b = std::move(s);
      }
      // Every expert keeps its channels [f0, f1) on this rank; the router stays whole, so
      // every rank picks the same experts, and the partial sums of their down projections
      // add up over the ranks as a dense FFN's do.
      for (size_t e = 0; e < E; ++e) {
        L.gate_exps[e] = row_slice(L.gate_exps[e], f0, f1);
        L.up_exps[e] = row_slice(L.up_exps[e], f0, f1);
        L.down_exps[e] = column_slice(L.down_exps[e], f0, f1, "ffn_down_exps", li,
                                      m.owned_[2 * m.w_.layers.size() + l * E + e]);
      }
      continue;
    }
    L.w_gate = row_slice(L.w_gate, f0, f1);
    L.w_up = row_slice(L.w_up, f0, f1);
    L.w_down = column_slice(L.w_down, f0, f1, "ffn_down", li, m.owned_[2 * l + 1]);
  }
  m.w_.output = row_slice(m.w_.output, t.vocab0, t.vocab1);
  // head_dim() stays the whole model's: dim / n_heads no longer gives it.
  c.key_length = hd;
  c.n_heads = qh;
  c.n_kv_heads = kvh;
  c.hidden_dim = static_cast<int>(f1 - f0);
  m.tp_comm_ = comm;
}

void tp_reduce(const Model& m, float* x, size_t n) {
  if (m.tp_comm()) m.tp_comm()->sum(x, n);
}

float tp_max(const Model& m, float local_max) {
  return m.tp_comm() ? m.tp_comm()->max(local_max) : local_max;
}

void classify(const Model& m, const float* x, int n, float* logits, ThreadPool* pool) {
  const ops::Matrix& out = m.weights().output;
  TpComm* comm = m.tp_comm();
  const float cap = m.config().final_softcap;
  if (!comm) {
    ops::matmul(out, x, n, logits, pool);
    if (cap > 0.0f) ops::softcap(logits, static_cast<size_t>(n) * m.config().vocab_size, cap);
    return;
  }
  // Each rank's rows for all n tokens ([n, rows_r] blocks in rank order), then
  // reordered into [n, vocab].
  const TpSlice& t = m.config().tp;
  const int V = m.config().vocab_size, mine = t.vocab1 - t.vocab0;
  // Scratch that grows to the largest batch and is then reused: decoding allocates nothing.
  thread_local std::vector<float> part, all;
  thread_local std::vector<int> counts;
  part.resize(static_cast<size_t>(n) * mine);
  ops::matmul(out, x, n, part.data(), pool);
  counts.resize(t.vocab_counts.size());
  for (size_t k = 0; k < counts.size(); ++k) counts[k] = t.vocab_counts[k] * n;
  all.resize(static_cast<size_t>(n) * V);
  comm->gather(part.data(), counts, all.data());
  size_t off = 0;
  int v0 = 0;
  for (size_t k = 0; k < counts.size(); ++k) {
    const int rows = t.vocab_counts[k];
    for (int i = 0; i < n; ++i) {
      std::memcpy(logits + static_cast<size_t>(i) * V + v0,
                  all.data() + off + static_cast<size_t>(i) * rows, rows * sizeof(float));
    }
    off += static_cast<size_t>(n) * rows;
    v0 += rows;
  }
  if (cap > 0.0f) ops::softcap(logits, static_cast<size_t>(n) * V, cap);
}

}  // namespace kivi::model
