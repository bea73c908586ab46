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
  const int threads = opt.threads > 0 ? opt.threads : hardware_threads();
  kv::CacheConfig cc = opt.cache;
  cc.n_layers = c.n_layers;
  cc.n_kv_heads = c.n_kv_heads;
  cc.head_dim = c.head_dim();
  cc.ctx = ctx_;
  cc.validate();
  opt_.cache = cc;
  pool_ = std::make_unique<ThreadPool>(threads);
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
                     pool_.get(), opt_.forward);
    } else {
      model::forward(m_, *st_, *cache_, tokens.data() + i, b, i + b == n ? logits_.data() : nullptr, false,
                     pool_.get(), opt_.forward);
    }
  }
  if (all_logits) std::memcpy(logits_.data(), all_logits + static_cast<size_t>(n - 1) * V, V * sizeof(float));
  return logits_.data();
}

const float* Session::decode(int token) {
  if (pos() >= ctx_) fail("context full: %d tokens", ctx_);
  model::forward(m_, *st_, *cache_, &token, 1, logits_.data(), false, pool_.get(), opt_.forward);
  return logits_.data();
}

void Session::reset() { cache_->clear(); }

}  // namespace kivi::runtime
