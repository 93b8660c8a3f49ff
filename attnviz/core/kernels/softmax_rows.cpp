// attnviz's fused softmax for the attention core's no-gradient path (see attnviz/core/kernel.py).
//
// One block of raw scores Q·Kᵀ [b, h, r, c] becomes its pattern in place: per row,
//   s = raw·scaling (+ mask);  pattern = exp(s − max s) · (1 / Σ exp(s − max s))
// in three passes over a row that stays in the L1 cache, instead of the five separate passes over the
// whole block that torch makes (scale, mask, and softmax's three). While the exponentials are at hand it
// can also reduce each row to a summary the statistics need (max weight, entropy, mean |i − j|, the weights
// on the keys nearest the query), so those cost no further pass over the block. The pattern does not
// depend on whether the summary is asked for.
//
// The numbers are torch's own: the same exp (SLEEF's expf_u10, which torch's CPU softmax calls), the same
// lanes (16 with AVX-512, 8 with AVX2), Σ exp added lane-wise in column order with the last partial vector
// added into the first lanes, then the lanes halved pairwise, and a multiplication by 1/Σ. So a pattern is
// bit for bit torch.softmax of the same scores (tested), and a forward pass through the kernel drifts from
// transformers' eager attention no more than one through torch's operations.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <immintrin.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

// Built with -mavx2 -mfma (and -mavx512f where the CPU has it): attnviz.core.kernel only builds it there.

// One routine per row, written once over a "lanes" type: Lanes8 (AVX2) or Lanes16 (AVX-512); Lanes1
// handles the scale-and-max of a row's last width % lanes elements (a max does not depend on order).
struct Lanes1 {
  using V = float;
  static constexpr int64_t width = 1;
  static V load(const float* p) { return *p; }
  static void store(float* p, V v) { *p = v; }
  static V set(float v) { return v; }
  static V add(V a, V b) { return a + b; }
  static V mul(V a, V b) { return a * b; }
  static V max(V a, V b) { return a > b ? a : b; }
};

// The operations both vector widths spell alike but for the intrinsics' prefix (_mm256, _mm512) and integer suffix
// (si256, si512): V and I the float and int32 vectors of W lanes; 2^q puts q + 127 into the exponent bits.
#define ATTNVIZ_LANE_OPS(PREFIX, SUFFIX, W)                                                                             \
  using V = __m##W;                                                                                                     \
  using I = __m##W##i;                                                                                                  \
  static V load(const float* p) { return PREFIX##_loadu_ps(p); }                                                        \
  static void store(float* p, V v) { PREFIX##_storeu_ps(p, v); }                                                        \
  static V set(float v) { return PREFIX##_set1_ps(v); }                                                                 \
  static V add(V a, V b) { return PREFIX##_add_ps(a, b); }                                                              \
  static V sub(V a, V b) { return PREFIX##_sub_ps(a, b); }                                                              \
  static V mul(V a, V b) { return PREFIX##_mul_ps(a, b); }                                                              \
  static V fmadd(V a, V b, V c) { return PREFIX##_fmadd_ps(a, b, c); }                                                  \
  static V max(V a, V b) { return PREFIX##_max_ps(a, b); }                                                              \
  static I round_to_int(V x) { return PREFIX##_cvtps_epi32(x); }                                                        \
  static V to_float(I q) { return PREFIX##_cvtepi32_ps(q); }                                                            \
  static V power_of_two(I q) {                                                                                          \
    return PREFIX##_cast##SUFFIX##_ps(PREFIX##_slli_epi32(PREFIX##_add_epi32(q, PREFIX##_set1_epi32(127)), 23));        \
  }

struct Lanes8 {
  ATTNVIZ_LANE_OPS(_mm256, si256, 256)
  static constexpr int64_t width = 8;
  static V abs(V x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x); }
  static V zero_below(V x, V value, V lo) { return _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), value); }
  static V iota() { return _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7); }
  static float sum(V v) {  // lanes halved pairwise: (0..3 + 4..7), then (0,1 + 2,3), then 0 + 1, as torch does
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
  }
  static float largest(V v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_shuffle_ps(s, s, 1)));
  }
};

#if defined(__AVX512F__)
struct Lanes16 {
  ATTNVIZ_LANE_OPS(_mm512, si512, 512)
  static constexpr int64_t width = 16;
  static V abs(V x) { return _mm512_abs_ps(x); }
  static V zero_below(V x, V value, V lo) {
    return _mm512_maskz_mov_ps(static_cast<__mmask16>(~_mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ)), value);
  }
  static V iota() { return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }
  static float sum(V v) { return _mm512_reduce_add_ps(v); }  // halved pairwise (16 → 8 → 4 → 2 → 1), as torch
  static float largest(V v) { return _mm512_reduce_max_ps(v); }
};
using Wide = Lanes16;
#else
using Wide = Lanes8;
#endif
#undef ATTNVIZ_LANE_OPS

// exp(d) for -86.5 ≤ d ≤ 0 exactly as SLEEF's expf_u10 computes it (the function torch's CPU softmax calls;
// written out here so that it inlines): d = q·ln 2 + s, a degree-6 polynomial in s, times 2^q. SLEEF multiplies by
// 2^q in two steps so that any q works; here q ≥ −125, where one exact multiplication by a normal 2^q gives the
// same bits. Tested bit for bit against torch.softmax.
template <class T>
static inline typename T::V sleef_exp(typename T::V d) {
  const auto q = T::round_to_int(T::mul(d, T::set(1.442695040888963407359924681001892137426645954152985934135449406931f)));
  const auto qf = T::to_float(q);
  auto s = T::fmadd(qf, T::set(-0.693145751953125f), d);
  s = T::fmadd(qf, T::set(-1.428606765330187045e-06f), s);
  auto u = T::set(0.000198527617612853646278381f);
  u = T::fmadd(u, s, T::set(0.00139304355252534151077271f));
  u = T::fmadd(u, s, T::set(0.00833336077630519866943359f));
  u = T::fmadd(u, s, T::set(0.0416664853692054748535156f));
  u = T::fmadd(u, s, T::set(0.166666671633720397949219f));
  u = T::fmadd(u, s, T::set(0.5f));
  u = T::add(T::set(1.0f), T::fmadd(T::mul(s, s), u, s));
  return T::mul(u, T::power_of_two(q));
}

// exp(x) for x ≤ 0 as torch's softmax computes it, except that below -86.5 it returns exactly 0 (torch: at
// most 2.6e-38, which does not change a sum that holds a 1): masked keys get weight 0, and no result is ever
// subnormal (a subnormal costs a microcode assist per element). `clamped` receives max(x, −86.5): finite where x
// is −∞, and x wherever the result is not 0, so e·clamped is e·x without 0·(−∞).
template <class T>
static inline typename T::V guarded_exp(typename T::V x, typename T::V& clamped) {
  const auto lo = T::set(-86.5f);
  clamped = T::max(x, lo);
  return T::zero_below(x, sleef_exp<T>(clamped), lo);
}

// Pass 1 over elements [begin, end) of a row in steps of T::width: scale, mask, running max.
template <class T, bool HasMask>
static inline typename T::V scale_and_max(float* x, const float* mrow, int64_t begin, int64_t end, float scale,
                                          typename T::V top) {
  for (int64_t j = begin; j < end; j += T::width) {
    auto s = T::mul(T::load(x + j), T::set(scale));
    if (HasMask) s = T::add(s, T::load(mrow + j));
    T::store(x + j, s);
    top = T::max(top, s);
  }
  return top;
}

// Pass 1 over a whole row of `width` scores, in place: its full vectors, then its last width % lanes elements one by
// one; returns the row's largest scaled score.
template <bool HasMask>
static inline float scaled_max(float* x, const float* mrow, int64_t width, float scale) {
  const int64_t body = width - width % Wide::width;
  const float top = Wide::largest(
      scale_and_max<Wide, HasMask>(x, mrow, 0, body, scale, Wide::set(-std::numeric_limits<float>::infinity())));
  return scale_and_max<Lanes1, HasMask>(x, mrow, body, width, scale, top);
}

// Pass 2 over a row: e = exp(s − max) in place and Σ e; for the summary also Σ e·(s − max) and Σ e·|i − j|,
// in float lanes over chunks of CHUNK vectors, then in double (a distance sum reaches ~10³ per lane, where
// float32 accumulation over a 2048-key row would be off by ~10⁻⁵ relative, a bias that survives averaging).
// Σ e is added in the same order whether or not the summary is asked for: the pattern does not change.
struct RowSums {
  float total = 0.0f;
  double shift = 0.0, distance = 0.0, weighted = 0.0;
};
constexpr int64_t CHUNK = 16;

// `first_column`: the position of x[0] among the keys (a tile of keys starts later than key 0). With `Weigh`,
// also Σ e·w over the row's per-key quantities `w` (attend_rows_'s weighted sums, in the same pass).
template <bool Summarise, bool Weigh = false>
static inline RowSums exponentiate(float* x, int64_t width, float top, float query, float first_column = 0.0f,
                                   const float* w = nullptr) {
  using T = Wide;
  using V = T::V;
  const int64_t body = width - width % T::width;
  V total = T::set(0.0f), shift = T::set(0.0f), distance = T::set(0.0f), weighted = T::set(0.0f);
  V query_minus_key = T::sub(T::set(query - first_column), T::iota());  // i − j of each lane (exact integers)
  RowSums sums;
  auto step = [&](V s, V weights) -> V {  // one vector of scaled scores -> its exponentials, added to the sums
    V shifted;
    const V e = guarded_exp<T>(T::sub(s, T::set(top)), shifted);
    total = T::add(total, e);
    if (Summarise) {
      shift = T::fmadd(e, shifted, shift);
      distance = T::fmadd(e, T::abs(query_minus_key), distance);
      query_minus_key = T::sub(query_minus_key, T::set(static_cast<float>(T::width)));
    }
    if (Weigh) weighted = T::fmadd(e, weights, weighted);
    return e;
  };
  auto flush = [&]() {
    if (Summarise) {
      sums.shift += static_cast<double>(T::sum(shift));
      sums.distance += static_cast<double>(T::sum(distance));
      shift = distance = T::set(0.0f);
    }
    if (Weigh) {
      sums.weighted += static_cast<double>(T::sum(weighted));
      weighted = T::set(0.0f);
    }
  };
  const V no_weights = T::set(0.0f);
  for (int64_t j = 0; j < body; j += T::width) {
    T::store(x + j, step(T::load(x + j), Weigh ? T::load(w + j) : no_weights));
    if ((j / T::width) % CHUNK == CHUNK - 1) flush();
  }
  if (body < width) {  // the last partial vector, padded with −∞: exp gives 0 there, so it adds into the first lanes
    alignas(64) float tail[T::width], tail_weights[T::width];
    for (int64_t k = 0; k < T::width; ++k) {
      tail[k] = body + k < width ? x[body + k] : -std::numeric_limits<float>::infinity();
      tail_weights[k] = Weigh && body + k < width ? w[body + k] : 0.0f;
    }
    T::store(tail, step(T::load(tail), T::load(tail_weights)));
    std::copy(tail, tail + (width - body), x + body);
  }
  flush();
  if (body > 0) {
    sums.total = T::sum(total);
  } else {  // a row shorter than one vector: torch adds its elements one after the other
    sums.total = x[0];
    for (int64_t j = 1; j < width; ++j) sums.total += x[j];
  }
  return sums;
}

// Where one row's summary goes: max weight, entropy, mean distance, and the weights on the keys around the
// query (keys query − o for o = −reach … reach, 0 where there is no such key), each `stride` floats apart.
struct SummaryOut {
  float* first;     // the row's max weight; entropy at first[stride], distance at first[2·stride], band after
  int64_t stride;   // floats between one summary value and the next (b·h·r)
  int64_t reach;    // band offsets −reach … reach
};

// A head's attention sink (gpt-oss's learned sinks): one more logit in every row's softmax whose weight goes to no
// key, so the row's weights on keys sum to 1 − its sink share. None where `logit` is null (most models).
struct SinkRow {
  const float* logit = nullptr;  // the head's sink logit (already a logit: not scaled, not masked), or null
  float* share = nullptr;        // receives the row's sink weight, or null
};

// One row: s = raw·scale (+ mask), then the softmax of s (and the sink, if any) in place; optionally its summary.
// With a sink the summary's entropy is that of the whole distribution, keys and sink (−Σ p ln p over both).
template <bool HasMask, bool Summarise>
static inline void softmax_row(float* x, const float* mrow, int64_t width, float scale, int64_t query,
                               const SummaryOut& out, const SinkRow& sink = SinkRow()) {
  const int64_t body = width - width % Wide::width;
  float top = scaled_max<HasMask>(x, mrow, width, scale);
  const float key_top = top;  // the largest score of a key (the sink's may be larger)
  if (sink.logit) top = std::max(top, *sink.logit);

  RowSums sums = exponentiate<Summarise>(x, width, top, static_cast<float>(query));
  float sink_weight = 0.0f;  // exp(sink − max), the sink's term of Σ
  if (sink.logit) {
    sink_weight = std::exp(*sink.logit - top);
    sums.total += sink_weight;
    if (Summarise) sums.shift += static_cast<double>(sink_weight) * (static_cast<double>(*sink.logit) - top);
  }
  const float inverse = 1.0f / sums.total;
  for (int64_t j = 0; j < body; j += Wide::width) Wide::store(x + j, Wide::mul(Wide::load(x + j), Wide::set(inverse)));
  for (int64_t j = body; j < width; ++j) x[j] *= inverse;
  if (sink.share) *sink.share = sink_weight * inverse;
  if (Summarise) {
    const double total = sums.total;
    const double h = std::log(total) - sums.shift / total;
    out.first[0] = sink.logit ? std::exp(key_top - top) * inverse : inverse;
    out.first[out.stride] = h > 0.0 ? static_cast<float>(h) : 0.0f;
    out.first[2 * out.stride] = static_cast<float>(sums.distance / total);
    for (int64_t offset = -out.reach; offset <= out.reach; ++offset) {
      const int64_t key = query - offset;
      out.first[(3 + offset + out.reach) * out.stride] = key >= 0 && key < width ? x[key] : 0.0f;
    }
  }
}

// Where a block's additive mask rows lie: float32 [b|1, h|1, r|1, >=c] (last dim stride 1), or none.
struct MaskView {
  const float* data = nullptr;
  int64_t batch = 0, head = 0, row = 0;  // strides, 0 along a broadcast dimension

  MaskView(const c10::optional<at::Tensor>& mask_opt, int64_t width) {
    if (!mask_opt.has_value() || !mask_opt->defined()) return;
    const at::Tensor& m = *mask_opt;
    TORCH_CHECK(m.scalar_type() == at::kFloat && m.dim() == 4 && m.stride(3) == 1 && m.size(3) >= width);
    data = m.data_ptr<float>();
    batch = m.size(0) == 1 ? 0 : m.stride(0);
    head = m.size(1) == 1 ? 0 : m.stride(1);
    row = m.size(2) == 1 ? 0 : m.stride(2);
  }
  const float* at(int64_t b, int64_t h, int64_t q) const { return data ? data + b * batch + h * head + q * row : nullptr; }
};

// One row of a block: its softmax in place, and its summary when `out.first` is set.
static inline void pattern_row(float* x, const float* mrow, int64_t width, float scale, int64_t query,
                               const SummaryOut& out, const SinkRow& sink = SinkRow()) {
  const bool summarise = out.first != nullptr;
  if (mrow && summarise) softmax_row<true, true>(x, mrow, width, scale, query, out, sink);
  else if (mrow) softmax_row<true, false>(x, mrow, width, scale, query, out, sink);
  else if (summarise) softmax_row<false, true>(x, mrow, width, scale, query, out, sink);
  else softmax_row<false, false>(x, mrow, width, scale, query, out, sink);
}

// Per-head sink logits float32 [h] (None: no sinks) and where each row's sink weight goes, float32 [b, h, r]
// contiguous (None: nowhere). Optional arguments of every routine, None by default.
using OptionalTensor = c10::optional<at::Tensor>;
static inline bool given(const OptionalTensor& t) { return t.has_value() && t->defined() && t->numel() > 0; }

struct Sinks {
  const float* logits = nullptr;
  float* shares = nullptr;

  Sinks(const OptionalTensor& sinks, const OptionalTensor& sink_share, int64_t heads, int64_t rows) {
    if (!given(sinks)) return;
    TORCH_CHECK(sinks->scalar_type() == at::kFloat && sinks->is_contiguous() && sinks->numel() == heads,
                "sinks must be float32 [heads]");
    logits = sinks->data_ptr<float>();
    if (!given(sink_share)) return;
    TORCH_CHECK(sink_share->scalar_type() == at::kFloat && sink_share->is_contiguous() && sink_share->numel() == rows,
                "sink_share must be float32 [b, h, rows]");
    shares = sink_share->data_ptr<float>();
  }
  // head `hd`'s sink and where row `row` (flat over [b, h, r]) puts its share
  SinkRow at(int64_t hd, int64_t row) const {
    return logits ? SinkRow{logits + hd, shares ? shares + row : nullptr} : SinkRow();
  }
};

static void check_summary(const at::Tensor& summary, int64_t reach, int64_t rows) {
  TORCH_CHECK(reach >= 0);
  TORCH_CHECK(summary.numel() == 0 || (summary.scalar_type() == at::kFloat && summary.is_contiguous() &&
                                       summary.numel() == (4 + 2 * reach) * rows));
}

// Softmax of scaled, masked scores, row by row, in place, with optional per-row summaries.
// scores:  float32 [b, h, r, c] contiguous: raw Q·Kᵀ, overwritten with the pattern.
// mask:    float32 [b|1, h|1, r|1, >=c] additive (last dim stride 1), or None.
// summary: float32 [3 + 2·reach + 1, b, h, r] (max weight, entropy in nats, mean |i - j|, then the weight on
//          key i − o for o = −reach … reach), or an empty tensor.
// sinks:   float32 [h] per-head sink logits, or None (no sinks); sink_share: float32 [b, h, r] receives each
//          row's sink weight, or None.
void softmax_rows_(at::Tensor scores, c10::optional<at::Tensor> mask_opt, double scaling, int64_t query_start,
                   at::Tensor summary, int64_t reach, OptionalTensor sinks, OptionalTensor sink_share) {
  TORCH_CHECK(scores.scalar_type() == at::kFloat && scores.is_contiguous() && scores.dim() == 4);
  const int64_t batch = scores.size(0), heads = scores.size(1), rows = scores.size(2), width = scores.size(3);
  float* data = scores.data_ptr<float>();
  const MaskView mask(mask_opt, width);
  const int64_t total = batch * heads * rows;
  check_summary(summary, reach, total);
  float* out = summary.numel() > 0 ? summary.data_ptr<float>() : nullptr;
  const float scale = static_cast<float>(scaling);
  const Sinks sink(sinks, sink_share, heads, total);
  at::parallel_for(0, total, 8, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t q = row % rows, bh = row / rows, hd = bh % heads, bt = bh / heads;
      const SummaryOut where{out ? out + row : nullptr, total, reach};
      pattern_row(data + row * width, mask.at(bt, hd, q), width, scale, query_start + q, where, sink.at(hd, row));
    }
  });
}
