// Tree-verify MLA attention on the GPU, the sm_90a flash kernel (ddtree/kernels.h, section 4;
// reference/mla-verify-attention.md; issue 5): Hopper warpgroup MMA (wgmma) with both operands read straight
// from shared memory (no ldmatrix / register staging: the traffic that bounds the portable kernel, docs/
// PERF_NOTES.md A2-A4), 64-row tiles, 64-key KV tiles double-buffered with cp.async into the 128-byte
// swizzled layout wgmma reads, f32 online softmax, the same KV splits at fixed absolute positions, the same
// workspace and the same fixed-order combine as the portable kernel (verify_attn_sched.cuh). Same semantics
// and outputs as the oracle and the CPU twin to the correctness bar.
//
// Work decomposition (one CTA = 2 math warpgroups + 1 producer warpgroup = 384 threads; one item = 64 rows x
// one key range):
//  - Rows: request r's flattened (node, head) rows in tiles of 64 (8 nodes x 8 heads at H = 8); row tile t =
//    request-local rows [64 t, 64 t + 64). Keys: the split's range [kb, ke) (kb = s x split_keys) in tiles of
//    64 keys starting at kb (so a chain node and the single-node decode see the same tiles: rule E).
//  - Shared memory (1024-byte aligned, 224 KB): Q latent part [64 rows][512] as 8 boxes of [64 rows][64 dims]
//    (128-byte rows, 16-byte chunks XOR-swizzled by row & 7: the canonical 128B-swizzle layout); two KV
//    stages [64 keys][576] as 9 such boxes; P hi and P lo [64 rows][64 keys] bf16, same layout. Q's rope part
//    (64 dims) lives in registers as wgmma A fragments (4 k-steps): with it in shared memory the plan would
//    need 232 KB, above the 227 KB a CTA may have.
//  - Per KV tile: warpgroup w computes S_w = Q K_w^T for keys [32 w, 32 w + 32) of the tile (wgmma
//    m64n32k16: 32 k-steps from shared memory + 4 rope k-steps with A in registers); scale, mask (prefix /
//    ancestor bits / key range), row max over its 32 keys, exchanged through shared memory (both warpgroups
//    then take the same max of the two); P = exp2(s - m) as a bf16 pair hi + lo (as the portable kernel:
//    bf16 P alone misses the element bar on peaked rows) into shared memory; then warpgroup w owns output
//    dims [256 w, 256 w + 256): O_w = alpha O_w + P_hi V_w + P_lo V_w with wgmma m64n256k16 (A = P, K-major;
//    B = V = the first 512 dims of the same KV tile, read N-major; kPBf16: two m64n128k16 halves, S66). Two
//    barriers of the math warps per tile (row maxima exchanged, P written) and an mbarrier wait for the tile; a
//    tile's PV stays in flight under the next tile's S where that tile has landed (S72c). With p_precision
//    DDT_ATTN_P_BF16 (the kPBf16 instantiations) P is hi alone: no P lo stores and one PV product per tile (here and
//    on the narrow path).
//  - Loads: the producer warpgroup (its registers given to the math warpgroups with setmaxnreg) fills the two
//    KV stages as the math warps free them (mbarriers empty per stage, full per group of 3 boxes: S waits for each
//    group before its k-steps): TMA, one copy per group through a 3D tensor map (page_size and split_keys
//    multiples of 64), else cp.async by its 128 threads (any page
//    size; slots past the key range zero-filled). Per item it also computes the geometry and the page check and
//    hands them to the math warps through a two-slot ring in shared memory, and loads Q by TMA (one copy: the
//    latent 512 dims of 64 rows, or the narrow path's 16 rows x 576) once the math warps are done with the
//    previous item's Q; without the Q tensor maps the math warps load Q with cp.async.
//  - Requests of at most 16 rows (T 1 at H 8 / 16: decode) take the narrow path instead (process_narrow:
//    rows as wgmma's N, 8 for requests of at most 8 rows, else 16; S^T = K Q^T and O^T = V^T P^T, warpgroup 0 S
//    and softmax, warpgroup 1 PV), bitwise equal to the 64-row path above (docs/PERF_NOTES.md S14, S55).
//  - Partials of split items: stored by the math warps, except (planned calls) rows 0-31 of an item whose last tile
//    sits in KV stage 1 and that another item of the CTA follows: written into that stage and bulk-copied to the
//    workspace by the producer before it refills the stage (S65, stages_partials).
//  - Scheduling, checks, padding, poison, workspace and combine: exactly the portable kernel's
//    (verify_attn_sched.cuh; persistent CTAs over items numbered request by request, split then row tile, the
//    last split of a request of at most 128 rows and 32 splits listed after every other item: MainCounts).
// Compiled only for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL): other targets get an empty kernel and the launcher
// refuses devices other than compute capability 9.0.
#include <cuda.h>  // CUtensorMap (types only: encoded through the runtime's driver entry point)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include "kernels/common/validate.h"
#include "kernels/common/verify_attn_index.h"
#include "kernels/common/verify_attn_split.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/verify_attn_sched.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace ddtree::kern::attn {
namespace {

using namespace ddtree::kern::sm90;  // the wgmma wrappers, fences and descriptors (kernels/cuda/wgmma.cuh)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DDT_SM90_BODY 1
#else
#define DDT_SM90_BODY 0
#endif

// ---- config ----
constexpr int kRows = 64;                   // query rows per item (wgmma M)
constexpr int kKeys = 64;                   // keys per KV tile
constexpr int kBox = 64 * 128;              // one [64 rows][64 bf16] 128B-swizzled box: 8,192 bytes
constexpr int kQBytes = 8 * kBox;           // 65,536: Q's latent 512 dims
constexpr int kKvBytes = 9 * kBox;          // 73,728: one KV tile (576 dims)
constexpr int kPBytes = kBox;               //  8,192: P hi or P lo
// A KV tile lands in kKvGroups groups of kGroupBoxes boxes (dims 0-191, 192-383, 384-575), each completing its own
// full barrier, so S starts on the first group while the others land (docs/PERF_NOTES.md S59).
constexpr int kKvGroups = 3, kGroupBoxes = 3;
static_assert(kKvGroups * kGroupBoxes == 9, "the 9 boxes of a 576-dim KV tile");
constexpr int kOffQ = 0, kOffKv = kQBytes, kOffPHi = kOffKv + 2 * kKvBytes, kOffPLo = kOffPHi + kPBytes;
constexpr int kSmemUsed = kOffPLo + kPBytes;        // 229,376
constexpr int kSmemBytes = kSmemUsed + 1024;        // + alignment slack of the dynamic base
// Static shared memory (red, the mbarriers, the item ring, the item list, the narrow-mode slot): ~1 KB, which
// ptxas -v reports as 2,048 bytes; dynamic + static must stay within the 227 KB a CTA may have.
constexpr int kSmemStaticBound = 2048;
static_assert(kSmemBytes + kSmemStaticBound <= 232448, "sm_90: at most 227 KB of shared memory per CTA");
constexpr int kCtaThreads = kThreads + 128;   // + the producer warpgroup
static_assert(kThreads == 256 && kRows * 4 == kThreads, "Q loader: 4 threads per row, 16 chunks each");
static_assert(kCtaThreads - kThreads == 2 * kRows, "cp.async KV loader: 2 producer threads per key row");
static_assert(kDimQK == 576 && kDimV == 512, "tiling assumes 512 latent + 64 rope dims");
static_assert(2 * kPBytes >= kScanBufInts * 4, "the request scan (kScanBufInts) fits the P buffers");
// The narrow path (requests of at most kNarrowRows rows; process_narrow): rows are wgmma's N. Its buffers
// live in the wide path's Q region (the item's first math_bar separates the math warps' items of either path; the
// producer's Q copies into the region wait for q_empty / qregion_empty: Pipe):
constexpr int kNarrowRows = 16;                      // wgmma N: T 1 at H 8 / 16, T 2 at H 8
constexpr int kNBox = kNarrowRows * 128;             // 2,048: one [16 rows][64 bf16] 128B-swizzled box
constexpr int kOffNQ = kOffQ;                        // Q^T: 9 boxes (576 dims), 18,432
constexpr int kOffNP = kOffNQ + 9 * kNBox;           // by tile parity: P^T hi, P^T lo (2 x 2,048)
constexpr int kOffNPf = kOffNP + 2 * 2 * kNBox;      // P f32 [16 rows][64 keys] (warpgroup 0's row sums)
constexpr int kOffNRed = kOffNPf + kNarrowRows * kKeys * 4;   // [4 warps][16 rows] f32 maxima (+ spare)
constexpr int kOffNL = kOffNRed + 2 * 4 * kNarrowRows * 4;    // [16 rows][8] f32 row-sum partials
constexpr int kOffNFin = kOffNL + kNarrowRows * 8 * 4;        // [16 rows] final (m, l)
constexpr int kOffNAlpha = kOffNFin + kNarrowRows * 8;        // [2 parities][16 rows] f32 rescale factors
static_assert(kOffNAlpha + 2 * kNarrowRows * 4 <= kOffQ + kQBytes, "the narrow path's buffers fit the Q region");
static_assert(kOffNP % 1024 == 0 && kNBox % 1024 == 0, "P^T boxes start on 1,024-byte boundaries (swizzle atoms)");

// ---- PTX wrappers (sm_90a) ----
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
// (cp_async16 / cp_async_commit / cp_async_wait_all: verify_attn_sched.cuh)
// Generic-proxy writes to shared memory (cp.async, st.shared) made visible to the async proxy (wgmma reads).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Bulk copy shared -> global (bytes a multiple of 16, both 16-byte aligned), in this thread's bulk group.
__device__ __forceinline__ void bulk_store(void* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until this thread's committed bulk copies have read their shared-memory source / have completed.
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// mbarrier (shared::cta) and the bulk tensor copy (TMA) completing on it.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// One arrival on bar per warp (lane 0), after the whole warp got here (the math warps' releases of a stage, an
// info slot or the Q region: the barriers count warps).
__device__ __forceinline__ void warp_arrive(uint32_t bar, int lane) {
  __syncwarp();
  if (lane == 0) mbar_arrive(bar);
}
// One arrival on bar once every cp.async this thread issued so far has landed (the barrier's count includes it).
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Named barriers: 1 = the two math warpgroups (256 threads), 2 = the producer warpgroup (128); barrier 0 is
// __syncthreads (all 384: the shared driver's round boundaries only).
__device__ __forceinline__ void math_bar() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }
// 3 + w: math warpgroup w alone (128 threads; the narrow path's per-tile barriers).
__device__ __forceinline__ void wg_bar(int wg) { asm volatile("bar.sync %0, 128;\n" ::"r"(3 + wg) : "memory"); }
// An OR over one role's threads (a barrier of that role).
template <int kBarrier, int kCount>
__device__ __forceinline__ bool role_bar_or(bool v) {
  uint32_t r;
  asm volatile(
      "{\n.reg .pred in, out;\nsetp.ne.u32 in, %1, 0;\nbar.red.or.pred out, %2, %3, in;\nselp.u32 %0, 1, 0, out;\n}\n"
      : "=r"(r) : "r"(uint32_t(v)), "n"(kBarrier), "n"(kCount) : "memory");
  return r != 0;
}
// Register reallocation between warpgroups (every warp of the warpgroup executes it).
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
// Whether the phase of parity `parity` of bar has completed, without waiting (S72c).
__device__ __forceinline__ bool mbar_test(uint32_t bar, uint32_t parity) {
  uint32_t r;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(r) : "r"(bar), "r"(parity) : "memory");
  return r != 0;
}
// The OR of pred over math warpgroup wg's 128 threads (named barrier 3 + wg with a reduction; every thread of the
// warpgroup calls it): the same value in all of them, so a warpgroup-wide choice may depend on it (S72c).
__device__ __forceinline__ bool wg_any(int wg, bool pred) {
  uint32_t r;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbar.red.or.pred q, %2, 128, p;\nselp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(r) : "r"(uint32_t(pred)), "r"(3 + wg) : "memory");
  return r != 0;
}
// Brings the tensor map (a kernel parameter) into the TMA unit's descriptor cache before its first use.
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// One [64 rows][64 bf16] box of the 2D KV tensor map at (dim x, row y) into 128B-swizzled shared memory.
__device__ __forceinline__ void tma_load_box(uint32_t dst, const CUtensorMap* map, int x, int y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar) : "memory");
}
// Boxes of a 3D map {64 dims, rows, chunks} from row y and chunk z: the KV map (encode_kv_map: box [3 chunks][64
// rows][64 bf16], one group of a tile, i.e. the same swizzled boxes one after another) or Q's (encode_q_maps).
__device__ __forceinline__ void tma_load_tile3d(uint32_t dst, const CUtensorMap* map, int y, uint32_t bar, int z = 0) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(0), "r"(y), "r"(z), "r"(bar) : "memory");
}
// The same with an L2 eviction priority (policy: l2_policy_evict_first's).
__device__ __forceinline__ void tma_load_tile3d_hint(uint32_t dst, const CUtensorMap* map, int y, uint32_t bar, int z,
                                                     uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(0), "r"(y), "r"(z), "r"(bar), "l"(policy) : "memory");
}
// The L2 policy of the hinted KV copies: evict_first, for tiles no other CTA reads (a request of one row tile:
// its KV is read once per call), so the stream of KV does not push the split partials out of L2 before the
// combine reads them back. (Every other copy is unhinted: an evict_normal hint is not the same as none and
// cost ~1%, docs/PERF_NOTES.md S27.)
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}
// Bit i = ancestor bit t0 + i of a vis row of W words (0 where t0 + i lies outside [0, 64 W)).
__device__ __forceinline__ uint64_t vis_window(const uint64_t* row, int W, int64_t t0) {
  if (t0 <= -64) return 0;
  if (t0 < 0) return W > 0 ? row[0] << (-t0) : 0;
  const int64_t w = t0 >> 6;
  const int sh = int(t0 & 63);
  const uint64_t lo = w < W ? row[w] : 0, hi = w + 1 < W ? row[w + 1] : 0;
  return sh ? (lo >> sh) | (hi << (64 - sh)) : lo;
}

// The wide path's O rescale of acc[kBegin .. kEnd): the thread's row a (d[4 j], d[4 j + 1]) by alpha_a, row b
// (d[4 j + 2], d[4 j + 3]) by alpha_b.
template <int kBegin, int kEnd>
__device__ __forceinline__ void rescale_o(float (&acc)[128], float alpha_a, float alpha_b) {
#pragma unroll
  for (int j = kBegin / 4; j < kEnd / 4; ++j) {
    acc[4 * j] *= alpha_a;
    acc[4 * j + 1] *= alpha_a;
    acc[4 * j + 2] *= alpha_b;
    acc[4 * j + 3] *= alpha_b;
  }
}
// The bf16-P PV of one 128-dim half (S66): acc[kOff .. kOff + 63] rescaled, then the half's P V k-steps issued and
// committed (one commit group). dv: V's descriptor at the half's first dim. Only the half's registers are touched
// outside the wgmmas, so the other half's group may be in flight (ptxas does not serialise them: the ptxas check's
// C75xx grep).
template <int kOff>
__device__ __forceinline__ void pv_half(float (&acc)[128], float alpha_a, float alpha_b, uint64_t dp, uint64_t dv) {
  rescale_o<kOff, kOff + 64>(acc, alpha_a, alpha_b);
#pragma unroll
  for (int i = kOff; i < kOff + 64; ++i) asm volatile("" : "+f"(acc[i])::"memory");
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kKeys / 16; ++ks)
    wgmma_m64n128k16_ss_tb<kOff>(acc, dp + uint64_t(ks * 2), dv + uint64_t(ks * 128), 1);
  wgmma_commit();
}

// The item's geometry (computed from the item alone): rows [64 t, 64 t + 64) of request r against its split's
// key range [kb, ke) (kb = split x split_keys), or all keys when not split. The producer computes it with the
// page check (bad) and hands it to the math warps through shared memory (Pipe::info).
struct ItemGeom {
  Request q;
  bool shape_ok, is_split, bad;
  int rows_here;              // rows of this tile that exist (< 64 on a request's last tile)
  int64_t n_rows;             // the request's rows (nodes x heads)
  int64_t row0, tile_row0;    // global flattened row of the request's row 0; the tile's first request row
  int64_t prow0;              // workspace row of the tile's row 0 (split only)
  int64_t kb, ke, ntiles;     // key range and its 64-key tiles
};
// q: the item's request (make_request, or a planned record's copy of it).
__device__ ItemGeom item_geom(const ddt_verify_attn_params& p, int split_keys, const Item item, const Request& q) {
  ItemGeom g;
  g.q = q;
  const int64_t n_rows = int64_t(g.q.nodes) * p.heads;
  g.n_rows = n_rows;
  g.shape_ok = request_shape_ok(p, g.q);
  const SplitPlan plan = split_plan(g.shape_ok ? g.q.keys : 0, n_rows, split_keys, kRows);
  const int t = item.local % plan.row_tiles, split = item.local / plan.row_tiles;
  g.is_split = plan.splits > 1;
  g.row0 = int64_t(g.q.first_row) * p.heads;
  g.tile_row0 = int64_t(t) * kRows;
  g.rows_here = n_rows - g.tile_row0 < kRows ? int(n_rows - g.tile_row0) : kRows;
  g.prow0 = int64_t(item.partial_base) + int64_t(split) * n_rows + g.tile_row0;
  g.kb = g.is_split ? int64_t(split) * split_keys : 0;
  g.ke = g.is_split ? min(g.q.keys, g.kb + split_keys) : g.q.keys;
  g.ntiles = (g.ke - g.kb + kKeys - 1) / kKeys;
  return g;
}
// The request of a planned record (no global reads: the plan kernel copied node_offsets and prefix_lens).
__device__ __forceinline__ Request planned_request(const ddt_verify_attn_params& p, const PlanItem& rec) {
  return request_of(p, rec.r, rec.first_row, rec.nodes, rec.prefix);
}
// Is the request's shape or a page of the key range bad? The producer warpgroup decides it (an OR over its
// threads, each checking a strided share of the pages, through barrier 2) and publishes it with the geometry.
// The pages first, first + stride, ... of the item's key range, or its shape, bad? (One thread's share; no early
// exit, so the loads stay in flight.)
__device__ __forceinline__ bool item_pages_bad(const ddt_verify_attn_params& p, const ItemGeom& g, int first, int stride) {
  bool bad = !g.shape_ok;
  if (!bad && g.ke > g.kb) {
    const int64_t pg0 = g.kb / p.page_size, pg1 = (g.ke + p.page_size - 1) / p.page_size;
    for (int64_t k = pg0 + first; k < pg1; k += stride) bad |= !page_ok(p, g.q, k);
  }
  return bad;
}
__device__ bool item_bad(const ddt_verify_attn_params& p, const ItemGeom& g) {
  constexpr int kRole = kCtaThreads - kThreads;
  return role_bar_or<2, kRole>(item_pages_bad(p, g, int(threadIdx.x) - kThreads, kRole));
}

// The kernel's narrow_mode argument, kept in shared memory (written by thread 0 before the first barrier):
// a register would stay live across the persistent loops.
__device__ __forceinline__ int& narrow_mode_slot() {
  __shared__ int mode;
  return mode;
}

// The KV pipeline: two stages; full[b][g] completes when group g (kKvGroups) of stage b's tile has landed (TMA: one
// arrival with the group's byte count; cp.async: one arrival per producer thread when its copies land, on every
// group), empty[b] when the 8 math warps are done reading it. Parities: bit b = the parity of stage b's next
// completion, kept across items (every tile of every item goes through the same two stages in order, tile kt in stage
// kt & 1).
// Per item the producer also hands the math warps the item's geometry (ItemGeom incl. the page check) through
// a ring of two slots (mbarriers info_full / info_empty per slot), and, with Q tensor maps (qtma), loads the
// item's Q into the Q region by TMA as soon as the math warps are done with the previous item's Q (q_empty:
// after the last tile's S), so neither the scalars' and page table's latency nor Q's sits at the start of an item.
// The narrow path keeps its scratch (P^T, f32 P, maxima, row sums) in the Q region beside Q^T until the item's end,
// so the region has two releases (S70): q_empty once Q (Q^T) is no longer read (the wide path and the narrow
// warpgroup 0 after the last tile's S; the narrow warpgroup 1, which never reads Q^T, at its item's start) and
// qregion_empty at the narrow item's end (the wide path: with q_empty). The next item's Q^T overwrites only Q^T and
// waits for q_empty alone; a wide Q covers the scratch and waits for both.
// Phase words (one per thread, bits): KV stages 0, 1; info slots 2, 3; Q 4; the next info slot 5; the producer's
// qregion_empty 6.
struct Pipe {
  const CUtensorMap* map;
  const CUtensorMap* qmap_wide;    // q as {64 dims, rows, 8 chunks}: box {64, 64, 8} = Q's latent 8 boxes
  const CUtensorMap* qmap_narrow;  // q as {64 dims, rows, 9 chunks}: box {64, 16, 9} = the narrow Q^T boxes
  ItemGeom* info;                  // [2] (shared memory)
  uint32_t full, empty;  // shared addresses of the two mbarriers each (8 bytes apart)
  uint32_t info_full, info_empty, q_full, q_empty, qregion_empty;
  bool tma;              // TMA (page_size and split_keys multiples of 64) or cp.async
  bool tile3d;           // the map is 3D: one copy per group of a tile (else 9 boxes of the 2D map)
  bool qtma;             // Q by TMA from the producer (else cp.async by the math warps)
  bool kv_evict_first;   // KV copies of one-row-tile requests marked L2 evict_first (kv_l2_evict_first)
};
// S65 (docs/PERF_NOTES.md): a split item of the wide path whose last tile sits in KV stage 1 (an even number of
// tiles; TMA path) hands rows 0-31 of its f32 partial o to the producer through that stage: the math warps holding
// them write the rows there (kStagedRowBytes apart: 2,064 B, so a warp's 16-byte stores to 8 rows are 4-way, the
// minimum) and release the stage only then; the producer, which refills the stage next, bulk-copies them to the
// workspace first (flush_staged). Rows 32-63 and (m, l) keep their direct stores. The same values at the same
// addresses as the direct stores: the bits do not depend on the path.
constexpr int kStagedRows = 32, kStagedRowBytes = kDimV * 4 + 16;
static_assert(kStagedRows * kStagedRowBytes <= kKvBytes, "the staged partial rows fit in one KV stage");
// Only in the planned instantiations (the unplanned producer spills with it) and for an item another item of the
// CTA follows (the last one's copies would wait for its epilogue and lengthen the CTA's tail: batch 1 lost 2-5%).
__device__ __forceinline__ bool stages_partials(const Pipe& pipe, bool is_split, int64_t ntiles, bool has_next) {
  return pipe.tma && has_next && is_split && ntiles >= 2 && (ntiles & 1) == 0;
}
// The producer's record of rows staged in stage 1 and not yet copied out (rows 0: none).
struct StagedRows {
  int64_t prow0 = 0;  // workspace row of staged row 0
  int rows = 0;
};
// One bulk copy per staged row, then until they have read the stage (the caller may refill it after this).
__device__ __forceinline__ void flush_staged(StagedRows& st, float* ws_o, uint32_t sbase) {
#pragma unroll 1
  for (int i = 0; i < st.rows; ++i)
    bulk_store(ws_o + (st.prow0 + i) * kDimV, sbase + uint32_t(kOffKv + kKvBytes + i * kStagedRowBytes), kDimV * 4);
  bulk_commit();
  bulk_wait_read();
  st.rows = 0;
}
// Full barrier of KV group gr (kKvGroups per tile) of stage buf.
__device__ __forceinline__ uint32_t full_bar(const Pipe& pipe, int buf, int gr) {
  return pipe.full + 8u * uint32_t(kKvGroups * buf + gr);
}
// Waits until the whole KV tile of stage buf (every group) has landed; par: the stage's phase.
__device__ __forceinline__ void wait_tile(const Pipe& pipe, int buf, uint32_t par) {
#pragma unroll
  for (int gr = 0; gr < kKvGroups; ++gr) mbar_wait(full_bar(pipe, buf, gr), par);
}

// The producer warpgroup's share of an item: wait until a stage is free, look up where the tile lives, issue
// its copies. TMA: thread 256 alone, one copy (3D map) or 9 boxes of [64 keys][64 dims] from the tile's page
// (page_size and the range start are multiples of 64: a tile's 64 keys lie in one page; rows past ke are
// zeroed by the math warps after the copy lands). cp.async: 2 threads per key row, 36 16-byte chunks each,
// slots past the range zero-filled, completion tracked per thread on full[b] (cp.async.mbarrier.arrive).
// rec: the item's planned record (a planned call: the geometry from it without global reads, its page check
// verdict, the first tile's page for the TMA path), else null.
// staged[0]: rows an earlier item left in stage 1 (S65), copied out before the stage is refilled; staged[1]: this
// item's, which become staged[0] after its tiles (both in shared memory: the producer's registers are few).
template <bool kStage>
__device__ void produce_item(const ddt_verify_attn_params& p, int split_keys, const Item item, const PlanItem* rec,
                             uint32_t sbase, const Pipe& pipe, uint32_t& empty_phase, float* ws_o,
                             StagedRows* staged, bool has_next) {
#if DDT_SM90_BODY
  // (No barrier with the math warps: the stages, the item's geometry and Q are handed over through mbarriers
  // alone, so the next item's geometry, Q and first tiles load while the math warps finish this one.)
  ItemGeom g = item_geom(p, split_keys, item, rec ? planned_request(p, *rec) : make_request(p, item.r));
  DDT_PROF_CTA_AT(9, kThreads, true);
  const int pt = int(threadIdx.x) - kThreads;  // 0 .. 127
  // The geometry and page check to the math warps first, then Q by TMA (once per item of a good shape) as soon
  // as the previous item is done with what this Q overwrites (a narrow Q^T: the previous Q; a wide Q: the whole
  // region, a narrow item's scratch included), then the tiles: the math warps get the geometry as early as
  // possible, and Q, issued before the first tile's page lookup, lands before the first tile.
  const bool q_load = pipe.qtma && g.shape_ok;
  const bool narrow = narrow_mode_slot() != 0 && g.n_rows <= kNarrowRows;
  // (first use of each: passes; both barriers complete once per item that loads Q, so both parities flip for each)
  const uint32_t q_free_parity = ((empty_phase >> 4) & 1u) ^ 1u, region_free_parity = ((empty_phase >> 6) & 1u) ^ 1u;
  if (q_load) empty_phase ^= (1u << 4) | (1u << 6);
  auto issue_q = [&] {
    // The narrow path's Q^T [9 boxes][16 rows][64 dims] or the wide path's latent Q [8 boxes][64 rows][64
    // dims] (rows past the request: the next rows of q, or zeros past its end; their scores reach only their
    // own rows, which are never stored).
    mbar_expect_tx(pipe.q_full, narrow ? uint32_t(9 * kNBox) : uint32_t(kQBytes));
    tma_load_tile3d(sbase + uint32_t(narrow ? kOffNQ : kOffQ), narrow ? pipe.qmap_narrow : pipe.qmap_wide,
                    int(g.row0 + (narrow ? 0 : g.tile_row0)), pipe.q_full);
  };
  g.bad = rec ? rec->bad != 0 : item_bad(p, g);  // (uniform over the producer: item_bad has a role barrier)
  DDT_PROF_CTA_AT(10, kThreads, true);
  const int slot = int(empty_phase >> 5) & 1;
  if (pt == 0) {
    mbar_wait(pipe.info_empty + 8u * uint32_t(slot), ((empty_phase >> (2 + slot)) & 1u) ^ 1u);  // first use: passes
    pipe.info[slot] = g;
    mbar_arrive(pipe.info_full + 8u * uint32_t(slot));  // (release: the math warps read the slot after their wait)
    DDT_PROF_CTA_AT(12, kThreads, true);
    if (q_load) {
      // (This order matters: q_empty's phase for the previous Q-loading item completes only after that item started,
      // so every item before it has ended and qregion_empty is at most one phase behind the wait below; waited the
      // other way round, a wide item after two narrow ones could pass on a stale phase.)
      mbar_wait(pipe.q_empty, q_free_parity);
      if (!narrow) mbar_wait(pipe.qregion_empty, region_free_parity);  // (a narrow item's scratch: S70)
      issue_q();
    }
    DDT_PROF_CTA_AT(13, kThreads, true);
  }
  empty_phase ^= (1u << 5) | (1u << (2 + slot));
  if (g.bad) return;
  if (pipe.tma && pt != 0) return;
  // (a wide split item of an even number of tiles leaves its rows 0-31 in stage 1: process_item's epilogue; TMA
  // only, where thread 256 alone gets here: stages_partials needs TMA, and the cp.async path's 128 threads would
  // write the same zero without a barrier)
  if constexpr (kStage)
    if (pipe.tma)
      staged[1] = StagedRows{g.prow0, !narrow &&
                                              stages_partials(pipe, g.is_split, g.ntiles, has_next)
                                          ? int(g.rows_here < kStagedRows ? g.rows_here : kStagedRows)
                                          : 0};
  const int row = pipe.tma ? 0 : pt >> 1, half = pt & 1;
  const int64_t table_row = int64_t(g.q.r) * p.max_pages;
  // (evict_first where no other CTA of this call reads the tile: a request of one row tile; the 3D map's copy
  // only: the 2D map's 9 boxes, the fallback, stay unhinted)
  const bool evict_first = pipe.kv_evict_first && g.n_rows <= kRows;
  const uint64_t kv_policy = l2_policy_evict_first();  // (used only when evict_first)
#pragma unroll 1
  for (int64_t kt = 0; kt < g.ntiles; ++kt) {
    const int buf = int(kt & 1);
    const int64_t j = g.kb + kt * kKeys + row;  // this thread's key
    const bool in = j < g.ke;
    const int64_t lpage = j / p.page_size;
    // (an entry past the range may be anything: clamp the lookup, use page 0 for slots not loaded)
    // (a planned TMA item's first tile: the page from its record; the plan kernel read the same entry)
    int32_t page = rec && pipe.tma && kt == 0 ? rec->first_page
                                              : p.page_table[table_row + (lpage < g.q.pages ? lpage : g.q.pages - 1)];
    // A planned item's pages were checked when the plan was made; a page table changed since (a stale plan:
    // undefined results) must still not send a copy out of the cache. (Unplanned: checked above, rec null.)
    if (rec && (page < 0 || int64_t(page) >= p.num_pages)) page = 0;
    const int64_t slot = (in ? int64_t(page) : 0) * p.page_size + (j - lpage * p.page_size);
    DDT_PROF_CTA_AT(14, kThreads, true);
    mbar_wait(pipe.empty + 8u * uint32_t(buf), ((empty_phase >> buf) & 1u) ^ 1u);  // first use: passes
    empty_phase ^= 1u << buf;
    if constexpr (kStage)
      if (buf == 1 && staged[0].rows > 0) flush_staged(staged[0], ws_o, sbase);  // (rows > 0: TMA, pt 0 alone)
    const uint32_t bar = pipe.full + 8u * uint32_t(kKvGroups * buf), dst = sbase + uint32_t(kOffKv + buf * kKvBytes);
    if (pipe.tma) {
#pragma unroll 1
      for (int gr = 0; gr < kKvGroups; ++gr) {  // (group gr completes full barrier gr of the stage)
        const uint32_t bar_g = bar + 8u * uint32_t(gr), dst_g = dst + uint32_t(gr * kGroupBoxes * kBox);
        mbar_expect_tx(bar_g, uint32_t(kGroupBoxes * kBox));
        if (pipe.tile3d) {
          if (evict_first) tma_load_tile3d_hint(dst_g, pipe.map, int(slot), bar_g, gr * kGroupBoxes, kv_policy);
          else tma_load_tile3d(dst_g, pipe.map, int(slot), bar_g, gr * kGroupBoxes);
        } else {
#pragma unroll 1
          for (int b = 0; b < kGroupBoxes; ++b)
            tma_load_box(dst_g + uint32_t(b * kBox), pipe.map, 64 * (gr * kGroupBoxes + b), int(slot), bar_g);
        }
      }
      DDT_PROF_CTA_AT(11, kThreads, true);
    } else {
      const uint16_t* src = p.kv_cache + slot * kDimQK;
#pragma unroll 4
      for (int i = 0; i < 36; ++i) {
        const int ch = half + 2 * i;
        cp_async16(dst + uint32_t((ch >> 3) * kBox) + sw128_off(row, ch & 7), src + ch * 8, in ? 16 : 0);
      }
#pragma unroll
      for (int gr = 0; gr < kKvGroups; ++gr) cp_async_mbar_arrive(bar + 8u * uint32_t(gr));  // (all land together)
    }
  }
  if constexpr (kStage)
    if (pipe.tma && staged[1].rows > 0) staged[0] = staged[1];  // (else an earlier item's rows may still wait there)
#endif
}

// Named barriers of 256 threads by id (the narrow path's handovers: ready 5 + b, free 7 + b).
__device__ __forceinline__ void named_bar_sync(int id) { asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory"); }
__device__ __forceinline__ void named_bar_arrive(int id) { asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory"); }

// The narrow path: an item of a request with at most kNarrowRows (16) rows (T 1 at H 8 / 16: decode), so
// the wide path's 64-row tiles would be 1/8 to 1/4 used. The rows become wgmma's N instead of its M:
//   S^T [64 keys x N rows] = K Q^T  (m64nNk16, N = 8 for requests of at most 8 rows, else 16; A = the KV
//                                     tile's 9 boxes as they lie (K-major, the wide path's B), B = Q^T: [9 boxes]
//                                     [16 rows][64 dims], K-major (N = 8 reads rows 0-7); 36 k-steps in the wide
//                                     path's order: 32 latent, then 4 rope)
//   O^T [512 dims x N rows] += V^T P^T (m64nNk16, A = V read MN-major (the wide path's V descriptor),
//                                     B = P^T hi, then P^T lo: [16 rows][64 keys] bf16, K-major)
// Roles: warpgroup 0 computes S^T, the masks, the row maxima and P (and the row sums); warpgroup 1 holds
// all of O^T (8 accumulators of 64 dims) and runs PV. They hand over P^T (hi, lo) and the rescale factors
// through two buffers by tile parity (named barriers: "ready" 5 + b, warpgroup 0 arrives after writing
// buffer b, warpgroup 1 syncs; "free" 7 + b, warpgroup 1 arrives after its PV read buffer b, warpgroup 0
// syncs before rewriting it two tiles later), so tile t's PV runs under tile t + 1's S and softmax.
// Every row's result is bitwise the wide path's (FIDELITY rule E: a chain node, computed in a wide item,
// equals the same row decoded alone, a narrow item): the same k-step order, the same scale / exp2 / hi-lo
// formulas, and the row sums in the wide path's order (per (warpgroup, quad lane) partials over the same
// keys: warpgroup 0's thread t holds row t / 8, partial t % 8, read from P in f32 in shared memory; then
// the same adds). It relies on a wgmma dot product giving the same bits with its operands swapped (checked
// bitwise on the GPU by ChainNodeEqualsSingleNodeDecodeBitwise and Sm90NarrowPathEqualsWidePathBitwise).
// Thread (warp v of a warpgroup, lane g * 4 + c) holds S^T / O^T elements d[4 j + 2 h + e] = (key or dim
// 16 v + g + 8 h, row 8 j + 2 c + e), j, h, e in {0, 1}.
// kN: wgmma's N, the rows an item may have: 8 (requests of <= 8 rows: T 1 at H 8) or 16; the buffers keep the
// 16-row layout either way (N = 8 reads rows 0-7 of each swizzle atom). kJ = kN / 8 column groups, kI = 2 kJ rows
// per thread (row n = 8 (i >> 1) + 2 c + (i & 1)).
template <int kN, bool kPBf16>
__device__ __forceinline__ void process_narrow(const ddt_verify_attn_params& p, const ItemGeom& geo, unsigned char* base, float* ws_o,
                               float* ws_ml, const Pipe& pipe, uint32_t& full_phase, uint32_t q_parity) {
#if DDT_SM90_BODY
  static_assert(kN == 8 || kN == 16, "narrow path: N = 8 or 16");
  constexpr int kJ = kN / 8, kI = 2 * kJ;
  // (tid from an opaque move: values derived from it stay inside the item instead of being hoisted out of
  // the persistent loops, where they would be live across the wide path too and spill)
  int tid = threadIdx.x;
  asm volatile("" : "+r"(tid));
  const int lane = tid & 31, wv = (tid >> 5) & 3, wt = tid & 127;
  const int role = __shfl_sync(0xFFFFFFFFu, tid >> 7, 0);  // (uniform per warp, and visibly so to ptxas)
  const int g = lane >> 2, c = lane & 3;
  const int H = p.heads;
  const Request& q = geo.q;
  const int64_t row0 = geo.row0, prow0 = geo.prow0, kb = geo.kb, ke = geo.ke, ntiles = geo.ntiles;
  const int rows_here = geo.rows_here;
  DDT_PROF_START(tp);
  const uint32_t sbase = smem_u32(base);
  const uint32_t sq = sbase + kOffNQ;
  float* fin = reinterpret_cast<float*>(base + kOffNFin);  // [16] x (m, l)
  float* alpha_buf = reinterpret_cast<float*>(base + kOffNAlpha);  // [2 parities][16]
  if (pipe.qtma) {
    mbar_wait(pipe.q_full, q_parity);  // Q^T by the producer's TMA
  } else {
    cp_async_wait_all();  // Q^T (every math thread issued a share)
    fence_proxy_async();
    math_bar();
  }

  if (role == 0) {
    // ---- warpgroup 0: S^T, masks, maxima, P, row sums ----
    float* pf = reinterpret_cast<float*>(base + kOffNPf);      // [16][64]
    float* red = reinterpret_cast<float*>(base + kOffNRed);    // [4 warps][16]
    float* lpart = reinterpret_cast<float*>(base + kOffNL);    // [16][8]
    const float scale_log2 = p.softmax_scale * kLog2e;
    float m_run[kI];  // running max (log2 units) of this thread's rows n = 8 j + 2 c + e (index i = 2 j + e)
#pragma unroll
    for (int i = 0; i < kI; ++i) m_run[i] = num::kNegInf;
    // The row-sum threads: row ln, the wide path's share of its warpgroup lw, quad lane lc.
    const int ln = wt >> 3, lw = (wt >> 2) & 1, lc = wt & 3;
    float l_m = num::kNegInf, l_part = 0.0f;
#pragma unroll 1
    for (int64_t it = 0; it < ntiles; ++it) {
      const int buf = __shfl_sync(0xFFFFFFFFu, int(it & 1), 0);  // (warp-uniform for ptxas: S46)
      const int64_t k0 = kb + it * kKeys;
      DDT_PROF_COUNT(10);
      const int64_t past = k0 + kKeys - ke;
      // (TMA: S^T waits for each group of boxes before its k-steps; the whole tile first where rows past the range
      // are zeroed, and for cp.async, whose copies land together)
      if (!pipe.tma || past > 0) wait_tile(pipe, buf, (full_phase >> buf) & 1u);
      full_phase ^= 1u << buf;  // (the group waits below: the parity before this flip)
      if (!pipe.tma) fence_proxy_async();  // cp.async (generic proxy) writes before wgmma reads them
      // As the wide path: zero the rows TMA copied past the key range. (This loop and the mask below repeat the
      // wide path's on purpose: shared inline helpers for them changed the whole kernel's register allocation,
      // 92 / 124 -> 188 / 440 B of spills, checked with ptxas -v.)
      if (pipe.tma && past > 0) {
        unsigned char* kvb = base + kOffKv + buf * kKvBytes;
        const int first = kKeys - int(past);
        for (int i = wt; i < int(past) * 72; i += 128) {
          const int r = first + i / 72, ch = i % 72;
          *reinterpret_cast<uint4*>(kvb + (ch >> 3) * kBox + sw128_off(r, ch & 7)) = make_uint4(0, 0, 0, 0);
        }
        fence_proxy_async();
        wg_bar(0);  // (warpgroup 1 reads the tile after "ready", which comes later)
      }
      DDT_PROF_LAP(2, tp);  // waiting for the tile's bytes
      DDT_PROF_CTA(2, true);
      const uint32_t skv = sbase + uint32_t(kOffKv + buf * kKvBytes);

      // S^T = K Q^T over the 576 dims.
      float s[kN / 2];
      reg_fence(s);
      const uint64_t dk0 = sw128_desc(skv, 16, 1024), dq0 = sw128_desc(sq, 16, 1024);
#pragma unroll
      for (int gr = 0; gr < kKvGroups; ++gr) {  // (a group's k-steps once its boxes landed: one commit group each)
        mbar_wait(full_bar(pipe, buf, gr), ((full_phase >> buf) & 1u) ^ 1u);  // (at once if the tile was waited for)
        wgmma_fence();
#pragma unroll
        for (int st = 4 * kGroupBoxes * gr; st < 4 * kGroupBoxes * (gr + 1); ++st) {
          const uint64_t offk = uint64_t(((st >> 2) * kBox + (st & 3) * 32) >> 4);
          const uint64_t offq = uint64_t(((st >> 2) * kNBox + (st & 3) * 32) >> 4);
          wgmma_narrow<kN, 0, 0>(s, dk0 + offk, dq0 + offq, st > 0);
        }
        wgmma_commit();
      }
      wgmma_wait_all();
      reg_fence(s);
      warp_arrive(pipe.empty + 8u * uint32_t(buf), lane);  // this warp is done with the stage
      if (pipe.qtma && it == ntiles - 1) warp_arrive(pipe.q_empty, lane);  // ... and with Q^T (S70)
      DDT_PROF_LAP(5, tp);  // S^T

      // Scale and mask (the wide path's masks, per row), max over this thread's 2 keys, the 8 lanes of
      // equal c (the warp's 16 keys), then the 4 warps through shared memory.
      uint64_t vm[kI];
#pragma unroll
      for (int i = 0; i < kI; ++i) vm[i] = ~uint64_t(0);
      if (!(k0 + kKeys <= q.prefix && k0 + kKeys <= ke)) {
        const int64_t t0 = k0 - q.prefix, n_in = ke - k0;
        const uint64_t in_mask = n_in >= 64 ? ~uint64_t(0) : (uint64_t(1) << n_in) - 1;
        const uint64_t pre_mask = t0 >= 0 ? 0 : (t0 <= -64 ? ~uint64_t(0) : (uint64_t(1) << -t0) - 1);
#pragma unroll
        for (int i = 0; i < kI; ++i) {  // (the vis rows looked up here: few registers live across the loop)
          const int n = 8 * (i >> 1) + 2 * c + (i & 1);
          const uint64_t* vis = p.vis + (int64_t(q.first_row) + n / H) * p.vis_words;
          vm[i] = ((n < rows_here ? vis_window(vis, p.vis_words, t0) : 0) | pre_mask) & in_mask;
        }
      }
      const int ka = 16 * wv + g;  // this thread's keys ka, ka + 8
      float mx[kI];
#pragma unroll
      for (int i = 0; i < kI; ++i) {
        const int ri = 4 * (i >> 1) + (i & 1);  // s[ri] = (ka, row i), s[ri + 2] = (ka + 8, row i)
        s[ri] = (vm[i] >> ka) & 1u ? __fmul_rn(s[ri], scale_log2) : num::kNegInf;
        s[ri + 2] = (vm[i] >> (ka + 8)) & 1u ? __fmul_rn(s[ri + 2], scale_log2) : num::kNegInf;
        mx[i] = fmaxf(s[ri], s[ri + 2]);
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], 4));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], 8));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], 16));
      }
      if (g == 0)
#pragma unroll
        for (int i = 0; i < kI; ++i) red[wv * kNarrowRows + 8 * (i >> 1) + 2 * c + (i & 1)] = mx[i];
      DDT_PROF_LAP(13, tp);  // mask, scale, max
      wg_bar(0);  // (B) the 4 warps' maxima
      DDT_PROF_LAP(6, tp);
      // (a max is exact: any order gives the wide path's value)
      auto tile_max = [&](int n) {
        return fmaxf(fmaxf(red[n], red[kNarrowRows + n]), fmaxf(red[2 * kNarrowRows + n], red[3 * kNarrowRows + n]));
      };
      float muse[kI], alpha[kI];
#pragma unroll
      for (int i = 0; i < kI; ++i) {
        const float mnew = fmaxf(m_run[i], tile_max(8 * (i >> 1) + 2 * c + (i & 1)));
        muse[i] = mnew == num::kNegInf ? 0.0f : mnew;
        alpha[i] = exp2_ftz(m_run[i] - muse[i]);
        m_run[i] = mnew;
      }
      float alpha_l;
      {  // the row-sum thread's row (read here: red is rewritten after the next tile's barrier B)
        const float mnew = fmaxf(l_m, tile_max(ln));
        const float mu = mnew == num::kNegInf ? 0.0f : mnew;
        alpha_l = exp2_ftz(l_m - mu);
        l_m = mnew;
      }
      // P = exp2(s - m) as bf16 hi + lo (kPBf16: hi alone) into P^T [row][key] of buffer buf (K-major,
      // swizzled), f32 P for the row sums, the rescale factors for warpgroup 1. (Store offsets from an opaque copy of
      // the thread index, recomputed each tile: hoisted out of the persistent loops they are spilled.)
      if (it >= 2) named_bar_sync(7 + buf);  // warpgroup 1's PV of tile it - 2 is done with buffer buf
      unsigned char* phi = base + kOffNP + buf * 2 * kNBox;
      unsigned char* plo = phi + kNBox;
      int tl = tid;
      asm volatile("" : "+r"(tl));
      const int cl = tl & 3, kal = 16 * ((tl >> 5) & 3) + ((tl >> 2) & 7);
#pragma unroll
      for (int i = 0; i < kI; ++i) {
        const int n = 8 * (i >> 1) + 2 * cl + (i & 1), ri = 4 * (i >> 1) + (i & 1);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int key = kal + 8 * h;
          const float pv = exp2_ftz(s[ri + 2 * h] - muse[i]);
          const __nv_bfloat16 hi = __float2bfloat16_rn(pv);
          const uint32_t off = sw128_off(n, key >> 3) + 2 * (key & 7);
          *reinterpret_cast<__nv_bfloat16*>(phi + off) = hi;
          if constexpr (!kPBf16)
            *reinterpret_cast<__nv_bfloat16*>(plo + off) = __float2bfloat16_rn(pv - __bfloat162float(hi));
          pf[n * kKeys + key] = pv;
        }
        if (kal == 0) alpha_buf[buf * kNarrowRows + n] = alpha[i];  // (warp 0, lanes 0 .. 3: the 16 rows)
      }
      fence_proxy_async();
      named_bar_arrive(5 + buf);  // P^T of tile it ready for warpgroup 1
      DDT_PROF_LAP(7, tp);  // exp2, P^T stores
      wg_bar(0);  // (C) P f32 complete
      {  // the wide path's share: keys 32 lw + 8 j + 2 lc (+ 1), j = 0 .. 3, summed in that order
        const float* pr = pf + ln * kKeys + 32 * lw + 2 * lc;
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) sum += pr[8 * j] + pr[8 * j + 1];
        l_part = __fmaf_rn(l_part, alpha_l, sum);
      }
      DDT_PROF_LAP(8, tp);  // barrier C and the row sums
    }
    if (pipe.qtma && ntiles <= 0) warp_arrive(pipe.q_empty, lane);  // (no tile, no S^T: Q^T released here)
    lpart[ln * 8 + lw * 4 + lc] = l_part;
    if ((wt & 7) == 0) fin[2 * ln] = l_m;
  } else {
    // ---- warpgroup 1: O^T = alpha O^T + V^T P_hi^T + V^T P_lo^T (kPBf16: no P_lo term), all 512 dims ----
    if (pipe.qtma) warp_arrive(pipe.q_empty, lane);  // (this warpgroup never reads Q^T; S70)
    float acc[8][kN / 2];  // O^T blocks: dims 64 b + 16 wv + g (+ 8)
#pragma unroll
    for (int b = 0; b < 8; ++b)
#pragma unroll
      for (int r = 0; r < kN / 2; ++r) acc[b][r] = 0.0f;
#pragma unroll 1
    for (int64_t it = 0; it < ntiles; ++it) {
      const int buf = __shfl_sync(0xFFFFFFFFu, int(it & 1), 0);  // (warp-uniform for ptxas: S46)
      wait_tile(pipe, buf, (full_phase >> buf) & 1u);  // (the tile's bytes visible here)
      full_phase ^= 1u << buf;
      if (!pipe.tma) fence_proxy_async();  // cp.async (generic proxy) writes before wgmma reads them
      named_bar_sync(5 + buf);  // P^T and the rescale factors of tile it
      float alpha[kI];
#pragma unroll
      for (int i = 0; i < kI; ++i) alpha[i] = alpha_buf[buf * kNarrowRows + 8 * (i >> 1) + 2 * c + (i & 1)];
#pragma unroll
      for (int b = 0; b < 8; ++b)
#pragma unroll
        for (int r = 0; r < kN / 2; ++r) acc[b][r] *= alpha[2 * (r >> 2) + (r & 1)];
#pragma unroll
      for (int b = 0; b < 8; ++b) reg_fence(acc[b]);
      wgmma_fence();
      const uint32_t skv = sbase + uint32_t(kOffKv + buf * kKvBytes);
      const uint32_t sphi = sbase + uint32_t(kOffNP + buf * 2 * kNBox), splo = sphi + kNBox;
      const uint64_t dphi = sw128_desc(sphi, 16, 1024), dplo = sw128_desc(splo, 16, 1024);
#pragma unroll
      for (int b = 0; b < 8; ++b) {
        const uint64_t dv = sw128_desc(skv + uint32_t(b * kBox), kBox, 1024);
#pragma unroll
        for (int ks = 0; ks < kKeys / 16; ++ks)
          wgmma_narrow<kN, 1, 0>(acc[b], dv + uint64_t(ks * 128), dphi + uint64_t(ks * 2), 1);
        if constexpr (!kPBf16)
#pragma unroll
          for (int ks = 0; ks < kKeys / 16; ++ks)
            wgmma_narrow<kN, 1, 0>(acc[b], dv + uint64_t(ks * 128), dplo + uint64_t(ks * 2), 1);
      }
      wgmma_commit();
      wgmma_wait_all();
#pragma unroll
      for (int b = 0; b < 8; ++b) reg_fence(acc[b]);
      if (it + 2 < ntiles) named_bar_arrive(7 + buf);  // buffer buf free (warpgroup 0 waits only for it >= 2)
      warp_arrive(pipe.empty + 8u * uint32_t(buf), lane);
    }
    math_bar();  // warpgroup 0's (m, l) partials written
    math_bar();  // the final l
    // Split: the partial positions (partial_pos) of dims 16 k + g and 16 k + 8 + g (k = 4 b + wv) are 4 (g / 2) +
    // (g & 1) and + 2: lanes g and g ^ 1 (lane ^ 4, the same rows) swap one value, so even g writes the float2 at
    // 4 (g / 2) and odd g the one at 4 (g / 2) + 2 (whole 32-byte sectors; the same values at the same positions).
    // (split through a shuffle from lane 0: visibly warp-uniform to ptxas, which otherwise guards every shuffle
    // below with a divergence check and a slow path, as it did in the unplanned build)
    const bool odd = (g & 1) != 0, split = __shfl_sync(0xFFFFFFFFu, geo.is_split ? 1 : 0, 0) != 0;
#pragma unroll
    for (int i = 0; i < kI; ++i) {
      const int n = 8 * (i >> 1) + 2 * c + (i & 1);
      const bool row_in = n < rows_here;  // (the same for lanes g and g ^ 1: the shuffles run on every lane)
      if (split) {
#pragma unroll
        for (int b = 0; b < 8; ++b) {
          const float v0 = acc[b][4 * (i >> 1) + (i & 1)], v1 = acc[b][4 * (i >> 1) + 2 + (i & 1)];
          const float other = __shfl_xor_sync(0xFFFFFFFFu, odd ? v0 : v1, 4);
          if (row_in) {
            const int pos = (partial_pos(64 * b + 16 * wv + g) & ~1) + (odd ? 2 : 0);
            *reinterpret_cast<float2*>(ws_o + (prow0 + n) * kDimV + pos) = odd ? make_float2(other, v1)
                                                                               : make_float2(v0, other);
          }
        }
        continue;
      }
      if (!row_in) continue;
      const float l = fin[2 * n + 1];
      const float inv = l != 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
      for (int b = 0; b < 8; ++b)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int d = 64 * b + 16 * wv + g + 8 * h;
          const float v = acc[b][4 * (i >> 1) + 2 * h + (i & 1)];
          p.out[(row0 + n) * kDimV + d] = uint16_t(num::f32_to_bf16(v * inv));
        }
    }
    if (pipe.qtma) {  // this warp is done with the Q region (fin lives there): the next item's wide Q may load
      warp_arrive(pipe.qregion_empty, lane);
    }
    return;
  }
  // Warpgroup 0: row sums in the wide path's order, ((q0 + q1) + (q2 + q3)) per warpgroup share, then share
  // 0 + share 1; (m, l) to the workspace or lse.
  math_bar();
  if (tid < kNarrowRows) {
    const float* lp = reinterpret_cast<const float*>(base + kOffNL) + tid * 8;
    fin[2 * tid + 1] = ((lp[0] + lp[1]) + (lp[2] + lp[3])) + ((lp[4] + lp[5]) + (lp[6] + lp[7]));
  }
  math_bar();
  if (tid < rows_here) {
    const float m = fin[2 * tid], l = fin[2 * tid + 1];
    if (geo.is_split) {
      ws_ml[(prow0 + tid) * 2] = m;
      ws_ml[(prow0 + tid) * 2 + 1] = l;
    } else {
      p.lse[row0 + tid] = l != 0.0f ? __fmaf_rn(m, kLn2, logf(l)) : num::kNegInf;
    }
  }
  if (tid == 0 && narrow_mode_slot() == 2) atomicOr(p.status, DDT_DATA_PROBE_NARROW);  // DDTREE_SM90_NARROW=probe
  if (pipe.qtma) {  // this warp is done with the Q region
    warp_arrive(pipe.qregion_empty, lane);
  }
  DDT_PROF_LAP(12, tp);  // epilogue (warpgroup 0's view)
#endif
}

// The math warpgroups' share of an item (threads 0 .. 255). base: the 1024-aligned shared-memory window
// (generic pointer), red: [2 warpgroups][64 rows] f32 exchange; full_phase: see Pipe. kPBf16: P as one bf16
// (DDT_ATTN_P_BF16: no P lo, one PV product), else the hi + lo pair.
// kStage / has_next: S65's staged partial rows (stages_partials).
template <bool kPBf16, bool kStage>
__device__ void process_item(const ddt_verify_attn_params& p, int split_keys, const Item item, bool has_next, unsigned char* base,
                             float* red, float* ws_o, float* ws_ml, const Pipe& pipe, uint32_t& full_phase) {
#if DDT_SM90_BODY
  math_bar();  // every math warp is done with the previous item's P and red
  // (tid from an opaque move after the barrier: the values derived from it (Q load offsets, rows) stay in the
  // item instead of being hoisted out of the persistent loop, where they are spilled and reloaded per item)
  int tid = threadIdx.x;
  asm volatile("" : "+r"(tid));
  // (wg through a lane-0 shuffle: ptxas then knows it is warp-uniform, so the descriptors built from it stay in
  // uniform registers instead of an R2UR pair per wgmma)
  const int lane = tid & 31, wg = __shfl_sync(0xFFFFFFFFu, tid >> 7, 0), wv = (tid >> 5) & 3;
  const int g = lane >> 2, c = lane & 3;
  const int H = p.heads;
  const float nan = num::bits_f32(0x7FC00000u);
  DDT_PROF_START(tp);
  DDT_PROF_COUNT(9);
  DDT_PROF_CTA(1, true);

  // The item's geometry and page check, from the producer (slot by item parity; one release per warp).
  const int slot = int(full_phase >> 5) & 1;
  mbar_wait(pipe.info_full + 8u * uint32_t(slot), (full_phase >> (2 + slot)) & 1u);
  full_phase ^= (1u << 5) | (1u << (2 + slot));
  const ItemGeom geo = pipe.info[slot];
  warp_arrive(pipe.info_empty + 8u * uint32_t(slot), lane);
  const Request& q = geo.q;
  const bool is_split = geo.is_split;
  const int64_t row0 = geo.row0, tile_row0 = geo.tile_row0, prow0 = geo.prow0, kb = geo.kb, ke = geo.ke;
  const int64_t ntiles = geo.ntiles;
  const int rows_here = geo.rows_here;

  const uint32_t q_parity = (full_phase >> 4) & 1u;
  if (pipe.qtma && geo.shape_ok) full_phase ^= 1u << 4;  // (the producer loaded Q for every item of a good shape)
  if (geo.bad) {
    if (pipe.qtma && geo.shape_ok) {  // Q landed (no other copy may be in flight into the region) and is released
      mbar_wait(pipe.q_full, q_parity);
      warp_arrive(pipe.q_empty, lane);
      warp_arrive(pipe.qregion_empty, lane);
    }
    if (tid == 0) atomicOr(p.status, DDT_DATA_BAD_INDEX);
    if (!is_split) fill_rows(p, row0 + tile_row0, row0 + tile_row0 + rows_here, kWarps, num::kBf16QuietNaN, nan);
    else for (int i = tid; i < rows_here; i += kThreads) ws_ml[(prow0 + i) * 2] = nan;
    return;
  }
  // Q: by the producer's TMA (qtma: q_parity is the phase to wait for), else cp.async by the math warps, rows
  // past the request zero-filled.
  const uint32_t sbase = smem_u32(base);
  const uint32_t sq = sbase + kOffQ, sphi = sbase + kOffPHi, splo = sbase + kOffPLo;
  // The narrow path for requests of at most 16 rows (one row tile): Q^T, all 576 dims, into [9 boxes][16
  // rows][64 dims].
  const int narrow_mode = narrow_mode_slot();
  const bool narrow = narrow_mode != 0 && geo.n_rows <= kNarrowRows;
  if (narrow && !pipe.qtma) {
    const uint16_t* qrow = p.q + row0 * kDimQK;
    for (int i = tid; i < kNarrowRows * 72; i += kThreads) {
      const int r = i / 72, ch = i % 72;
      const bool in = r < rows_here;
      cp_async16(sbase + uint32_t(kOffNQ + (ch >> 3) * kNBox) + sw128_off(r, ch & 7),
                 qrow + (in ? r : 0) * kDimQK + ch * 8, in ? 16 : 0);
    }
    cp_async_commit();
  }
  if (narrow) {
    DDT_PROF_LAP(1, tp);  // item prologue
    // N = 8 for requests of at most 8 rows (T 1 at H 8), else 16 (narrow_mode 3: 16 always, for comparisons)
    if (geo.n_rows <= 8 && narrow_mode != 3)
      process_narrow<8, kPBf16>(p, geo, base, ws_o, ws_ml, pipe, full_phase, q_parity);
    else process_narrow<16, kPBf16>(p, geo, base, ws_o, ws_ml, pipe, full_phase, q_parity);
    return;
  }
  // Q: the latent part into shared memory (16 chunks per thread), the rope part as A fragments: qr[s] = rows
  // 16 wv + g (+ 8), dims 512 + 16 s + 2 c (+ 8).
  if (!pipe.qtma) {
    const uint16_t* qrow = p.q + (row0 + tile_row0) * kDimQK;
#pragma unroll 4
    for (int i = 0; i < 16; ++i) {
      const int lin = tid + kThreads * i, r = lin >> 6, ch = lin & 63;
      const bool in = r < rows_here;
      cp_async16(sq + uint32_t((ch >> 3) * kBox) + sw128_off(r, ch & 7), qrow + (in ? r : 0) * kDimQK + ch * 8,
                 in ? 16 : 0);
    }
    cp_async_commit();
  }
  uint32_t qr[4][4] = {};
  {
    const int ra = 16 * wv + g, rb = ra + 8;
    const uint32_t* qa = reinterpret_cast<const uint32_t*>(p.q + (row0 + tile_row0 + ra) * kDimQK + kDimV);
    const uint32_t* qb = reinterpret_cast<const uint32_t*>(p.q + (row0 + tile_row0 + rb) * kDimQK + kDimV);
    const bool va = ra < rows_here, vb = rb < rows_here;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int w0 = s * 8 + c;  // u32 index of dims (16 s + 2 c, + 1)
      qr[s][0] = va ? __ldg(qa + w0) : 0u;
      qr[s][1] = vb ? __ldg(qb + w0) : 0u;
      qr[s][2] = va ? __ldg(qa + w0 + 4) : 0u;
      qr[s][3] = vb ? __ldg(qb + w0 + 4) : 0u;
    }
  }

  // Rows of this thread (tile-local): ra = 16 wv + g and rb = ra + 8; their vis rows (valid rows only).
  const int ra = 16 * wv + g, rb = ra + 8;
  const bool va = ra < rows_here, vb = rb < rows_here;
  const uint64_t* vis_a = p.vis + (int64_t(q.first_row) + (tile_row0 + (va ? ra : 0)) / H) * p.vis_words;
  const uint64_t* vis_b = p.vis + (int64_t(q.first_row) + (tile_row0 + (vb ? rb : 0)) / H) * p.vis_words;
  const float scale_log2 = p.softmax_scale * kLog2e;
  float m_a = num::kNegInf, m_b = num::kNegInf;  // running max (log2 units), rows ra / rb
  float l_a = 0.0f, l_b = 0.0f;                  // this thread's share of the row sums

  const bool stage_o = kStage && stages_partials(pipe, is_split, ntiles, has_next);  // (S65: rows 0-31 via stage 1)
  float acc[128];  // O[64 rows x dims 256 wg .. + 255]
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;

  if (pipe.tma) DDT_PROF_COUNT(14);
  if (pipe.tma && pipe.tile3d) DDT_PROF_COUNT(15);
  DDT_PROF_LAP(1, tp);  // item prologue: scalars, page checks, Q issued
#pragma unroll 1
  for (int64_t it = 0; it < ntiles; ++it) {
    const int buf = __shfl_sync(0xFFFFFFFFu, int(it & 1), 0);  // (warp-uniform for ptxas: S46)
    const int64_t k0 = kb + it * kKeys;  // absolute key of the tile's row 0
    DDT_PROF_COUNT(10);
    if (it == 0) {  // Q
      if (pipe.qtma) mbar_wait(pipe.q_full, q_parity);
      else cp_async_wait_all();
    }
    const int64_t past = k0 + kKeys - ke;  // rows [64 - past, 64) lie past the key range
    // (TMA: S waits for each group of boxes before its k-steps; the whole tile first where rows past the range are
    // zeroed, and for cp.async, whose copies land together)
    if (!pipe.tma || past > 0) wait_tile(pipe, buf, (full_phase >> buf) & 1u);
    full_phase ^= 1u << buf;  // (the group waits below: the parity before this flip)
    if (pipe.tma && past > 0) {  // TMA copied them from the page (possibly NaN poison): zero them
      unsigned char* kvb = base + kOffKv + buf * kKvBytes;
      const int first = kKeys - int(past);
      for (int i = tid; i < int(past) * 72; i += kThreads) {
        const int r = first + i / 72, ch = i % 72;
        *reinterpret_cast<uint4*>(kvb + (ch >> 3) * kBox + sw128_off(r, ch & 7)) = make_uint4(0, 0, 0, 0);
      }
    }
    // (the generic-proxy writes before S's wgmma reads: cp.async's copies of the tile or of Q, the zeroed rows; a TMA
    // tile needs none, and P's stores were fenced before barrier C of the previous tile: S72)
    if (!pipe.tma || past > 0 || (it == 0 && !pipe.qtma)) fence_proxy_async();
    DDT_PROF_LAP(2, tp);  // waiting for the tile's bytes
    DDT_PROF_CTA(2, true);
    // (A) Q's cp.async copies (first tile) and the zeroed rows (last tile) visible to every math warp. Other
    // tiles need no barrier here: each thread waited for the tile itself (and Q by TMA), and P / red of the
    // previous tile are rewritten only after barrier B, which every warp reaches after its previous PV.
    if ((it == 0 && !pipe.qtma) || (pipe.tma && past > 0)) math_bar();
    DDT_PROF_LAP(3, tp);
    DDT_PROF_LAP(4, tp);  // (no loads issued here: the producer warpgroup's)
    const uint32_t skv = sbase + uint32_t(kOffKv + buf * kKvBytes);

    // S = Q K_w^T, keys [32 wg, 32 wg + 32) of the tile.
    float s[16];
    reg_fence(s);
    // Descriptors: the base ones plus compile-time (offset >> 4) steps (addresses stay below 256 KB, so the
    // 14-bit start field never carries).
    const uint64_t dq0 = sw128_desc(sq, 16, 1024), dk0 = sw128_desc(skv + uint32_t(wg * 4096), 16, 1024);
    // The previous tile's PV is in flight (S72). If this tile's first group has landed (the warpgroup's common
    // verdict: the wgmma waits below must be uniform), S's first group is issued behind the PV and the previous stage
    // released once the PV is done (wait_group 1); else the PV is waited for and the stage released first, so its
    // refill never waits for this tile (S72b's loss at T 8).
    const bool s_behind_pv =
        it > 0 && wg_any(wg, mbar_test(full_bar(pipe, buf, 0), ((full_phase >> buf) & 1u) ^ 1u));
    if (it > 0 && !s_behind_pv) {
      wgmma_wait<0>();
      warp_arrive(pipe.empty + 8u * uint32_t(buf ^ 1), lane);
    }
#pragma unroll
    for (int gr = 0; gr < kKvGroups; ++gr) {  // (a group's k-steps once its boxes landed: one commit group each)
      mbar_wait(full_bar(pipe, buf, gr), ((full_phase >> buf) & 1u) ^ 1u);  // (at once if the tile was waited for)
      wgmma_fence();
#pragma unroll
      for (int st = 4 * kGroupBoxes * gr; st < min(4 * kGroupBoxes * (gr + 1), 32); ++st) {
        const uint64_t off = uint64_t(((st >> 2) * kBox + (st & 3) * 32) >> 4);
        wgmma_m64n32k16_ss(s, dq0 + off, dk0 + off, st > 0);
      }
      if (gr == kKvGroups - 1)  // (the rope box is the last group's)
#pragma unroll
        for (int st = 0; st < 4; ++st) wgmma_m64n32k16_rs(s, qr[st], dk0 + uint64_t((8 * kBox + st * 32) >> 4), 1);
      wgmma_commit();
      if (gr == 0 && s_behind_pv) {  // the previous tile's PV, left in flight under this S's first group (S72): once
        wgmma_wait<1>();             // it is done, its stage is free for the producer
        warp_arrive(pipe.empty + 8u * uint32_t(buf ^ 1), lane);
      }
    }
    wgmma_wait_all();
    reg_fence(s);
    reg_fence(acc);
    if (pipe.qtma && it == ntiles - 1) {  // this warp is done with Q: the producer may load the next item's
      warp_arrive(pipe.q_empty, lane);
      warp_arrive(pipe.qregion_empty, lane);
    }
    DDT_PROF_LAP(5, tp);  // S (warp 0's warpgroup)

    // Scale and mask: element (row, key) with key = k0 + 32 wg + 8 j + 2 c + e (explicit roundings: the narrow path
    // repeats them). A tile inside the prefix has every key visible and is scaled alone (S62: the selects cost ~2%
    // at T >= 8); else the tile's visible keys as 64-bit masks per row (bit i: key k0 + i): prefix bits | the row's
    // ancestor bits shifted into place (two vis words, loaded together), cut at the range end.
    float mxa = num::kNegInf, mxb = num::kNegInf;
    if (k0 + kKeys <= q.prefix && k0 + kKeys <= ke) {
#pragma unroll
      for (int i = 0; i < 16; ++i) s[i] = __fmul_rn(s[i], scale_log2);
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          mxa = fmaxf(mxa, s[4 * j + e]);
          mxb = fmaxf(mxb, s[4 * j + 2 + e]);
        }
    } else {
      const int64_t t0 = k0 - q.prefix, n_in = ke - k0;  // tree index of the tile's key 0; range keys in the tile
      const uint64_t in_mask = n_in >= 64 ? ~uint64_t(0) : (uint64_t(1) << n_in) - 1;
      const uint64_t pre_mask = t0 >= 0 ? 0 : (t0 <= -64 ? ~uint64_t(0) : (uint64_t(1) << -t0) - 1);
      const uint64_t vm_a = ((va ? vis_window(vis_a, p.vis_words, t0) : 0) | pre_mask) & in_mask;
      const uint64_t vm_b = ((vb ? vis_window(vis_b, p.vis_words, t0) : 0) | pre_mask) & in_mask;
      const uint32_t vis_wa = uint32_t(vm_a >> (32 * wg)), vis_wb = uint32_t(vm_b >> (32 * wg));  // this WG's keys
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int bit = 8 * j + 2 * c + e;
          float& xa = s[4 * j + e];
          float& xb = s[4 * j + 2 + e];
          xa = (vis_wa >> bit) & 1u ? __fmul_rn(xa, scale_log2) : num::kNegInf;
          xb = (vis_wb >> bit) & 1u ? __fmul_rn(xb, scale_log2) : num::kNegInf;
          mxa = fmaxf(mxa, xa);
          mxb = fmaxf(mxb, xb);
        }
    }
    mxa = fmaxf(mxa, __shfl_xor_sync(0xFFFFFFFFu, mxa, 1));
    mxa = fmaxf(mxa, __shfl_xor_sync(0xFFFFFFFFu, mxa, 2));
    mxb = fmaxf(mxb, __shfl_xor_sync(0xFFFFFFFFu, mxb, 1));
    mxb = fmaxf(mxb, __shfl_xor_sync(0xFFFFFFFFu, mxb, 2));
    if (c == 0) {
      red[wg * kRows + ra] = mxa;
      red[wg * kRows + rb] = mxb;
    }
    DDT_PROF_LAP(13, tp);  // mask, scale, row max
    math_bar();  // (B) both warpgroups' row maxima
    DDT_PROF_LAP(6, tp);
    // The same max in both warpgroups (the two halves in a fixed order).
    const float ma_new = fmaxf(m_a, fmaxf(red[ra], red[kRows + ra]));
    const float mb_new = fmaxf(m_b, fmaxf(red[rb], red[kRows + rb]));
    const float ma_use = ma_new == num::kNegInf ? 0.0f : ma_new;  // no key yet: e^(-inf) = 0, not NaN
    const float mb_use = mb_new == num::kNegInf ? 0.0f : mb_new;
    const float alpha_a = exp2_ftz(m_a - ma_use), alpha_b = exp2_ftz(m_b - mb_use);
    m_a = ma_new;
    m_b = mb_new;
    float sum_a = 0.0f, sum_b = 0.0f;
    unsigned char* phi = base + kOffPHi;
    unsigned char* plo = base + kOffPLo;
    // (The store offsets from an opaque copy of the thread index, recomputed each tile: hoisted out of the
    // persistent loops they are spilled.)
    int tl = tid;
    asm volatile("" : "+r"(tl));
    const int ral = 16 * ((tl >> 5) & 3) + ((tl >> 2) & 7), cl = tl & 3, wgl = tl >> 7;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float pa0 = exp2_ftz(s[4 * j] - ma_use), pa1 = exp2_ftz(s[4 * j + 1] - ma_use);
      const float pb0 = exp2_ftz(s[4 * j + 2] - mb_use), pb1 = exp2_ftz(s[4 * j + 3] - mb_use);
      sum_a += pa0 + pa1;
      sum_b += pb0 + pb1;
      // P = hi + lo, both bf16 (p - hi is exact in f32; kPBf16: hi alone); key chunk 4 wg + j, bytes 4 c of it.
      const __nv_bfloat162 ha = __floats2bfloat162_rn(pa0, pa1), hb = __floats2bfloat162_rn(pb0, pb1);
      const uint32_t oa = sw128_off(ral, 4 * wgl + j) + 4 * cl, ob = sw128_off(ral + 8, 4 * wgl + j) + 4 * cl;
      *reinterpret_cast<__nv_bfloat162*>(phi + oa) = ha;
      *reinterpret_cast<__nv_bfloat162*>(phi + ob) = hb;
      if constexpr (!kPBf16) {
        const float2 fa = __bfloat1622float2(ha), fb = __bfloat1622float2(hb);
        *reinterpret_cast<__nv_bfloat162*>(plo + oa) = __floats2bfloat162_rn(pa0 - fa.x, pa1 - fa.y);
        *reinterpret_cast<__nv_bfloat162*>(plo + ob) = __floats2bfloat162_rn(pb0 - fb.x, pb1 - fb.y);
      }
    }
    l_a = __fmaf_rn(l_a, alpha_a, sum_a);
    l_b = __fmaf_rn(l_b, alpha_b, sum_b);
    fence_proxy_async();
    DDT_PROF_LAP(7, tp);  // exp2, P hi / lo stores
    math_bar();  // (C) P complete
    DDT_PROF_LAP(8, tp);

    // O_w = alpha O_w + P_hi V_w + P_lo V_w (kPBf16: no P_lo term). kPBf16: in two 128-dim halves, the second half's
    // rescale while the first half's wgmmas run (S66: at T >= 8 1% faster planned, 2% unplanned; the hi + lo
    // instantiation measured 1% slower that way, its schedule and descriptors worse: one m64n256 chain). Per element
    // the same products in the same order either way: bits unchanged.
    const uint64_t dv0 = sw128_desc(skv + uint32_t(4 * wg * kBox), kBox, 1024);
    const uint64_t dphi = sw128_desc(sphi, 16, 1024), dplo = sw128_desc(splo, 16, 1024);
    if constexpr (kPBf16) {
      pv_half<0>(acc, alpha_a, alpha_b, dphi, dv0);
      pv_half<64>(acc, alpha_a, alpha_b, dphi, dv0 + uint64_t((2 * kBox) >> 4));
    } else {
      rescale_o<0, 128>(acc, alpha_a, alpha_b);
      reg_fence(acc);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kKeys / 16; ++ks)
        wgmma_m64n256k16_ss_tb(acc, dphi + uint64_t(ks * 2), dv0 + uint64_t(ks * 128), 1);
#pragma unroll
      for (int ks = 0; ks < kKeys / 16; ++ks)
        wgmma_m64n256k16_ss_tb(acc, dplo + uint64_t(ks * 2), dv0 + uint64_t(ks * 128), 1);
      wgmma_commit();
    }
    // (PV(t) stays in flight: the next tile's S is issued behind it and its wait covers both; the stage is released
    // there. S72)
    DDT_PROF_LAP(11, tp);  // PV issued (warp 0's warpgroup)
  }
  // The last tile's PV; its stage is free for the producer once it completed (a staging item's last tile: after the
  // epilogue has written its rows into the stage, S65).
  wgmma_wait_all();
  reg_fence(acc);
  if (ntiles > 0 && !stage_o) warp_arrive(pipe.empty + 8u * uint32_t((ntiles - 1) & 1), lane);

  if (pipe.qtma && ntiles <= 0) {  // (no tile, no S: Q landed (its phase consumed) and released here; split items
    mbar_wait(pipe.q_full, q_parity);  // always have a key, so no item gets here today)
    warp_arrive(pipe.q_empty, lane);
    warp_arrive(pipe.qregion_empty, lane);
  }

  // Row sums: the quad's shares, then the two warpgroups' in a fixed order (through red).
  l_a += __shfl_xor_sync(0xFFFFFFFFu, l_a, 1);
  l_a += __shfl_xor_sync(0xFFFFFFFFu, l_a, 2);
  l_b += __shfl_xor_sync(0xFFFFFFFFu, l_b, 1);
  l_b += __shfl_xor_sync(0xFFFFFFFFu, l_b, 2);
  math_bar();  // every warp is done reading red
  if (c == 0) {
    red[wg * kRows + ra] = l_a;
    red[wg * kRows + rb] = l_b;
  }
  math_bar();
  l_a = red[ra] + red[kRows + ra];
  l_b = red[rb] + red[kRows + rb];

  // 3. Split: unnormalised o and (m, l) to the workspace. Not split: normalise, store, lse.
  const int col = 256 * wg + 2 * c;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = half ? rb : ra;
    if (r >= rows_here) continue;
    const float m = half ? m_b : m_a, l = half ? l_b : l_a;
    if (is_split) {
      if (wg == 0 && c == 0) {
        ws_ml[(prow0 + r) * 2] = m;
        ws_ml[(prow0 + r) * 2 + 1] = l;
      }
      // (positions, not dims: the dims 16 b + 2 c (+ 1) and 16 b + 8 + 2 c (+ 1) of this warpgroup's 256 are one
      // float4 at position 16 b + 4 c, partial_pos; rows 0-31 of a staging item into stage 1 at the same positions)
      float4* o = stage_o && wv < 2
                      ? reinterpret_cast<float4*>(base + kOffKv + kKvBytes + r * kStagedRowBytes) + 64 * wg + c
                      : reinterpret_cast<float4*>(ws_o + (prow0 + r) * kDimV + 256 * wg + 4 * c);
#pragma unroll
      for (int b = 0; b < 16; ++b)  // (16-dim block b)
        o[4 * b] = make_float4(acc[8 * b + 2 * half], acc[8 * b + 2 * half + 1], acc[8 * b + 4 + 2 * half],
                               acc[8 * b + 4 + 2 * half + 1]);
    } else {
      // No visible key <=> l = 0 (a finite visible score gives l >= 1); a NaN score makes l NaN: out and
      // lse NaN (also when every visible score is NaN and m stayed -inf).
      const bool any = l != 0.0f;
      const float inv = any ? 1.0f / l : 0.0f;
      if (wg == 0 && c == 0) p.lse[row0 + tile_row0 + r] = any ? __fmaf_rn(m, kLn2, logf(l)) : num::kNegInf;
      uint32_t* o = reinterpret_cast<uint32_t*>(p.out + (row0 + tile_row0 + r) * kDimV + col);
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const uint32_t lo = num::f32_to_bf16(acc[4 * j + 2 * half] * inv);
        const uint32_t hi = num::f32_to_bf16(acc[4 * j + 2 * half + 1] * inv);
        o[4 * j] = lo | (hi << 16);
      }
    }
  }
  if (stage_o) {  // (the loop's last tile withheld this release: the producer copies rows 0-31 out, then refills)
    if (wv < 2) fence_proxy_async();
    warp_arrive(pipe.empty + 8u, lane);
  }
  DDT_PROF_LAP(12, tp);  // epilogue
#endif
}

// The registers per thread of the producer and of the math warpgroups (setmaxnreg; 128 x producer + 256 x math <=
// 64 K): the planned instantiations' producer needs 56 for S65's staged rows without spilling (the math warps then
// fit 216 without spilling either); the unplanned ones keep 40 / 232 (their math warps' scheduler needs them).
template <bool kPlanned> constexpr int kProducerRegs = kPlanned ? 56 : 40;
template <bool kPlanned> constexpr int kMathRegs = kPlanned ? 216 : 232;
static_assert(128 * kProducerRegs<true> + 256 * kMathRegs<true> <= 65536 &&
                  128 * kProducerRegs<false> + 256 * kMathRegs<false> <= 65536,
              "setmaxnreg: the CTA's registers fit the SM's 64 K");
// One CTA per SM: math warpgroups 0 and 1 (threads 0 .. 255: S, softmax, PV, epilogue) and the producer
// warpgroup 2 (threads 256 .. 383: the KV copies). Registers: 168 per thread at launch; the producer gives
// back to kProducerRegs and the math warpgroups take kMathRegs (setmaxnreg; above).
// kPlanned: the instantiation of planned calls (plan non-null); the unplanned one compiles without the plan's code.
// kPBf16: p_precision DDT_ATTN_P_BF16 (P as one bf16, one PV product), else the default hi + lo.
template <bool kPlanned, bool kPBf16>
__global__ void __launch_bounds__(kCtaThreads, 1)
    verify_attn_sm90_kernel(ddt_verify_attn_params p, int split_keys, float* ws_o, float* ws_ml,
                            const __grid_constant__ CUtensorMap kv_map, int use_tma, int narrow_mode,
                            const __grid_constant__ CUtensorMap q_map_wide,
                            const __grid_constant__ CUtensorMap q_map_narrow, int use_qtma, int kv_l2_evict_first,
                            const PlanHeader* plan, int64_t plan_capacity) {
  // use_tma: encode_kv_map's 0 (cp.async) / 1 (2D map, 9 boxes per tile) / 2 (3D map, one copy per group of 3 boxes);
  // use_qtma: 1 = the Q maps are valid (encode_q_maps), Q loads by the producer's TMA; 0 = cp.async;
  // kv_l2_evict_first: 1 = the TMA copies of KV tiles that only one CTA reads carry an L2 evict_first hint
  // (kv_evict_first_pays: the launcher's choice);
  // narrow_mode: 1 = requests of at most 16 rows take process_narrow (at N = 8 up to 8 rows), 0 = off
  // (DDTREE_SM90_NARROW=0), 2 = on and each narrow item sets DDT_DATA_PROBE_NARROW (DDTREE_SM90_NARROW=probe: the
  // tests' evidence that it ran), 3 = on at N = 16 for every narrow item (DDTREE_SM90_NARROW=16, for comparisons)
  // plan: null (each CTA checks node_offsets and scans the requests) or a plan of plan_capacity items
  // (ddt_verify_attn_sm90_planned_cuda)
#if DDT_SM90_BODY
  pdl_launch_dependents();  // the combine (launched with PDL) may start its scan now; it waits for this grid
  DDT_PROF_CTA(0, false);
  DDT_PROF_CTA_NS(5);
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  __shared__ float red[2 * kRows];
  // full[2][kKvGroups], empty[2], info_full[2], info_empty[2], q_full, q_empty, qregion_empty
  constexpr int kF = 2 * kKvGroups;
  __shared__ __align__(8) uint64_t bars[kF + 9];
  __shared__ ItemGeom info[2];
  const Pipe pipe{&kv_map,         &q_map_wide,          &q_map_narrow,         info,          smem_u32(bars),
                  smem_u32(bars + kF), smem_u32(bars + kF + 2), smem_u32(bars + kF + 4), smem_u32(bars + kF + 6),
                  smem_u32(bars + kF + 7), smem_u32(bars + kF + 8), use_tma != 0,  use_tma == 2,          use_qtma != 0, kv_l2_evict_first != 0};
  if (threadIdx.x == 0) {  // made visible to all threads by run_flash_items' first barrier
    narrow_mode_slot() = narrow_mode;
    for (int b = 0; b < kF; ++b) mbar_init(pipe.full + 8u * uint32_t(b), pipe.tma ? 1 : 128);
    mbar_init(pipe.empty, kWarps);
    mbar_init(pipe.empty + 8, kWarps);
    mbar_init(pipe.info_full, 1);
    mbar_init(pipe.info_full + 8, 1);
    mbar_init(pipe.info_empty, kWarps);
    mbar_init(pipe.info_empty + 8, kWarps);
    mbar_init(pipe.q_full, 1);
    mbar_init(pipe.q_empty, kWarps);
    mbar_init(pipe.qregion_empty, kWarps);
    mbar_init_fence();
    if (pipe.tma) tma_prefetch_map(pipe.map);
    if (pipe.qtma) {
      tma_prefetch_map(pipe.qmap_wide);
      tma_prefetch_map(pipe.qmap_narrow);
    }
  }
  unsigned char* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  int* scan_buf = reinterpret_cast<int*>(base + kOffPHi);
  if (threadIdx.x >= kThreads) {
    setmaxnreg_dec<kProducerRegs<kPlanned>>();
    uint32_t empty_phase = 0;
    const uint32_t sbase = smem_u32(base);
    __shared__ StagedRows staged[2];  // (producer thread 256's, produce_item)
    if (kPlanned && threadIdx.x == kThreads) staged[0] = staged[1] = StagedRows{};
    run_flash_items<kRows, true, kPlanned>(
        p, split_keys, scan_buf,
        [&](const Item& item, const PlanItem* rec, bool has_next) {
          if constexpr (kPlanned) produce_item<true>(p, split_keys, item, rec, sbase, pipe, empty_phase, ws_o, staged, has_next);
          else produce_item<false>(p, split_keys, item, rec, sbase, pipe, empty_phase, nullptr, nullptr, false);
          __syncwarp();  // warp 8 converged again (on the TMA path lane 0 alone ran the tiles) before any barrier
        },
        plan, plan_capacity);
    // The last staging item's rows (S65): once the math warps have written them (their release of stage 1), out,
    // and every bulk copy complete before the CTA ends.
    if (kPlanned && threadIdx.x == kThreads && staged[0].rows > 0) {
      mbar_wait(pipe.empty + 8u, ((empty_phase >> 1) & 1u) ^ 1u);
      flush_staged(staged[0], ws_o, sbase);
    }
    if (kPlanned && threadIdx.x == kThreads) bulk_wait_all();
  } else {
    setmaxnreg_inc<kMathRegs<kPlanned>>();
    uint32_t full_phase = 0;
    run_flash_items<kRows, false, kPlanned>(
        p, split_keys, scan_buf,
        [&](const Item& item, const PlanItem*, bool has_next) {
          process_item<kPBf16, kPlanned>(p, split_keys, item, has_next, base, red, ws_o, ws_ml, pipe, full_phase);
          DDT_PROF_CTA(3, false);
        },
        plan, plan_capacity);
    DDT_PROF_CTA(4, false);
    DDT_PROF_CTA_NS(6);
  }
#endif
}

// The per-step plan (ddt_verify_attn_sm90_plan_cuda): what every CTA of an unplanned call works out before its
// first copy, done once. Each CTA checks node_offsets and scans the requests as the main kernel does (the scan
// is per CTA, O(batch)); item b (grid-strided over threads) gets its record: the scan's Item, the request's
// scalars, the page check over its key range (item_bad's, one thread) and the first tile's page. CTA 0 writes
// the header last among its own writes; the main kernel reads the plan only after this kernel has finished.
// (Any architecture: no sm_90a instruction.)
__global__ void __launch_bounds__(kThreads)
    verify_attn_sm90_plan_kernel(ddt_verify_attn_params p, int split_keys, PlanHeader* plan, int64_t capacity) {
  __shared__ int s_items[kThreads], s_rows[kThreads], s_tail[kThreads];
  PlanItem* items = reinterpret_cast<PlanItem*>(plan + 1);
  const bool offsets_malformed = offsets_bad(p);
  int total = 0;
  if (!offsets_malformed) {
    scan_requests(p, MainCounts<kRows>{split_keys}, s_items, s_rows, s_tail);
    total = scanned_main_items(s_items, s_tail);
    for (int64_t b = int64_t(blockIdx.x) * kThreads + threadIdx.x; b < total && b < capacity;
         b += int64_t(gridDim.x) * kThreads) {
      const Item item = locate_item(p, MainCounts<kRows>{split_keys}, s_items, s_rows, int(b), s_tail);
      const ItemGeom g = item_geom(p, split_keys, item, make_request(p, item.r));
      const bool bad = item_pages_bad(p, g, 0, 1);
      PlanItem rec;
      rec.r = item.r;
      rec.local = item.local;
      rec.partial_base = item.partial_base;
      rec.bad = bad ? 1 : 0;
      rec.first_row = g.q.first_row;
      rec.nodes = g.q.nodes;
      rec.prefix = int32_t(g.q.prefix);
      rec.first_page = !bad && g.ke > g.kb ? int32_t(page_entry(p, g.q, g.kb / p.page_size)) : 0;
      items[b] = rec;
    }
  }
  // (total > capacity cannot happen for a plan sized by ddt_verify_attn_sm90_plan_bytes; if it did, the items
  // count is left past the capacity and the planned call refuses the plan: DDT_DATA_BAD_PLAN)
  if (blockIdx.x == 0 && threadIdx.x == 0) *plan = plan_header(p, split_keys, total, !offsets_malformed);
}

// Per device, once: compute capability 9.0, a body in the loaded image, the dynamic shared-memory opt-in and
// the resident grid sizes. States beyond FlashDeviceInfo's: -1 not an sm_90 device, -3 the loaded kernel has
// no body (a build for plain sm_90 / compute_90, not sm_90a).
FlashDeviceInfo device_info() {
  return cached_device_info([](int dev) -> FlashDeviceInfo {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return {-2, 0, 0};
    }
    if (major != 9 || minor != 0) return {-1, 0, 0};
    // The body exists only in sm_90a code (DDT_SM90_BODY); an image built for plain 90 loads an empty kernel
    // on this device. The body's static shared memory (red, the mbarriers, the item list) tells them apart.
    cudaFuncAttributes fa{};
    if (cudaFuncGetAttributes(&fa, verify_attn_sm90_kernel<false, false>) != cudaSuccess) {
      (void)cudaGetLastError();
      return {-2, 0, 0};
    }
    if (fa.sharedSizeBytes == 0) return {-3, 0, 0};
    // (every instantiation opts in to the dynamic shared memory; they have the same launch resources)
    if (cudaFuncSetAttribute(verify_attn_sm90_kernel<true, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kSmemBytes) != cudaSuccess ||
        cudaFuncSetAttribute(verify_attn_sm90_kernel<false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kSmemBytes) != cudaSuccess ||
        cudaFuncSetAttribute(verify_attn_sm90_kernel<true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kSmemBytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return {-2, 0, 0};
    }
    return resident_grids(verify_attn_sm90_kernel<false, false>, kCtaThreads, kSmemBytes, dev);
  });
}

// The KV cache for TMA, boxes in the layout wgmma reads (128-byte swizzle, 1,024-byte aligned boxes of
// [64 rows][64 dims]). Returns 2: a 3D map {64 dims, slots, 9 chunks} (strides 1,152 B per slot and 128 B
// per chunk: the chunks of a row overlap the dims) whose box {64, 64, 3} is a group of a tile (kKvGroups copies per
// tile);
// 1: the 2D map [slots][576] with boxes of 64 x 64 (9 copies per tile), if the 3D encoding is refused;
// 0: no TMA (driver entry point or both encodings unavailable; the launcher then takes the cp.async path,
// which loads the same bytes into the same layout). DDTREE_SM90_TMA=0 forces 0, =9 forces the 2D map.
// The driver's cuTensorMapEncodeTiled, or null (no entry point, or DDTREE_SM90_TMA=0).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    const char* env = std::getenv("DDTREE_SM90_TMA");
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (env && env[0] == '0') return PFN_cuTensorMapEncodeTiled_v12000(nullptr);
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return PFN_cuTensorMapEncodeTiled_v12000(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// q [total_nodes x heads rows][576] as the two 3D maps of Pipe (the KV map's trick: {64 dims, rows, chunks}
// with strides 1,152 B per row and 128 B per chunk, 128-byte swizzle, so one copy lands a whole Q tile in the
// layout wgmma reads): wide box {64, 64, 8} (the latent 512 dims of 64 rows), narrow box {64, 16, 9} (all 576
// dims of 16 rows). 1 when both encode (DDTREE_SM90_QTMA=0 forces 0: the math warps' cp.async path).
int encode_q_maps(CUtensorMap* wide, CUtensorMap* narrow, const ddt_verify_attn_params& p) {
  const char* env = std::getenv("DDTREE_SM90_QTMA");  // (read per call: the tests compare both paths)
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  const int64_t rows = int64_t(p.total_nodes) * p.heads;
  if (!encode || (env && env[0] == '0') || rows > int64_t(INT32_MAX)) return 0;
  void* q = const_cast<uint16_t*>(p.q);
  const cuuint32_t elem[3] = {1, 1, 1};
  const cuuint64_t strides[2] = {cuuint64_t(kDimQK) * 2, 128};
  const cuuint64_t dims_w[3] = {64, cuuint64_t(rows), 8}, dims_n[3] = {64, cuuint64_t(rows), 9};
  const cuuint32_t box_w[3] = {64, 64, 8}, box_n[3] = {64, kNarrowRows, 9};
  return encode(wide, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, q, dims_w, strides, box_w, elem,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS &&
                 encode(narrow, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, q, dims_n, strides, box_n, elem,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS
             ? 1
             : 0;
}

int encode_kv_map(CUtensorMap* map, const ddt_verify_attn_params& p) {
  static const char* env = std::getenv("DDTREE_SM90_TMA");
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (!encode) return 0;
  void* kv = const_cast<uint16_t*>(p.kv_cache);
  const cuuint64_t slots = cuuint64_t(p.num_pages) * cuuint64_t(p.page_size);
  const cuuint32_t elem[3] = {1, 1, 1};
  if (!(env && env[0] == '9')) {
    const cuuint64_t dims[3] = {64, slots, 9};
    const cuuint64_t strides[2] = {cuuint64_t(kDimQK) * 2, 128};
    const cuuint32_t box[3] = {64, 64, kGroupBoxes};
    if (encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, kv, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS)
      return 2;
  }
  const cuuint64_t dims[2] = {cuuint64_t(kDimQK), slots};
  const cuuint64_t strides[1] = {cuuint64_t(kDimQK) * 2};
  const cuuint32_t box[2] = {64, 64};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, kv, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS
             ? 1
             : 0;
}

}  // namespace
}  // namespace ddtree::kern::attn

namespace ddtree::kern::attn {
namespace {
// The device checks both entry points share: a compute capability 9.0 GPU with the kernel's sm_90a body.
int check_sm90_device(const FlashDeviceInfo& dev) {
  if (dev.state == -1)
    return fail(DDT_ERR_ARCH, "verify_attn_sm90: needs a compute capability 9.0 GPU (H100 / H200); use the "
                              "portable kernel on other GPUs");
  if (dev.state == -3)
    return fail(DDT_ERR_ARCH, "verify_attn_sm90: this library was built without sm_90a code (CUDA architectures "
                              "must include 90a, not only 90); use the portable kernel or rebuild");
  if (dev.state != 1)
    return fail(DDT_ERR_CUDA, "verify_attn_sm90: cannot query the device or opt in to 226 KB of dynamic shared "
                              "memory");
  return DDT_OK;
}
// Whether the KV copies of one-row-tile requests take the L2 evict_first hint: when the split partials (bounded
// by the capacities) fit a third of the H200's 50 MB L2, so that, with the KV stream evicted first, they are still
// there for the combine (docs/PERF_NOTES.md S27: 128k T 1 b 1 -3 to -6 us; with 33-266 MB of partials the hint
// cost the fixed batches 1-5%, so they copy without it). A cache hint only: no result depends on it.
int kv_evict_first_pays(const Bounds& b) {
  const int64_t partial_bytes = b.partial_rows * int64_t(kPartialRowBytes);
  return partial_bytes > 0 && partial_bytes <= (int64_t(16) << 20) ? 1 : 0;
}
// Both main-kernel entry points after their checks: plan null (unplanned) or checked.
int launch_sm90(const ddt_verify_attn_params* p, int split_keys, const PlanHeader* plan, int64_t plan_capacity,
                void* workspace, cudaStream_t s, const FlashDeviceInfo& dev) {
  if (p->total_nodes == 0) return DDT_OK;
  const Bounds b = capacity_bounds(*p, split_keys);  // items bound of 32-row tiles: >= 64-row items
  int64_t grid = std::min<int64_t>(b.items, dev.main_ctas);
  if (grid < 1) grid = 1;  // padding rows only
  float* ws_o = static_cast<float*>(workspace);
  float* ws_ml = ws_o + b.partial_rows * kDimV;
  // TMA when every tile's 64 keys lie in one page: page_size and split_keys multiples of 64 (tiles start at
  // multiples of 64), and row coordinates within int32.
  CUtensorMap map{};
  const int tma = p->page_size % 64 == 0 && split_keys % 64 == 0 &&
                          int64_t(p->num_pages) * p->page_size <= int64_t(INT32_MAX)
                      ? encode_kv_map(&map, *p)
                      : 0;
  // The narrow path (process_narrow) unless DDTREE_SM90_NARROW=0; =probe also marks the status word (read per
  // call: the tests compare both paths; a captured CUDA graph keeps the value of its capture).
  const char* narrow_env = std::getenv("DDTREE_SM90_NARROW");
  const int narrow = !narrow_env                          ? 1
                     : std::strcmp(narrow_env, "0") == 0     ? 0
                     : std::strcmp(narrow_env, "probe") == 0 ? 2
                     : std::strcmp(narrow_env, "16") == 0    ? 3  // (N = 16 also for requests of <= 8 rows)
                                                              : 1;
  // Q by the producer's TMA when the q maps encode (DDTREE_SM90_QTMA=0: the math warps' cp.async).
  CUtensorMap qmap_wide{}, qmap_narrow{};
  const int qtma = encode_q_maps(&qmap_wide, &qmap_narrow, *p);
  const int evict_first = kv_evict_first_pays(b);
  // The instantiation: planned or not, P's precision (validate() admitted only the two DDT_ATTN_P_ values).
  const bool p_bf16 = p->p_precision == DDT_ATTN_P_BF16;
  auto* kernel = plan ? (p_bf16 ? verify_attn_sm90_kernel<true, true> : verify_attn_sm90_kernel<true, false>)
                      : (p_bf16 ? verify_attn_sm90_kernel<false, true> : verify_attn_sm90_kernel<false, false>);
  kernel<<<unsigned(grid), kCtaThreads, kSmemBytes, s>>>(*p, split_keys, ws_o, ws_ml, map, tma, narrow, qmap_wide,
                                                         qmap_narrow, qtma, evict_first, plan, plan ? plan_capacity : 0);
  DDT_CUDA_LAUNCHED();
  return launch_combine(*p, split_keys, b, dev, ws_o, ws_ml, s, plan, plan_capacity);
}
}  // namespace
}  // namespace ddtree::kern::attn

extern "C" int ddt_verify_attn_sm90_cuda(const ddt_verify_attn_params* p, int split_keys, void* workspace,
                                         size_t workspace_bytes, void* stream) {
  using namespace ddtree::kern;
  if (int rc = attn::check_flash_call(p, split_keys, workspace, workspace_bytes, "verify_attn_sm90")) return rc;
  const attn::FlashDeviceInfo dev = attn::device_info();
  if (int rc = attn::check_sm90_device(dev)) return rc;
  return attn::launch_sm90(p, split_keys, nullptr, 0, workspace, static_cast<cudaStream_t>(stream), dev);
}

extern "C" int ddt_verify_attn_sm90_plan_cuda(const ddt_verify_attn_params* p, int split_keys, void* plan,
                                              size_t plan_bytes, void* stream) {
  using namespace ddtree::kern;
  clear_error();
  if (int rc = validate(p)) return rc;
  int64_t capacity = 0;
  if (int rc = attn::check_plan(p, split_keys, plan, plan_bytes, "verify_attn_sm90_plan", &capacity)) return rc;
  const attn::FlashDeviceInfo dev = attn::device_info();
  if (int rc = attn::check_sm90_device(dev)) return rc;
  // One CTA per 256 items of the bound, at most one wave (each CTA repeats the O(batch) check and scan).
  const int64_t items = attn::capacity_bounds(*p, split_keys).items;
  const int64_t grid = std::max<int64_t>(1, std::min<int64_t>((items + attn::kThreads - 1) / attn::kThreads, dev.sms));
  attn::verify_attn_sm90_plan_kernel<<<unsigned(grid), attn::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      *p, split_keys, static_cast<attn::PlanHeader*>(plan), capacity);
  DDT_CUDA_LAUNCHED();
  return DDT_OK;
}

extern "C" int ddt_verify_attn_sm90_planned_cuda(const ddt_verify_attn_params* p, int split_keys, const void* plan,
                                                 size_t plan_bytes, void* workspace, size_t workspace_bytes,
                                                 void* stream) {
  using namespace ddtree::kern;
  if (int rc = attn::check_flash_call(p, split_keys, workspace, workspace_bytes, "verify_attn_sm90_planned")) return rc;
  int64_t capacity = 0;
  if (int rc = attn::check_plan(p, split_keys, plan, plan_bytes, "verify_attn_sm90_planned", &capacity)) return rc;
  const attn::FlashDeviceInfo dev = attn::device_info();
  if (int rc = attn::check_sm90_device(dev)) return rc;
  return attn::launch_sm90(p, split_keys, static_cast<const attn::PlanHeader*>(plan), capacity, workspace,
                           static_cast<cudaStream_t>(stream), dev);
}
