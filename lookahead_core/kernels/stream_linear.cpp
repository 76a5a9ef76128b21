// y = x W^T (+ b) for an x of a few rows, streaming W from memory once.
//
// A decode step of k tokens multiplies k activation rows by every weight matrix. On CPUs, BLAS
// (MKL's sgemm) runs a matrix-vector kernel for k <= 3 and from k = 4 on one that takes about
// twice as long: a 4-token forward then costs about two 1-token ones although the weights'
// memory traffic, not the arithmetic, bounds it.
//
// Built once per instruction set (lookahead_core/kernels/__init__.py passes the flags):
// * AVX-512 (__AVX512F__): each block of 4 weight rows is loaded once and multiplied with up to 6
//   input rows held in 24 accumulators, so k <= 6 streams W once (k = 7..12: twice).
// * AVX2 + FMA: each block of 2 weight rows is loaded from memory once (the next block prefetched
//   meanwhile) and multiplied with every input row, 6 at a time in 12 of the 16 registers; the
//   block stays in L1 between those groups, so W is streamed once for any number of rows.
//
// Every output is the same sum in the same order whatever the number of rows, the block or the
// thread it falls in (16- or 8-lane fused multiply-adds over the input features in order, then one
// horizontal add in a fixed order): a row's result does not depend on the rows beside it (batch
// invariance). The two builds sum in different orders: their results differ by float32 rounding.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#if defined(__AVX512F__)

namespace {

constexpr int kRowsPerPass = 6;    // input rows sharing one pass over W
constexpr int64_t kBlock = 4;      // weight rows per block

// Output rows [o, o + R) of x's K rows; R = 4 (a block) or 1 (the remainder).
template <int R, int K>
void block(const float* __restrict w, int64_t in, const float* __restrict x, float* __restrict y,
           int64_t out, int64_t o, const float* __restrict bias) {
  __m512 acc[R][K];
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < K; ++k) acc[r][k] = _mm512_setzero_ps();
  const float* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = w + (o + r) * in;
  for (int64_t i = 0; i < in; i += 16) {
    __m512 wv[R];
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(rows[r] + i + R * in), _MM_HINT_T0);
      wv[r] = _mm512_loadu_ps(rows[r] + i);
    }
#pragma GCC unroll 6
    for (int k = 0; k < K; ++k) {
      const __m512 xv = _mm512_loadu_ps(x + k * in + i);
      for (int r = 0; r < R; ++r) acc[r][k] = _mm512_fmadd_ps(wv[r], xv, acc[r][k]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < K; ++k)
      y[k * out + o + r] = _mm512_reduce_add_ps(acc[r][k]) + (bias ? bias[o + r] : 0.0f);
}

template <int K>
void pass(const float* w, int64_t in, int64_t out, const float* x, float* y, const float* bias) {
  const int64_t blocks = out / kBlock;
  at::parallel_for(0, blocks, 32, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) block<kBlock, K>(w, in, x, y, out, b * kBlock, bias);
  });
  for (int64_t o = blocks * kBlock; o < out; ++o) block<1, K>(w, in, x, y, out, o, bias);
}

}  // namespace

#elif defined(__AVX2__) && defined(__FMA__)

namespace {

constexpr int kRowsPerGroup = 6;   // input rows sharing one pass over a block (12 accumulators)
constexpr int64_t kBlock = 2;      // weight rows per block

// The fixed-order horizontal sum of one accumulator: lanes (i, i + 4), then (i, i + 2), then (0, 1).
inline float reduce(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Output rows [o, o + R) for x's K rows; meanwhile the next block's rows are prefetched, by every
// group (the first brings them from memory, the others find them cached).
template <int R, int K>
inline void group(const float* __restrict w, int64_t in, const float* __restrict x, float* __restrict y,
                  int64_t out, int64_t o, const float* __restrict bias) {
  __m256 acc[R][K];
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < K; ++k) acc[r][k] = _mm256_setzero_ps();
  const float* rows = w + o * in;
  for (int64_t i = 0; i < in; i += 8) {
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = _mm256_loadu_ps(rows + r * in + i);
    if ((i & 15) == 0)
      for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(rows + (R + r) * in + i), _MM_HINT_T0);
#pragma GCC unroll 6
    for (int k = 0; k < K; ++k) {
      const __m256 xv = _mm256_loadu_ps(x + k * in + i);
      for (int r = 0; r < R; ++r) acc[r][k] = _mm256_fmadd_ps(wv[r], xv, acc[r][k]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < K; ++k)
      y[k * out + o + r] = reduce(acc[r][k]) + (bias ? bias[o + r] : 0.0f);
}

// Output rows [o, o + R) for all m rows of x: groups of 6 rows, then the rest; the block stays in
// L1 between groups, so W is read from memory once whatever m.
template <int R>
void block(const float* w, int64_t in, const float* x, int64_t m, float* y, int64_t out, int64_t o, const float* bias) {
  int64_t k = 0;
  for (; k + kRowsPerGroup <= m; k += kRowsPerGroup)
    group<R, kRowsPerGroup>(w, in, x + k * in, y + k * out, out, o, bias);
  const float* xs = x + k * in;
  float* ys = y + k * out;
  switch (m - k) {
    case 1: group<R, 1>(w, in, xs, ys, out, o, bias); break;
    case 2: group<R, 2>(w, in, xs, ys, out, o, bias); break;
    case 3: group<R, 3>(w, in, xs, ys, out, o, bias); break;
    case 4: group<R, 4>(w, in, xs, ys, out, o, bias); break;
    case 5: group<R, 5>(w, in, xs, ys, out, o, bias); break;
    default: break;
  }
}

void product(const float* w, int64_t in, int64_t out, const float* x, int64_t m, float* y, const float* bias) {
  const int64_t blocks = out / kBlock;
  at::parallel_for(0, blocks, 64, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) block<kBlock>(w, in, x, m, y, out, b * kBlock, bias);
  });
  for (int64_t o = blocks * kBlock; o < out; ++o) block<1>(w, in, x, m, y, out, o, bias);
}

}  // namespace

#else
#error "stream_linear.cpp is built with -mavx512f or with -mavx2 -mfma"
#endif


torch::Tensor stream_linear(const torch::Tensor& x, const torch::Tensor& weight, const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "stream_linear: shapes ", x.sizes(), " and ", weight.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat, "stream_linear: float32 only");
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "stream_linear: CPU tensors only");
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous(), "stream_linear: contiguous tensors only");
  TORCH_CHECK(x.size(1) % 16 == 0, "stream_linear: in_features must be a multiple of 16, got ", x.size(1));
  const int64_t m = x.size(0), in = x.size(1), out = weight.size(0);
  const float* b = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == out, "stream_linear: bias");
    b = bias->data_ptr<float>();
  }
  auto y = torch::empty({m, out}, x.options());
  const float* w = weight.data_ptr<float>();
#if defined(__AVX512F__)
  for (int64_t done = 0; done < m; done += kRowsPerPass) {
    const float* xs = x.data_ptr<float>() + done * in;
    float* ys = y.data_ptr<float>() + done * out;
    switch (std::min<int64_t>(kRowsPerPass, m - done)) {
      case 1: pass<1>(w, in, out, xs, ys, b); break;
      case 2: pass<2>(w, in, out, xs, ys, b); break;
      case 3: pass<3>(w, in, out, xs, ys, b); break;
      case 4: pass<4>(w, in, out, xs, ys, b); break;
      case 5: pass<5>(w, in, out, xs, ys, b); break;
      default: pass<6>(w, in, out, xs, ys, b); break;
    }
  }
#else
  product(w, in, out, x.data_ptr<float>(), m, y.data_ptr<float>(), b);
#endif
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
#if defined(__AVX512F__)
  m.def("stream_linear", &stream_linear, "y = x W^T (+ b), W streamed once per 6 rows of x (AVX-512, float32)");
#else
  m.def("stream_linear", &stream_linear, "y = x W^T (+ b), W streamed once (AVX2 + FMA, float32)");
#endif
}
