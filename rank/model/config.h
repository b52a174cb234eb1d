// ModelConfig: the fields of a Hugging Face DeepSeek-V3 / Kimi-K2 config.json that change the math, parsed
// and checked. Anything the cpu backend does not implement (another scoring function, attention biases,
// FP8 quantized weights, moe_layer_freq != 1, ...) is refused with a ConfigError naming the field, never
// ignored. Keys that do not change the forward pass (training knobs, bookkeeping) are listed in config.cpp
// and ignored; any other key is refused unless LoadOptions-like `allow_unknown_keys` is set.
//
// Reference semantics: transformers' DeepseekV3 (models/deepseek_v3/modeling_deepseek_v3.py and
// modeling_rope_utils.py _compute_yarn_parameters), which the tests hold this backend against.
#pragma once

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddtree::model {

class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// RoPE over the qk_rope_head_dim part of q and k. Written in config.json either as `rope_scaling` (the
// hub's DeepSeek-V3 / Kimi-K2 files: {"type": "yarn", "factor": 40, ...} with a top-level rope_theta) or as
// transformers 5's `rope_parameters` ({"rope_type": "yarn", "rope_theta": ..., ...}).
struct RopeConfig {
  bool yarn = false;             // false: plain RoPE ("default"); true: YaRN
  double theta = 10000.0;        // base
  // YaRN only (transformers' defaults where a key is absent):
  double factor = 1.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;           // 0 = absent
  double mscale_all_dim = 0.0;   // 0 = absent
  double attention_factor = -1;  // < 0 = absent (derived from factor / mscale / mscale_all_dim)
  int64_t original_max_position_embeddings = 0;
  bool truncate = true;
};

struct ModelConfig {
  std::string model_type;  // "deepseek_v3" or "kimi_k2"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  // MLA
  int64_t q_lora_rank = 0;  // 0: config says null -> plain q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // MLP / MoE
  int64_t intermediate_size = 0;      // dense layers
  int64_t moe_intermediate_size = 0;  // per routed expert; shared experts use n_shared_experts x this
  int64_t n_routed_experts = 0;       // 0: config says null -> every layer dense
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  // RoPE / norms / head
  RopeConfig rope;
  bool rope_interleave = true;
  double rms_norm_eps = 1e-6;  // input/post-attention/final norms; q_a/kv_a norms use 1e-6 (as transformers)
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;
  int64_t bos_token_id = -1;              // -1: none
  std::vector<int64_t> eos_token_ids;     // may be empty

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t kv_row_dim() const { return kv_lora_rank + qk_rope_head_dim; }  // latent KV row: 576 for real dims
  // transformers: layer l is MoE iff n_routed_experts > 0 and l >= first_k_dense_replace (moe_layer_freq
  // must be 1, checked at parse time).
  bool is_moe_layer(int64_t layer) const { return n_routed_experts > 0 && layer >= first_k_dense_replace; }

  // 1/sqrt(qk_nope + qk_rope), times yarn_get_mscale(factor, mscale_all_dim)^2 when YaRN has a non-zero
  // mscale_all_dim (transformers' yarn_apply_mscale). Computed in double, used as float.
  double softmax_scale() const;
  // cos/sin multiplier of the RoPE tables (YaRN attention_factor; 1 for plain RoPE).
  double rope_attention_factor() const;
  // Inverse frequencies [qk_rope_head_dim / 2], in fp32 arithmetic exactly as transformers computes them.
  std::vector<float> rope_inv_freq() const;

  // One line naming every field that changes the math (ranks compare it with check_same_everywhere).
  std::string fingerprint() const;
};

// Parses config.json text. `source` names the file in error messages. allow_unknown_keys: accept keys
// this parser does not know (they are reported by name otherwise).
ModelConfig parse_config(const std::string& json_text, const std::string& source, bool allow_unknown_keys = false);
// Reads and parses DIR/config.json.
ModelConfig load_config(const std::filesystem::path& model_dir, bool allow_unknown_keys = false);

}  // namespace ddtree::model
