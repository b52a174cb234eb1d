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
} ddt_status;

/* ---- data status word bits (OR-ed into *status by kernels) ---- */
#define DDT_DATA_NAN_LOGIT 0x1u   /* a NaN logit / log-prob was seen: treated as -inf, the row goes on */
#define DDT_DATA_BAD_INDEX 0x2u   /* a tree / token index out of range: that request is skipped */

/* ---- limits ---- */
#define DDT_MAX_BUDGET 512  /* nodes besides the root; N = budget + 1 <= 513 */
#define DDT_MAX_DEPTH 32
#define DDT_MAX_TOPK 1024   /* K of the top-K kernel */
#define DDT_MAX_VOCAB (1 << 19) /* columns per shard: keeps the fixed-point exp sum below 2^63 */

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
 * log-prob = value - global lse. With S = 1 this is just log_softmax restricted to the top-K. Token ids must
 * be unique across shards (disjoint vocabulary slices). CPU and CUDA outputs are bitwise identical. */
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
  int32_t* finished;           /* [batch] 0 running, 1 stop token, 2 max_new reached */
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

#ifdef __cplusplus
}
#endif
#endif /* DDTREE_KERNELS_H_ */
