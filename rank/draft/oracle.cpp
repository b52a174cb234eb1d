// The oracle drafter (tests and benchmarks only): see drafter.h.
#include <sstream>
#include <stdexcept>
#include <unordered_set>

#include "rank/draft/drafter.h"

namespace ddtree::draft {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
double unit(uint64_t h) { return double(h >> 11) * (1.0 / 9007199254740992.0); }

class OracleDrafter final : public Drafter {
 public:
  explicit OracleDrafter(const OracleProfile& p) : p_(p) {}
  const char* name() const override { return "oracle"; }

  void draft(const DraftContext& ctx, const DraftShard& out) const override {
    const std::vector<int32_t>& t = *ctx.tokens;
    const int64_t generated = int64_t(t.size()) - ctx.prompt_len;  // >= 1: the root is a generated token
    const int64_t vshard = out.vocab1 - out.vocab0;
    std::unordered_set<int32_t> used;
    for (int d = 1; d <= out.depth; ++d) {
      // The drafted token at depth d is generated token number (generated - 1 + d) (0-based).
      const int64_t g = generated - 1 + d;
      const int64_t abs_pos = ctx.prompt_len + g;
      const uint64_t h = mix(mix(p_.seed ^ mix(ctx.seed)) ^ uint64_t(abs_pos));
      int32_t truth = -1;
      if (ctx.reference && g < int64_t(ctx.reference->size())) truth = (*ctx.reference)[std::size_t(g)];
      // The rank of the true token: r with probability rank_prob[r] * decay^(d-1), else absent.
      int truth_rank = -1;
      if (truth >= 0) {
        double scale = 1.0;
        for (int i = 1; i < d; ++i) scale *= p_.depth_decay;
        const double u = unit(h);
        double acc = 0.0;
        for (std::size_t r = 0; r < p_.rank_prob.size(); ++r) {
          acc += p_.rank_prob[r] * scale;
          if (u < acc) {
            truth_rank = int(r);
            break;
          }
        }
      }
      used.clear();
      if (truth >= 0) used.insert(truth);  // fillers never repeat the true token (even when it is absent)
      uint64_t f = mix(h ^ 0xA5A5A5A5ull);
      for (int r = 0; r < out.k; ++r) {
        int32_t tok;
        if (r == truth_rank) {
          tok = truth;
        } else {
          if (int64_t(used.size()) >= out.vocab_size) break;
          do {
            f = mix(f);
            tok = int32_t(f % uint64_t(out.vocab_size));
          } while (used.count(tok));
          used.insert(tok);
        }
        if (tok >= out.vocab0 && tok < out.vocab1)
          out.logits[int64_t(d - 1) * vshard + (tok - out.vocab0)] = -float(r);
      }
    }
  }

 private:
  OracleProfile p_;
};

}  // namespace

OracleProfile parse_oracle_profile(const std::string& s) {
  OracleProfile p;
  p.rank_prob.clear();
  std::string probs = s, decay;
  if (auto slash = s.find('/'); slash != std::string::npos) {
    probs = s.substr(0, slash);
    decay = s.substr(slash + 1);
  }
  std::stringstream ss(probs);
  std::string item;
  double sum = 0.0;
  try {
    while (std::getline(ss, item, ',')) {
      const double v = std::stod(item);
      if (!(v >= 0.0 && v <= 1.0)) throw std::invalid_argument("probability out of [0, 1]");
      p.rank_prob.push_back(v);
      sum += v;
    }
    if (!decay.empty()) p.depth_decay = std::stod(decay);
  } catch (const std::exception& e) {
    throw std::invalid_argument("oracle profile '" + s + "': " + e.what());
  }
  if (p.rank_prob.empty() || sum > 1.0 + 1e-9 || !(p.depth_decay >= 0.0 && p.depth_decay <= 1.0))
    throw std::invalid_argument("oracle profile '" + s +
                                "': want 'p0,p1,...[/decay]' with sum(p) <= 1 and decay in [0, 1]");
  return p;
}

std::unique_ptr<Drafter> make_oracle_drafter(const OracleProfile& p) { return std::make_unique<OracleDrafter>(p); }

}  // namespace ddtree::draft
