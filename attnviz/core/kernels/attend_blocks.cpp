// (continues softmax_rows.cpp and tile_products.cpp: the three are compiled as one source, this one last)
// The BLAS single-precision product torch itself calls (MKL's, linked into libtorch_cpu on x86), found at
// load time: torch does not export a C++ entry for it. Column-major, Fortran calling convention.
using Sgemm = void (*)(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                       const int*, const float*, const int*, const float*, float*, const int*);

static Sgemm blas_sgemm() {
  static const Sgemm found = reinterpret_cast<Sgemm>(dlsym(RTLD_DEFAULT, "sgemm_"));
  return found;
}

// Whether attend_block_ can run here (torch's BLAS was found).
bool block_kernel_available() { return blas_sgemm() != nullptr; }

// c[m, n] = a[m, k]·b[k, n] (or ·bᵀ when `b_transposed`, b then [n, k]), row-major with leading dimensions;
// with `accumulate`, c += a·b.
static inline void matmul_rows(Sgemm sgemm, const float* a, int64_t lda, const float* b, int64_t ldb,
                               bool b_transposed, float* c, int64_t ldc, int64_t m, int64_t n, int64_t k,
                               bool accumulate = false) {
  // row-major c = a·b is column-major cᵀ = bᵀ·aᵀ: BLAS gets b first
  const char tb = b_transposed ? 'T' : 'N', ta = 'N';
  const int mi = static_cast<int>(n), ni = static_cast<int>(m), ki = static_cast<int>(k);
  const int ldb_i = static_cast<int>(ldb), lda_i = static_cast<int>(lda), ldc_i = static_cast<int>(ldc);
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  sgemm(&tb, &ta, &mi, &ni, &ki, &one, b, &ldb_i, a, &lda_i, &beta, c, &ldc_i);
}

// Σ_j x[j]·w[j] over one row (the weights a row gives, times a per-key quantity), in float lanes.
static inline float weighted_sum(const float* x, const float* w, int64_t width) {
  const int64_t body = width - width % Wide::width;
  Wide::V lanes = Wide::set(0.0f);
  for (int64_t j = 0; j < body; j += Wide::width) lanes = Wide::fmadd(Wide::load(x + j), Wide::load(w + j), lanes);
  float total = Wide::sum(lanes);
  for (int64_t j = body; j < width; ++j) total += x[j] * w[j];
  return total;
}

// Per-key quantities [b, h, ≥width] whose pattern-weighted sum per row goes to `weighted` [b, h, rows] (both
// float32, contiguous), or none (an empty tensor).
struct KeyWeights {
  const float* data = nullptr;
  float* sums = nullptr;
  int64_t stride = 0;  // floats per (b, h) row of the weights

  KeyWeights(const at::Tensor& key_weights, const at::Tensor& weighted, int64_t batch, int64_t heads, int64_t width,
             int64_t rows) {
    if (key_weights.numel() == 0) return;
    TORCH_CHECK(key_weights.scalar_type() == at::kFloat && key_weights.is_contiguous() && key_weights.dim() == 3 &&
                key_weights.size(0) == batch && key_weights.size(1) == heads && key_weights.size(2) >= width &&
                weighted.scalar_type() == at::kFloat && weighted.is_contiguous() && weighted.numel() == rows);
    data = key_weights.data_ptr<float>();
    sums = weighted.data_ptr<float>();
    stride = key_weights.size(2);
  }
  const float* row(int64_t bh) const { return data ? data + bh * stride : nullptr; }
};

// The operands both attention routines read and write, checked, as raw pointers: query [b, h, q, d] (last dim
// stride 1), key and value [b, kvh, k, d] and [b, kvh, k, dv] contiguous, output [b, q, h, dv] contiguous.
struct Operands {
  const float* q;
  const float* k;
  const float* v;
  float* o;

  Operands(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& output) {
    TORCH_CHECK(query.scalar_type() == at::kFloat && query.dim() == 4 && query.stride(3) == 1);
    TORCH_CHECK(key.scalar_type() == at::kFloat && key.is_contiguous() && value.scalar_type() == at::kFloat &&
                value.is_contiguous() && key.dim() == 4 && value.dim() == 4 &&
                key.sizes().slice(0, 3) == value.sizes().slice(0, 3));
    TORCH_CHECK(output.scalar_type() == at::kFloat && output.is_contiguous() && output.dim() == 4);
    q = query.data_ptr<float>();
    k = key.data_ptr<float>();
    v = value.data_ptr<float>();
    o = output.data_ptr<float>();
  }
};

// One block of queries through attention, scores, softmax (as softmax_rows_, with its summary) and the
// output, in one parallel region of b·h·⌈r/rows_per_task⌉ independent tasks. Each task makes its own single-threaded
// matrix products: a batched Q·Kᵀ over the key/value heads splits over as few threads as there are such
// heads (3 for SmolLM2), so it leaves threads idle; these tasks keep every thread busy.
// query:   float32 [b, h, q, d], last dim stride 1; rows query_start … query_start + r − 1 are the block.
// key, value: float32 [b, kvh, k, d] and [b, kvh, k, dv] contiguous, h a multiple of kvh (head g·n_rep + i reads kv
//          head g); dv, the value head size, may differ from d (multi-head latent attention).
// scores:  float32 [b, h, r, c] contiguous buffer, c ≤ k: receives the pattern over keys < c (later keys
//          must have weight 0: the mask hides them from every row of the block).
// mask, summary, reach, sinks, sink_share: as softmax_rows_.
// output:  float32 [b, q, h, dv] contiguous: receives pattern·V for the block's rows of every head.
// rows_per_task: query rows of one head per task (each task repacks its keys for BLAS: more rows, less waste).
// key_weights: float32 [b, h, k] contiguous or an empty tensor; with it, weighted [b, h, r] receives each row's
//          Σ_j pattern_ij·key_weights_j while the row is in L1 (a value-norm weighted sum, without a pass of its own).
void attend_block_(at::Tensor query, at::Tensor key, at::Tensor value, at::Tensor scores,
                   c10::optional<at::Tensor> mask_opt, double scaling, int64_t query_start, at::Tensor summary,
                   int64_t reach, at::Tensor output, int64_t rows_per_task, at::Tensor key_weights,
                   at::Tensor weighted, OptionalTensor sinks, OptionalTensor sink_share) {
  const Sgemm sgemm = blas_sgemm();
  TORCH_CHECK(sgemm != nullptr, "no BLAS sgemm_ in this process");
  TORCH_CHECK(scores.scalar_type() == at::kFloat && scores.is_contiguous() && scores.dim() == 4);
  const Operands io(query, key, value, output);
  const int64_t batch = scores.size(0), heads = scores.size(1), rows = scores.size(2), width = scores.size(3);
  const int64_t kv_heads = key.size(1), key_len = key.size(2), head_dim = key.size(3), value_dim = value.size(3);
  TORCH_CHECK(heads % kv_heads == 0 && width <= key_len && query.size(3) == head_dim);
  TORCH_CHECK(query_start + rows <= query.size(2) && output.size(1) == query.size(2) && output.size(2) == heads &&
              output.size(3) == value_dim);
  const int64_t n_rep = heads / kv_heads, query_len = query.size(2);
  const MaskView mask(mask_opt, width);
  const int64_t total = batch * heads * rows;
  check_summary(summary, reach, total);
  float* out = summary.numel() > 0 ? summary.data_ptr<float>() : nullptr;
  const float scale = static_cast<float>(scaling);
  const KeyWeights weights(key_weights, weighted, batch, heads, width, total);
  const Sinks sink(sinks, sink_share, heads, total);
  float* s_data = scores.data_ptr<float>();
  const int64_t chunks = (rows + rows_per_task - 1) / rows_per_task;
  at::parallel_for(0, batch * heads * chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t chunk = task % chunks, bh = task / chunks, hd = bh % heads, bt = bh / heads;
      const int64_t first = chunk * rows_per_task, n = std::min(rows_per_task, rows - first);
      const float* q = io.q + bt * query.stride(0) + hd * query.stride(1) + (query_start + first) * query.stride(2);
      const int64_t kv = (bt * kv_heads + hd / n_rep) * key_len * head_dim;  // [k, d] of kv head hd / n_rep
      const int64_t vkv = (bt * kv_heads + hd / n_rep) * key_len * value_dim;  // [k, dv] of kv head hd / n_rep
      float* s = s_data + ((bt * heads + hd) * rows + first) * width;         // [n, c]
      // s[n, c] = q[n, d]·k[c, d]ᵀ
      matmul_rows(sgemm, q, query.stride(2), io.k + kv, head_dim, true, s, width, n, width, head_dim);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t row = (bt * heads + hd) * rows + first + i;
        const SummaryOut where{out ? out + row : nullptr, total, reach};
        pattern_row(s + i * width, mask.at(bt, hd, first + i), width, scale, query_start + first + i, where,
                    sink.at(hd, row));
        if (weights.data) weights.sums[row] = weighted_sum(s + i * width, weights.row(bt * heads + hd), width);
      }
      // o[n, dv] = s[n, c]·v[c, dv], the rows of head hd in output [b, q, h, dv]
      float* o = io.o + ((bt * query_len + query_start + first) * heads + hd) * value_dim;
      matmul_rows(sgemm, s, width, io.v + vkv, value_dim, false, o, heads * value_dim, n, value_dim, width);
    }
  });
}

// One query row's running state in attend_rows_: flash attention's running max and Σ exp(s − max), with the
// summary's sums, all relative to the running max (rescaled when it grows).
struct OnlineRow {
  float top = -std::numeric_limits<float>::infinity();  // largest scaled score so far (the sink's included)
  float key_top = -std::numeric_limits<float>::infinity();  // largest scaled score of a key so far
  double total = 0.0, shift = 0.0, distance = 0.0, weighted = 0.0;  // Σ e, Σ e·(s − top), Σ e·|i − j|, Σ e·w_j
};

// Attention over every query of a call without ever holding a row of the pattern: flash attention's tiling with
// the statistics' summary. Per task (one head's rows_per_task queries) the keys come in tiles of key_tile: scores
// of the tile (tile_scores, or BLAS where the head dimension does not suit it), scale and mask, the tile's
// exponentials against the running max (the row's sums and output rescaled where it grew), then exponentials·V
// added to the output (tile_output, or BLAS). Only a tile of rows_per_task × key_tile floats is written, and it
// stays in the L2 cache, where a block of whole rows does not.
// The summary (max weight, entropy, distance, band) is that of softmax_rows_, to rounding; the weights on the
// band's keys and on `columns` come from their scaled scores, kept as the tiles pass, and the final max and sum.
// query:   float32 [b, h, q, d], last dim stride 1; query row i is at position query_start + i.
// key, value: float32 [b, kvh, k, d] and [b, kvh, k, dv] contiguous, h a multiple of kvh.
// mask:    as softmax_rows_, over all q rows, or None.
// starts, stops: int64 [⌈q/rows_per_task⌉]: the keys [start, stop) each task's rows can weigh (the mask or the
//          layout hides every other one; starts a multiple of KEY_PADDING, so a tile reads whole key panels).
// summary: float32 [4 + 2·reach + G, b, h, q] (softmax_rows_'s fields, then the weight on each of `columns`), or empty.
// columns: int64 [G] key positions whose weights go to the summary.
// output:  float32 [b, q, h, dv] contiguous: pattern·V.
// key_weights, weighted: as attend_block_ (weighted [b, h, q]).
// sinks, sink_share: as softmax_rows_ (sink_share [b, h, q]): each row's running max and sum start with its sink.
// causal:  query position p sees keys ≤ p only (the causal triangle without a mask tensor; with a mask, both apply);
// window:  (> 0) and only the last `window` of them, keys > p − window (without causality also keys < p + window);
// key_ranges: int64 [b, 2] or None: and only its sequence's keys [start, stop) (padding outside). With no mask, a
//          row that may weigh no key weighs every key alike (as softmax does on a row of equal lowest scores), or
//          with a sink, only its sink.
void attend_rows_(at::Tensor query, at::Tensor key, at::Tensor value, c10::optional<at::Tensor> mask_opt,
                  double scaling, int64_t query_start, at::Tensor starts, at::Tensor stops, at::Tensor summary,
                  int64_t reach, at::Tensor columns, at::Tensor output, int64_t rows_per_task, int64_t key_tile,
                  at::Tensor key_weights, at::Tensor weighted, OptionalTensor sinks, OptionalTensor sink_share,
                  bool causal, int64_t window, OptionalTensor key_ranges) {
  const Operands io(query, key, value, output);
  TORCH_CHECK(rows_per_task > 0 && key_tile > 0 && reach >= 0);
  // own register-blocked products where both head sizes are multiples of the block (64, 128, …), else BLAS
  const bool own_products = query.size(3) % COLUMN_BLOCK == 0 && value.size(3) % COLUMN_BLOCK == 0;
  const Sgemm sgemm = blas_sgemm();
  TORCH_CHECK(own_products || sgemm != nullptr, "no BLAS sgemm_ in this process");
  const int64_t batch = query.size(0), heads = query.size(1), rows = query.size(2), head_dim = query.size(3);
  const int64_t kv_heads = key.size(1), key_len = key.size(2), value_dim = value.size(3);
  TORCH_CHECK(heads % kv_heads == 0 && key.size(3) == head_dim && key.size(0) == batch);
  TORCH_CHECK(output.size(0) == batch && output.size(1) == rows && output.size(2) == heads &&
              output.size(3) == value_dim);
  const int64_t n_rep = heads / kv_heads, chunks = (rows + rows_per_task - 1) / rows_per_task;
  TORCH_CHECK(stops.scalar_type() == at::kLong && stops.is_contiguous() && stops.numel() == chunks);
  TORCH_CHECK(columns.scalar_type() == at::kLong && columns.is_contiguous() && columns.dim() == 1);
  TORCH_CHECK(starts.scalar_type() == at::kLong && starts.is_contiguous() && starts.numel() == chunks);
  const int64_t* stop_of = stops.data_ptr<int64_t>();
  const int64_t* start_of = starts.data_ptr<int64_t>();
  for (int64_t c = 0; c < chunks; ++c)
    TORCH_CHECK(stop_of[c] >= 0 && stop_of[c] <= key_len && start_of[c] >= 0 && start_of[c] % KEY_PADDING == 0);
  TORCH_CHECK(window >= 0);
  const int64_t* range_of = nullptr;  // [b, 2]: each sequence's keys [start, stop)
  if (given(key_ranges)) {
    TORCH_CHECK(key_ranges->scalar_type() == at::kLong && key_ranges->is_contiguous() &&
                    key_ranges->numel() == 2 * batch,
                "key_ranges must be int64 [b, 2]");
    range_of = key_ranges->data_ptr<int64_t>();
  }
  const bool ranged = causal || window > 0 || range_of != nullptr;
  const int64_t gathered = columns.numel(), band = 2 * reach + 1, kept_width = band + gathered;
  const int64_t* column_of = columns.data_ptr<int64_t>();
  const MaskView mask(mask_opt, key_len);
  TORCH_CHECK(!(mask.data && (window > 0 || range_of)), "a window or key ranges replace the mask: give one of them");
  const int64_t total_rows = batch * heads * rows;
  TORCH_CHECK(summary.numel() == 0 || (summary.scalar_type() == at::kFloat && summary.is_contiguous() &&
                                       summary.numel() == (3 + band + gathered) * total_rows));
  float* out = summary.numel() > 0 ? summary.data_ptr<float>() : nullptr;
  const KeyWeights weights(key_weights, weighted, batch, heads, key_len, total_rows);
  const Sinks sink(sinks, sink_share, heads, total_rows);
  const float scale = static_cast<float>(scaling);
  const float lowest = -std::numeric_limits<float>::infinity();
  // Keys and values rearranged once per call into the panels the products read contiguously: keys
  // [b, kvh, k' / CB, d, CB] (k' = k padded to KEY_PADDING with zeros, so a tile's last block reads whole vectors),
  // values [b, kvh, dv / CB, k, CB] (CB = COLUMN_BLOCK).
  const int64_t padded_len = (key_len + KEY_PADDING - 1) / KEY_PADDING * KEY_PADDING;
  at::Tensor key_panels, value_panels;
  if (own_products) {
    key_panels = at::zeros({batch, kv_heads, padded_len, head_dim}, key.options());
    key_panels.narrow(2, 0, key_len).copy_(key);
    key_panels = key_panels.view({batch, kv_heads, padded_len / COLUMN_BLOCK, COLUMN_BLOCK, head_dim})
                     .transpose(3, 4)
                     .contiguous();
    value_panels = value.view({batch, kv_heads, key_len, value_dim / COLUMN_BLOCK, COLUMN_BLOCK})
                       .permute({0, 1, 3, 2, 4})
                       .contiguous();
  }
  const float* kp_data = own_products ? key_panels.data_ptr<float>() : nullptr;
  const float* vp_data = own_products ? value_panels.data_ptr<float>() : nullptr;
  const int64_t tile_stride = (key_tile + KEY_PADDING - 1) / KEY_PADDING * KEY_PADDING;  // floats per tile row

  // Tasks cost as many keys as their rows see (a causal triangle: up to rows/rows_per_task to one): the costliest
  // go first and each thread takes the next one as it finishes, so no thread is left with the long tail.
  const int64_t tasks = batch * heads * chunks;
  std::vector<int64_t> order(tasks);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) {
                     return stop_of[a % chunks] - start_of[a % chunks] > stop_of[b % chunks] - start_of[b % chunks];
                   });
  std::atomic<int64_t> next{0};

  auto run = [&](int64_t task, float* tile, float* kept, OnlineRow* state) {
    const int64_t chunk = task % chunks, bh = task / chunks, hd = bh % heads, bt = bh / heads;
    const int64_t first = chunk * rows_per_task, n = std::min(rows_per_task, rows - first), stop = stop_of[chunk];
    const int64_t begin = start_of[chunk];
    const float* q = io.q + bt * query.stride(0) + hd * query.stride(1) + first * query.stride(2);
    const int64_t kv = (bt * kv_heads + hd / n_rep) * key_len * head_dim;  // [k, d] of kv head hd / n_rep
    const int64_t group = bt * kv_heads + hd / n_rep;
    const int64_t vkv = group * key_len * value_dim;  // [k, dv] of kv head hd / n_rep
    const float* key_panel = own_products ? kp_data + group * padded_len * head_dim : nullptr;  // [k'/CB, d, CB]
    const float* value_panel = own_products ? vp_data + vkv : nullptr;                          // [dv/CB, k, CB]
    const int64_t out_stride = heads * value_dim;
    float* o = io.o + ((bt * rows + first) * heads + hd) * value_dim;  // rows of head hd in output [b, q, h, dv]
    const float* w_row = weights.row(bt * heads + hd);
    const float* sink_logit = sink.logits ? sink.logits + hd : nullptr;
    for (int64_t i = 0; i < n; ++i) {
      std::fill(o + i * out_stride, o + i * out_stride + value_dim, 0.0f);
      state[i] = OnlineRow();
      if (sink_logit) {  // the sink is the row's first term: exp(sink − max) = 1 with the max at the sink
        state[i].top = *sink_logit;
        state[i].total = 1.0;
      }
    }
    std::fill(kept, kept + n * kept_width, lowest);
    for (int64_t key0 = begin; key0 < stop; key0 += key_tile) {
      const int64_t width = std::min(key_tile, stop - key0);
      // tile[n, width] = q[n, d]·k[key0 : key0 + width, d]ᵀ (rows tile_stride floats apart)
      if (own_products) {
        tile_scores(q, query.stride(2), key_panel + key0 * head_dim, head_dim, tile, tile_stride, n, width);
      } else {
        matmul_rows(sgemm, q, query.stride(2), io.k + kv + key0 * head_dim, head_dim, true, tile, tile_stride, n,
                    width, head_dim);
      }
      for (int64_t i = 0; i < n; ++i) {
        float* x = tile + i * tile_stride;
        const int64_t position = query_start + first + i;
        const float* mrow = mask.at(bt, hd, first + i);
        if (ranged) {  // the keys [lo, hi) the row may weigh; the others get weight 0 (−inf scores)
          int64_t lo = window > 0 ? position - window + 1 : 0;
          int64_t hi = causal ? position + 1 : window > 0 ? std::min(key_len, position + window) : key_len;
          if (range_of) {
            lo = std::max(lo, range_of[2 * bt]);
            hi = std::min(hi, range_of[2 * bt + 1]);
          }
          if (lo >= hi && !sink_logit && !mrow) {  // weighs no key: every key alike, as softmax of equal scores
            TORCH_CHECK(begin == 0 && stop == key_len, "a row that weighs no key needs every key of its task");
            std::fill(x, x + width, 0.0f);
          } else {
            if (key0 < lo) std::fill(x, x + std::min(width, lo - key0), lowest);
            if (key0 + width > hi) std::fill(x + std::clamp<int64_t>(hi - key0, 0, width), x + width, lowest);
          }
        }
        const float tile_top =
            mrow ? scaled_max<true>(x, mrow + key0, width, scale) : scaled_max<false>(x, nullptr, width, scale);
        float* row_kept = kept + i * kept_width;  // scaled scores of the band's keys, then of `columns`
        for (int64_t key = std::max(key0, position - reach); key <= std::min(key0 + width - 1, position + reach); ++key)
          row_kept[position - key + reach] = x[key - key0];
        for (int64_t g = 0; g < gathered; ++g)
          if (column_of[g] >= key0 && column_of[g] < key0 + width) row_kept[band + g] = x[column_of[g] - key0];
        OnlineRow& row = state[i];
        row.key_top = std::max(row.key_top, tile_top);
        const float top = std::max(row.top, tile_top);
        if (top == lowest) {  // every key so far is masked with −inf: nothing to add yet
          std::fill(x, x + width, 0.0f);
          continue;
        }
        if (top > row.top && row.total > 0.0) {  // the running max grew: everything so far shrinks by α
          const double alpha = std::exp(static_cast<double>(row.top) - top);
          row.shift = alpha * (row.shift + (static_cast<double>(row.top) - top) * row.total);
          row.total *= alpha;
          row.distance *= alpha;
          row.weighted *= alpha;
          float* o_row = o + i * out_stride;
          const float shrink = static_cast<float>(alpha);
          for (int64_t c = 0; c < value_dim; ++c) o_row[c] *= shrink;
        }
        row.top = top;
        const float at = static_cast<float>(position), from = static_cast<float>(key0);
        const bool weigh = w_row != nullptr;
        const float* w = weigh ? w_row + key0 : nullptr;
        const RowSums tile_sums = out ? (weigh ? exponentiate<true, true>(x, width, top, at, from, w)
                                               : exponentiate<true, false>(x, width, top, at, from))
                                      : (weigh ? exponentiate<false, true>(x, width, top, at, from, w)
                                               : exponentiate<false, false>(x, width, top, at, from));
        row.total += tile_sums.total;
        row.shift += tile_sums.shift;
        row.distance += tile_sums.distance;
        row.weighted += tile_sums.weighted;
      }
      // o[n, d] += exponentials[n, width]·v[key0 : key0 + width, d]
      if (own_products) {
        tile_output(tile, tile_stride, value_panel + key0 * COLUMN_BLOCK, key_len * COLUMN_BLOCK, value_dim, width,
                    o, out_stride, n);
      } else {
        matmul_rows(sgemm, tile, tile_stride, io.v + vkv + key0 * value_dim, value_dim, false, o, out_stride, n,
                    value_dim, width, true);
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      const OnlineRow& row = state[i];
      const double inverse = 1.0 / row.total;
      const float inverse_f = static_cast<float>(inverse);
      float* o_row = o + i * out_stride;
      for (int64_t c = 0; c < value_dim; ++c) o_row[c] *= inverse_f;
      const int64_t flat = (bt * heads + hd) * rows + first + i;
      if (weights.data) weights.sums[flat] = static_cast<float>(row.weighted * inverse);
      if (sink.shares) sink.shares[flat] = static_cast<float>(std::exp(static_cast<double>(*sink_logit) - row.top) * inverse);
      if (!out) continue;
      const double h = std::log(row.total) - row.shift * inverse;  // with a sink: over keys and sink
      out[flat] = static_cast<float>(sink_logit ? std::exp(static_cast<double>(row.key_top) - row.top) * inverse : inverse);
      out[total_rows + flat] = h > 0.0 ? static_cast<float>(h) : 0.0f;
      out[2 * total_rows + flat] = static_cast<float>(row.distance * inverse);
      const float* row_kept = kept + i * kept_width;
      for (int64_t f = 0; f < kept_width; ++f)  // exp(−inf) = 0: keys never seen, masked or past the stop
        out[(3 + f) * total_rows + flat] = std::exp(row_kept[f] - row.top) * inverse_f;
    }
  };
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    std::vector<float> tile(rows_per_task * tile_stride), kept(rows_per_task * kept_width);
    std::vector<OnlineRow> state(rows_per_task);
    for (int64_t t = next.fetch_add(1); t < tasks; t = next.fetch_add(1)) run(order[t], tile.data(), kept.data(), state.data());
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // the sink arguments are optional (None: no sinks), after the positional ones
  m.def("softmax_rows_", &softmax_rows_, py::arg("scores"), py::arg("mask"), py::arg("scaling"),
        py::arg("query_start"), py::arg("summary"), py::arg("reach"), py::arg("sinks") = py::none(),
        py::arg("sink_share") = py::none());
  m.def("attend_block_", &attend_block_, py::arg("query"), py::arg("key"), py::arg("value"), py::arg("scores"),
        py::arg("mask"), py::arg("scaling"), py::arg("query_start"), py::arg("summary"), py::arg("reach"),
        py::arg("output"), py::arg("rows_per_task"), py::arg("key_weights"), py::arg("weighted"),
        py::arg("sinks") = py::none(), py::arg("sink_share") = py::none());
  m.def("attend_rows_", &attend_rows_, py::arg("query"), py::arg("key"), py::arg("value"), py::arg("mask"),
        py::arg("scaling"), py::arg("query_start"), py::arg("starts"), py::arg("stops"), py::arg("summary"),
        py::arg("reach"),
        py::arg("columns"), py::arg("output"), py::arg("rows_per_task"), py::arg("key_tile"),
        py::arg("key_weights"), py::arg("weighted"), py::arg("sinks") = py::none(),
        py::arg("sink_share") = py::none(), py::arg("causal") = false, py::arg("window") = 0,
        py::arg("key_ranges") = py::none());
  m.def("block_kernel_available", &block_kernel_available);
}
