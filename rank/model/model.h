// The DeepSeek-V3 / Kimi-K2 model on the cpu backend: one tensor-parallel shard of it, loaded from a Hugging
// Face model directory, run in fp32. The reference every faster backend is held against (FIDELITY.md).
//
// Numerics: weights are stored as read (bf16 / f16 widen exactly to fp32); every activation, the latent KV
// cache, the router and the logits are fp32. No bf16 rounding is applied anywhere in this backend, so tests
// against an fp32 reference use the fp32 tolerance of rule M (1e-4), and rule E holds across batch
// compositions and tree shapes: each row's arithmetic depends on nothing but that row and the KV rows it
// sees, always visited in increasing slot order (rank/model/ops.h).
//
// Attention is the absorbed MLA form in every mode (prefill, decode, tree verify):
//   q_lat[h] = W_UK[h]^T q_nope[h] (kv_lora_rank), q_pe[h] roped at the row's position;
//   score(j) = softmax_scale * (q_lat[h] . c_kv[j] + q_pe[h] . k_pe[j]) over visible key slots j;
//   o_lat[h] = sum_j p_j c_kv[j]; v[h] = W_UV[h] o_lat[h]; out = o_proj(concat_h v[h]).
// W_UK / W_UV are the nope / v row blocks of kv_b_proj ([heads * (nope + v), kv_lora_rank], per head the
// qk_nope_head_dim W_UK rows, then the v_head_dim W_UV rows).
//
// Tensor parallelism (shard = (tp_rank, tp_size)); every split is contiguous and in rank order:
//   - attention heads: rank r owns heads [r*h, (r+1)*h), h = heads / tp_size (q_b_proj / q_proj and
//     kv_b_proj rows, o_proj columns); q_a_proj, q_a_layernorm, kv_a_proj_with_mqa, kv_a_layernorm are
//     replicated, so every rank holds the whole latent KV cache;
//   - dense MLP: intermediate_size split (gate/up rows, down columns);
//   - MoE: every routed expert's and the shared experts' intermediate split the same way (not expert
//     parallelism): the router (gate.weight, e_score_correction_bias) is replicated, every rank routes
//     every token identically and computes its slice of each selected expert;
//   - vocabulary: rows [r*ceil(V/tp), min(V, (r+1)*ceil(V/tp))) of embed_tokens and lm_head. The embedding
//     partial is the row where the token is in the shard, zeros elsewhere; logits stay sharded.
// Partial results (embedding, attention o_proj, MLP/MoE down_proj) are summed across ranks by the
// AllReduceFn the caller installs (rank order; Comm::all_reduce kSum): the model never talks to other
// ranks itself. tp_size 1 needs none.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "rank/kv/latent_kv.h"
#include "rank/model/config.h"
#include "rank/model/safetensors.h"

namespace ddtree::model {

struct ShardSpec {
  int tp_rank = 0;
  int tp_size = 1;
};

// What this shard owns: half-open ranges in the full model's index spaces.
struct ShardRanges {
  int64_t head0 = 0, head1 = 0;            // attention heads
  int64_t inter0 = 0, inter1 = 0;          // dense MLP intermediate
  int64_t moe_inter0 = 0, moe_inter1 = 0;  // each routed expert's intermediate
  int64_t shared0 = 0, shared1 = 0;        // shared experts' intermediate (n_shared x moe_intermediate)
  int64_t vocab0 = 0, vocab1 = 0;          // vocabulary rows
  int64_t heads() const { return head1 - head0; }
  int64_t vocab() const { return vocab1 - vocab0; }
};
// Throws ConfigError when a dimension does not divide by tp_size (heads, intermediates).
ShardRanges shard_ranges(const ModelConfig& c, const ShardSpec& s);

// A row-major fp32 matrix [rows, cols] (PyTorch Linear weight layout [out, in]).
struct Mat {
  int64_t rows = 0, cols = 0;
  std::vector<float> w;
};

struct MlpWeights {  // SiLU-gated MLP slice: gate/up [I_local, H], down [H, I_local]
  Mat gate, up, down;
};

struct LayerWeights {
  std::vector<float> input_norm, post_norm;  // [H]
  // attention (local heads hl; qk = nope + rope)
  Mat q_a;                      // [q_lora, H]       (q LoRA only)
  std::vector<float> q_a_norm;  // [q_lora]
  Mat q_b;                      // [hl * qk, q_lora] (q LoRA) or q_proj [hl * qk, H]
  Mat kv_a;                     // [kv_lora + rope, H]
  std::vector<float> kv_a_norm; // [kv_lora]
  Mat kv_b;                     // [hl * (nope + v), kv_lora]
  Mat o;                        // [H, hl * v]
  // MLP
  bool moe = false;
  MlpWeights dense;                   // dense layers
  Mat router;                         // [E, H]
  std::vector<float> router_bias;     // [E] e_score_correction_bias
  std::vector<MlpWeights> experts;    // [E]
  MlpWeights shared;                  // n_shared_experts > 0
};

struct ModelWeights {
  Mat embed;                    // [vocab_local, H] rows vocab0..vocab1
  Mat lm_head;                  // [vocab_local, H] (a copy of embed's rows when tie_word_embeddings)
  std::vector<float> final_norm;  // [H]
  std::vector<LayerWeights> layers;
};

struct LoadOptions {
  bool allow_unknown_config_keys = false;
};

// Reads this shard's weights from an open checkpoint with the hub's tensor names. Throws CheckpointError
// (file + tensor) for anything missing, mis-shaped, of an unsupported dtype or truncated.
ModelWeights load_weights(const Checkpoint& ckpt, const ModelConfig& c, const ShardSpec& s);
// The shard `s` cut out of full (tp_size 1) weights, with the same contiguous splits as load_weights.
ModelWeights slice_weights(const ModelWeights& full, const ModelConfig& c, const ShardSpec& s);

// One request's rows in a forward step, in the tree builder's layout (kernels.h ddt_tree_build_params):
// row i is written to KV slot prefix_len + i and uses RoPE position positions[i]. Key slot j is visible to
// row i iff j < prefix_len, or j = prefix_len + b with bit b of vis row i set (vis = nullptr: causal,
// b <= i). Causal prefill of a chunk and one-token decode are the chain case (positions = slots).
struct RequestRows {
  int kv_request = 0;                  // the request's row in the KV page table
  int64_t prefix_len = 0;              // tokens already in the cache (P)
  int n = 0;                           // rows (tokens / tree nodes), >= 1
  const int32_t* tokens = nullptr;     // [n]
  const int32_t* positions = nullptr;  // [n]; nullptr = prefix_len + i (chain)
  const int32_t* slots = nullptr;      // [n]; optional, must equal prefix_len + i (checked)
  const uint64_t* vis = nullptr;       // [n, ceil(n / 64)] ancestor bitmask rows; nullptr = causal
};

struct ForwardResult {
  int64_t rows = 0;           // total rows of the step (requests concatenated in order)
  std::vector<float> logits;  // [rows, vocab_local] for this shard's vocabulary slice
  // When capture_hidden: [num_layers + 1, rows, H], transformers' output_hidden_states: [0] the embeddings,
  // [l] the residual stream after layer l-1 for l < L, [L] the output of the final norm.
  std::vector<float> hidden;
};

using AllReduceFn = std::function<void(float* data, std::size_t count)>;

class Model {
 public:
  Model(ModelConfig config, ShardSpec shard, ModelWeights weights);
  // Opens DIR (config.json + safetensors) and loads shard `s`.
  static Model load(const std::filesystem::path& dir, const ShardSpec& s = {}, const LoadOptions& o = {});

  const ModelConfig& config() const { return cfg_; }
  const ShardSpec& shard() const { return shard_; }
  const ShardRanges& ranges() const { return ranges_; }
  const ModelWeights& weights() const { return w_; }

  // Sum of partial results across ranks (required when tp_size > 1).
  void set_all_reduce(AllReduceFn fn) { all_reduce_ = std::move(fn); }

  // A latent KV cache shaped for this model.
  kv::LatentKvShape kv_shape(int page_size, int num_pages, int max_requests, int max_pages_per_request) const;

  // Runs every request's rows through the model: writes their KV rows (slots must already be reserved in
  // `cache`), returns logits (and hidden states). Throws std::invalid_argument for malformed rows.
  void forward(const std::vector<RequestRows>& batch, kv::LatentKvCache& cache, ForwardResult& out,
               bool capture_hidden = false) const;

  // ---- building blocks (partial results of this shard, before the all-reduce; used by forward and by the
  // tensor-parallel tests) ----
  // out[n, H]: embedding rows for tokens in this shard's vocabulary, zeros otherwise.
  void embed_partial(const int32_t* tokens, int64_t n, float* out) const;
  // x_normed[rows, H] (after input_layernorm) -> out[rows, H] (o_proj of the local heads). Writes the rows'
  // latent KV into `cache` (layer `layer`) first, then attends.
  void attention_partial(int layer, const std::vector<RequestRows>& batch, const float* x_normed,
                         kv::LatentKvCache& cache, float* out) const;
  // x_normed[rows, H] (after post_attention_layernorm) -> out[rows, H] (dense MLP or routed + shared
  // experts, this shard's intermediate slice).
  void mlp_partial(int layer, const float* x_normed, int64_t rows, float* out) const;
  // Router of an MoE layer for one row: selected experts (score-descending, ties to the smaller id) and
  // their final weights (normalised if norm_topk_prob, times routed_scaling_factor).
  void route(int layer, const float* x_normed, std::vector<int>& experts, std::vector<float>& weights) const;
  // x[rows, H] after the final norm -> logits[rows, vocab_local].
  void lm_head(const float* x, int64_t rows, float* logits) const;

  // RoPE of one rope vector (qk_rope_head_dim) at `position`, in place; output in the half layout.
  void apply_rope(float* x, int64_t position) const;

 private:
  void reduce(float* data, std::size_t count) const;

  ModelConfig cfg_;
  ShardSpec shard_;
  ShardRanges ranges_;
  ModelWeights w_;
  AllReduceFn all_reduce_;
  std::vector<float> inv_freq_;  // [rope / 2]
  float attn_factor_ = 1.0f;     // cos/sin multiplier (YaRN)
  float softmax_scale_ = 0.0f;
};

}  // namespace ddtree::model
