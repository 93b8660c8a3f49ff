// (continues softmax_rows.cpp, before attend_blocks.cpp: the three are compiled as one source, in that order)
// The two products of attend_rows_ without BLAS, whose every call repacks both of its operands: at 8,192 keys that
// repacking took a quarter of the time. Keys come pre-transposed (kt [d, k'], k' a multiple of COLUMN_BLOCK), so a
// tile of scores is Rows broadcast query values against two vectors of keys at a time, all in registers.
constexpr int64_t COLUMN_BLOCK = 2 * Wide::width;  // columns (keys, or output features) per register block
constexpr int64_t KEY_PADDING = 32;                 // keys are padded to a multiple of this (≥ COLUMN_BLOCK)
// rows per register block: 6 × 2 accumulators (with 2 operands and a broadcast, 15 of AVX2's 16 registers) keep
// both FMA units busy through their 5-cycle latency, where 4 × 2 leave a fifth of their slots empty
constexpr int BLOCK_ROWS = 6;

// Calls f(std::integral_constant<int, rows>) for the 1 … BLOCK_ROWS − 1 rows left after the full blocks: one
// block of them (rows one at a time would each cost nearly a full block, their two sums waiting on the FMA latency).
template <class F>
static inline void remaining_rows(int64_t rows, F&& f) {
  static_assert(BLOCK_ROWS == 6, "one case per remainder");
  switch (rows) {
    case 1: f(std::integral_constant<int, 1>()); break;
    case 2: f(std::integral_constant<int, 2>()); break;
    case 3: f(std::integral_constant<int, 3>()); break;
    case 4: f(std::integral_constant<int, 4>()); break;
    case 5: f(std::integral_constant<int, 5>()); break;
    default: break;
  }
}

// c[r, 0 .. COLUMN_BLOCK) (+)= Σ_j a[r, j]·panel[j, ·] for Rows rows of a (row stride a_stride) and of c (c_stride),
// j over `inner`: Rows broadcast values of a against two vectors of the panel at a time, all in registers. The panel
// is [inner, COLUMN_BLOCK] contiguous: the keys' block transposed for scores (4 KB at d = 64, in L1 for every row of
// the tile), the values' features for the output. With Accumulate, c's rows are added to; else overwritten.
template <int Rows, bool Accumulate>
static inline void panel_block(const float* a, int64_t a_stride, const float* panel, int64_t inner, float* c,
                               int64_t c_stride) {
  using T = Wide;
  T::V acc[Rows][2];
  for (int r = 0; r < Rows; ++r) {
    acc[r][0] = Accumulate ? T::load(c + r * c_stride) : T::set(0.0f);
    acc[r][1] = Accumulate ? T::load(c + r * c_stride + T::width) : T::set(0.0f);
  }
  for (int64_t j = 0; j < inner; ++j) {
    const T::V p0 = T::load(panel + j * COLUMN_BLOCK), p1 = T::load(panel + j * COLUMN_BLOCK + T::width);
    for (int r = 0; r < Rows; ++r) {
      const T::V ar = T::set(a[r * a_stride + j]);
      acc[r][0] = T::fmadd(ar, p0, acc[r][0]);
      acc[r][1] = T::fmadd(ar, p1, acc[r][1]);
    }
  }
  for (int r = 0; r < Rows; ++r) {
    T::store(c + r * c_stride, acc[r][0]);
    T::store(c + r * c_stride + T::width, acc[r][1]);
  }
}

// panel_block over all n rows of a and c: full blocks of BLOCK_ROWS rows, then one block of the rest.
template <bool Accumulate>
static inline void rows_by_panel(const float* a, int64_t a_stride, const float* panel, int64_t inner, float* c,
                                 int64_t c_stride, int64_t n) {
  int64_t i = 0;
  for (; i + BLOCK_ROWS <= n; i += BLOCK_ROWS)
    panel_block<BLOCK_ROWS, Accumulate>(a + i * a_stride, a_stride, panel, inner, c + i * c_stride, c_stride);
  remaining_rows(n - i, [&](auto rows) {
    constexpr int Rows = decltype(rows)::value;
    panel_block<Rows, Accumulate>(a + i * a_stride, a_stride, panel, inner, c + i * c_stride, c_stride);
  });
}

// s[n, ⌈width⌉] = q[n, d]·keys[key0 …]ᵀ, the keys as panels [⌈k / COLUMN_BLOCK⌉, d, COLUMN_BLOCK] from the tile's
// first: columns past `width` (up to a multiple of COLUMN_BLOCK) are written too.
static void tile_scores(const float* q, int64_t q_stride, const float* panels, int64_t head_dim, float* s,
                        int64_t s_stride, int64_t n, int64_t width) {
  for (int64_t j = 0; j < width; j += COLUMN_BLOCK)  // one panel of keys for every row
    rows_by_panel<false>(q, q_stride, panels + j * head_dim, head_dim, s + j, s_stride, n);
}

// o[n, d] += e[n, width]·values[width, d], the values as panels [d / COLUMN_BLOCK, k', COLUMN_BLOCK] (`panels` at the
// tile's first key, `panel_stride` floats from one feature block to the next).
static void tile_output(const float* e, int64_t e_stride, const float* panels, int64_t panel_stride, int64_t head_dim,
                        int64_t width, float* o, int64_t o_stride, int64_t n) {
  for (int64_t c = 0; c < head_dim; c += COLUMN_BLOCK)  // one block of features for every row
    rows_by_panel<true>(e, e_stride, panels + (c / COLUMN_BLOCK) * panel_stride, width, o + c, o_stride, n);
}
