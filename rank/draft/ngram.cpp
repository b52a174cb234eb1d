// The n-gram (prompt-lookup) drafter: see drafter.h.
#include <algorithm>
#include <cmath>
#include <map>

#include "rank/draft/drafter.h"

namespace ddtree::draft {
namespace {

class NgramDrafter final : public Drafter {
 public:
  explicit NgramDrafter(const NgramOptions& o) : o_(o) {}
  const char* name() const override { return "ngram"; }

  void draft(const DraftContext& ctx, const DraftShard& out) const override {
    const std::vector<int32_t>& t = *ctx.tokens;
    const int64_t T = int64_t(t.size());
    if (T < 2) return;
    const int64_t lo = std::max<int64_t>(0, T - o_.window);
    const int64_t vshard = out.vocab1 - out.vocab0;
    // Longest suffix first: the first n with at least one earlier occurrence wins.
    for (int n = std::min<int64_t>(o_.max_ngram, T - 1); n >= o_.min_ngram; --n) {
      const int32_t* suf = t.data() + (T - n);
      // votes[d][token] over the most recent max_matches occurrences (start i, ending before T - 1 so at
      // least one continuation token exists).
      std::vector<std::map<int32_t, int>> votes(std::size_t(out.depth));
      int matches = 0;
      for (int64_t i = T - n - 1; i >= lo && matches < o_.max_matches; --i) {
        if (!std::equal(suf, suf + n, t.data() + i)) continue;
        ++matches;
        for (int d = 1; d <= out.depth; ++d) {
          const int64_t j = i + n - 1 + d;  // the token that followed the occurrence at depth d
          if (j >= T) break;
          ++votes[std::size_t(d - 1)][t[std::size_t(j)]];
        }
      }
      if (matches == 0) continue;
      for (int d = 0; d < out.depth; ++d)
        for (const auto& [tok, cnt] : votes[std::size_t(d)])
          if (tok >= out.vocab0 && tok < out.vocab1)
            out.logits[int64_t(d) * vshard + (tok - out.vocab0)] = std::log(float(cnt));
      return;
    }
  }

 private:
  NgramOptions o_;
};

}  // namespace

std::unique_ptr<Drafter> make_ngram_drafter(const NgramOptions& o) { return std::make_unique<NgramDrafter>(o); }

}  // namespace ddtree::draft
