// Tree-verify MLA attention on the GPU, the sm_90a flash kernel (ddtree/kernels.h, section 4;
// reference/mla-verify-attention.md; issue 5): Hopper warpgroup MMA (wgmma) with both operands read straight
// from shared memory (no ldmatrix / register staging: the traffic that bounds the portable kernel, docs/
// PERF_NOTES.md A2-A4), 64-row tiles, 64-key KV tiles double-buffered with cp.async into the 128-byte
// swizzled layout wgmma reads, f32 online softmax, the same KV splits at fixed absolute positions, the same
// workspace and the same fixed-order combine as the portable kernel (verify_attn_sched.cuh). Same semantics
// and outputs as the oracle and the CPU twin to the correctness bar.
//
// Work decomposition (one CTA = 2 warpgroups = 256 threads; one item = 64 rows x one key range):
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
//    B = V = the first 512 dims of the same KV tile, read N-major). Three CTA barriers per tile: tile landed,
//    row maxima exchanged, P written.
//  - Loads: every thread issues 18 16-byte cp.async per KV tile (row = tid / 4, any page size; slots past the
//    key range are zero-filled, never read), its slot's page looked up a tile ahead; Q (16 chunks per
//    thread) once per item.
//  - Scheduling, checks, padding, poison, workspace and combine: exactly the portable kernel's
//    (verify_attn_sched.cuh; persistent CTAs over items numbered request-major, then split, then row tile).
// Compiled only for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL): other targets get an empty kernel and the launcher
// refuses devices other than compute capability 9.0.
#include <cuda.h>  // CUtensorMap (types only: encoded through the runtime's driver entry point)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include "kernels/common/validate.h"
#include "kernels/common/verify_attn_index.h"
#include "kernels/common/verify_attn_split.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/verify_attn_sched.cuh"

namespace ddtree::kern::attn {
namespace {

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
constexpr int kOffQ = 0, kOffKv = kQBytes, kOffPHi = kOffKv + 2 * kKvBytes, kOffPLo = kOffPHi + kPBytes;
constexpr int kSmemUsed = kOffPLo + kPBytes;        // 229,376
constexpr int kSmemBytes = kSmemUsed + 1024;        // + alignment slack of the dynamic base
static_assert(kSmemBytes + kMaxItemsPerCta * 12 + 1024 <= 232448, "sm_90: at most 227 KB of shared memory per CTA");
static_assert(kThreads == 256 && kRows * 4 == kThreads, "KV loader: 4 threads per key row, 18 chunks each");
static_assert(kDimQK == 576 && kDimV == 512, "tiling assumes 512 latent + 64 rope dims");
static_assert(2 * kPBytes >= 2 * kThreads * 4, "the request scan (2 x 256 int) fits the P buffers");

// ---- PTX wrappers (sm_90a) ----
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// Generic-proxy writes to shared memory (cp.async, st.shared) made visible to the async proxy (wgmma reads).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// mbarrier (shared::cta) and the bulk tensor copy (TMA) completing on it.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
// Brings the tensor map (a kernel parameter) into the TMA unit's descriptor cache before its first use.
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// One [64 rows][64 bf16] box of the KV tensor map at (dim x, row y) into 128B-swizzled shared memory.
__device__ __forceinline__ void tma_load_box(uint32_t dst, const CUtensorMap* map, int x, int y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar) : "memory");
}
// Keeps the compiler from moving accesses of an accumulator register across the asynchronous region.
template <int N>
__device__ __forceinline__ void reg_fence(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// Shared-memory matrix descriptor, 128-byte swizzle: start address, leading / stride byte offsets (bytes).
// K-major operands (Q, K, P): SBO = 1,024 (the next 8 rows), LBO unused (1). N-major V: LBO = the next 64
// dims (one box, 8,192), SBO = the next 8 keys (1,024). Every box starts on a 1,024-byte boundary (base
// offset 0); a k-step inside a 128-byte row advances the start address by 32 bytes.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFFu) >> 4) | (uint64_t((lbo & 0x3FFFFu) >> 4) << 16) |
         (uint64_t((sbo & 0x3FFFFu) >> 4) << 32) | (uint64_t(1) << 62);
}
// Byte offset of 16-byte chunk c (0..7) of row r in a 128B-swizzled box.
__device__ __forceinline__ uint32_t sw128_off(int r, int c) { return uint32_t(r * 128 + ((c ^ (r & 7)) << 4)); }

// Bit i = ancestor bit t0 + i of a vis row of W words (0 where t0 + i lies outside [0, 64 W)).
__device__ __forceinline__ uint64_t vis_window(const uint64_t* row, int W, int64_t t0) {
  if (t0 <= -64) return 0;
  if (t0 < 0) return W > 0 ? row[0] << (-t0) : 0;
  const int64_t w = t0 >> 6;
  const int sh = int(t0 & 63);
  const uint64_t lo = w < W ? row[w] : 0, hi = w + 1 < W ? row[w + 1] : 0;
  return sh ? (lo >> sh) | (hi << (64 - sh)) : lo;
}

// wgmma.mma_async wrappers. D: 64 x N f32, thread (warp v of the warpgroup, lane g * 4 + c) holds
// d[4 j + 0, 1] = rows 16 v + g, cols 8 j + 2 c, + 1 and d[4 j + 2, 3] = row 16 v + g + 8, same cols.
// scale_d = 0: D = A B (the accumulator's old values ignored). The operand lists are written out (generated).
// ---- generated: wgmma wrappers (operand lists written out; see the comment above) ----
__device__ __forceinline__ void wgmma_m64n32k16_ss(float (&d)[16], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(scale_d)
      : "memory");
}
__device__ __forceinline__ void wgmma_m64n32k16_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d)
      : "memory");
}
__device__ __forceinline__ void wgmma_m64n256k16_ss_tb(float (&d)[128], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(scale_d)
      : "memory");
}

// One work item: rows [64 t, 64 t + 64) of request r against its split's key range. base: the 1024-aligned
// shared-memory window (generic pointer), red: [2 warpgroups][64 rows] f32 exchange.
// TMA path (on: page_size and split_keys multiples of 64): thread 0 loads each tile as 9 boxes through the
// kv_map completing on full[buf]; phase: bit b = the parity of buffer b's next completion (kept across items).
struct Tma {
  const CUtensorMap* map;
  uint32_t full;  // shared address of the two mbarriers (8 bytes each)
  bool on;
};
__device__ void process_item(const ddt_verify_attn_params& p, int split_keys, const Item item, unsigned char* base,
                             float* red, float* ws_o, float* ws_ml, const Tma& tma, uint32_t& phase) {
#if DDT_SM90_BODY
  const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, wv = (tid >> 5) & 3;
  const int g = lane >> 2, c = lane & 3;
  const int H = p.heads;
  const float nan = num::bits_f32(0x7FC00000u);
  __syncthreads();  // the previous item is done with every shared buffer
  DDT_PROF_START(tp);
  DDT_PROF_COUNT(9);

  const Request q = make_request(p, item.r);
  const int64_t n_rows = int64_t(q.nodes) * H;
  const bool shape_ok = request_shape_ok(p, q);
  const SplitPlan plan = split_plan(shape_ok ? q.keys : 0, n_rows, split_keys, kRows);
  const int t = item.local % plan.row_tiles, split = item.local / plan.row_tiles;
  const bool is_split = plan.splits > 1;
  const int64_t row0 = int64_t(q.first_row) * H;  // global flattened row of the request's row 0
  const int64_t tile_row0 = int64_t(t) * kRows;
  const int rows_here = n_rows - tile_row0 < kRows ? int(n_rows - tile_row0) : kRows;
  const int64_t prow0 = int64_t(item.partial_base) + int64_t(split) * n_rows + tile_row0;
  // The key range: the split's [kb, ke), or all keys.
  const int64_t kb = is_split ? int64_t(split) * split_keys : 0;
  const int64_t ke = is_split ? min(q.keys, kb + split_keys) : q.keys;

  const uint32_t sbase = smem_u32(base);
  const uint32_t sq = sbase + kOffQ, sphi = sbase + kOffPHi, splo = sbase + kOffPLo;
  // Q: the latent part into shared memory (16 chunks per thread, rows past the request zero-filled), the
  //    rope part as A fragments: qr[s] = rows 16 wv + g (+ 8), dims 512 + 16 s + 2 c (+ 8).
  {
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
  uint32_t qr[4][4];
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

  // 1. Scalars and the pages of the key range (as the portable kernel; Q's loads above are already in flight,
  //    their rows exist whatever the request's other scalars say).
  bool bad = !shape_ok;
  if (!bad && ke > kb) {
    const int64_t pg0 = kb / p.page_size, pg1 = (ke + p.page_size - 1) / p.page_size;
    for (int64_t k = pg0 + tid; k < pg1; k += kThreads) bad |= !page_ok(p, q, k);
  }
  if (__syncthreads_or(bad)) {
    cp_async_wait_all();  // Q's copies land before the next item reuses the buffer
    if (tid == 0) atomicOr(p.status, DDT_DATA_BAD_INDEX);
    if (!is_split) fill_rows(p, row0 + tile_row0, row0 + tile_row0 + rows_here, kWarps, num::kBf16QuietNaN, nan);
    else for (int i = tid; i < rows_here; i += kThreads) ws_ml[(prow0 + i) * 2] = nan;
    return;
  }

  // KV loader: key row lr = tid / 4 of the tile, chunks (tid & 3) + 4 i, i < 18. Where its slot lives is
  // looked up one tile ahead (SlotRef: the page-table load is issued a tile before its value is used, so
  // issuing never waits on it; consuming it at once costs ~1.4k cycles per tile). Thread 0's SlotRef (row 0)
  // also gives the TMA path its tile's first row.
  const int lr = tid >> 2, lc = tid & 3;
  const int64_t ntiles = (ke - kb + kKeys - 1) / kKeys;
  struct SlotRef {
    int32_t page;  // physical page as loaded (not consumed until the tile is issued: widening it to 64 bits
                   // at once, as page_entry does, stalls for the load, ~1.5k cycles per tile)
    uint32_t off;  // slot within the page
    bool in;       // a key of the range (else zero-filled)
  };
  auto slot_ref = [&](int64_t kt) {
    SlotRef r;
    const int64_t j = kb + kt * kKeys + lr;
    r.in = kt < ntiles && j < ke;
    int64_t lpage;
    if (j <= 0x7FFFFFFF) {  // 32-bit division (a 64-bit one is a long software routine on the GPU)
      lpage = uint32_t(j) / uint32_t(p.page_size);
      r.off = uint32_t(j) - uint32_t(lpage) * uint32_t(p.page_size);
    } else {
      lpage = j / p.page_size;
      r.off = uint32_t(j % p.page_size);
    }
    // Unconditional load of an entry that exists (clamped): a select on the loaded value would consume it at
    // once and stall for the load.
    r.page = p.page_table[int64_t(q.r) * p.max_pages + (lpage < q.pages ? lpage : q.pages - 1)];
    return r;
  };
  auto load_tile = [&](const SlotRef& r, int buf) {
    const uint32_t dst = sbase + uint32_t(kOffKv + buf * kKvBytes);
    const int64_t page = r.in ? int64_t(r.page) : 0;  // (an entry past the range may be anything)
    const uint16_t* src = p.kv_cache + (page * p.page_size + r.off) * kDimQK;  // = kv_row_offset when in
#pragma unroll
    for (int i = 0; i < 18; ++i) {
      const int ch = lc + 4 * i;
      cp_async16(dst + uint32_t((ch >> 3) * kBox) + sw128_off(lr, ch & 7), src + ch * 8, r.in ? 16 : 0);
    }
    cp_async_commit();
  };

  // Rows of this thread (tile-local): ra = 16 wv + g and rb = ra + 8; their vis rows (valid rows only).
  const int ra = 16 * wv + g, rb = ra + 8;
  const bool va = ra < rows_here, vb = rb < rows_here;
  const uint64_t* vis_a = p.vis + (int64_t(q.first_row) + (tile_row0 + (va ? ra : 0)) / H) * p.vis_words;
  const uint64_t* vis_b = p.vis + (int64_t(q.first_row) + (tile_row0 + (vb ? rb : 0)) / H) * p.vis_words;
  const float scale_log2 = p.softmax_scale * kLog2e;
  float m_a = num::kNegInf, m_b = num::kNegInf;  // running max (log2 units), rows ra / rb
  float l_a = 0.0f, l_b = 0.0f;                  // this thread's share of the row sums

  float acc[128];  // O[64 rows x dims 256 wg .. + 255]
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;

  // TMA: tile kt's 64 keys lie in one page (page_size and the range start are multiples of 64), from row
  // page x page_size + off of the [slots][576] tensor (thread 0's SlotRef). Rows past ke hold whatever the
  // page has (possibly NaN poison): they are zeroed in shared memory after the copy lands.
  auto tma_tile = [&](const SlotRef& r, int buf) {
    const uint32_t bar = tma.full + 8u * uint32_t(buf), dst = sbase + uint32_t(kOffKv + buf * kKvBytes);
    const int y = int(int64_t(r.page) * p.page_size + r.off);
    mbar_expect_tx(bar, uint32_t(kKvBytes));
#pragma unroll 1
    for (int b = 0; b < 9; ++b) tma_load_box(dst + uint32_t(b * kBox), tma.map, 64 * b, y, bar);
  };
  if (tma.on) {
    DDT_PROF_COUNT(14);
    if (tid == 0) tma_tile(slot_ref(0), 0);
  } else {
    load_tile(slot_ref(0), 0);
  }
  SlotRef next = slot_ref(1);
  DDT_PROF_LAP(1, tp);  // item prologue: scalars, page checks, Q issued, first tile issued
#pragma unroll 1
  for (int64_t it = 0; it < ntiles; ++it) {
    const int buf = int(it & 1);
    const int64_t k0 = kb + it * kKeys;  // absolute key of the tile's row 0
    DDT_PROF_COUNT(10);
    if (tma.on) {
      if (it == 0) cp_async_wait_all();  // Q
      mbar_wait(tma.full + 8u * uint32_t(buf), (phase >> buf) & 1u);
      phase ^= 1u << buf;
      const int64_t past = k0 + kKeys - ke;  // rows [64 - past, 64) lie past the key range: zero them
      if (past > 0) {
        unsigned char* kvb = base + kOffKv + buf * kKvBytes;
        const int first = kKeys - int(past);
        for (int i = tid; i < int(past) * 72; i += kThreads) {
          const int r = first + i / 72, ch = i % 72;
          *reinterpret_cast<uint4*>(kvb + (ch >> 3) * kBox + sw128_off(r, ch & 7)) = make_uint4(0, 0, 0, 0);
        }
      }
    } else {
      cp_async_wait_all();
    }
    fence_proxy_async();
    DDT_PROF_LAP(2, tp);  // waiting for the tile's bytes
    __syncthreads();  // (A) tile `it` (and Q) visible; every warp is done with tile it - 1, P and red
    DDT_PROF_LAP(3, tp);
    if (tma.on) {
      if (tid == 0 && it + 1 < ntiles) tma_tile(next, buf ^ 1);
    } else if (it + 1 < ntiles) {
      load_tile(next, buf ^ 1);
    }
    if (it + 2 < ntiles && (!tma.on || tid == 0)) next = slot_ref(it + 2);  // used a tile from now
    DDT_PROF_LAP(4, tp);  // next tile's loads issued
    const uint32_t skv = sbase + uint32_t(kOffKv + buf * kKvBytes);

    // S = Q K_w^T, keys [32 wg, 32 wg + 32) of the tile.
    float s[16];
    reg_fence(s);
    wgmma_fence();
    // Descriptors: the base ones plus compile-time (offset >> 4) steps (addresses stay below 256 KB, so the
    // 14-bit start field never carries).
    const uint64_t dq0 = sw128_desc(sq, 16, 1024), dk0 = sw128_desc(skv + uint32_t(wg * 4096), 16, 1024);
#pragma unroll
    for (int st = 0; st < 32; ++st) {
      const uint64_t off = uint64_t(((st >> 2) * kBox + (st & 3) * 32) >> 4);
      wgmma_m64n32k16_ss(s, dq0 + off, dk0 + off, st > 0);
    }
#pragma unroll
    for (int st = 0; st < 4; ++st) wgmma_m64n32k16_rs(s, qr[st], dk0 + uint64_t((8 * kBox + st * 32) >> 4), 1);
    wgmma_commit();
    wgmma_wait_all();
    reg_fence(s);
    DDT_PROF_LAP(5, tp);  // S (warp 0's warpgroup)

    // Scale and mask: element (row, key) with key = k0 + 32 wg + 8 j + 2 c + e. The tile's visible keys as
    // 64-bit masks per row (bit i: key k0 + i): all ones inside the prefix; else prefix bits | the row's
    // ancestor bits shifted into place (two vis words, loaded together), cut at the range end.
    uint64_t vm_a = ~uint64_t(0), vm_b = ~uint64_t(0);
    if (!(k0 + kKeys <= q.prefix && k0 + kKeys <= ke)) {
      const int64_t t0 = k0 - q.prefix, n_in = ke - k0;  // tree index of the tile's key 0; range keys in the tile
      const uint64_t in_mask = n_in >= 64 ? ~uint64_t(0) : (uint64_t(1) << n_in) - 1;
      const uint64_t pre_mask = t0 >= 0 ? 0 : (t0 <= -64 ? ~uint64_t(0) : (uint64_t(1) << -t0) - 1);
      vm_a = ((va ? vis_window(vis_a, p.vis_words, t0) : 0) | pre_mask) & in_mask;
      vm_b = ((vb ? vis_window(vis_b, p.vis_words, t0) : 0) | pre_mask) & in_mask;
    }
    const uint32_t vis_wa = uint32_t(vm_a >> (32 * wg)), vis_wb = uint32_t(vm_b >> (32 * wg));  // this WG's keys
    float mxa = num::kNegInf, mxb = num::kNegInf;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int bit = 8 * j + 2 * c + e;
        float& xa = s[4 * j + e];
        float& xb = s[4 * j + 2 + e];
        xa = (vis_wa >> bit) & 1u ? xa * scale_log2 : num::kNegInf;
        xb = (vis_wb >> bit) & 1u ? xb * scale_log2 : num::kNegInf;
        mxa = fmaxf(mxa, xa);
        mxb = fmaxf(mxb, xb);
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
    __syncthreads();  // (B) both warpgroups' row maxima
    DDT_PROF_LAP(6, tp);
    // The same max in both warpgroups (the two halves in a fixed order).
    const float ma_new = fmaxf(m_a, fmaxf(red[ra], red[kRows + ra]));
    const float mb_new = fmaxf(m_b, fmaxf(red[rb], red[kRows + rb]));
    const float ma_use = ma_new == num::kNegInf ? 0.0f : ma_new;  // no key yet: e^(-inf) = 0, not NaN
    const float mb_use = mb_new == num::kNegInf ? 0.0f : mb_new;
    const float alpha_a = exp2f(m_a - ma_use), alpha_b = exp2f(m_b - mb_use);
    m_a = ma_new;
    m_b = mb_new;
    float sum_a = 0.0f, sum_b = 0.0f;
    unsigned char* phi = base + kOffPHi;
    unsigned char* plo = base + kOffPLo;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float pa0 = exp2f(s[4 * j] - ma_use), pa1 = exp2f(s[4 * j + 1] - ma_use);
      const float pb0 = exp2f(s[4 * j + 2] - mb_use), pb1 = exp2f(s[4 * j + 3] - mb_use);
      sum_a += pa0 + pa1;
      sum_b += pb0 + pb1;
      // P = hi + lo, both bf16 (p - hi is exact in f32); key chunk 4 wg + j, bytes 4 c of it.
      const __nv_bfloat162 ha = __floats2bfloat162_rn(pa0, pa1), hb = __floats2bfloat162_rn(pb0, pb1);
      const float2 fa = __bfloat1622float2(ha), fb = __bfloat1622float2(hb);
      const __nv_bfloat162 la = __floats2bfloat162_rn(pa0 - fa.x, pa1 - fa.y);
      const __nv_bfloat162 lb = __floats2bfloat162_rn(pb0 - fb.x, pb1 - fb.y);
      const uint32_t oa = sw128_off(ra, 4 * wg + j) + 4 * c, ob = sw128_off(rb, 4 * wg + j) + 4 * c;
      *reinterpret_cast<__nv_bfloat162*>(phi + oa) = ha;
      *reinterpret_cast<__nv_bfloat162*>(phi + ob) = hb;
      *reinterpret_cast<__nv_bfloat162*>(plo + oa) = la;
      *reinterpret_cast<__nv_bfloat162*>(plo + ob) = lb;
    }
    l_a = l_a * alpha_a + sum_a;
    l_b = l_b * alpha_b + sum_b;
    fence_proxy_async();
    DDT_PROF_LAP(7, tp);  // exp2, P hi / lo stores
    __syncthreads();  // (C) P complete
    DDT_PROF_LAP(8, tp);

    // O_w = alpha O_w + P_hi V_w + P_lo V_w.
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      acc[4 * j] *= alpha_a;
      acc[4 * j + 1] *= alpha_a;
      acc[4 * j + 2] *= alpha_b;
      acc[4 * j + 3] *= alpha_b;
    }
    reg_fence(acc);
    wgmma_fence();
    const uint64_t dv0 = sw128_desc(skv + uint32_t(4 * wg * kBox), kBox, 1024);
    const uint64_t dphi = sw128_desc(sphi, 16, 1024), dplo = sw128_desc(splo, 16, 1024);
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks)
      wgmma_m64n256k16_ss_tb(acc, dphi + uint64_t(ks * 2), dv0 + uint64_t(ks * 128), 1);
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks)
      wgmma_m64n256k16_ss_tb(acc, dplo + uint64_t(ks * 2), dv0 + uint64_t(ks * 128), 1);
    wgmma_commit();
    wgmma_wait_all();
    reg_fence(acc);
    DDT_PROF_LAP(11, tp);  // PV (warp 0's warpgroup)
  }

  // Row sums: the quad's shares, then the two warpgroups' in a fixed order (through red).
  l_a += __shfl_xor_sync(0xFFFFFFFFu, l_a, 1);
  l_a += __shfl_xor_sync(0xFFFFFFFFu, l_a, 2);
  l_b += __shfl_xor_sync(0xFFFFFFFFu, l_b, 1);
  l_b += __shfl_xor_sync(0xFFFFFFFFu, l_b, 2);
  __syncthreads();  // every warp is done reading red
  if (c == 0) {
    red[wg * kRows + ra] = l_a;
    red[wg * kRows + rb] = l_b;
  }
  __syncthreads();
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
      float* o = ws_o + (prow0 + r) * kDimV + col;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<float2*>(o + 8 * j) = make_float2(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
    } else {
      // No visible key <=> m = -inf (then l = 0); a NaN score leaves m finite and l NaN: out and lse NaN.
      const bool any = m != num::kNegInf;
      const float inv = any ? 1.0f / l : 0.0f;
      if (wg == 0 && c == 0) p.lse[row0 + tile_row0 + r] = any ? m * kLn2 + logf(l) : num::kNegInf;
      uint32_t* o = reinterpret_cast<uint32_t*>(p.out + (row0 + tile_row0 + r) * kDimV + col);
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const uint32_t lo = num::f32_to_bf16(acc[4 * j + 2 * half] * inv);
        const uint32_t hi = num::f32_to_bf16(acc[4 * j + 2 * half + 1] * inv);
        o[4 * j] = lo | (hi << 16);
      }
    }
  }
  DDT_PROF_LAP(12, tp);  // epilogue
#endif
}

__global__ void __launch_bounds__(kThreads, 1)
    verify_attn_sm90_kernel(ddt_verify_attn_params p, int split_keys, float* ws_o, float* ws_ml,
                            const __grid_constant__ CUtensorMap kv_map, int use_tma) {
#if DDT_SM90_BODY
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  __shared__ float red[2 * kRows];
  __shared__ __align__(8) uint64_t full[2];
  const Tma tma{&kv_map, smem_u32(full), use_tma != 0};
  uint32_t phase = 0;
  if (threadIdx.x == 0 && tma.on) {  // made visible to all threads by offsets_bad's barrier
    mbar_init(tma.full, 1);
    mbar_init(tma.full + 8, 1);
    mbar_init_fence();
    tma_prefetch_map(tma.map);
  }
  unsigned char* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  run_flash_items<kRows>(p, split_keys, reinterpret_cast<int*>(base + kOffPHi), [&](const Item& item) {
    process_item(p, split_keys, item, base, red, ws_o, ws_ml, tma, phase);
  });
#endif
}

// Per device, once: compute capability 9.0, the dynamic shared-memory opt-in and the resident grid sizes.
struct DeviceInfo {
  int state = 0;         // 0 not asked, 1 ok, -1 not an sm_90 device, -2 CUDA query / opt-in failed
  int main_ctas = 0;     // resident main-kernel CTAs (one per SM)
  int combine_ctas = 0;  // resident combine CTAs
};
DeviceInfo device_info() {
  constexpr int kMaxDevices = 64;
  static DeviceInfo info[kMaxDevices];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) {
    (void)cudaGetLastError();
    return {-2, 0, 0};
  }
  if (info[dev].state != 0) return info[dev];
  int major = 0, minor = 0, sms = 0, occ = 0, occ2 = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return {-2, 0, 0};
  }
  if (major != 9 || minor != 0) return info[dev] = {-1, 0, 0};
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaFuncSetAttribute(verify_attn_sm90_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes) !=
          cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, verify_attn_sm90_kernel, kThreads, kSmemBytes) !=
          cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ2, verify_attn_combine_kernel, kThreads, 0) != cudaSuccess ||
      occ < 1 || occ2 < 1) {
    (void)cudaGetLastError();
    return {-2, 0, 0};
  }
  return info[dev] = {1, occ * sms, occ2 * sms};
}

// The KV cache as a 2D tensor [slots][576] bf16 for TMA: boxes of 64 rows x 64 dims, 128-byte swizzle (the
// layout wgmma reads). False when the driver entry point or the encoding is unavailable (the launcher then
// takes the cp.async path, which loads the same bytes into the same layout). DDTREE_SM90_TMA=0 forces that.
bool encode_kv_map(CUtensorMap* map, const ddt_verify_attn_params& p) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    const char* e = std::getenv("DDTREE_SM90_TMA");
    if (e && e[0] == '0') return PFN_cuTensorMapEncodeTiled_v12000(nullptr);
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return PFN_cuTensorMapEncodeTiled_v12000(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (!encode) return false;
  const cuuint64_t dims[2] = {cuuint64_t(kDimQK), cuuint64_t(p.num_pages) * cuuint64_t(p.page_size)};
  const cuuint64_t strides[1] = {cuuint64_t(kDimQK) * 2};
  const cuuint32_t box[2] = {64, 64}, elem[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint16_t*>(p.kv_cache), dims, strides, box, elem,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace
}  // namespace ddtree::kern::attn

extern "C" int ddt_verify_attn_sm90_cuda(const ddt_verify_attn_params* p, int split_keys, void* workspace,
                                         size_t workspace_bytes, void* stream) {
  using namespace ddtree::kern;
  if (int rc = attn::check_flash_call(p, split_keys, workspace, workspace_bytes, "verify_attn_sm90")) return rc;
  const attn::DeviceInfo dev = attn::device_info();
  if (dev.state == -1)
    return fail(DDT_ERR_ARCH, "verify_attn_sm90: needs a compute capability 9.0 GPU (H100 / H200); use the "
                              "portable kernel on other GPUs");
  if (dev.state != 1)
    return fail(DDT_ERR_CUDA, "verify_attn_sm90: cannot query the device or opt in to 226 KB of dynamic shared "
                              "memory (a build without sm_90a?)");
  if (p->total_nodes == 0) return DDT_OK;
  const attn::Bounds b = attn::capacity_bounds(*p, split_keys);  // items bound of 32-row tiles: >= 64-row items
  int64_t grid = std::min<int64_t>(b.items, dev.main_ctas);
  if (grid < 1) grid = 1;  // padding rows only
  float* ws_o = static_cast<float*>(workspace);
  float* ws_ml = ws_o + b.partial_rows * attn::kDimV;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  // TMA when every tile's 64 keys lie in one page: page_size and split_keys multiples of 64 (tiles start at
  // multiples of 64), and row coordinates within int32.
  CUtensorMap map{};
  const bool tma = p->page_size % 64 == 0 && split_keys % 64 == 0 &&
                   int64_t(p->num_pages) * p->page_size <= int64_t(INT32_MAX) && attn::encode_kv_map(&map, *p);
  attn::verify_attn_sm90_kernel<<<unsigned(grid), attn::kThreads, attn::kSmemBytes, s>>>(*p, split_keys, ws_o, ws_ml,
                                                                                         map, tma ? 1 : 0);
  DDT_CUDA_LAUNCHED();
  return attn::launch_combine(*p, split_keys, b, dev.combine_ctas, ws_o, ws_ml, s);
}
