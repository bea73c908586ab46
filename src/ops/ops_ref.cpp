// Scalar references for ops.h, accumulating in double. Written for clarity only.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/ops.h"
#include "quant/dequant.h"

namespace kivi::ops::ref {

void matvec(const Matrix& w, const float* x, float* y) {
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    quant::dequantize_row(w.dtype, w.row(r), row.data(), w.cols);
    double s = 0.0;
    for (int64_t c = 0; c < w.cols; ++c) s += static_cast<double>(row[c]) * x[c];
    y[r] = static_cast<float>(s);
  }
}

void rmsnorm(float* out, const float* x, const float* weight, int n, float eps) {
  double ss = 0.0;
  for (int i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const double inv = 1.0 / std::sqrt(ss / n + eps);
  for (int i = 0; i < n; ++i) out[i] = static_cast<float>(weight[i] * inv * x[i]);
}

void softmax(float* x, int n) {
  double mx = *std::max_element(x, x + n), sum = 0.0;
  for (int i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - mx);
  for (int i = 0; i < n; ++i) x[i] = static_cast<float>(std::exp(x[i] - mx) / sum);
}

double dot(const float* a, const float* b, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

}  // namespace kivi::ops::ref
