/* ddtree-engine kernels: the C ABI.
 *
 * Every kernel family has a CPU twin (suffix _cpu: host pointers, plain and obviously right, the cpu
 * backend) and a CUDA implementation (suffix _cuda: device pointers plus a cudaStream_t passed as void*).
 * Both take the same params struct and produce bit-identical integer outputs (token ids, tree structure)
 * and, where stated, bit-identical floats.
 *
 * Conventions
 *  - Shapes are given in comments as [dim0, dim1, ...], row-major, contiguous. Dtypes: f32 = float,
 *    i32 = int32_t, u64 = uint64_t, u32 = uint32_t.
 *  - Every pointer must be non-null and aligned to its element size (rows of logits that start on a
 *    16-byte boundary are read with vector loads); violations are returned as DDT_ERR_NULL / DDT_ERR_ALIGN before any
 *    work is launched. A host-visible argument error never launches anything.
 *  - The _cuda calls never synchronise the host and never allocate: they can be captured in a CUDA graph
 *    and replayed with new inputs written in place.
 *  - Problems visible only in the data (a NaN logit, a tree index out of range) are OR-ed into a uint32
 *    status word (`status`, device memory for _cuda, host memory for _cpu) that the caller reads later;
 *    the kernel never dereferences out-of-range data. The word is never cleared by a kernel.
 *  - Packed argmax keys (u64): (order-preserving bits of the f32 value) << 32 | (0xFFFFFFFF - token id).
 *    A larger key is a larger value, ties go to the smaller token id, and keys reduce across vocabulary
 *    shards with a plain integer max (an all-reduce max over u64).
 */
#ifndef DDTREE_KERNELS_H_
#define DDTREE_KERNELS_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes (return values) ---- */
typedef enum ddt_status {
  DDT_OK = 0,
  DDT_ERR_NULL = 1,        /* a required pointer is null */
  DDT_ERR_ALIGN = 2,       /* a pointer is not aligned as required */
  DDT_ERR_SHAPE = 3,       /* a dimension is out of range (rows, vocab, K, shards, node width) */
  DDT_ERR_BUDGET = 4,      /* tree budget 0 or above DDT_MAX_BUDGET */
  DDT_ERR_DEPTH = 5,       /* tree depth 0 or above DDT_MAX_DEPTH */
  DDT_ERR_TEMPERATURE = 6, /* temperature < 0, NaN or inf */
  DDT_ERR_NO_CUDA = 7,     /* this build has no cuda backend, or no GPU is present */
  DDT_ERR_CUDA = 8,        /* a CUDA runtime call failed (ddt_last_error_message() says which) */
  DDT_ERR_VALUE = 9,       /* a scalar argument out of range (verify attention: softmax_scale) */
  DDT_ERR_ARCH = 10,       /* the GPU lacks the kernel's architecture (the sm_90a kernel off compute capability 9.0) */
} ddt_status;

/* ---- data status word bits (OR-ed into *status by kernels) ---- */
#define DDT_DATA_NAN_LOGIT 0x1u   /* a NaN logit / log-prob (treated as -inf) or, in top-K, a +inf logit (lse = +inf) */
#define DDT_DATA_BAD_INDEX 0x2u   /* malformed tree (node count out of range) or an empty key: that request is skipped */
#define DDT_DATA_BAD_PLAN 0x4u    /* verify attention: the plan passed to ddt_verify_attn_sm90_planned_cuda was made for other
                                     scalars (batch, heads, split_keys, capacities) or never written: every row poisoned */
#define DDT_DATA_PROBE_NARROW 0x100u /* test hook, set only with DDTREE_SM90_NARROW=probe (DDTREE_PORTABLE_NARROW=probe
                                        or probe8) in the environment: an item of ddt_verify_attn_sm90_cuda
                                        (_portable_cuda) took the narrow path (requests of <= 16 rows; probe8: the
                                        narrow-8 kernel, every item) */
#define DDT_DATA_PROBE_COMBINE 0x200u /* test hook, set only with DDTREE_ATTN_COMBINE=probe in the environment: the
                                         flash kernels' combine merged a row with one warp (requests of <= 8 splits) */

/* ---- limits ---- */
#define DDT_MAX_BUDGET 512  /* nodes besides the root; N = budget + 1 <= 513 */
#define DDT_MAX_DEPTH 32
#define DDT_MAX_TOPK 1024   /* K of the top-K kernel */
#define DDT_MAX_VOCAB (1 << 19) /* global vocabulary (vocab_offset + columns): keeps the fixed-point exp sum below 2^63 */

const char* ddt_status_string(int status);
/* Detail of the last error returned on this thread (names the argument or the CUDA call). */
const char* ddt_last_error_message(void);
/* 1 when this build has the cuda backend and a GPU is visible, else 0. Never aborts. */
int ddt_cuda_available(void);

/* ======================= 1. Top-K over a vocabulary shard =======================
 * For each row (request x draft position) of a vocabulary shard's logits: the K largest logits with their
 * global token ids (vocab_offset + column), sorted by (logit descending, id ascending), and the shard's
 * log-sum-exp. NaN logits count as -inf and set DDT_DATA_NAN_LOGIT. If K > vocab the tail is (-inf, -1).
 * The LSE is m + log(sum exp(x - m)) with m the row max (an all -inf row gives lse = -inf), from portable
 * exp / log and an exact fixed-point sum (kernels/common/topk_math.h): CPU and CUDA outputs, the lse
 * included, are bitwise identical; the lse is within a few ulp of the exact value. */
typedef struct ddt_topk_shard_params {
  const float* logits;  /* [rows, vocab] f32, row stride ld (elements, ld >= vocab) */
  int64_t ld;
  int rows;
  int vocab;            /* columns in this shard */
  int vocab_offset;     /* global id of column 0 */
  int k;                /* 1..DDT_MAX_TOPK */
  float* out_values;    /* [rows, k] f32 raw logits, descending */
  int32_t* out_ids;     /* [rows, k] i32 global ids (-1 for padding) */
  float* out_lse;       /* [rows] f32 shard log-sum-exp */
  uint32_t* status;     /* [1] data status word */
} ddt_topk_shard_params;

/* Combine S shards' top-K lists into the global top-K log-probs: global lse = log-sum-exp of the shard
 * lses folded in shard order; the S*k candidates are merged by (value desc, id asc) skipping id -1;
 * log-prob = value - global lse. With S = 1 this is just log_softmax restricted to the top-K.
 * Preconditions (the topk_shard output always meets them; the CUDA kernel relies on them): each shard's list
 * is sorted by (value desc, id asc) with id -1 padding only at its tail, and ids are unique across shards
 * (disjoint vocabulary slices). Under them CPU and CUDA outputs are bitwise identical. */
typedef struct ddt_topk_combine_params {
  const float* values;   /* [shards, rows, k] f32 */
  const int32_t* ids;    /* [shards, rows, k] i32 */
  const float* lse;      /* [shards, rows] f32 */
  int shards;            /* 1..64 */
  int rows;
  int k;
  float* out_logprobs;   /* [rows, k] f32, descending; -inf padding */
  int32_t* out_ids;      /* [rows, k] i32; -1 padding */
} ddt_topk_combine_params;

int ddt_topk_shard_cpu(const ddt_topk_shard_params* p);
int ddt_topk_combine_cpu(const ddt_topk_combine_params* p);
int ddt_topk_shard_cuda(const ddt_topk_shard_params* p, void* stream);
int ddt_topk_combine_cuda(const ddt_topk_combine_params* p, void* stream);

/* ======================= 2. DDTree best-first tree builder =======================
 * reference/ddtree.md exactly: per request a heap of (score, seq, parent, depth, rank), max by score,
 * ties to the smaller seq; node index = pop order; a node's score is its parent's score plus its own
 * log-prob. Fixed width N = budget + 1 per request; nodes past node_count are padding: token = root
 * token, parent = -1, depth = 1 (so position = prefix_len + 1 stays a valid RoPE position), score = -inf,
 * not linked into any child list, vis row {0, i}. CPU and CUDA outputs are bitwise identical. */
typedef struct ddt_tree_build_params {
  const float* logprobs;     /* [batch, depth, k] f32, each row sorted descending (top-K output) */
  const int32_t* token_ids;  /* [batch, depth, k] i32 */
  const int32_t* root_tokens;/* [batch] i32: the bonus token of the previous step (node 0) */
  const int32_t* prefix_lens;/* [batch] i32: committed tokens before the tree (slot of node 0) */
  int batch;                 /* 1..65535 */
  int depth;                 /* max tree depth L (draft positions), 1..DDT_MAX_DEPTH */
  int k;                     /* candidates per position, >= 1 (K > budget is allowed, only B used) */
  int budget;                /* B, nodes besides the root, 1..DDT_MAX_BUDGET */
  /* outputs, N = budget + 1, W = ceil(N / 64) */
  int32_t* tokens;           /* [batch, N] */
  int32_t* parents;          /* [batch, N]  parent[0] = -1 */
  int32_t* depths;           /* [batch, N]  depth[0] = 0 */
  float* scores;             /* [batch, N]  summed log-prob root..node; score[0] = 0 */
  int32_t* slots;            /* [batch, N]  prefix_len + i: where verify writes node i's KV row */
  int32_t* positions;        /* [batch, N]  prefix_len + depth[i]: RoPE position */
  uint64_t* vis;             /* [batch, N, W] ancestor bitmask rows (bit j: node j visible to node i) */
  int32_t* first_child;      /* [batch, N]  -1 if none */
  int32_t* next_sibling;     /* [batch, N]  -1 if none; children in pop order */
  int32_t* node_count;       /* [batch]     nodes in the tree including the root, 1..N */
  uint32_t* status;          /* [1] data status word */
} ddt_tree_build_params;

int ddt_tree_build_cpu(const ddt_tree_build_params* p);
int ddt_tree_build_cuda(const ddt_tree_build_params* p, void* stream);

/* ======================= 3. Accept =======================
 * 3a. Per-node packed keys from a vocabulary shard of the target logits: greedy (temperature == 0) or a
 * Gumbel-max sample at temperature T > 0: value = logit / T + gumbel(seed[r], out_pos, id), with
 * out_pos = positions[node] + 1 (the absolute position of the token being sampled) and the Gumbel noise
 * from a counter-based hash and a portable log, so CPU and CUDA produce bitwise-identical keys and a
 * speculative step samples exactly the token plain sampling would at the same position. Keys reduce
 * across shards by integer max. NaN logits count as -inf (key of -inf) and set DDT_DATA_NAN_LOGIT. */
typedef struct ddt_sample_keys_params {
  const float* logits;       /* [batch * nodes, vocab] f32, row stride ld >= vocab */
  int64_t ld;
  int batch;
  int nodes;                 /* N per request (tree width; 1 for plain decoding) */
  int vocab;                 /* columns in this shard */
  int vocab_offset;          /* global id of column 0 */
  const int32_t* positions;  /* [batch, nodes] i32 position of each node (prefix_len + depth) */
  const uint64_t* seeds;     /* [batch] u64 per-request seed (unused when temperature == 0) */
  float temperature;         /* 0 = greedy; > 0 = Gumbel-max sampling */
  uint64_t* out_keys;        /* [batch, nodes] u64 packed keys */
  uint32_t* status;          /* [1] */
} ddt_sample_keys_params;

/* 3b. The walk: from the root follow the child whose token equals the node's target token (decoded from
 * its key; among children with that token the first in pop order, which for a valid tree is the only one)
 * until none matches; emit the path's tokens then the bonus target token; a stop token ends the
 * output (inclusive) and max_new truncates. One warp per request on CUDA. */
typedef struct ddt_accept_params {
  const uint64_t* keys;        /* [batch, N] u64 reduced keys (target token of node i = low bits) */
  const int32_t* tokens;       /* [batch, N] tree tokens (tree builder output) */
  const int32_t* parents;      /* [batch, N] (children are found as the nodes whose parent is cur) */
  const int32_t* node_count;   /* [batch] */
  int batch;
  int n;                       /* N, tree width, 1..DDT_MAX_BUDGET+1 */
  int max_path;                /* capacity of path / new_tokens rows, 1..DDT_MAX_DEPTH+1 */
  const int32_t* max_new;      /* [batch] tokens this request may still emit (>= 0) */
  const int32_t* stop_ids;     /* [num_stop] stop token ids shared by the batch (may be null if 0) */
  int num_stop;
  /* outputs */
  int32_t* path;               /* [batch, max_path] accepted node indices, path[0] = 0; -1 padded */
  int32_t* path_len;           /* [batch] accepted nodes incl. the root (KV rows to keep), >= 1 */
  int32_t* new_tokens;         /* [batch, max_path] emitted tokens; -1 padded */
  int32_t* num_new;            /* [batch] emitted tokens (after stop / max_new truncation) */
  int32_t* bonus;              /* [batch] target token at the last accepted node (next root token) */
  int32_t* finished;           /* [batch] 0 running, 1 stop token, 2 max_new reached, 3 bad data (see status;
                                  path = {0}, num_new = 0, bonus = -1) */
  uint32_t* status;            /* [1] */
} ddt_accept_params;

int ddt_sample_keys_cpu(const ddt_sample_keys_params* p);
int ddt_sample_keys_cuda(const ddt_sample_keys_params* p, void* stream);
int ddt_accept_cpu(const ddt_accept_params* p);
int ddt_accept_cuda(const ddt_accept_params* p, void* stream);

/* Helpers shared by both backends and the tests (exact, pure functions). */
uint32_t ddt_float_order_bits(float x);          /* order-preserving; NaN maps like -inf */
uint64_t ddt_pack_key(float value, int32_t token_id);
int32_t ddt_key_token(uint64_t key);
float ddt_gumbel(uint64_t seed, int64_t position, int32_t token_id); /* the noise sample keys use */

/* ======================= 4. Tree-verify MLA attention (absorbed MLA over a paged latent KV cache) =======================
 * reference/mla-verify-attention.md. bf16 values are passed as their uint16_t bit patterns (the upper half of
 * an IEEE f32); ddt_f32_to_bf16 / ddt_bf16_to_f32 convert (round to nearest even).
 *
 * Request r (0 <= r < batch) owns the query rows (tree nodes) [node_offsets[r], node_offsets[r+1]), N_r of
 * them, and has a prefix of P_r = prefix_lens[r] committed tokens. Its KV rows sit at token slots 0 .. P_r-1
 * (prefix) and P_r .. P_r+N_r-1 (node i's own row, already written, at slot P_r + i); slot t lives in page
 * page_table[r * max_pages + t / page_size] at offset t % page_size of kv_cache.
 * For query row i (local node index i = row - node_offsets[r]) and head h:
 *   key slot j in [0, P_r + N_r) is visible iff j < P_r or bit (j - P_r) of vis row `row` is set
 *     (bit b = word b / 64, bit b % 64 of the row's vis_words u64 words; bits b >= N_r are ignored);
 *   s_j  = softmax_scale * sum_{d < 576} q[row, h, d] * kv[j, d]        (q_lat . c_kv + q_pe . k_pe)
 *   out[row, h, :] = sum_j softmax(s)_j * kv[j, 0:512]                  (V = the c_kv part of the row)
 *   lse[row, h]    = ln(sum_j exp(s_j))  over visible j: natural log, of the SCALED scores
 *                    (exp(s_j - lse) is the probability of key j).
 * A row with no visible key gives out = 0, lse = -inf (cannot happen for a tree: a node sees itself). A NaN
 * score (a NaN in the row's q or in a visible key) makes the row's out and lse NaN, also when every visible
 * score is NaN; no status bit (the indices are fine). Non-finite KV rows of the request that a row does NOT
 * see: the twin and the oracle skip them; the flash kernels multiply them by a probability of 0 inside the
 * tensor-core product, so a NaN / inf in the V part of such a row (slots [0, P_r + N_r): written by the model,
 * so the model already produced it) may turn other rows of the same 64-key tile (sm_90a) or 32-key tile
 * (portable) NaN. +-inf inputs in general give implementation-dependent non-finite or empty rows.
 * Rows [node_offsets[batch], total_nodes) belong to no request (padding, e.g. a CUDA graph captured for a
 * maximum node count): out = 0, lse = -inf, no status bit.
 * Data checks (device data, so in the kernel; a failure ORs DDT_DATA_BAD_INDEX into *status, nothing
 * out of range is dereferenced, and the affected rows are written as NaN: out = bf16 NaN, lse = NaN):
 *   - node_offsets must be 0 = off[0] <= off[1] <= ... <= off[batch] <= total_nodes; otherwise EVERY row of
 *     the call is NaN;
 *   - for each request with N_r >= 1: P_r >= 0, N_r <= 64 * vis_words, P_r + N_r <= max_pages * page_size,
 *     and every page index it needs (page_table[r * max_pages + k] for k < ceil((P_r + N_r) / page_size)) in
 *     [0, num_pages); otherwise that request's rows (only) are NaN. Unused page-table entries, pages and
 *     slots beyond P_r + N_r never reach a result (they may hold anything, NaN included): no kernel reads
 *     them, except that the sm_90a kernel's TMA path copies whole 64-slot blocks of the request's own last
 *     page and zeroes the slots past P_r + N_r in shared memory before any use.
 * Host-visible checks (return codes, nothing launched): null pointers (DDT_ERR_NULL), alignment
 * (DDT_ERR_ALIGN: q, kv_cache, out 16 bytes; vis 8; the rest 4), batch / total_nodes / heads / page_size /
 * max_pages / num_pages / vis_words ranges (DDT_ERR_SHAPE), softmax_scale finite and > 0 and p_precision one of
 * the DDT_ATTN_P_ values (DDT_ERR_VALUE).
 * Numerics: _cpu accumulates in f64 (the reference; slow: for tests up to P ~ 2k); the CUDA oracle in f32 with an
 * online softmax; outputs round to bf16 (nearest even). They agree to the correctness bar of
 * reference/mla-verify-attention.md (in practice within 1 bf16 ulp), not bitwise. A row's result does not depend on the
 * other rows of the batch (batch invariance: every kernel). The CPU twin and the oracle visit keys in a fixed order
 * of their absolute slot, so with them a chain node i gives bitwise the result of decoding a single node at
 * prefix P_r + i; the portable and sm_90a kernels too, for a given split_keys (below). */
#define DDT_ATTN_DIM_QK 576  /* per query / cache row: 512 latent (c_kv, absorbed q_nope) + 64 rope */
#define DDT_ATTN_DIM_V 512   /* output row: the latent part */
#define DDT_ATTN_MAX_HEADS 256
#define DDT_ATTN_MAX_ROWS (1 << 24) /* total_nodes */
/* p_precision: how precisely the softmax weights p_j enter the PV product (a per-call choice; a deployment uses one).
 * DDT_ATTN_P_HILO (0, the default): the correctness bar of reference/mla-verify-attention.md for every kernel (the
 *   flash kernels feed P to the tensor cores as a bf16 pair hi + lo, two PV products).
 * DDT_ATTN_P_BF16 (1, opt-in: FlashMLA's precision): the flash kernels (portable and sm_90a) round each p_j to one
 *   bf16 (relative error <= 2^-8) and run one PV product, ~10% faster at T >= 8 (docs/BENCHMARKS.md). Its bar:
 *   out[row, h, d] within the bar plus 2^-8 x sum_j p_j |v_jd| / sum_j p_j of the exact value (the weights'
 *   rounding, summed over the keys at its worst; peaked rows whose output cancels are where it exceeds the bar),
 *   and the bar's cosine criterion (< 5e-6 over a result; measured 1.0-1.8e-6 on the tests' peaked problems); lse
 *   as in the default (row sums of the unrounded f32 weights). Batch invariance and chain node == single-node decode
 *   (FIDELITY rule E) hold within the mode; results differ between modes. The CPU twin and the oracle accept it and
 *   compute at the default precision (at least as precise). Other values: DDT_ERR_VALUE.
 * ABI: p_precision (added 2026-11-30) made the struct 120 bytes (112 before); code built against an older header must
 * be rebuilt, or the library reads past the caller's struct. Zero-initialise the struct (`= {}` / memset) so that
 * fields added at its end later default to 0. */
#define DDT_ATTN_P_HILO 0
#define DDT_ATTN_P_BF16 1

typedef struct ddt_verify_attn_params {
  const uint16_t* q;            /* [total_nodes, heads, 576] bf16: absorbed q_nope (512) then roped q_pe (64) */
  const uint16_t* kv_cache;     /* [num_pages, page_size, 576] bf16: c_kv (512) then roped k_pe (64) */
  const int32_t* page_table;    /* [batch, max_pages] i32 physical page of each logical page */
  const int32_t* prefix_lens;   /* [batch] i32 P_r: committed tokens before the tree */
  const int32_t* node_offsets;  /* [batch + 1] i32 cumulative node counts, node_offsets[0] = 0 */
  const uint64_t* vis;          /* [total_nodes, vis_words] u64 ancestor bitmask rows (bit i: tree node i) */
  int batch;                    /* 0..65535 */
  int total_nodes;              /* rows of q / out / lse / vis (>= node_offsets[batch]), 0..DDT_ATTN_MAX_ROWS */
  int heads;                    /* local heads H, 1..DDT_ATTN_MAX_HEADS */
  int page_size;                /* tokens per page, >= 1 */
  int max_pages;                /* page-table row stride, >= 1 */
  int64_t num_pages;            /* pages in kv_cache, >= 1 */
  int vis_words;                /* W, u64 words per vis row, >= 1 */
  float softmax_scale;          /* 1/sqrt(qk_nope + qk_rope) (times YaRN mscale^2): finite, > 0 */
  uint16_t* out;                /* [total_nodes, heads, 512] bf16 */
  float* lse;                   /* [total_nodes, heads] f32 natural-log sum of exp(scaled scores) */
  uint32_t* status;             /* [1] data status word */
  int p_precision;              /* DDT_ATTN_P_HILO (0: a zero-initialised field) or DDT_ATTN_P_BF16, below */
} ddt_verify_attn_params;

int ddt_verify_attn_cpu(const ddt_verify_attn_params* p);
/* The oracle: one CTA per (row, head), f32, no host sync, no allocation, CUDA-graph safe. */
int ddt_verify_attn_cuda(const ddt_verify_attn_params* p, void* stream);
/* The portable flash kernel (mma.sync bf16 tensor cores, sm_80 .. sm_120, <= 99 KB shared memory per CTA):
 * same semantics, checks and outputs as the oracle, to the correctness bar (not bitwise: f32 online softmax,
 * P fed to the tensor cores as a bf16 hi + lo pair), batch invariant, no host sync, no allocation, CUDA-graph
 * safe (two launches: the attention and, when a request may split its keys, the combine of the splits).
 * split_keys: 0 (never split) or a positive multiple of 32: a request with P_r + N_r > split_keys is cut at the
 * absolute positions split_keys, 2 split_keys, ... and the pieces are combined in a fixed order. Because the
 * cut points are absolute, a chain node i of a request at prefix P and the single-node decode at prefix
 * P + i give bitwise the same result for the same split_keys (FIDELITY rule E on cuda): use one value per
 * deployment. Small values (e.g. 512) let one long request fill the GPU; 0 avoids the partial traffic and
 * the workspace when batches are large.
 * workspace: device memory of at least ddt_verify_attn_portable_workspace(p, split_keys) bytes, 16-byte
 * aligned (may be null when that is 0); no initialisation needed, scratch after the call. The size depends only
 * on batch, total_nodes, heads, max_pages x page_size and split_keys, so one allocation serves every call (and
 * every replay of a captured graph) with those capacities: total_nodes x heads x ceil(max_keys / split_keys)
 * partial rows of 2,056 B (f32 o, m, l) when max_keys = max_pages x page_size exceeds split_keys, else 0.
 * Returns DDT_ERR_NULL / DDT_ERR_ALIGN / DDT_ERR_SHAPE for a missing, misaligned or too small workspace and
 * DDT_ERR_SHAPE for a bad split_keys; ddt_verify_attn_portable_workspace returns DDT_ERR_SHAPE when the
 * capacities would need 2^31 or more work items or partial rows. */
int ddt_verify_attn_portable_workspace(const ddt_verify_attn_params* p, int split_keys, size_t* bytes);
int ddt_verify_attn_portable_cuda(const ddt_verify_attn_params* p, int split_keys, void* workspace,
                                  size_t workspace_bytes, void* stream);
/* The sm_90a flash kernel (Hopper: wgmma with operands in shared memory, 64-row x 64-key tiles, a producer
 * warpgroup loading the KV tiles): the same semantics, checks, outputs, split_keys rule, workspace
 * (ddt_verify_attn_portable_workspace sizes it) and combine as the portable kernel, to the correctness bar;
 * batch invariant, chain node == single-node decode bitwise for one split_keys, no host sync, no allocation,
 * CUDA-graph safe. Returns DDT_ERR_ARCH on a GPU of another compute capability than 9.0, or when the library
 * holds no sm_90a code (built for plain 90). */
int ddt_verify_attn_sm90_cuda(const ddt_verify_attn_params* p, int split_keys, void* workspace,
                              size_t workspace_bytes, void* stream);
/* The sm_90a kernel with its schedule made beforehand, once per speculative step (FlashMLA's metadata, FlashInfer's
 * plan / run): the node_offsets check, the scan over the requests and every item's page check, which
 * ddt_verify_attn_sm90_cuda runs at the start of every call, depend only on batch, heads, split_keys, the
 * capacities (total_nodes, page_size, max_pages, num_pages, vis_words) and the contents of node_offsets,
 * prefix_lens and page_table, which stay the same for every layer of a step. ddt_verify_attn_sm90_plan_cuda
 * (one small kernel) writes them to `plan`; ddt_verify_attn_sm90_planned_cuda then starts each CTA from one read
 * of it. Results, status bits and the workspace are those of ddt_verify_attn_sm90_cuda, bitwise. The plan must be
 * made again when any of the above changes (q, kv_cache, vis, softmax_scale, out, lse and status may change
 * freely); a plan made for other scalars, or not yet written, poisons every row and sets DDT_DATA_BAD_PLAN
 * (total_nodes = 0: nothing is launched); a stale plan (the same scalars, other node_offsets, prefix_lens or
 * page_table contents than when it was made) gives undefined results but never an access outside the buffers.
 * plan: device memory of at least ddt_verify_attn_sm90_plan_bytes(p, split_keys) bytes (host only, no GPU
 * needed; sized by capacities like the workspace), 16-byte aligned; no initialisation needed. No host sync, no
 * allocation, CUDA-graph safe (capture the plan with the step's first layer, or separately). Errors: as
 * ddt_verify_attn_sm90_cuda, plus DDT_ERR_NULL / DDT_ERR_ALIGN / DDT_ERR_SHAPE for a missing, misaligned or
 * too small plan. */
int ddt_verify_attn_sm90_plan_bytes(const ddt_verify_attn_params* p, int split_keys, size_t* bytes);
/* The plan kernel's CPU twin: the same bytes (header and the listed items) from host copies of the params' arrays
 * (node_offsets, prefix_lens, page_table; the other pointers are checked as by every call but not read). */
int ddt_verify_attn_sm90_plan_cpu(const ddt_verify_attn_params* p, int split_keys, void* plan, size_t plan_bytes);
int ddt_verify_attn_sm90_plan_cuda(const ddt_verify_attn_params* p, int split_keys, void* plan, size_t plan_bytes,
                                   void* stream);
int ddt_verify_attn_sm90_planned_cuda(const ddt_verify_attn_params* p, int split_keys, const void* plan,
                                      size_t plan_bytes, void* workspace, size_t workspace_bytes, void* stream);

/* ======================= 5. Accepted-path KV compaction =======================
 * reference/ddtree.md "KV after accept". Verify wrote tree node i's KV row at slot P_r + i of request r, in every
 * layer; the accept kernel's path lists the accepted nodes (path[0] = 0, strictly increasing, so path[k] >= k).
 * Compaction moves the row of slot P_r + path[k] to slot P_r + k for k = 1 .. path_len[r] - 1 (rows with
 * path[k] == k stay), in every layer, so that the accepted sequence occupies P_r .. P_r + path_len[r] - 1. The
 * result equals the copies done one by one in increasing k (each source read before any move overwrites it; a fully
 * parallel copy races: for path [0, 2, 3] the row moved to slot P + 1 comes from slot P + 2, which the next move
 * overwrites). Rows are opaque bytes: row_bytes each (1,152 for the bf16 latent
 * row of 576; the cpu backend's f32 rows are 4 x 576), a multiple of 4. Layer l's cache starts at kv + l x
 * layer_stride bytes and is laid out [num_pages, page_size, row_bytes]; slot t of request r lives in page
 * page_table[r * max_pages + t / page_size] at offset t % page_size (verify attention's addressing).
 * remap = 1 (page_size 1 only): no row moves; instead the page-table entries of slots P_r + k and P_r + path[k]
 * are swapped in increasing k, which leaves slot P_r + k mapped to the page that held node path[k]'s row in
 * every layer at once. Zero KV bytes move, and the request keeps the same set of pages (the pages of rejected
 * nodes end up past the accepted ones), so a page allocator needs no update.
 * Data checks (device data, so in the kernel; per request): 1 <= path_len[r] <= max_path, path[0] == 0, path
 * strictly increasing, P_r >= 0, P_r + path[last] < max_pages * page_size, and the page of every slot a move
 * reads or writes in [0, num_pages). A request failing one ORs DDT_DATA_BAD_INDEX into *status and is left
 * untouched (no row, no page-table entry written); the other requests are compacted. Entries of path past
 * path_len[r] are never read. The accept kernel's bad-data result (path = {0}, path_len = 1) moves nothing.
 * The caller keeps the pages a request's moves touch (its slots P_r .. P_r + path[last]) private to that request
 * and mapped once in its row (copy-on-write of shared prefix pages is the caller's): the moves of different
 * requests then never alias, and the kernel's read-all-then-write order gives the sequential result.
 * Host-visible checks (return codes, nothing launched): null pointers (DDT_ERR_NULL), alignment (DDT_ERR_ALIGN:
 * kv 4 bytes, the int arrays 4), ranges (DDT_ERR_SHAPE: batch 0..65535, num_layers 1..65535, row_bytes a
 * positive multiple of 4 up to 65536, layer_stride a multiple of 4 in [num_pages x page_size x row_bytes,
 * 2^62 / num_layers], page_size >= 1, max_pages >= 1, 1 <= num_pages <= 2^40 / page_size, max_path
 * 1..DDT_MAX_DEPTH + 1, remap only with page_size 1).
 * CPU and CUDA results are bitwise identical (bytes are copied, not computed). The CUDA kernel: one CTA per
 * (request, group of layers), sources staged in registers then written, 16-byte accesses when row_bytes,
 * layer_stride and kv allow; remap one warp per request; no host sync, no allocation, CUDA-graph safe, launched
 * with PDL after the accept kernel. */
typedef struct ddt_kv_compact_params {
  void* kv;                    /* layer 0's [num_pages, page_size, row_bytes]; layer l at kv + l * layer_stride */
  int64_t layer_stride;        /* bytes from one layer's cache to the next */
  int num_layers;              /* 1..65535 */
  int row_bytes;               /* bytes per token row, a multiple of 4, 4..65536 */
  int page_size;               /* tokens per page, >= 1 */
  int64_t num_pages;           /* pages per layer, >= 1 */
  int32_t* page_table;         /* [batch, max_pages] i32; written only when remap = 1 */
  int max_pages;               /* page-table row stride, >= 1 */
  const int32_t* prefix_lens;  /* [batch] i32 P_r: committed tokens before the tree (node 0's slot) */
  const int32_t* path;         /* [batch, max_path] i32 accepted node indices (ddt_accept_params.path) */
  const int32_t* path_len;     /* [batch] i32 accepted nodes including the root (ddt_accept_params.path_len) */
  int batch;                   /* 0..65535 */
  int max_path;                /* path row stride, 1..DDT_MAX_DEPTH + 1 */
  int remap;                   /* 0: copy rows; 1: swap page-table entries (page_size == 1) */
  uint32_t* status;            /* [1] data status word */
} ddt_kv_compact_params;

int ddt_kv_compact_cpu(const ddt_kv_compact_params* p);
int ddt_kv_compact_cuda(const ddt_kv_compact_params* p, void* stream);

/* bf16 <-> f32 (the conversions both backends use; round to nearest even, NaN stays a quiet NaN). */
uint16_t ddt_f32_to_bf16(float x);
float ddt_bf16_to_f32(uint16_t h);

#ifdef __cplusplus
}
#endif
#endif /* DDTREE_KERNELS_H_ */
