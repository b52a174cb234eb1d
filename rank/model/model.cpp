// The cpu backend's forward pass. See model.h for the math, the sharding and the numerics.
#include "rank/model/model.h"

#include "ddtree/kernels.h"  // ddt_float_order_bits

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "rank/model/ops.h"

namespace ddtree::model {

namespace {
// RMSNorm eps of q_a_layernorm and kv_a_layernorm: transformers (and DeepSeek's own code) construct them
// without config.rms_norm_eps, i.e. with the default 1e-6.
constexpr double kLatentNormEps = 1e-6;

inline std::size_t sz(int64_t n) { return std::size_t(n); }

std::invalid_argument bad(const std::string& m) { return std::invalid_argument("Model::forward: " + m); }
}  // namespace

Model::Model(ModelConfig config, ShardSpec shard, ModelWeights weights)
    : cfg_(std::move(config)), shard_(shard), ranges_(shard_ranges(cfg_, shard_)), w_(std::move(weights)) {
  inv_freq_ = cfg_.rope_inv_freq();
  attn_factor_ = float(cfg_.rope_attention_factor());
  softmax_scale_ = float(cfg_.softmax_scale());
  if (int64_t(w_.layers.size()) != cfg_.num_hidden_layers) throw ConfigError("Model: layer count mismatch");
}

Model Model::load(const std::filesystem::path& dir, const ShardSpec& s, const LoadOptions& o) {
  ModelConfig c = load_config(dir, o.allow_unknown_config_keys);
  shard_ranges(c, s);  // refuse an impossible split before reading anything
  Checkpoint ck(dir);
  ModelWeights w = load_weights(ck, c, s);
  return Model(std::move(c), s, std::move(w));
}

kv::LatentKvShape Model::kv_shape(int page_size, int num_pages, int max_requests, int max_pages_per_request) const {
  return kv::LatentKvShape{int(cfg_.num_hidden_layers), int(cfg_.kv_row_dim()), page_size, num_pages, max_requests,
                           max_pages_per_request};
}

void Model::reduce(float* data, std::size_t count) const {
  if (shard_.tp_size == 1) return;
  if (!all_reduce_) throw std::logic_error("Model: tp_size > 1 but no all-reduce installed (set_all_reduce)");
  all_reduce_(data, count);
}

void Model::apply_rope(float* x, int64_t position) const {
  // transformers: angle_i = inv_freq_i * float(position) (fp32), cos/sin times the YaRN attention factor.
  // Interleaved (rope_interleave, the DeepSeek-V3 checkpoints): pairs (x[2i], x[2i+1]); otherwise
  // rotate_half pairs (x[i], x[i + d/2]). Output in both cases: [x_a*c - x_b*s (d/2), x_b*c + x_a*s (d/2)].
  const int64_t d = cfg_.qk_rope_head_dim, half = d / 2;
  float tmp[1024];
  if (d > 1024) throw ConfigError("qk_rope_head_dim above 1024");
  const float pos = float(position);
  for (int64_t i = 0; i < half; ++i) {
    const float ang = inv_freq_[std::size_t(i)] * pos;
    const float c = float(std::cos(double(ang))) * attn_factor_;
    const float s = float(std::sin(double(ang))) * attn_factor_;
    const float a = cfg_.rope_interleave ? x[2 * i] : x[i];
    const float b = cfg_.rope_interleave ? x[2 * i + 1] : x[i + half];
    tmp[i] = a * c - b * s;
    tmp[half + i] = b * c + a * s;
  }
  std::copy(tmp, tmp + d, x);
}

void Model::embed_partial(const int32_t* tokens, int64_t n, float* out) const {
  const int64_t H = cfg_.hidden_size;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = tokens[i];
    float* o = out + i * H;
    if (t >= ranges_.vocab0 && t < ranges_.vocab1)
      std::copy_n(&w_.embed.w[std::size_t((t - ranges_.vocab0) * H)], H, o);
    else
      std::fill(o, o + H, 0.0f);
  }
}

void Model::lm_head(const float* x, int64_t rows, float* logits) const {
  ops::matmul_wt(x, rows, w_.lm_head.w.data(), w_.lm_head.rows, cfg_.hidden_size, logits);
}

void Model::attention_partial(int layer, const std::vector<RequestRows>& batch, const float* xn,
                              kv::LatentKvCache& cache, float* out) const {
  const LayerWeights& lw = w_.layers[std::size_t(layer)];
  const int64_t H = cfg_.hidden_size, hl = ranges_.heads(), nope = cfg_.qk_nope_head_dim,
                rope = cfg_.qk_rope_head_dim, qk = cfg_.qk_head_dim(), vd = cfg_.v_head_dim,
                kvl = cfg_.kv_lora_rank, row_dim = cfg_.kv_row_dim(), nv = nope + vd;
  int64_t rows = 0;
  for (const auto& r : batch) rows += r.n;

  // 1. Projections of every row: q [rows, hl*qk] and the latent KV row, written to the cache.
  std::vector<float> q(sz(rows * hl * qk));
  if (cfg_.q_lora_rank > 0) {
    const int64_t ql = cfg_.q_lora_rank;
    std::vector<float> qa(sz(rows * ql)), qan(sz(ql));
    ops::matmul_wt(xn, rows, lw.q_a.w.data(), ql, H, qa.data());
    for (int64_t r = 0; r < rows; ++r) {
      ops::rmsnorm(&qa[std::size_t(r * ql)], lw.q_a_norm.data(), ql, kLatentNormEps, qan.data());
      std::copy(qan.begin(), qan.end(), qa.begin() + r * ql);
    }
    ops::matmul_wt(qa.data(), rows, lw.q_b.w.data(), hl * qk, ql, q.data());
  } else {
    ops::matmul_wt(xn, rows, lw.q_b.w.data(), hl * qk, H, q.data());
  }
  std::vector<float> kv(sz(rows * row_dim));
  ops::matmul_wt(xn, rows, lw.kv_a.w.data(), row_dim, H, kv.data());
  {
    int64_t g = 0;
    for (const auto& req : batch)
      for (int i = 0; i < req.n; ++i, ++g) {
        const int64_t pos = req.positions ? req.positions[i] : req.prefix_len + i;
        float* dst = cache.row(layer, req.kv_request, req.prefix_len + i);
        const float* src = &kv[std::size_t(g * row_dim)];
        ops::rmsnorm(src, lw.kv_a_norm.data(), kvl, kLatentNormEps, dst);
        std::copy(src + kvl, src + row_dim, dst + kvl);
        apply_rope(dst + kvl, pos);
      }
  }

  // 2. Absorbed attention per row and local head, then o_proj of the local heads.
  std::vector<float> attn(sz(rows * hl * vd));
  std::vector<float> q_lat(sz(kvl)), q_pe(sz(rope)), o_lat(sz(kvl));
  std::vector<float> scores;
  std::vector<const float*> keys;
  int64_t g = 0;
  for (const auto& req : batch) {
    const int64_t P = req.prefix_len, W = (req.n + 63) / 64;
    for (int i = 0; i < req.n; ++i, ++g) {
      const int64_t pos = req.positions ? req.positions[i] : P + i;
      // Visible key rows in increasing slot order: the prefix, then the tree rows whose bit is set.
      keys.clear();
      for (int64_t j = 0; j < P; ++j) keys.push_back(cache.row(layer, req.kv_request, j));
      for (int b = 0; b < req.n; ++b) {
        const bool visible = req.vis ? ((req.vis[i * W + b / 64] >> (b % 64)) & 1u) != 0 : b <= i;
        if (visible) keys.push_back(cache.row(layer, req.kv_request, P + b));
      }
      scores.resize(keys.size());
      for (int64_t h = 0; h < hl; ++h) {
        const float* qh = &q[std::size_t((g * hl + h) * qk)];
        const float* wkv = &lw.kv_b.w[std::size_t(h * nv * kvl)];  // [nope + v, kvl] block of head h
        // q_lat = W_UK^T q_nope: accumulated over d in increasing order, elementwise in c.
        std::fill(q_lat.begin(), q_lat.end(), 0.0f);
        for (int64_t d = 0; d < nope; ++d) {
          const float qd = qh[d];
          const float* wr = wkv + d * kvl;
          for (int64_t c = 0; c < kvl; ++c) q_lat[std::size_t(c)] += qd * wr[c];
        }
        std::copy(qh + nope, qh + qk, q_pe.begin());
        apply_rope(q_pe.data(), pos);
        float m = -std::numeric_limits<float>::infinity();
        for (std::size_t k = 0; k < keys.size(); ++k) {
          const float s = (ops::dot(q_lat.data(), keys[k], kvl) + ops::dot(q_pe.data(), keys[k] + kvl, rope)) *
                          softmax_scale_;
          scores[k] = s;
          m = std::max(m, s);
        }
        float sum = 0.0f;
        for (std::size_t k = 0; k < keys.size(); ++k) {
          scores[k] = std::exp(scores[k] - m);
          sum += scores[k];
        }
        std::fill(o_lat.begin(), o_lat.end(), 0.0f);
        for (std::size_t k = 0; k < keys.size(); ++k) {
          const float p = scores[k] / sum;
          const float* cr = keys[k];
          for (int64_t c = 0; c < kvl; ++c) o_lat[std::size_t(c)] += p * cr[c];
        }
        // v = W_UV o_lat
        float* vo = &attn[std::size_t((g * hl + h) * vd)];
        for (int64_t d = 0; d < vd; ++d) vo[d] = ops::dot(wkv + (nope + d) * kvl, o_lat.data(), kvl);
      }
    }
  }
  ops::matmul_wt(attn.data(), rows, lw.o.w.data(), H, hl * vd, out);
}

void Model::route(int layer, const float* x, std::vector<int>& experts, std::vector<float>& weights) const {
  // transformers DeepseekV3TopkRouter: sigmoid scores; choice = score + e_score_correction_bias; group
  // score = sum of the group's top-2 choices; keep the topk_group best groups; top num_experts_per_tok
  // choices among them; weights = the *scores* (no bias) of those, / (sum + 1e-20) if norm_topk_prob,
  // times routed_scaling_factor. Ties (never seen with real weights) go to the smaller index.
  const LayerWeights& lw = w_.layers[std::size_t(layer)];
  const int64_t E = cfg_.n_routed_experts, G = cfg_.n_group, per = E / G, H = cfg_.hidden_size;
  std::vector<float> score(sz(E)), choice(sz(E));
  for (int64_t e = 0; e < E; ++e) {
    score[std::size_t(e)] = ops::sigmoid(ops::dot(x, &lw.router.w[std::size_t(e * H)], H));
    choice[std::size_t(e)] = score[std::size_t(e)] + lw.router_bias[std::size_t(e)];
  }
  // Strict weak order even with NaN scores (NaN ranks as -inf, as the kernels' order bits do).
  auto better = [](float a, int ia, float b, int ib) {
    const uint32_t oa = ddt_float_order_bits(a), ob = ddt_float_order_bits(b);
    return oa > ob || (oa == ob && ia < ib);
  };
  std::vector<float> gscore(sz(G));
  for (int64_t gi = 0; gi < G; ++gi) {
    int b1 = -1, b2 = -1;
    for (int64_t e = gi * per; e < (gi + 1) * per; ++e) {
      const int ie = int(e);
      if (b1 < 0 || better(choice[e], ie, choice[b1], b1)) {
        b2 = b1;
        b1 = ie;
      } else if (b2 < 0 || better(choice[e], ie, choice[b2], b2)) {
        b2 = ie;
      }
    }
    gscore[std::size_t(gi)] = choice[std::size_t(b1)] + choice[std::size_t(b2)];
  }
  std::vector<int> gorder(sz(G));
  std::iota(gorder.begin(), gorder.end(), 0);
  std::sort(gorder.begin(), gorder.end(), [&](int a, int b) { return better(gscore[a], a, gscore[b], b); });
  std::vector<char> allowed(sz(E), 0);
  for (int64_t k = 0; k < cfg_.topk_group; ++k)
    for (int64_t e = gorder[std::size_t(k)] * per; e < (gorder[std::size_t(k)] + 1) * per; ++e) allowed[e] = 1;
  std::vector<int> cand;
  for (int64_t e = 0; e < E; ++e)
    if (allowed[std::size_t(e)]) cand.push_back(int(e));
  std::sort(cand.begin(), cand.end(), [&](int a, int b) { return better(choice[a], a, choice[b], b); });
  experts.assign(cand.begin(), cand.begin() + cfg_.num_experts_per_tok);
  weights.resize(experts.size());
  float sum = 0.0f;
  for (std::size_t k = 0; k < experts.size(); ++k) {
    weights[k] = score[std::size_t(experts[k])];
    sum += weights[k];
  }
  const float rs = float(cfg_.routed_scaling_factor);
  for (float& wk : weights) {
    if (cfg_.norm_topk_prob) wk = wk / (sum + 1e-20f);
    wk = wk * rs;
  }
}

namespace {
// out[H] (+)= scale * down(silu(gate x) * up x) for one row.
void mlp_row(const MlpWeights& m, const float* x, int64_t H, float scale, bool accumulate, float* out,
             std::vector<float>& tmp) {
  const int64_t I = m.gate.rows;
  tmp.resize(std::size_t(I));
  for (int64_t i = 0; i < I; ++i) {
    const float gv = ops::dot(&m.gate.w[std::size_t(i * H)], x, H);
    const float uv = ops::dot(&m.up.w[std::size_t(i * H)], x, H);
    tmp[std::size_t(i)] = ops::silu(gv) * uv;
  }
  for (int64_t o = 0; o < H; ++o) {
    const float y = ops::dot(&m.down.w[std::size_t(o * I)], tmp.data(), I);
    out[o] = accumulate ? out[o] + y * scale : y * scale;
  }
}
}  // namespace

void Model::mlp_partial(int layer, const float* xn, int64_t rows, float* out) const {
  const LayerWeights& lw = w_.layers[std::size_t(layer)];
  const int64_t H = cfg_.hidden_size;
  std::vector<float> tmp;
  std::vector<int> experts;
  std::vector<float> weights;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = xn + r * H;
    float* o = out + r * H;
    if (!lw.moe) {
      mlp_row(lw.dense, x, H, 1.0f, false, o, tmp);
      continue;
    }
    // Routed experts in routing order (score descending), then the shared experts: the same fixed order
    // on every rank and for every batch.
    route(layer, x, experts, weights);
    std::fill(o, o + H, 0.0f);
    for (std::size_t k = 0; k < experts.size(); ++k)
      mlp_row(lw.experts[std::size_t(experts[k])], x, H, weights[k], true, o, tmp);
    if (cfg_.n_shared_experts > 0) mlp_row(lw.shared, x, H, 1.0f, true, o, tmp);
  }
}

void Model::forward(const std::vector<RequestRows>& batch, kv::LatentKvCache& cache, ForwardResult& out,
                    bool capture_hidden) const {
  const int64_t H = cfg_.hidden_size, Ln = cfg_.num_hidden_layers;
  // Validate once at the boundary.
  if (batch.empty()) throw bad("empty batch");
  if (cache.row_dim() != cfg_.kv_row_dim() || cache.shape().num_layers != Ln)
    throw bad("KV cache shape does not match the model (row_dim " + std::to_string(cache.row_dim()) + ", expected " +
              std::to_string(cfg_.kv_row_dim()) + ")");
  int64_t rows = 0;
  std::vector<int32_t> tokens;
  for (std::size_t r = 0; r < batch.size(); ++r) {
    const RequestRows& q = batch[r];
    const std::string who = "request " + std::to_string(r) + ": ";
    if (q.n < 1 || !q.tokens) throw bad(who + "needs n >= 1 and tokens");
    if (q.prefix_len < 0) throw bad(who + "negative prefix_len");
    if (cache.capacity(q.kv_request) < q.prefix_len + q.n)
      throw bad(who + "KV slots up to " + std::to_string(q.prefix_len + q.n) + " are not reserved");
    for (std::size_t s = 0; s < r; ++s)
      if (batch[s].kv_request == q.kv_request) throw bad(who + "kv_request appears twice in the batch");
    const int64_t W = (q.n + 63) / 64;
    for (int i = 0; i < q.n; ++i) {
      if (q.tokens[i] < 0 || q.tokens[i] >= cfg_.vocab_size)
        throw bad(who + "token " + std::to_string(q.tokens[i]) + " outside the vocabulary");
      if (q.slots && q.slots[i] != q.prefix_len + i)
        throw bad(who + "slot of row " + std::to_string(i) + " is not prefix_len + i");
      if (q.positions && (q.positions[i] < 0 || q.positions[i] > q.prefix_len + i))
        throw bad(who + "position of row " + std::to_string(i) + " outside [0, prefix_len + i]");
      if (q.vis) {
        // A row sees itself and only rows before it (parent[i] < i in the tree builder's layout).
        if (!((q.vis[i * W + i / 64] >> (i % 64)) & 1u)) throw bad(who + "vis row " + std::to_string(i) + " lacks its own bit");
        for (int b = i + 1; b < int(W * 64); ++b)
          if ((q.vis[i * W + b / 64] >> (b % 64)) & 1u)
            throw bad(who + "vis row " + std::to_string(i) + " sees a later row " + std::to_string(b));
      }
      tokens.push_back(q.tokens[i]);
    }
    rows += q.n;
  }
  out.rows = rows;
  const std::size_t rh = std::size_t(rows * H);
  if (capture_hidden) out.hidden.assign(std::size_t(Ln + 1) * rh, 0.0f);
  else out.hidden.clear();

  std::vector<float> x(rh), xn(rh), part(rh), tmp(sz(H));
  embed_partial(tokens.data(), rows, x.data());
  reduce(x.data(), rh);
  if (capture_hidden) std::copy(x.begin(), x.end(), out.hidden.begin());
  for (int l = 0; l < int(Ln); ++l) {
    const LayerWeights& lw = w_.layers[std::size_t(l)];
    for (int64_t r = 0; r < rows; ++r) ops::rmsnorm(&x[std::size_t(r * H)], lw.input_norm.data(), H, cfg_.rms_norm_eps, &xn[std::size_t(r * H)]);
    attention_partial(l, batch, xn.data(), cache, part.data());
    reduce(part.data(), rh);
    for (std::size_t i = 0; i < rh; ++i) x[i] = x[i] + part[i];
    for (int64_t r = 0; r < rows; ++r) ops::rmsnorm(&x[std::size_t(r * H)], lw.post_norm.data(), H, cfg_.rms_norm_eps, &xn[std::size_t(r * H)]);
    mlp_partial(l, xn.data(), rows, part.data());
    reduce(part.data(), rh);
    for (std::size_t i = 0; i < rh; ++i) x[i] = x[i] + part[i];
    if (capture_hidden && l + 1 < Ln) std::copy(x.begin(), x.end(), out.hidden.begin() + std::ptrdiff_t(std::size_t(l + 1) * rh));
  }
  for (int64_t r = 0; r < rows; ++r) ops::rmsnorm(&x[std::size_t(r * H)], w_.final_norm.data(), H, cfg_.rms_norm_eps, &xn[std::size_t(r * H)]);
  if (capture_hidden) std::copy(xn.begin(), xn.end(), out.hidden.begin() + std::ptrdiff_t(std::size_t(Ln) * rh));
  out.logits.assign(std::size_t(rows * ranges_.vocab()), 0.0f);
  lm_head(xn.data(), rows, out.logits.data());
}

}  // namespace ddtree::model
