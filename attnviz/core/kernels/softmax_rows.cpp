// attnviz's fused softmax for the attention core's no-gradient path (see attnviz/core/kernel.py).
//
// One block of raw scores Q·Kᵀ [b, h, r, c] becomes its pattern in place: per row,
//   s = raw·scaling (+ mask);  pattern = exp(s − max s) / Σ exp(s − max s)
// in three passes over a row that stays in the L1 cache, instead of the five separate passes over the
// whole block that torch makes (scale, mask, and softmax's three). While the exponentials are at hand it
// can also reduce each row to a summary the statistics need (max weight, entropy, mean |i − j|), so those
// cost no further pass over the block. The pattern does not depend on whether the summary is asked for.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

// exp(x) for float, vectorisable: Cody-Waite range reduction and a degree-6 polynomial (< 2 ulp).
// Below -86.5 it returns exactly 0: masked keys get weight 0, and no result is ever subnormal
// (exp(-86.5) ≈ 2.6e-38; a subnormal product would cost a microcode assist per element).
static inline float exp_approx(float x) {
  const float hi = 88.0f, lo = -86.5f;
  float clamped = x > hi ? hi : x;
  clamped = clamped < lo ? lo : clamped;
  float n = std::nearbyint(clamped * 1.44269504088896341f);
  float r = std::fma(-n, 0.693359375f, clamped);
  r = std::fma(-n, -2.12194440e-4f, r);
  float p = 1.9875691500E-4f;
  p = std::fma(p, r, 1.3981999507E-3f);
  p = std::fma(p, r, 8.3334519073E-3f);
  p = std::fma(p, r, 4.1665795894E-2f);
  p = std::fma(p, r, 1.6666665459E-1f);
  p = std::fma(p, r, 5.0000001201E-1f);
  p = std::fma(p, r * r, r + 1.0f);
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  float result = p * scale;
  return x < lo ? 0.0f : result;
}

// One row: s = raw·scale (+ mask), then the softmax of s in place; optionally its summary.
// Templated so that the inner loops have no branches and vectorise.
template <bool HasMask, bool Summarise>
static inline void softmax_row(float* x, const float* mrow, int64_t width, float scale, float query,
                               float* max_weight, float* entropy, float* distance) {
  constexpr int64_t L = 16;  // lanes: partial maxima and sums kept apart, as vector registers would
  const int64_t body = width - width % L;
  float top_lane[L];
  for (int64_t l = 0; l < L; ++l) top_lane[l] = -std::numeric_limits<float>::infinity();
  for (int64_t j0 = 0; j0 < body; j0 += L) {
    for (int64_t l = 0; l < L; ++l) {
      float s = x[j0 + l] * scale;
      if (HasMask) s = s + mrow[j0 + l];
      x[j0 + l] = s;
      top_lane[l] = s > top_lane[l] ? s : top_lane[l];
    }
  }
  for (int64_t j = body; j < width; ++j) {
    float s = x[j] * scale;
    if (HasMask) s = s + mrow[j];
    x[j] = s;
    top_lane[0] = s > top_lane[0] ? s : top_lane[0];
  }
  float top = top_lane[0];
  for (int64_t l = 1; l < L; ++l) top = top_lane[l] > top ? top_lane[l] : top;

  float total_lane[L] = {0}, shift_lane[L] = {0}, distance_lane[L] = {0};
  for (int64_t j0 = 0; j0 < body; j0 += L) {
    for (int64_t l = 0; l < L; ++l) {
      float shifted = x[j0 + l] - top;
      float e = exp_approx(shifted);
      x[j0 + l] = e;
      total_lane[l] += e;
      if (Summarise) {
        shift_lane[l] += e > 0.0f ? e * shifted : 0.0f;
        distance_lane[l] += e * std::fabs(query - static_cast<float>(j0 + l));
      }
    }
  }
  for (int64_t j = body; j < width; ++j) {
    float shifted = x[j] - top;
    float e = exp_approx(shifted);
    x[j] = e;
    total_lane[0] += e;
    if (Summarise) {
      shift_lane[0] += e > 0.0f ? e * shifted : 0.0f;
      distance_lane[0] += e * std::fabs(query - static_cast<float>(j));
    }
  }
  float total = 0.0f;
  double shift = 0.0, dist = 0.0;
  for (int64_t l = 0; l < L; ++l) {
    total += total_lane[l];
    shift += shift_lane[l];
    dist += distance_lane[l];
  }
  const float inverse = 1.0f / total;
  for (int64_t j = 0; j < width; ++j) x[j] *= inverse;
  if (Summarise) {
    float h = static_cast<float>(std::log(static_cast<double>(total)) - shift / total);
    *max_weight = inverse;
    *entropy = h > 0.0f ? h : 0.0f;
    *distance = static_cast<float>(dist / total);
  }
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

// exp_approx on 8 lanes, the same operations in the same order (so the same numbers).
static inline __m256 exp_approx8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-86.5f), hi = _mm256_set1_ps(88.0f);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  __m256 c = _mm256_min_ps(hi, _mm256_max_ps(lo, x));  // NaN stays NaN (the second operand wins)
  __m256 n = _mm256_round_ps(_mm256_mul_ps(c, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), c);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500E-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}

static inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

static inline float horizontal_max(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

template <bool HasMask, bool Summarise>
static inline void softmax_row_avx2(float* x, const float* mrow, int64_t width, float scale, float query,
                                    float* max_weight, float* entropy, float* distance) {
  const int64_t body = width - width % 8;
  const __m256 scale8 = _mm256_set1_ps(scale);
  __m256 top8 = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < body; j += 8) {
    __m256 s = _mm256_mul_ps(_mm256_loadu_ps(x + j), scale8);
    if (HasMask) s = _mm256_add_ps(s, _mm256_loadu_ps(mrow + j));
    _mm256_storeu_ps(x + j, s);
    top8 = _mm256_max_ps(top8, s);
  }
  float top = horizontal_max(top8);
  for (int64_t j = body; j < width; ++j) {
    float s = x[j] * scale;
    if (HasMask) s = s + mrow[j];
    x[j] = s;
    top = s > top ? s : top;
  }
  const __m256 top_v = _mm256_set1_ps(top), zero = _mm256_setzero_ps();
  const __m256 sign = _mm256_set1_ps(-0.0f), query8 = _mm256_set1_ps(query), eight = _mm256_set1_ps(8.0f);
  __m256 total8 = zero, shift8 = zero, distance8 = zero;
  __m256 column = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t j = 0; j < body; j += 8) {
    __m256 shifted = _mm256_sub_ps(_mm256_loadu_ps(x + j), top_v);
    __m256 e = exp_approx8(shifted);
    _mm256_storeu_ps(x + j, e);
    total8 = _mm256_add_ps(total8, e);
    if (Summarise) {
      __m256 positive = _mm256_cmp_ps(e, zero, _CMP_GT_OQ);
      shift8 = _mm256_add_ps(shift8, _mm256_and_ps(positive, _mm256_mul_ps(e, shifted)));
      __m256 gap = _mm256_andnot_ps(sign, _mm256_sub_ps(query8, column));  // |i - j|
      distance8 = _mm256_fmadd_ps(e, gap, distance8);
      column = _mm256_add_ps(column, eight);
    }
  }
  float total = horizontal_sum(total8), shift = horizontal_sum(shift8), dist = horizontal_sum(distance8);
  for (int64_t j = body; j < width; ++j) {
    float shifted = x[j] - top;
    float e = exp_approx(shifted);
    x[j] = e;
    total += e;
    if (Summarise) {
      shift += e > 0.0f ? e * shifted : 0.0f;
      dist = std::fma(e, std::fabs(query - static_cast<float>(j)), dist);
    }
  }
  const float inverse = 1.0f / total;
  const __m256 inverse8 = _mm256_set1_ps(inverse);
  for (int64_t j = 0; j < body; j += 8) _mm256_storeu_ps(x + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), inverse8));
  for (int64_t j = body; j < width; ++j) x[j] *= inverse;
  if (Summarise) {
    float h = std::log(total) - shift * inverse;
    *max_weight = inverse;
    *entropy = h > 0.0f ? h : 0.0f;
    *distance = dist * inverse;
  }
}
#define softmax_row softmax_row_avx2
#if defined(__AVX512F__)
// The AVX2 routine on 16 lanes, the same operations in the same order.
static inline __m512 exp_approx16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-86.5f), hi = _mm512_set1_ps(88.0f);
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  __m512 c = _mm512_min_ps(hi, _mm512_max_ps(lo, x));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(c, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), c);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500E-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~underflow), _mm512_mul_ps(p, _mm512_castsi512_ps(bits)));
}

template <bool HasMask, bool Summarise>
static inline void softmax_row_avx512(float* x, const float* mrow, int64_t width, float scale, float query,
                                      float* max_weight, float* entropy, float* distance) {
  const int64_t body = width - width % 16;
  const __m512 scale16 = _mm512_set1_ps(scale);
  __m512 top16 = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < body; j += 16) {
    __m512 s = _mm512_mul_ps(_mm512_loadu_ps(x + j), scale16);
    if (HasMask) s = _mm512_add_ps(s, _mm512_loadu_ps(mrow + j));
    _mm512_storeu_ps(x + j, s);
    top16 = _mm512_max_ps(top16, s);
  }
  float top = _mm512_reduce_max_ps(top16);
  for (int64_t j = body; j < width; ++j) {
    float s = x[j] * scale;
    if (HasMask) s = s + mrow[j];
    x[j] = s;
    top = s > top ? s : top;
  }
  const __m512 top_v = _mm512_set1_ps(top), zero = _mm512_setzero_ps();
  const __m512 query16 = _mm512_set1_ps(query), sixteen = _mm512_set1_ps(16.0f);
  __m512 total16 = zero, shift16 = zero, distance16 = zero;
  __m512 column = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t j = 0; j < body; j += 16) {
    __m512 shifted = _mm512_sub_ps(_mm512_loadu_ps(x + j), top_v);
    __m512 e = exp_approx16(shifted);
    _mm512_storeu_ps(x + j, e);
    total16 = _mm512_add_ps(total16, e);
    if (Summarise) {
      const __mmask16 positive = _mm512_cmp_ps_mask(e, zero, _CMP_GT_OQ);
      shift16 = _mm512_add_ps(shift16, _mm512_maskz_mul_ps(positive, e, shifted));
      distance16 = _mm512_fmadd_ps(e, _mm512_abs_ps(_mm512_sub_ps(query16, column)), distance16);
      column = _mm512_add_ps(column, sixteen);
    }
  }
  float total = _mm512_reduce_add_ps(total16), shift = _mm512_reduce_add_ps(shift16);
  float dist = _mm512_reduce_add_ps(distance16);
  for (int64_t j = body; j < width; ++j) {
    float shifted = x[j] - top;
    float e = exp_approx(shifted);
    x[j] = e;
    total += e;
    if (Summarise) {
      shift += e > 0.0f ? e * shifted : 0.0f;
      dist = std::fma(e, std::fabs(query - static_cast<float>(j)), dist);
    }
  }
  const float inverse = 1.0f / total;
  const __m512 inverse16 = _mm512_set1_ps(inverse);
  for (int64_t j = 0; j < body; j += 16) _mm512_storeu_ps(x + j, _mm512_mul_ps(_mm512_loadu_ps(x + j), inverse16));
  for (int64_t j = body; j < width; ++j) x[j] *= inverse;
  if (Summarise) {
    float h = std::log(total) - shift * inverse;
    *max_weight = inverse;
    *entropy = h > 0.0f ? h : 0.0f;
    *distance = dist * inverse;
  }
}
#undef softmax_row
#define softmax_row softmax_row_avx512
#endif
#endif

// Softmax of scaled, masked scores, row by row, in place, with optional per-row summaries.
// scores:  float32 [b, h, r, c] contiguous: raw Q·Kᵀ, overwritten with the pattern.
// mask:    float32 [b|1, h|1, r|1, >=c] additive (last dim stride 1), or None.
// summary: float32 [3, b, h, r] (max weight, entropy in nats, mean |i - j|) or an empty tensor.
void softmax_rows_(at::Tensor scores, c10::optional<at::Tensor> mask_opt, double scaling, int64_t query_start,
                   at::Tensor summary) {
  TORCH_CHECK(scores.scalar_type() == at::kFloat && scores.is_contiguous() && scores.dim() == 4);
  const int64_t batch = scores.size(0), heads = scores.size(1), rows = scores.size(2), width = scores.size(3);
  float* data = scores.data_ptr<float>();
  const float* mask = nullptr;
  int64_t mask_b = 0, mask_h = 0, mask_r = 0;
  if (mask_opt.has_value() && mask_opt->defined()) {
    const at::Tensor& m = *mask_opt;
    TORCH_CHECK(m.scalar_type() == at::kFloat && m.dim() == 4 && m.stride(3) == 1 && m.size(3) >= width);
    mask = m.data_ptr<float>();
    mask_b = m.size(0) == 1 ? 0 : m.stride(0);
    mask_h = m.size(1) == 1 ? 0 : m.stride(1);
    mask_r = m.size(2) == 1 ? 0 : m.stride(2);
  }
  const bool summarise = summary.numel() > 0;
  TORCH_CHECK(!summarise || (summary.scalar_type() == at::kFloat && summary.is_contiguous() &&
                             summary.numel() == 3 * batch * heads * rows));
  float* out = summarise ? summary.data_ptr<float>() : nullptr;
  const int64_t total = batch * heads * rows;
  const float scale = static_cast<float>(scaling);
  at::parallel_for(0, total, 8, [&](int64_t begin, int64_t end) {
    float unused[3];
    for (int64_t row = begin; row < end; ++row) {
      const int64_t q = row % rows, bh = row / rows, hd = bh % heads, bt = bh / heads;
      float* x = data + row * width;
      const float* mrow = mask ? mask + bt * mask_b + hd * mask_h + q * mask_r : nullptr;
      const float query = static_cast<float>(query_start + q);
      float* mw = summarise ? out + row : unused;
      float* en = summarise ? out + total + row : unused + 1;
      float* di = summarise ? out + 2 * total + row : unused + 2;
      if (mrow && summarise) softmax_row<true, true>(x, mrow, width, scale, query, mw, en, di);
      else if (mrow) softmax_row<true, false>(x, mrow, width, scale, query, mw, en, di);
      else if (summarise) softmax_row<false, true>(x, mrow, width, scale, query, mw, en, di);
      else softmax_row<false, false>(x, mrow, width, scale, query, mw, en, di);
    }
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("softmax_rows_", &softmax_rows_); }
