// CPU twin of tree-verify MLA attention (ddtree/kernels.h, section 4; reference/mla-verify-attention.md):
// the reference the CUDA kernels are tested against (CI: P up to ~2k). Plain and obviously right, not fast:
// for every (row, head) a loop over the request's key slots in increasing order, skipping invisible ones;
// scores, the softmax and the weighted sum in double (exact products of bf16 values, f64 sums), so its
// only visible rounding is the final one to bf16 (via f32; double rounding can move a result by one
// bf16 ulp in rare exact-tie cases, far inside the correctness bar) and to f32 for the lse.
// Two passes per row: the maximum score, then exp(s - max), their sum and the weighted sum of V.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/common/bf16.h"
#include "kernels/common/validate.h"
#include "kernels/common/verify_attn_index.h"

using namespace ddtree;
using namespace ddtree::kern::attn;

namespace {

void write_row(const ddt_verify_attn_params& p, int row, int h, uint16_t out_value, float lse) {
  uint16_t* o = p.out + (int64_t(row) * p.heads + h) * kDimV;
  for (int d = 0; d < kDimV; ++d) o[d] = out_value;
  p.lse[int64_t(row) * p.heads + h] = lse;
}

void poison_rows(const ddt_verify_attn_params& p, int row0, int row1) {
  for (int row = row0; row < row1; ++row)
    for (int h = 0; h < p.heads; ++h) write_row(p, row, h, num::kBf16QuietNaN, std::numeric_limits<float>::quiet_NaN());
}

// One request's rows, every check passed.
void compute_request(const ddt_verify_attn_params& p, const Request& q) {
  std::vector<double> qv(kDimQK), score(size_t(q.keys)), acc(kDimV);
  std::vector<char> vis(size_t(q.keys));
  for (int row = q.first_row; row < q.first_row + q.nodes; ++row) {
    const uint64_t* vis_row = p.vis + int64_t(row) * p.vis_words;
    for (int64_t j = 0; j < q.keys; ++j) vis[j] = visible(vis_row, q, j);
    for (int h = 0; h < p.heads; ++h) {
      const uint16_t* qr = p.q + (int64_t(row) * p.heads + h) * kDimQK;
      for (int d = 0; d < kDimQK; ++d) qv[d] = num::bf16_to_f32(qr[d]);
      double m = -std::numeric_limits<double>::infinity();
      int64_t n_visible = 0;
      for (int64_t j = 0; j < q.keys; ++j) {
        if (!vis[j]) continue;
        ++n_visible;
        const uint16_t* k = p.kv_cache + kv_row_offset(p, q, j);
        double dot[4] = {0.0, 0.0, 0.0, 0.0};  // 4 partial sums: f64 is exact enough, and 4x faster
        for (int d = 0; d < kDimQK; d += 4)
          for (int u = 0; u < 4; ++u) dot[u] += qv[d + u] * double(num::bf16_to_f32(k[d + u]));
        score[j] = double(p.softmax_scale) * ((dot[0] + dot[1]) + (dot[2] + dot[3]));
        if (score[j] > m) m = score[j];
      }
      // No visible key: 0 / -inf. A NaN score (a NaN in q or in a visible key) makes the row NaN, also when
      // every visible score is NaN (m stays -inf then, and exp(NaN) carries it into the sums).
      if (n_visible == 0) {
        write_row(p, row, h, num::f32_to_bf16(0.0f), -std::numeric_limits<float>::infinity());
        continue;
      }
      double sum = 0.0;
      for (auto& a : acc) a = 0.0;
      for (int64_t j = 0; j < q.keys; ++j) {
        if (!vis[j]) continue;
        const double e = std::exp(score[j] - m);
        sum += e;
        const uint16_t* v = p.kv_cache + kv_row_offset(p, q, j);
        for (int d = 0; d < kDimV; ++d) acc[d] += e * double(num::bf16_to_f32(v[d]));
      }
      uint16_t* o = p.out + (int64_t(row) * p.heads + h) * kDimV;
      for (int d = 0; d < kDimV; ++d) o[d] = num::f32_to_bf16(float(acc[d] / sum));
      p.lse[int64_t(row) * p.heads + h] = float(m + std::log(sum));
    }
  }
}

}  // namespace

extern "C" int ddt_verify_attn_cpu(const ddt_verify_attn_params* pp) {
  if (int rc = kern::validate(pp)) return rc;
  const ddt_verify_attn_params& p = *pp;
  bool offsets_ok = true;
  for (int r = 0; r <= p.batch; ++r) offsets_ok = offsets_ok && offsets_entry_ok(p, r);
  if (!offsets_ok) {  // no row can be attributed to a request: all of them are poisoned
    poison_rows(p, 0, p.total_nodes);
    *p.status |= DDT_DATA_BAD_INDEX;
    return DDT_OK;
  }
  bool bad = false;
  for (int r = 0; r < p.batch; ++r) {
    const Request q = make_request(p, r);
    if (q.nodes == 0) continue;
    bool ok = request_shape_ok(p, q);
    for (int64_t k = 0; ok && k < q.pages; ++k) ok = page_ok(p, q, k);
    if (!ok) {
      poison_rows(p, q.first_row, q.first_row + q.nodes);
      bad = true;
      continue;
    }
    compute_request(p, q);
  }
  const int end = p.batch > 0 ? p.node_offsets[p.batch] : 0;
  for (int row = end; row < p.total_nodes; ++row)  // padding rows
    for (int h = 0; h < p.heads; ++h) write_row(p, row, h, num::f32_to_bf16(0.0f), -std::numeric_limits<float>::infinity());
  if (bad) *p.status |= DDT_DATA_BAD_INDEX;
  return DDT_OK;
}
