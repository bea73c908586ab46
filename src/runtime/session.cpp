#include "runtime/session.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace kivi::runtime {

Session::Session(const model::Model& m, const SessionOptions& opt) : m_(m), opt_(opt) {
  const auto& c = m.config();
  ctx_ = opt.ctx > 0 ? opt.ctx : c.ctx;
  if (ctx_ > c.ctx && !c.synthetic) {
    fail("--ctx %d is larger than the model's context length %d", ctx_, c.ctx);
  }
  const int threads = opt.pool ? opt.pool->size() : opt.threads > 0 ? opt.threads : hardware_threads();
  kv::CacheConfig cc = opt.cache;
  cc.n_layers = c.n_layers;
  cc.n_kv_heads = c.n_kv_heads;
  cc.head_dim = c.head_dim();
  cc.ctx = ctx_;
  cc.validate();
  opt_.cache = cc;
  if (opt.pool) {
    pool_ = opt.pool;
  } else {
    own_pool_ = std::make_unique<ThreadPool>(threads);
    pool_ = own_pool_.get();
  }
  // int8 with one scale per tensor fixes the scale from the first prefill: prefill the
  // whole prompt as one batch so the scale sees all of it.
  auto tensor_scaled = [](const kv::StreamFormat& f) {
    return f.format == kv::Format::kInt8 && f.granularity == kv::Int8Granularity::kTensor;
  };
  if (tensor_scaled(cc.k) || tensor_scaled(cc.v)) opt_.max_batch = std::max(opt_.max_batch, ctx_);
  cache_ = std::make_unique<kv::KvCache>(cc, opt.block_summaries);
  st_ = std::make_unique<model::ForwardState>(c, std::max(1, opt_.max_batch), ctx_, threads, cc.block());
  logits_.reset(static_cast<size_t>(c.vocab_size));
}

const float* Session::prefill(const std::vector<int>& tokens, float* all_logits) {
  const int n = static_cast<int>(tokens.size());
  if (n == 0) fail("prefill: no tokens");
  if (pos() + n > ctx_) {
    fail("prompt of %d tokens does not fit: %d already in the context of %d tokens", n, pos(), ctx_);
  }
  const int V = vocab();
  for (int i = 0; i < n; i += st_->max_batch) {
    const int b = std::min(st_->max_batch, n - i);
    if (all_logits) {
      model::forward(m_, *st_, *cache_, tokens.data() + i, b, all_logits + static_cast<size_t>(i) * V, true,
                     pool_, opt_.forward);
    } else {
      model::forward(m_, *st_, *cache_, tokens.data() + i, b, i + b == n ? logits_.data() : nullptr, false,
                     pool_, opt_.forward);
    }
  }
  if (all_logits) std::memcpy(logits_.data(), all_logits + static_cast<size_t>(n - 1) * V, V * sizeof(float));
  return logits_.data();
}

const float* Session::decode(int token) {
  if (pos() >= ctx_) fail("context full: %d tokens", ctx_);
  model::forward(m_, *st_, *cache_, &token, 1, logits_.data(), false, pool_, opt_.forward);
  return logits_.data();
}

void Session::reset() { cache_->clear(); }

uint64_t session_bytes(const model::ModelConfig& c, const kv::CacheConfig& cache, int ctx, int max_batch) {
  kv::CacheConfig cc = cache;
  cc.n_layers = c.n_layers;
  cc.n_kv_heads = c.n_kv_heads;
  cc.head_dim = c.head_dim();
  cc.ctx = ctx;
  const bool tensor_scaled = (cc.k.format == kv::Format::kInt8 && cc.k.granularity == kv::Int8Granularity::kTensor) ||
                             (cc.v.format == kv::Format::kInt8 && cc.v.granularity == kv::Int8Granularity::kTensor);
  const uint64_t b = static_cast<uint64_t>(std::max(1, tensor_scaled ? std::max(max_batch, ctx) : max_batch));
  const uint64_t activations = b * (6ull * c.dim + 2ull * c.kv_dim() + 2ull * c.hidden_dim) * sizeof(float);
  const uint64_t rope = static_cast<uint64_t>(ctx) * c.head_dim() * sizeof(float);
  return kv::expected_bytes_reserved(cc) + activations + rope + static_cast<uint64_t>(c.vocab_size) * sizeof(float);
}

}  // namespace kivi::runtime
