// Tree-verify MLA attention on the GPU, the ORACLE (ddtree/kernels.h, section 4): simple and obviously
// correct, not fast. It is the reference for the flash kernels on shapes the CPU twin is too slow for,
// and the baseline of bench/bench_verify_attn.cpp.
//
// One CTA of 8 warps per (query row, head): grid = total_nodes * heads, blockIdx.x = row * heads + h.
//  1. Checks (every CTA on its own, so no scratch memory and no second kernel): the node_offsets array
//     (spread over the threads), the row's request (binary search), its scalars and every page-table
//     entry it needs. Bad -> NaN row and DDT_DATA_BAD_INDEX; padding row -> 0 / -inf.
//  2. Warp w visits key slots j = w, w + 8, w + 16, ... < P + N in increasing order (skipping invisible
//     ones; the mask test is warp-uniform): lane l holds q and the key's values at dims [8l, 8l+8) and
//     [256+8l, 256+8l+8) of the latent part and lanes 0-7 the 64 rope dims (16-byte loads); the f32 dot
//     is summed by an xor butterfly (every lane gets the same bits), scaled, and folded into the warp's
//     online softmax (running max m, sum l, 16 f32 accumulators per lane = the 512 output dims).
//  3. The 8 warps' (m, l, acc) are combined in warp order through shared memory: out = sum_w acc_w
//     e^(m_w - M) / sum_w l_w e^(m_w - M), lse = M + ln(L); rounded to bf16 (nearest even).
// Which warp sees key j and in which order depends only on the absolute slot j, so a row's result is a
// function of its own q, its visible key rows and their slots: batch invariant, and a chain node equals a
// single-node decode at the same prefix, bitwise. f32 with expf/logf (full-precision libdevice, not
// __expf): within ~1e-6 relative of the f64 CPU twin before the bf16 rounding.
// No host sync, no allocation: capturable in a CUDA graph and replayable with new inputs in place.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/bf16.h"
#include "kernels/common/validate.h"
#include "kernels/common/verify_attn_index.h"
#include "kernels/cuda/cuda_check.cuh"

namespace ddtree::kern::attn {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
static_assert(kDimV == 512 && kDimQK == 576, "lane layout below assumes 512 latent + 64 rope dims");

// 8 bf16 (one 16-byte load) widened to f32.
__device__ __forceinline__ void load8(const uint16_t* src, float* dst) {
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(src));
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    dst[2 * i] = num::bits_f32(w[i] << 16);
    dst[2 * i + 1] = num::bits_f32(w[i] & 0xFFFF0000u);
  }
}

// The whole row written with one value (padding: 0 / -inf; poisoned: NaN / NaN).
__device__ __forceinline__ void store_row(uint16_t* o, float* lse, int tid, uint16_t v, float l) {
  for (int d = tid; d < kDimV; d += kThreads) o[d] = v;
  if (tid == 0) *lse = l;
}

__global__ void __launch_bounds__(kThreads) verify_attn_oracle_kernel(ddt_verify_attn_params p) {
  __shared__ float s_m[kWarps], s_l[kWarps];
  __shared__ float s_acc[kWarps][kDimV];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int row = int(blockIdx.x / unsigned(p.heads));
  const int h = int(blockIdx.x % unsigned(p.heads));
  uint16_t* out = p.out + (int64_t(row) * p.heads + h) * kDimV;
  float* lse = p.lse + int64_t(row) * p.heads + h;
  const float nan = num::bits_f32(0x7FC00000u);

  // 1. Checks. node_offsets as a whole (every CTA: a malformed array poisons every row).
  bool bad = false;
  for (int r = tid; r <= p.batch; r += kThreads) bad |= !offsets_entry_ok(p, r);
  if (__syncthreads_or(bad)) {
    store_row(out, lse, tid, num::kBf16QuietNaN, nan);
    if (tid == 0) atomicOr(p.status, DDT_DATA_BAD_INDEX);
    return;
  }
  if (p.batch == 0 || row >= p.node_offsets[p.batch]) {  // padding row
    store_row(out, lse, tid, 0, num::kNegInf);
    return;
  }
  const Request q = make_request(p, owner_request(p, row));
  bad = !request_shape_ok(p, q);
  if (!bad)
    for (int64_t k = tid; k < q.pages; k += kThreads) bad |= !page_ok(p, q, k);
  if (__syncthreads_or(bad)) {
    store_row(out, lse, tid, num::kBf16QuietNaN, nan);
    // Every CTA of the request sets the bit (idempotent OR); the host only reads the word.
    if (tid == 0) atomicOr(p.status, DDT_DATA_BAD_INDEX);
    return;
  }

  // 2. Per-warp online softmax over the keys j == warp (mod 8).
  const uint16_t* qrow = p.q + (int64_t(row) * p.heads + h) * kDimQK;
  float qa[8], qb[8], qr[8];
  load8(qrow + 8 * lane, qa);
  load8(qrow + 256 + 8 * lane, qb);
  if (lane < 8) load8(qrow + kDimV + 8 * lane, qr);  // rope dims: lanes 0-7 only
  const uint64_t* vis_row = p.vis + int64_t(row) * p.vis_words;
  float m = num::kNegInf, l = 0.0f, acc_a[8], acc_b[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc_a[i] = acc_b[i] = 0.0f;
  for (int64_t j = warp; j < q.keys; j += kWarps) {
    if (!visible(vis_row, q, j)) continue;  // warp-uniform
    const uint16_t* k = p.kv_cache + kv_row_offset(p, q, j);
    float ka[8], kb[8], kr[8];
    load8(k + 8 * lane, ka);
    load8(k + 256 + 8 * lane, kb);
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) dot = fmaf(qa[i], ka[i], dot);
#pragma unroll
    for (int i = 0; i < 8; ++i) dot = fmaf(qb[i], kb[i], dot);
    if (lane < 8) {
      load8(k + kDimV + 8 * lane, kr);
#pragma unroll
      for (int i = 0; i < 8; ++i) dot = fmaf(qr[i], kr[i], dot);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xFFFFFFFFu, dot, o);  // same bits on every lane
    const float s = dot * p.softmax_scale;
    if (s > m) {  // warp-uniform; rescale what was accumulated under the old max (e^-inf = 0 at the start)
      const float c = expf(m - s);
      l *= c;
#pragma unroll
      for (int i = 0; i < 8; ++i) { acc_a[i] *= c; acc_b[i] *= c; }
      m = s;
    }
    const float e = expf(s - m);
    l += e;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      acc_a[i] = fmaf(e, ka[i], acc_a[i]);
      acc_b[i] = fmaf(e, kb[i], acc_b[i]);
    }
  }

  // 3. Combine the warps in warp order.
  if (lane == 0) { s_m[warp] = m; s_l[warp] = l; }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    s_acc[warp][8 * lane + i] = acc_a[i];
    s_acc[warp][256 + 8 * lane + i] = acc_b[i];
  }
  __syncthreads();
  float M = num::kNegInf;
  bool any = false;  // a visible key: l >= 1 for a finite score, NaN for a NaN one; 0 for none
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    M = fmaxf(M, s_m[w]);
    any |= s_l[w] != 0.0f;
  }
  if (!any) {  // no visible key at all (every visible score NaN: M = -inf, scale NaN, the row NaN below)
    store_row(out, lse, tid, 0, num::kNegInf);
    return;
  }
  float scale[kWarps], L = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    scale[w] = expf(s_m[w] - M);  // a warp that saw no key: e^-inf = 0
    L += s_l[w] * scale[w];
  }
  for (int d = tid; d < kDimV; d += kThreads) {
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o = fmaf(s_acc[w][d], scale[w], o);
    out[d] = num::f32_to_bf16(o / L);
  }
  if (tid == 0) *lse = M + logf(L);
}

}  // namespace
}  // namespace ddtree::kern::attn

extern "C" int ddt_verify_attn_cuda(const ddt_verify_attn_params* p, void* stream) {
  using namespace ddtree::kern;
  if (int rc = validate(p)) return rc;
  const int64_t ctas = int64_t(p->total_nodes) * p->heads;
  if (ctas == 0) return DDT_OK;
  if (ctas > 0x7FFFFFFF) return fail(DDT_ERR_SHAPE, "verify_attn: total_nodes * heads exceeds the grid limit");
  attn::verify_attn_oracle_kernel<<<unsigned(ctas), attn::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(*p);
  DDT_CUDA_LAUNCHED();
  return DDT_OK;
}
