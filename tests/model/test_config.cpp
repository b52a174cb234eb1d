// config.json parsing: every math-changing field, both RoPE spellings, and refusal (with the key named) of
// anything unknown or unsupported.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "rank/model/config.h"

namespace ddtree::model {
namespace {

using json = nlohmann::json;

// The hub's DeepSeek-V3 config.json (deepseek-ai/DeepSeek-V3), minus quantization_config.
json hub_deepseek_v3() {
  return json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                 "AutoModel": "modeling_deepseek.DeepseekV3Model",
                 "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
    "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
    "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
    "n_shared_experts": 1, "norm_topk_prob": true, "num_attention_heads": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": true,
    "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1", "use_cache": true, "v_head_dim": 128, "vocab_size": 129280})");
}

ModelConfig parse(const json& j) { return parse_config(j.dump(), "config.json"); }

// Expects a ConfigError whose message contains every one of `needles`.
void expect_refused(const json& j, std::initializer_list<const char*> needles) {
  try {
    parse(j);
    FAIL() << "accepted: " << j.dump();
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    for (const char* n : needles) EXPECT_NE(m.find(n), std::string::npos) << "message: " << m;
  }
}

TEST(ModelConfig, HubDeepSeekV3) {
  const ModelConfig c = parse(hub_deepseek_v3());
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.kv_row_dim(), 576);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_TRUE(c.rope.yarn);
  EXPECT_EQ(c.rope.factor, 40);
  EXPECT_FALSE(c.is_moe_layer(2));
  EXPECT_TRUE(c.is_moe_layer(3));
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{1});
  // mscale == mscale_all_dim: cos/sin unscaled; softmax scale 192^-0.5 * (0.1 ln 40 + 1)^2.
  EXPECT_DOUBLE_EQ(c.rope_attention_factor(), 1.0);
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c.softmax_scale(), m * m / std::sqrt(192.0), 1e-15);
  EXPECT_EQ(c.rope_inv_freq().size(), 32u);
}

TEST(ModelConfig, KimiK2Style) {
  json j = hub_deepseek_v3();
  j["model_type"] = "kimi_k2";
  j["rope_scaling"] = {{"beta_fast", 1.0}, {"beta_slow", 1.0}, {"factor", 32.0}, {"mscale", 1.0},
                       {"mscale_all_dim", 1.0}, {"original_max_position_embeddings", 4096}, {"type", "yarn"}};
  j["rope_theta"] = 50000.0;
  j["n_group"] = 1;
  j["topk_group"] = 1;
  j["n_routed_experts"] = 384;
  j["num_attention_heads"] = 64;
  j["num_key_value_heads"] = 64;
  j["first_k_dense_replace"] = 1;
  j["routed_scaling_factor"] = 2.827;
  j["eos_token_id"] = 163585;
  j["vocab_size"] = 163840;
  j["num_nextn_predict_layers"] = 0;
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.model_type, "kimi_k2");
  EXPECT_EQ(c.n_group, 1);
  EXPECT_EQ(c.rope.beta_fast, 1.0);
}

TEST(ModelConfig, RopeSpellingsAgree) {
  // Hub spelling (rope_scaling + top-level rope_theta) vs transformers 5's rope_parameters.
  json a = hub_deepseek_v3();
  json b = hub_deepseek_v3();
  b.erase("rope_scaling");
  b.erase("rope_theta");
  b["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 40}, {"beta_fast", 32},
                          {"beta_slow", 1}, {"mscale", 1.0}, {"mscale_all_dim", 1.0},
                          {"original_max_position_embeddings", 4096}};
  const ModelConfig ca = parse(a), cb = parse(b);
  EXPECT_EQ(ca.rope_inv_freq(), cb.rope_inv_freq());
  EXPECT_EQ(ca.softmax_scale(), cb.softmax_scale());
  EXPECT_EQ(ca.fingerprint(), cb.fingerprint());
  // Plain RoPE both ways.
  json c = hub_deepseek_v3();
  c["rope_scaling"] = nullptr;
  json d = hub_deepseek_v3();
  d.erase("rope_scaling");
  d.erase("rope_theta");
  d["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000}};
  EXPECT_FALSE(parse(c).rope.yarn);
  EXPECT_EQ(parse(c).rope_inv_freq(), parse(d).rope_inv_freq());
  EXPECT_DOUBLE_EQ(parse(c).softmax_scale(), 1.0 / std::sqrt(192.0));
}

TEST(ModelConfig, NullQLoraAndDenseOnly) {
  json j = hub_deepseek_v3();
  j["q_lora_rank"] = nullptr;
  j["n_routed_experts"] = nullptr;
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.q_lora_rank, 0);
  EXPECT_FALSE(c.is_moe_layer(60));
  j = hub_deepseek_v3();
  j["eos_token_id"] = json::array({1, 2});
  EXPECT_EQ(parse(j).eos_token_ids, (std::vector<int64_t>{1, 2}));
}

TEST(ModelConfig, RefusesUnsupportedValues) {
  auto with = [](const char* key, json v) {
    json j = hub_deepseek_v3();
    j[key] = v;
    return j;
  };
  expect_refused(with("scoring_func", "softmax"), {"config.json", "scoring_func", "softmax"});
  expect_refused(with("topk_method", "greedy"), {"topk_method", "greedy"});
  expect_refused(with("moe_layer_freq", 2), {"moe_layer_freq"});
  expect_refused(with("hidden_act", "gelu"), {"hidden_act", "gelu"});
  expect_refused(with("attention_bias", true), {"attention_bias"});
  expect_refused(with("num_key_value_heads", 8), {"num_key_value_heads"});
  expect_refused(with("model_type", "llama"), {"model_type", "llama"});
  expect_refused(with("quantization_config", json{{"quant_method", "fp8"}}), {"quantization_config"});
  expect_refused(with("q_lora_rank", "big"), {"q_lora_rank", "integer"});
  expect_refused(with("kv_lora_rank", 0), {"kv_lora_rank"});
  expect_refused(with("qk_rope_head_dim", 63), {"qk_rope_head_dim", "even"});
  expect_refused(with("n_group", 7), {"n_group"});
  expect_refused(with("topk_group", 9), {"topk_group"});
  expect_refused(with("num_experts_per_tok", 300), {"num_experts_per_tok"});
  expect_refused(with("rope_scaling", json{{"type", "linear"}, {"factor", 2.0}}), {"rope_type", "linear"});
  expect_refused(with("rope_scaling", json{{"type", "yarn"}, {"factor", 4.0}, {"low_freq_factor", 1}}),
                 {"low_freq_factor"});
  expect_refused(with("rope_scaling", json{{"type", "yarn"}}), {"factor"});
  expect_refused(with("eos_token_id", 200000), {"eos_token_id"});
  expect_refused(with("head_dim", 128), {"head_dim"});
  expect_refused(with("rope_interleave", "yes"), {"rope_interleave"});
}

TEST(ModelConfig, RefusesUnknownKeysAndBadJson) {
  json j = hub_deepseek_v3();
  j["sliding_window"] = 4096;
  expect_refused(j, {"unknown key", "sliding_window"});
  EXPECT_NO_THROW(parse_config(j.dump(), "config.json", /*allow_unknown_keys=*/true));
  j = hub_deepseek_v3();
  j.erase("kv_lora_rank");
  expect_refused(j, {"kv_lora_rank", "missing"});
  try {
    parse_config("{\"hidden_size\": 12,", "/x/config.json");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/x/config.json: not valid JSON"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_config("[1, 2]", "config.json"), ConfigError);
  EXPECT_THROW(load_config("/nonexistent/dir"), ConfigError);
}

}  // namespace
}  // namespace ddtree::model
