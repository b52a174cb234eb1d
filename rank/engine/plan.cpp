// Step plan serialisation: a flat little-endian byte string (the ranks run the same build, checked at
// startup, so no schema evolution is needed on this internal channel).
#include "rank/engine/plan.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace ddtree::engine {

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::kAutoregressive: return "autoregressive";
    case Mode::kChain: return "chain";
    case Mode::kTree: return "tree";
  }
  return "invalid";
}
const char* drafter_name(DrafterKind d) {
  switch (d) {
    case DrafterKind::kNone: return "none";
    case DrafterKind::kNgram: return "ngram";
    case DrafterKind::kOracle: return "oracle";
  }
  return "invalid";
}

int RequestSpec::width() const {
  switch (mode) {
    case Mode::kAutoregressive: return 1;
    case Mode::kChain: return depth + 1;
    case Mode::kTree: return budget + 1;
  }
  return 1;
}
int RequestSpec::topk(int64_t vocab) const {
  return mode == Mode::kTree ? int(std::min<int64_t>(budget, vocab)) : 1;
}

namespace {

struct Writer {
  std::vector<uint8_t> b;
  template <class T>
  void pod(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
  }
  template <class T>
  void vec(const std::vector<T>& v) {
    pod(uint64_t(v.size()));
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    b.insert(b.end(), p, p + v.size() * sizeof(T));
  }
};

struct Reader {
  const std::vector<uint8_t>& b;
  std::size_t at = 0;
  void need(std::size_t n) {
    if (n > b.size() - at) throw PlanError("step plan truncated at byte " + std::to_string(at));
  }
  template <class T>
  T pod() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, b.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  template <class T>
  std::vector<T> vec() {
    const uint64_t n = pod<uint64_t>();
    if (n > (b.size() - at) / sizeof(T)) throw PlanError("step plan: vector of " + std::to_string(n) + " too long");
    std::vector<T> v(n);
    std::memcpy(v.data(), b.data() + at, n * sizeof(T));
    at += n * sizeof(T);
    return v;
  }
};

constexpr uint32_t kMagic = 0x44445450;  // "DDTP"

}  // namespace

std::vector<uint8_t> serialize(const StepPlan& p) {
  Writer w;
  w.pod(kMagic);
  w.pod(p.step);
  w.pod(uint8_t(p.shutdown));
  w.pod(uint64_t(p.admit.size()));
  for (const RequestSpec& r : p.admit) {
    w.pod(r.slot);
    w.vec(r.prompt);
    w.pod(r.max_new);
    w.pod(r.temperature);
    w.pod(r.seed);
    w.pod(int32_t(r.mode));
    w.pod(int32_t(r.drafter));
    w.pod(r.depth);
    w.pod(r.budget);
    w.vec(r.stop_ids);
    w.pod(uint8_t(r.return_logits));
    w.vec(r.reference);
  }
  w.vec(p.release);
  w.vec(p.batch);
  w.vec(p.prefix);
  return std::move(w.b);
}

StepPlan deserialize(const std::vector<uint8_t>& bytes) {
  Reader r{bytes};
  if (r.pod<uint32_t>() != kMagic) throw PlanError("step plan: bad magic");
  StepPlan p;
  p.step = r.pod<uint64_t>();
  p.shutdown = r.pod<uint8_t>() != 0;
  const uint64_t n = r.pod<uint64_t>();
  if (n > bytes.size()) throw PlanError("step plan: admit count too large");
  for (uint64_t i = 0; i < n; ++i) {
    RequestSpec s;
    s.slot = r.pod<int32_t>();
    s.prompt = r.vec<int32_t>();
    s.max_new = r.pod<int32_t>();
    s.temperature = r.pod<float>();
    s.seed = r.pod<uint64_t>();
    s.mode = Mode(r.pod<int32_t>());
    s.drafter = DrafterKind(r.pod<int32_t>());
    s.depth = r.pod<int32_t>();
    s.budget = r.pod<int32_t>();
    s.stop_ids = r.vec<int32_t>();
    s.return_logits = r.pod<uint8_t>() != 0;
    s.reference = r.vec<int32_t>();
    p.admit.push_back(std::move(s));
  }
  p.release = r.vec<int32_t>();
  p.batch = r.vec<int32_t>();
  p.prefix = r.vec<int64_t>();
  if (r.at != bytes.size()) throw PlanError("step plan: trailing bytes");
  if (p.prefix.size() != p.batch.size()) throw PlanError("step plan: prefix and batch differ in length");
  return p;
}

}  // namespace ddtree::engine
