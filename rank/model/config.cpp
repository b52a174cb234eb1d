// config.json -> ModelConfig (see config.h). Every value that changes the math is checked here once.
#include "rank/model/config.h"

#include "ddtree/kernels.h"  // DDT_MAX_VOCAB

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace ddtree::model {
namespace {

using json = nlohmann::json;

// Keys that do not change the inference forward pass: bookkeeping, training-only knobs, generation defaults
// and the multi-token-prediction head (its layers are not part of the base model's forward).
const std::set<std::string> kIgnoredKeys = {
    "_name_or_path", "architectures", "auto_map", "transformers_version", "dtype", "torch_dtype",
    "output_hidden_states", "output_attentions", "return_dict", "chunk_size_feed_forward",
    "is_encoder_decoder", "id2label", "label2id", "problem_type", "initializer_range", "use_cache",
    "pad_token_id", "pretraining_tp", "attention_dropout", "num_nextn_predict_layers", "num_mtp_layers",
    "aux_loss_alpha", "seq_aux", "ep_size", "output_router_logits", "router_aux_loss_coef", "tokenizer_class",
    "tie_encoder_decoder", "tf_legacy_loss", "use_bfloat16", "bad_words_ids", "add_cross_attention",
    "finetuning_task", "prefix", "sep_token_id", "decoder_start_token_id", "task_specific_params",
    "torchscript", "pruned_heads", "cross_attention_hidden_size", "is_decoder", "tokenizer_class"};

// Keys parsed (and checked) below.
const std::set<std::string> kKnownKeys = {
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "q_lora_rank", "kv_lora_rank",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "qk_head_dim", "head_dim", "n_routed_experts",
    "n_shared_experts", "num_experts_per_tok", "first_k_dense_replace", "moe_layer_freq", "n_group",
    "topk_group", "topk_method", "scoring_func", "norm_topk_prob", "routed_scaling_factor", "rope_theta",
    "rope_scaling", "rope_parameters", "rope_interleave", "rms_norm_eps", "tie_word_embeddings",
    "eos_token_id", "bos_token_id", "hidden_act", "attention_bias", "max_position_embeddings",
    "original_max_position_embeddings", "quantization_config", "partial_rotary_factor"};

class Parser {
 public:
  Parser(const json& j, std::string source) : j_(j), src_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw ConfigError(src_ + ": " + key + ": " + what);
  }
  bool has(const std::string& key) const { return j_.contains(key); }
  bool is_null(const std::string& key) const { return !has(key) || j_.at(key).is_null(); }

  // Integer field. required: absent/null is an error; otherwise `def` is returned for absent/null.
  int64_t integer(const std::string& key, bool required, int64_t def = 0) const {
    if (is_null(key)) {
      if (required) fail(key, has(key) ? "is null, a positive integer is required" : "missing (required)");
      return def;
    }
    const json& v = j_.at(key);
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::floor(d) == d && std::fabs(d) < 9e15) return int64_t(d);
    }
    fail(key, "expected an integer, got " + v.dump());
  }
  int64_t positive(const std::string& key, bool required = true, int64_t def = 0) const {
    const int64_t v = integer(key, required, def);
    if (v <= 0 && (required || !is_null(key))) fail(key, "must be > 0, got " + std::to_string(v));
    return v;
  }
  double number(const std::string& key, bool required, double def = 0.0) const {
    if (is_null(key)) {
      if (required) fail(key, "missing (required)");
      return def;
    }
    const json& v = j_.at(key);
    if (!v.is_number()) fail(key, "expected a number, got " + v.dump());
    const double d = v.get<double>();
    if (!std::isfinite(d)) fail(key, "must be finite");
    return d;
  }
  bool boolean(const std::string& key, bool def) const {
    if (is_null(key)) return def;
    const json& v = j_.at(key);
    if (!v.is_boolean()) fail(key, "expected true or false, got " + v.dump());
    return v.get<bool>();
  }
  std::string string(const std::string& key, const std::string& def) const {
    if (is_null(key)) return def;
    const json& v = j_.at(key);
    if (!v.is_string()) fail(key, "expected a string, got " + v.dump());
    return v.get<std::string>();
  }

 private:
  const json& j_;
  std::string src_;
};

std::string fmt(double v) {
  std::ostringstream o;
  o.precision(17);
  o << v;
  return o.str();
}

void parse_rope(const json& root, const Parser& p, const std::string& src, ModelConfig& c) {
  // Two spellings: hub files carry `rope_theta` + `rope_scaling` (null or {"type": "yarn", ...});
  // transformers 5 writes `rope_parameters` ({"rope_type": ..., "rope_theta": ..., ...}).
  const bool has_params = !p.is_null("rope_parameters");
  const bool has_scaling = !p.is_null("rope_scaling");
  json params = json::object();
  std::string where;
  if (has_params && has_scaling) {
    // transformers 5 configs loaded from hub files sometimes carry both; they must agree on the type.
    where = "rope_parameters";
    params = root.at("rope_parameters");
  } else if (has_params) {
    where = "rope_parameters";
    params = root.at("rope_parameters");
  } else if (has_scaling) {
    where = "rope_scaling";
    params = root.at("rope_scaling");
  }
  if (!params.is_object()) p.fail(where, "expected an object, got " + params.dump());
  Parser rp(params, src + ": " + where);
  for (const auto& [k, v] : params.items()) {
    static const std::set<std::string> known = {
        "type", "rope_type", "rope_theta", "factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
        "original_max_position_embeddings", "attention_factor", "truncate", "partial_rotary_factor"};
    if (!known.count(k)) rp.fail(k, "unknown RoPE parameter (value " + v.dump() + "); refusing to guess its meaning");
  }
  std::string type = rp.string("rope_type", rp.string("type", "default"));
  if (params.contains("rope_type") && params.contains("type") && !params.at("type").is_null() &&
      rp.string("type", "") != type)
    rp.fail("type", "disagrees with rope_type (" + rp.string("type", "") + " vs " + type + ")");
  if (type != "default" && type != "yarn")
    rp.fail("rope_type", "'" + type + "' is not supported (supported: default, yarn)");
  c.rope.yarn = type == "yarn";
  // rope_theta: inside rope_parameters (transformers 5), else top level (hub files); default 10000.
  c.rope.theta = rp.number("rope_theta", false, p.number("rope_theta", false, 10000.0));
  if (!(c.rope.theta > 0)) p.fail("rope_theta", "must be > 0");
  const double prf = rp.number("partial_rotary_factor", false, p.number("partial_rotary_factor", false, 1.0));
  if (prf != 1.0) p.fail("partial_rotary_factor", "only 1.0 is supported, got " + fmt(prf));
  if (!c.rope.yarn) return;

  // YaRN, as transformers' _compute_yarn_parameters reads it.
  // original_max_position_embeddings: a top-level key wins (transformers' standardize_rope_params), then
  // the rope dict, then max_position_embeddings.
  if (!p.is_null("original_max_position_embeddings"))
    c.rope.original_max_position_embeddings = p.positive("original_max_position_embeddings");
  else if (!rp.is_null("original_max_position_embeddings"))
    c.rope.original_max_position_embeddings = rp.positive("original_max_position_embeddings");
  else
    c.rope.original_max_position_embeddings = c.max_position_embeddings;
  if (!params.contains("factor")) rp.fail("factor", "missing (required for yarn)");
  if (params.at("factor").is_null())
    c.rope.factor = double(c.max_position_embeddings) / double(c.rope.original_max_position_embeddings);
  else
    c.rope.factor = rp.number("factor", true);
  if (!(c.rope.factor > 0)) rp.fail("factor", "must be > 0");
  // `get("beta_fast") or 32`: absent, null and 0 all mean the default.
  c.rope.beta_fast = rp.number("beta_fast", false, 0.0);
  if (c.rope.beta_fast == 0.0) c.rope.beta_fast = 32.0;
  c.rope.beta_slow = rp.number("beta_slow", false, 0.0);
  if (c.rope.beta_slow == 0.0) c.rope.beta_slow = 1.0;
  c.rope.mscale = rp.number("mscale", false, 0.0);
  c.rope.mscale_all_dim = rp.number("mscale_all_dim", false, 0.0);
  c.rope.attention_factor = rp.is_null("attention_factor") ? -1.0 : rp.number("attention_factor", true);
  c.rope.truncate = rp.boolean("truncate", true);
}

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

double ModelConfig::softmax_scale() const {
  double s = std::pow(double(qk_head_dim()), -0.5);
  if (rope.yarn && rope.mscale_all_dim != 0.0) {
    const double m = yarn_get_mscale(rope.factor, rope.mscale_all_dim);
    s = s * m * m;
  }
  return s;
}

double ModelConfig::rope_attention_factor() const {
  if (!rope.yarn) return 1.0;
  if (rope.attention_factor >= 0) return rope.attention_factor;
  if (rope.mscale != 0.0 && rope.mscale_all_dim != 0.0)
    return yarn_get_mscale(rope.factor, rope.mscale) / yarn_get_mscale(rope.factor, rope.mscale_all_dim);
  return yarn_get_mscale(rope.factor, 1.0);
}

std::vector<float> ModelConfig::rope_inv_freq() const {
  // transformers, in fp32 tensor arithmetic: pos_freqs = base ** (arange(0, dim, 2) / dim);
  // default: 1 / pos_freqs. YaRN: blend of 1 / pos_freqs (extrapolation) and 1 / (factor * pos_freqs)
  // (interpolation) with a linear ramp over [low, high] (correction range from beta_fast / beta_slow).
  const int64_t dim = qk_rope_head_dim;
  const int64_t half = dim / 2;
  std::vector<float> pos_freqs(half), inv(half);
  const float base = float(rope.theta);
  for (int64_t i = 0; i < half; ++i) {
    const float e = float(2 * i) / float(dim);
    pos_freqs[i] = float(std::pow(double(base), double(e)));
  }
  if (!rope.yarn) {
    for (int64_t i = 0; i < half; ++i) inv[i] = 1.0f / pos_freqs[i];
    return inv;
  }
  const double d = double(dim), b = rope.theta, omax = double(rope.original_max_position_embeddings);
  auto correction_dim = [&](double rot) { return (d * std::log(omax / (rot * 2 * M_PI))) / (2 * std::log(b)); };
  double low = correction_dim(rope.beta_fast), high = correction_dim(rope.beta_slow);
  if (rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, d - 1);
  if (low == high) high += 0.001;  // transformers: prevent singularity
  const float flow = float(low), frange = float(high - low), ffactor = float(rope.factor);
  for (int64_t i = 0; i < half; ++i) {
    const float extrap = 1.0f / pos_freqs[i];
    const float interp = 1.0f / (ffactor * pos_freqs[i]);
    float ramp = (float(i) - flow) / frange;
    ramp = std::min(std::max(ramp, 0.0f), 1.0f);
    const float extrap_factor = 1.0f - ramp;
    inv[i] = interp * (1.0f - extrap_factor) + extrap * extrap_factor;
  }
  return inv;
}

std::string ModelConfig::fingerprint() const {
  std::ostringstream o;
  o << model_type << " V=" << vocab_size << " H=" << hidden_size << " L=" << num_hidden_layers
    << " heads=" << num_attention_heads << " q_lora=" << q_lora_rank << " kv_lora=" << kv_lora_rank
    << " nope=" << qk_nope_head_dim << " rope=" << qk_rope_head_dim << " v=" << v_head_dim
    << " inter=" << intermediate_size << " moe_inter=" << moe_intermediate_size << " experts=" << n_routed_experts
    << " shared=" << n_shared_experts << " topk=" << num_experts_per_tok << " dense=" << first_k_dense_replace
    << " groups=" << n_group << "/" << topk_group << " norm_topk=" << norm_topk_prob
    << " rscale=" << fmt(routed_scaling_factor) << " theta=" << fmt(rope.theta) << " yarn=" << rope.yarn;
  if (rope.yarn)
    o << "(" << fmt(rope.factor) << "," << fmt(rope.beta_fast) << "," << fmt(rope.beta_slow) << ","
      << fmt(rope.mscale) << "," << fmt(rope.mscale_all_dim) << "," << fmt(rope.attention_factor) << ","
      << rope.original_max_position_embeddings << "," << rope.truncate << ")";
  o << " interleave=" << rope_interleave << " eps=" << fmt(rms_norm_eps) << " tie=" << tie_word_embeddings;
  return o.str();
}

ModelConfig parse_config(const std::string& text, const std::string& source, bool allow_unknown_keys) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    throw ConfigError(source + ": not valid JSON: " + e.what());
  }
  if (!root.is_object()) throw ConfigError(source + ": expected a JSON object at the top level");
  Parser p(root, source);

  if (!allow_unknown_keys) {
    std::string unknown;
    for (const auto& [k, v] : root.items())
      if (!kKnownKeys.count(k) && !kIgnoredKeys.count(k)) unknown += (unknown.empty() ? "" : ", ") + k;
    if (!unknown.empty())
      throw ConfigError(source + ": unknown key(s) " + unknown +
                        " (not known to change or not to change the math; refusing to guess; "
                        "pass allow_unknown_keys to accept)");
  }

  ModelConfig c;
  c.model_type = p.string("model_type", "");
  if (c.model_type != "deepseek_v3" && c.model_type != "kimi_k2")
    p.fail("model_type", "'" + c.model_type + "' is not supported (supported: deepseek_v3, kimi_k2)");
  if (!p.is_null("quantization_config"))
    p.fail("quantization_config", "quantized checkpoints (FP8 / INT4) are not supported yet; use bf16 or fp32 weights");
  const std::string act = p.string("hidden_act", "silu");
  if (act != "silu") p.fail("hidden_act", "'" + act + "' is not supported (supported: silu)");
  if (p.boolean("attention_bias", false)) p.fail("attention_bias", "true is not supported (DeepSeek-V3 has no attention biases)");

  c.vocab_size = p.positive("vocab_size");
  c.hidden_size = p.positive("hidden_size");
  // Bounds that keep every size product far from overflow and within the kernels' limits.
  if (c.vocab_size > DDT_MAX_VOCAB)
    p.fail("vocab_size", std::to_string(c.vocab_size) + " is above the kernels' limit " + std::to_string(DDT_MAX_VOCAB));
  if (c.hidden_size > (1 << 16)) p.fail("hidden_size", std::to_string(c.hidden_size) + " is above 65536");
  c.num_hidden_layers = p.positive("num_hidden_layers");
  c.num_attention_heads = p.positive("num_attention_heads");
  if (!p.is_null("num_key_value_heads") && p.integer("num_key_value_heads", true) != c.num_attention_heads)
    p.fail("num_key_value_heads", "must equal num_attention_heads for MLA (got " +
                                       std::to_string(p.integer("num_key_value_heads", true)) + ")");
  c.q_lora_rank = p.is_null("q_lora_rank") ? 0 : p.positive("q_lora_rank");
  c.kv_lora_rank = p.positive("kv_lora_rank");
  c.qk_nope_head_dim = p.positive("qk_nope_head_dim");
  c.qk_rope_head_dim = p.positive("qk_rope_head_dim");
  if (c.qk_rope_head_dim % 2) p.fail("qk_rope_head_dim", "must be even");
  c.v_head_dim = p.positive("v_head_dim");
  if (!p.is_null("qk_head_dim") && p.integer("qk_head_dim", true) != c.qk_head_dim())
    p.fail("qk_head_dim", "must equal qk_nope_head_dim + qk_rope_head_dim");
  if (!p.is_null("head_dim") && p.integer("head_dim", true) != c.qk_rope_head_dim)
    p.fail("head_dim", "must equal qk_rope_head_dim (transformers sets head_dim = qk_rope_head_dim)");

  c.intermediate_size = p.positive("intermediate_size");
  c.n_routed_experts = p.is_null("n_routed_experts") ? 0 : p.positive("n_routed_experts");
  c.first_k_dense_replace = p.integer("first_k_dense_replace", false, 3);
  if (c.first_k_dense_replace < 0) p.fail("first_k_dense_replace", "must be >= 0");
  c.moe_layer_freq = p.integer("moe_layer_freq", false, 1);
  if (c.moe_layer_freq != 1)
    p.fail("moe_layer_freq", "only 1 is supported (transformers makes every layer >= first_k_dense_replace MoE), got " +
                                 std::to_string(c.moe_layer_freq));
  if (c.n_routed_experts > 0 && c.first_k_dense_replace < c.num_hidden_layers) {
    c.moe_intermediate_size = p.positive("moe_intermediate_size");
    c.n_shared_experts = p.integer("n_shared_experts", false, 1);
    if (c.n_shared_experts < 0) p.fail("n_shared_experts", "must be >= 0");
    c.num_experts_per_tok = p.positive("num_experts_per_tok");
    if (c.num_experts_per_tok > c.n_routed_experts) p.fail("num_experts_per_tok", "exceeds n_routed_experts");
    c.n_group = p.positive("n_group", false, 8);
    if (p.is_null("n_group")) c.n_group = 8;
    c.topk_group = p.positive("topk_group", false, 4);
    if (p.is_null("topk_group")) c.topk_group = 4;
    if (c.n_routed_experts % c.n_group) p.fail("n_group", "must divide n_routed_experts");
    if (c.n_routed_experts / c.n_group < 2)
      p.fail("n_group", "needs at least 2 experts per group (group score = sum of the top-2 scores)");
    if (c.topk_group > c.n_group) p.fail("topk_group", "exceeds n_group");
    if (c.topk_group * (c.n_routed_experts / c.n_group) < c.num_experts_per_tok)
      p.fail("topk_group", "selected groups hold fewer experts than num_experts_per_tok");
    const std::string scoring = p.string("scoring_func", "sigmoid");
    if (scoring != "sigmoid") p.fail("scoring_func", "'" + scoring + "' is not supported (supported: sigmoid)");
    const std::string method = p.string("topk_method", "noaux_tc");
    if (method != "noaux_tc") p.fail("topk_method", "'" + method + "' is not supported (supported: noaux_tc)");
    c.norm_topk_prob = p.boolean("norm_topk_prob", true);
    c.routed_scaling_factor = p.number("routed_scaling_factor", false, 2.5);
  } else {
    // Every layer dense: the MoE fields do not change the math (still type-checked where present).
    c.moe_intermediate_size = p.integer("moe_intermediate_size", false, 0);
    c.n_shared_experts = p.integer("n_shared_experts", false, 0);
    c.num_experts_per_tok = p.integer("num_experts_per_tok", false, 0);
    c.n_group = p.integer("n_group", false, 1);
    c.topk_group = p.integer("topk_group", false, 1);
    c.norm_topk_prob = p.boolean("norm_topk_prob", true);
    c.routed_scaling_factor = p.number("routed_scaling_factor", false, 1.0);
    const std::string scoring = p.string("scoring_func", "sigmoid");
    (void)scoring;
  }

  c.max_position_embeddings = p.positive("max_position_embeddings", false, 4096);
  if (p.is_null("max_position_embeddings")) c.max_position_embeddings = 4096;
  parse_rope(root, p, source, c);
  c.rope_interleave = p.boolean("rope_interleave", true);
  c.rms_norm_eps = p.number("rms_norm_eps", false, 1e-6);
  if (!(c.rms_norm_eps > 0)) p.fail("rms_norm_eps", "must be > 0");
  c.tie_word_embeddings = p.boolean("tie_word_embeddings", false);
  c.bos_token_id = p.integer("bos_token_id", false, -1);
  if (!p.is_null("eos_token_id")) {
    const json& e = root.at("eos_token_id");
    auto add = [&](const json& v) {
      if (!v.is_number_integer()) p.fail("eos_token_id", "expected an integer or a list of integers, got " + e.dump());
      const int64_t id = v.get<int64_t>();
      if (id < 0 || id >= c.vocab_size) p.fail("eos_token_id", "id " + std::to_string(id) + " outside the vocabulary");
      c.eos_token_ids.push_back(id);
    };
    if (e.is_array())
      for (const auto& v : e) add(v);
    else
      add(e);
  }
  return c;
}

ModelConfig load_config(const std::filesystem::path& model_dir, bool allow_unknown_keys) {
  const auto path = model_dir / "config.json";
  std::ifstream f(path, std::ios::binary);
  if (!f) throw ConfigError(path.string() + ": cannot open (is " + model_dir.string() + " a model directory?)");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_config(ss.str(), path.string(), allow_unknown_keys);
}

}  // namespace ddtree::model
