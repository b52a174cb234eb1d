// Loading (and slicing) one tensor-parallel shard of the weights, with the hub's tensor names. See model.h.
#include <string>

#include "rank/model/model.h"

namespace ddtree::model {
namespace {

std::string L(int64_t l) { return "model.layers." + std::to_string(l) + "."; }

struct Reader {
  const Checkpoint& ck;
  // Rows [r0, r1) of a [rows, cols] tensor.
  Mat rows(const std::string& name, int64_t rows, int64_t cols, int64_t r0, int64_t r1) const {
    return Mat{r1 - r0, cols, ck.read_f32(name, {rows, cols}, r0, r1, 0, cols)};
  }
  // Cols [c0, c1) of a [rows, cols] tensor.
  Mat cols(const std::string& name, int64_t rows, int64_t cols, int64_t c0, int64_t c1) const {
    return Mat{rows, c1 - c0, ck.read_f32(name, {rows, cols}, 0, rows, c0, c1)};
  }
  Mat full(const std::string& name, int64_t rows, int64_t cols) const { return this->rows(name, rows, cols, 0, rows); }
  std::vector<float> vec(const std::string& name, int64_t n) const { return ck.read_f32(name, {n}); }
};

MlpWeights read_mlp(const Reader& rd, const std::string& prefix, int64_t H, int64_t I, int64_t i0, int64_t i1) {
  MlpWeights m;
  m.gate = rd.rows(prefix + "gate_proj.weight", I, H, i0, i1);
  m.up = rd.rows(prefix + "up_proj.weight", I, H, i0, i1);
  m.down = rd.cols(prefix + "down_proj.weight", H, I, i0, i1);
  return m;
}

Mat slice_rows(const Mat& m, int64_t r0, int64_t r1) {
  Mat o{r1 - r0, m.cols, {}};
  o.w.assign(m.w.begin() + r0 * m.cols, m.w.begin() + r1 * m.cols);
  return o;
}
Mat slice_cols(const Mat& m, int64_t c0, int64_t c1) {
  Mat o{m.rows, c1 - c0, {}};
  o.w.reserve(std::size_t(m.rows * (c1 - c0)));
  for (int64_t r = 0; r < m.rows; ++r)
    o.w.insert(o.w.end(), m.w.begin() + r * m.cols + c0, m.w.begin() + r * m.cols + c1);
  return o;
}
MlpWeights slice_mlp(const MlpWeights& m, int64_t i0, int64_t i1) {
  return MlpWeights{slice_rows(m.gate, i0, i1), slice_rows(m.up, i0, i1), slice_cols(m.down, i0, i1)};
}

}  // namespace

ShardRanges shard_ranges(const ModelConfig& c, const ShardSpec& s) {
  if (s.tp_size < 1 || s.tp_rank < 0 || s.tp_rank >= s.tp_size)
    throw ConfigError("shard: tp_rank " + std::to_string(s.tp_rank) + " / tp_size " + std::to_string(s.tp_size) +
                      " is not a valid shard");
  const int64_t t = s.tp_size, r = s.tp_rank;
  auto split = [&](int64_t n, const char* what, int64_t& a, int64_t& b) {
    if (n % t)
      throw ConfigError(std::string("shard: ") + what + " = " + std::to_string(n) + " does not divide by tp_size " +
                        std::to_string(t));
    a = r * (n / t);
    b = a + n / t;
  };
  ShardRanges g;
  split(c.num_attention_heads, "num_attention_heads", g.head0, g.head1);
  split(c.intermediate_size, "intermediate_size", g.inter0, g.inter1);
  if (c.n_routed_experts > 0 && c.first_k_dense_replace < c.num_hidden_layers) {
    split(c.moe_intermediate_size, "moe_intermediate_size", g.moe_inter0, g.moe_inter1);
    split(c.moe_intermediate_size * c.n_shared_experts, "n_shared_experts * moe_intermediate_size", g.shared0,
          g.shared1);
  }
  const int64_t per = (c.vocab_size + t - 1) / t;
  g.vocab0 = std::min(c.vocab_size, r * per);
  g.vocab1 = std::min(c.vocab_size, (r + 1) * per);
  if (g.vocab1 <= g.vocab0)
    throw ConfigError("shard: vocab_size = " + std::to_string(c.vocab_size) + " leaves rank " + std::to_string(r) +
                      " of tp_size " + std::to_string(t) + " no vocabulary rows");
  return g;
}

ModelWeights load_weights(const Checkpoint& ck, const ModelConfig& c, const ShardSpec& s) {
  const ShardRanges g = shard_ranges(c, s);
  const Reader rd{ck};
  const int64_t H = c.hidden_size, qk = c.qk_head_dim(), nv = c.qk_nope_head_dim + c.v_head_dim;
  const int64_t nh = c.num_attention_heads;
  ModelWeights w;
  w.embed = rd.rows("model.embed_tokens.weight", c.vocab_size, H, g.vocab0, g.vocab1);
  if (c.tie_word_embeddings) {
    w.lm_head = w.embed;
  } else {
    w.lm_head = rd.rows("lm_head.weight", c.vocab_size, H, g.vocab0, g.vocab1);
  }
  w.final_norm = rd.vec("model.norm.weight", H);
  w.layers.resize(std::size_t(c.num_hidden_layers));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerWeights& lw = w.layers[std::size_t(l)];
    const std::string p = L(l), a = p + "self_attn.";
    lw.input_norm = rd.vec(p + "input_layernorm.weight", H);
    lw.post_norm = rd.vec(p + "post_attention_layernorm.weight", H);
    if (c.q_lora_rank > 0) {
      lw.q_a = rd.full(a + "q_a_proj.weight", c.q_lora_rank, H);
      lw.q_a_norm = rd.vec(a + "q_a_layernorm.weight", c.q_lora_rank);
      lw.q_b = rd.rows(a + "q_b_proj.weight", nh * qk, c.q_lora_rank, g.head0 * qk, g.head1 * qk);
    } else {
      lw.q_b = rd.rows(a + "q_proj.weight", nh * qk, H, g.head0 * qk, g.head1 * qk);
    }
    lw.kv_a = rd.full(a + "kv_a_proj_with_mqa.weight", c.kv_row_dim(), H);
    lw.kv_a_norm = rd.vec(a + "kv_a_layernorm.weight", c.kv_lora_rank);
    lw.kv_b = rd.rows(a + "kv_b_proj.weight", nh * nv, c.kv_lora_rank, g.head0 * nv, g.head1 * nv);
    lw.o = rd.cols(a + "o_proj.weight", H, nh * c.v_head_dim, g.head0 * c.v_head_dim, g.head1 * c.v_head_dim);
    lw.moe = c.is_moe_layer(l);
    const std::string m = p + "mlp.";
    if (!lw.moe) {
      lw.dense = read_mlp(rd, m, H, c.intermediate_size, g.inter0, g.inter1);
      continue;
    }
    lw.router = rd.full(m + "gate.weight", c.n_routed_experts, H);
    lw.router_bias = rd.vec(m + "gate.e_score_correction_bias", c.n_routed_experts);
    lw.experts.reserve(std::size_t(c.n_routed_experts));
    for (int64_t e = 0; e < c.n_routed_experts; ++e)
      lw.experts.push_back(read_mlp(rd, m + "experts." + std::to_string(e) + ".", H, c.moe_intermediate_size,
                                    g.moe_inter0, g.moe_inter1));
    if (c.n_shared_experts > 0)
      lw.shared = read_mlp(rd, m + "shared_experts.", H, c.moe_intermediate_size * c.n_shared_experts, g.shared0,
                           g.shared1);
  }
  return w;
}

ModelWeights slice_weights(const ModelWeights& f, const ModelConfig& c, const ShardSpec& s) {
  const ShardRanges g = shard_ranges(c, s);
  const int64_t qk = c.qk_head_dim(), nv = c.qk_nope_head_dim + c.v_head_dim, v = c.v_head_dim;
  ModelWeights w;
  w.embed = slice_rows(f.embed, g.vocab0, g.vocab1);
  w.lm_head = slice_rows(f.lm_head, g.vocab0, g.vocab1);
  w.final_norm = f.final_norm;
  for (const LayerWeights& fl : f.layers) {
    LayerWeights lw;
    lw.input_norm = fl.input_norm;
    lw.post_norm = fl.post_norm;
    lw.q_a = fl.q_a;
    lw.q_a_norm = fl.q_a_norm;
    lw.q_b = slice_rows(fl.q_b, g.head0 * qk, g.head1 * qk);
    lw.kv_a = fl.kv_a;
    lw.kv_a_norm = fl.kv_a_norm;
    lw.kv_b = slice_rows(fl.kv_b, g.head0 * nv, g.head1 * nv);
    lw.o = slice_cols(fl.o, g.head0 * v, g.head1 * v);
    lw.moe = fl.moe;
    if (!fl.moe) {
      lw.dense = slice_mlp(fl.dense, g.inter0, g.inter1);
    } else {
      lw.router = fl.router;
      lw.router_bias = fl.router_bias;
      for (const auto& e : fl.experts) lw.experts.push_back(slice_mlp(e, g.moe_inter0, g.moe_inter1));
      if (c.n_shared_experts > 0) lw.shared = slice_mlp(fl.shared, g.shared0, g.shared1);
    }
    w.layers.push_back(std::move(lw));
  }
  return w;
}

}  // namespace ddtree::model
