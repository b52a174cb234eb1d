// test_comm_mpi: the MPI Comm (rank/comm/comm_mpi.cpp), run by ctest under mpirun -np 1, 2 and 4
// (tests/mpi/CMakeLists.txt).
//
// Every test is collective: all ranks run the same tests in the same order and make the same Comm calls.
// So an assertion that fails on one rank must not skip a collective the other ranks make (use EXPECT_*
// between collectives; ASSERT_* only on conditions every rank evaluates alike). Expected values are computed
// locally on every rank from deterministic patterns, so each rank checks its own result.
//
// main() creates the comm before gtest runs, prints gtest's output on rank 0 only (other ranks print just
// their failures, prefixed with their rank), names after each test the ranks it failed on, and makes every
// rank exit non-zero if any rank failed. A watchdog aborts the job if it stops making progress.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "rank/comm/comm.h"
#include "rank/comm/mpi_check.h"

namespace {

using ddtree::Comm;
using ddtree::CommError;
using ddtree::DType;
using ddtree::ReduceOp;

Comm* g_comm = nullptr;  // made in main() before any test runs
Comm& comm() { return *g_comm; }

template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::kF32;
  if constexpr (std::is_same_v<T, double>) return DType::kF64;
  if constexpr (std::is_same_v<T, std::int32_t>) return DType::kI32;
  if constexpr (std::is_same_v<T, std::int64_t>) return DType::kI64;
  if constexpr (std::is_same_v<T, std::uint64_t>) return DType::kU64;
  if constexpr (std::is_same_v<T, std::uint8_t>) return DType::kU8;
}

// A deterministic value for (seed, i), distinct across seeds and indices, negative for some, so that a
// block that landed in the wrong place or was not written at all shows.
template <class T>
T pattern(int seed, std::size_t i) {
  const std::int64_t k = static_cast<std::int64_t>(seed) * 1000003 + static_cast<std::int64_t>(i);
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>((k % 2 ? -1 : 1) * (static_cast<double>(k) * 0.37 + 0.125));
  } else if constexpr (std::is_same_v<T, std::uint8_t>) {
    return static_cast<T>((seed * 37 + static_cast<int>(i % 251) * 3 + 1) & 0xFF);
  } else if constexpr (std::is_signed_v<T>) {
    return static_cast<T>(k % 2 ? -k : k);
  } else {
    return static_cast<T>(k) * 0x9E3779B97F4A7C15ull;
  }
}

template <class T>
std::vector<T> pattern_vector(int seed, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = pattern<T>(seed, i);
  return v;
}

template <class T>
bool same_bits(const T* a, const T* b, std::size_t n) {
  return n == 0 || std::memcmp(a, b, n * sizeof(T)) == 0;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && same_bits(a.data(), b.data(), a.size());
}

// Index of the first element whose bits differ, or -1.
template <class T>
long first_difference(const T* a, const T* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (std::memcmp(a + i, b + i, sizeof(T)) != 0) return static_cast<long>(i);
  }
  return -1;
}

// Collective: the lowest rank whose `v` differs bitwise from this rank's, or -1 if all agree.
template <class T>
int first_rank_with_other_bits(Comm& c, const std::vector<T>& v) {
  const std::size_t bytes = v.size() * sizeof(T);
  std::vector<std::uint8_t> all(bytes * static_cast<std::size_t>(c.size()));
  c.all_gather(v.data(), all.data(), bytes, DType::kU8);
  for (int r = 0; r < c.size(); ++r) {
    if (bytes && std::memcmp(all.data() + static_cast<std::size_t>(r) * bytes, v.data(), bytes) != 0)
      return r;
  }
  return -1;
}

// A second comm with tiny bounds, to drive the chunked paths with small buffers.
std::unique_ptr<Comm> make_small_comm(std::size_t max_scratch_bytes, std::size_t max_message_count) {
  ddtree::MpiCommOptions options;
  options.max_scratch_bytes = max_scratch_bytes;
  options.max_message_count = max_message_count;
  return ddtree::make_mpi_comm(nullptr, nullptr, options);
}

// ---------------------------------------------------------------------------------------------------------
TEST(CommMpi, RanksAndBuildId) {
  Comm& c = comm();
  EXPECT_GE(c.rank(), 0);
  EXPECT_LT(c.rank(), c.size());
  EXPECT_GE(c.local_rank(), 0);
  EXPECT_LT(c.local_rank(), c.local_size());
  EXPECT_LE(c.local_size(), c.size());
  // These tests run on one node: local ranks are the world ranks (split keyed by world rank).
  EXPECT_EQ(c.local_size(), c.size());
  EXPECT_EQ(c.local_rank(), c.rank());
  const std::string id = ddtree::build_id();
  EXPECT_NE(id.find("-cuda"), std::string::npos) << id;
  EXPECT_NE(id, "unknown");
  // Asked for MULTIPLE; whatever came back must be a valid level (MPI falls back, so do we).
  const auto level = ddtree::mpi_thread_level();
  EXPECT_STRNE(ddtree::mpi_thread_level_name(level), "invalid");
  if (c.rank() == 0)
    std::printf("[ info ] build_id %s, %s\n", id.c_str(), ddtree::mpi_thread_level_name(level));
  EXPECT_EQ(first_rank_with_other_bits(c, std::vector<char>(id.begin(), id.end())), -1);
}

TEST(CommMpi, DTypeSizesAndNames) {
  EXPECT_EQ(ddtree::dtype_size(DType::kF32), 4u);
  EXPECT_EQ(ddtree::dtype_size(DType::kF64), 8u);
  EXPECT_EQ(ddtree::dtype_size(DType::kI32), 4u);
  EXPECT_EQ(ddtree::dtype_size(DType::kI64), 8u);
  EXPECT_EQ(ddtree::dtype_size(DType::kU64), 8u);
  EXPECT_EQ(ddtree::dtype_size(DType::kU8), 1u);
  EXPECT_STREQ(ddtree::dtype_name(DType::kF32), "f32");
  EXPECT_STREQ(ddtree::dtype_name(DType::kF64), "f64");
  EXPECT_STREQ(ddtree::dtype_name(DType::kI32), "i32");
  EXPECT_STREQ(ddtree::dtype_name(DType::kI64), "i64");
  EXPECT_STREQ(ddtree::dtype_name(DType::kU64), "u64");
  EXPECT_STREQ(ddtree::dtype_name(DType::kU8), "u8");
  EXPECT_STREQ(ddtree::dtype_name(static_cast<DType>(42)), "invalid");
  EXPECT_THROW(ddtree::dtype_size(static_cast<DType>(42)), CommError);
}

// ---------------------------------------------------------------------------------------------------------
// broadcast from every root; non-root buffers start with their own (wrong) values.
template <class T>
void check_broadcast(Comm& c, std::size_t n) {
  for (int root = 0; root < c.size(); ++root) {
    std::vector<T> buf = pattern_vector<T>(c.rank() == root ? root : 100 + c.rank(), n);
    c.broadcast(buf.data(), n, dtype_of<T>(), root);
    const std::vector<T> want = pattern_vector<T>(root, n);
    EXPECT_TRUE(same_bits(buf, want))
        << ddtree::dtype_name(dtype_of<T>()) << " n=" << n << " root=" << root << " first difference at "
        << first_difference(buf.data(), want.data(), n);
  }
}

template <class T>
void check_broadcast_sizes(Comm& c) {
  for (std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1001}, std::size_t{65539}}) {
    check_broadcast<T>(c, n);
  }
}

TEST(CommMpi, BroadcastEveryRootDtypesSizes) {
  check_broadcast_sizes<float>(comm());
  check_broadcast_sizes<double>(comm());
  check_broadcast_sizes<std::int32_t>(comm());
  check_broadcast_sizes<std::int64_t>(comm());
  check_broadcast_sizes<std::uint64_t>(comm());
  check_broadcast_sizes<std::uint8_t>(comm());
}

TEST(CommMpi, BroadcastLongerThanOneMessage) {
  // 1000 elements per MPI call: 2501 takes three calls, the last one short.
  auto small = make_small_comm(4096, 1000);
  check_broadcast<double>(*small, 2501);
  check_broadcast<std::uint8_t>(*small, 3000);
  check_broadcast<std::int32_t>(*small, 999);
  // and the default comm with a larger buffer (8 MiB).
  check_broadcast<double>(comm(), (std::size_t{1} << 20) + 3);
}

// ---------------------------------------------------------------------------------------------------------
// all_reduce kSum: a fold in rank order, bitwise.
//
// Inputs mix magnitudes so that the order of the additions changes the rounding: (1e8 + 1) - 1e8 is 0 in f32
// but (1e8 - 1e8) + 1 is 1. Rank r's element i is kMix[(r + i) % n] scaled by a per-element factor.
template <class T>
T mixed_input(int rank, std::size_t i) {
  static constexpr double kMix[] = {1e8,  1.0,  -1e8,  1.0,  3.25, -3e7,  0.1, 7e7,
                                    -0.3, 1e-3, 2.5e8, -1.0, 1e16, -1e16, 0.7};
  constexpr std::size_t n = sizeof(kMix) / sizeof(kMix[0]);
  const double scale = 1.0 + static_cast<double>(i % 13) * 0.0625;
  return static_cast<T>(kMix[(static_cast<std::size_t>(rank) + i) % n] * scale);
}

template <class T>
std::vector<T> mixed_inputs(int rank, std::size_t count) {
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = mixed_input<T>(rank, i);
  return v;
}

// The reference: ((in_0 + in_1) + in_2) ..., or the same fold over ranks in reverse order.
template <class T>
std::vector<T> fold_sum(int size, std::size_t count, bool reverse) {
  std::vector<T> out(count);
  for (std::size_t i = 0; i < count; ++i) {
    T acc = mixed_input<T>(reverse ? size - 1 : 0, i);
    for (int k = 1; k < size; ++k) acc = acc + mixed_input<T>(reverse ? size - 1 - k : k, i);
    out[i] = acc;
  }
  return out;
}

template <class T>
void check_sum_rank_order(Comm& c, std::size_t count) {
  const std::vector<T> in = mixed_inputs<T>(c.rank(), count);
  std::vector<T> out(count, T(-12345));
  c.all_reduce(in.data(), out.data(), count, dtype_of<T>(), ReduceOp::kSum);
  const std::vector<T> want = fold_sum<T>(c.size(), count, false);
  EXPECT_TRUE(same_bits(out, want)) << ddtree::dtype_name(dtype_of<T>()) << " count " << count
                                    << ": first difference from the rank-order fold at "
                                    << first_difference(out.data(), want.data(), count);
  EXPECT_EQ(first_rank_with_other_bits(c, out), -1) << "ranks disagree on the all_reduce result";
  // The test bites: with three or more ranks, other orders round differently for some elements (with two,
  // a + b == b + a, so no order can differ; 15 elements cover every rotation of kMix).
  if (c.size() >= 3 && count >= 15) {
    const std::vector<T> reversed = fold_sum<T>(c.size(), count, true);
    std::size_t n_differ = 0;
    for (std::size_t i = 0; i < count; ++i) n_differ += std::memcmp(&want[i], &reversed[i], sizeof(T)) != 0;
    EXPECT_GT(n_differ, 0u) << "inputs do not distinguish fold orders";
  }
}

TEST(CommMpi, AllReduceSumIsRankOrderFold) {
  for (std::size_t count : {std::size_t{1}, std::size_t{15}, std::size_t{1001}}) {
    check_sum_rank_order<float>(comm(), count);
    check_sum_rank_order<double>(comm(), count);
  }
}

TEST(CommMpi, AllReduceSumIntegersWrap) {
  Comm& c = comm();
  const std::size_t n = 5;
  std::vector<std::int32_t> a(n), out_a(n);
  std::vector<std::int64_t> b(n), out_b(n);
  std::vector<std::uint8_t> d(n), out_d(n);
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = static_cast<std::int32_t>(c.rank() * 1000 - static_cast<int>(i));
    b[i] =
        std::numeric_limits<std::int64_t>::max() - static_cast<std::int64_t>(i);  // overflows from 2 ranks on
    d[i] = static_cast<std::uint8_t>(200 + i);
  }
  c.all_reduce(a.data(), out_a.data(), n, DType::kI32, ReduceOp::kSum);
  c.all_reduce(b.data(), out_b.data(), n, DType::kI64, ReduceOp::kSum);
  c.all_reduce(d.data(), out_d.data(), n, DType::kU8, ReduceOp::kSum);
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t want_a = 0;
    std::uint64_t want_b = 0;
    unsigned want_d = 0;
    for (int r = 0; r < c.size(); ++r) {
      want_a += r * 1000 - static_cast<int>(i);
      want_b +=
          static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max() - static_cast<std::int64_t>(i));
      want_d += 200 + static_cast<unsigned>(i);
    }
    EXPECT_EQ(out_a[i], want_a) << i;
    EXPECT_EQ(static_cast<std::uint64_t>(out_b[i]), want_b) << i;
    EXPECT_EQ(out_d[i], static_cast<std::uint8_t>(want_d & 0xFF)) << i;
  }
}

TEST(CommMpi, AllReduceInPlace) {
  Comm& c = comm();
  const std::size_t n = 1001;
  {  // sum, fold path
    std::vector<double> buf = mixed_inputs<double>(c.rank(), n);
    c.all_reduce(buf.data(), buf.data(), n, DType::kF64, ReduceOp::kSum);
    EXPECT_TRUE(same_bits(buf, fold_sum<double>(c.size(), n, false)));
  }
  {  // sum, fold path, chunked (chunks of 16 / size elements)
    auto small = make_small_comm(128, 1000);
    std::vector<float> buf = mixed_inputs<float>(c.rank(), n);
    small->all_reduce(buf.data(), buf.data(), n, DType::kF32, ReduceOp::kSum);
    EXPECT_TRUE(same_bits(buf, fold_sum<float>(c.size(), n, false)));
  }
  {  // integer max: MPI_MAX with MPI_IN_PLACE
    std::vector<std::int64_t> buf(n);
    for (std::size_t i = 0; i < n; ++i) buf[i] = pattern<std::int64_t>(c.rank(), i);
    c.all_reduce(buf.data(), buf.data(), n, DType::kI64, ReduceOp::kMax);
    for (std::size_t i = 0; i < n; ++i) {
      std::int64_t want = pattern<std::int64_t>(0, i);
      for (int r = 1; r < c.size(); ++r) want = std::max(want, pattern<std::int64_t>(r, i));
      EXPECT_EQ(buf[i], want) << i;
    }
  }
  {  // float max, fold path
    std::vector<float> buf = pattern_vector<float>(c.rank(), n);
    c.all_reduce(buf.data(), buf.data(), n, DType::kF32, ReduceOp::kMax);
    for (std::size_t i = 0; i < n; ++i) {
      float want = pattern<float>(0, i);
      for (int r = 1; r < c.size(); ++r) want = std::max(want, pattern<float>(r, i));
      EXPECT_EQ(buf[i], want) << i;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// all_reduce kMax.
template <class T>
void check_max(Comm& c, std::size_t n) {
  const std::vector<T> in = pattern_vector<T>(c.rank(), n);
  std::vector<T> out(n);
  c.all_reduce(in.data(), out.data(), n, dtype_of<T>(), ReduceOp::kMax);
  for (std::size_t i = 0; i < n; ++i) {
    T want = pattern<T>(0, i);
    for (int r = 1; r < c.size(); ++r) want = std::max(want, pattern<T>(r, i));
    EXPECT_EQ(out[i], want) << ddtree::dtype_name(dtype_of<T>()) << " element " << i;
  }
  EXPECT_EQ(first_rank_with_other_bits(c, out), -1);
}

TEST(CommMpi, AllReduceMax) {
  for (std::size_t n : {std::size_t{1}, std::size_t{33}}) {
    check_max<std::int32_t>(comm(), n);
    check_max<std::int64_t>(comm(), n);
    check_max<std::uint64_t>(comm(), n);
    check_max<std::uint8_t>(comm(), n);
    check_max<float>(comm(), n);
    check_max<double>(comm(), n);
  }
}

TEST(CommMpi, AllReduceMaxSignedZerosAndInfinities) {
  Comm& c = comm();
  const int last = c.size() - 1;
  const float inf = std::numeric_limits<float>::infinity();
  // 0: -0 everywhere but the last rank, which has +0    -> +0
  // 1: -0 everywhere                                     -> -0
  // 2: -inf everywhere but rank 0, which has -1e30       -> -1e30
  // 3: +inf on the last rank, 3 elsewhere                -> +inf
  std::vector<float> in = {c.rank() == last ? 0.0f : -0.0f, -0.0f, c.rank() == 0 ? -1e30f : -inf,
                           c.rank() == last ? inf : 3.0f};
  std::vector<float> out(in.size());
  c.all_reduce(in.data(), out.data(), in.size(), DType::kF32, ReduceOp::kMax);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(out[0]), std::bit_cast<std::uint32_t>(0.0f));
  EXPECT_EQ(std::bit_cast<std::uint32_t>(out[1]), std::bit_cast<std::uint32_t>(-0.0f));
  EXPECT_EQ(out[2], -1e30f);
  EXPECT_EQ(out[3], inf);
}

// NaN wins: if any rank holds NaN the result is NaN (the first NaN in rank order, payload kept).
template <class T>
T nan_with_payload(unsigned payload) {
  if constexpr (std::is_same_v<T, float>) {
    return std::bit_cast<float>(0x7FC00000u | (payload & 0x3FFFFFu));
  } else {
    return std::bit_cast<double>(0x7FF8000000000000ull | payload);
  }
}

template <class T>
void check_nan_wins(Comm& c) {
  const int last = c.size() - 1;
  // 0: NaN on the last rank only; 1: NaN on rank 0 only; 2: NaN on every rank with payload rank + 1
  // (rank 0's wins); 3: NaN nowhere; 4: NaN on ranks 1 and last (rank 1's wins; at np1: none).
  std::vector<T> in = {
      c.rank() == last ? nan_with_payload<T>(7) : T(c.rank()),
      c.rank() == 0 ? nan_with_payload<T>(9) : T(1e30),
      nan_with_payload<T>(static_cast<unsigned>(c.rank()) + 1), T(-c.rank()),
      (c.rank() == 1 || (c.rank() == last && last > 0)) ? nan_with_payload<T>(20 + c.rank()) : T(2)};
  std::vector<T> out(in.size());
  c.all_reduce(in.data(), out.data(), in.size(), dtype_of<T>(), ReduceOp::kMax);
  const auto bits = [](T v) {
    return std::bit_cast<std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>(v);
  };
  EXPECT_EQ(bits(out[0]), bits(nan_with_payload<T>(7)));
  EXPECT_EQ(bits(out[1]), bits(nan_with_payload<T>(9)));
  EXPECT_EQ(bits(out[2]), bits(nan_with_payload<T>(1)));
  EXPECT_EQ(out[3], T(0));
  if (c.size() > 1) {
    EXPECT_EQ(bits(out[4]), bits(nan_with_payload<T>(21)));
  } else {
    EXPECT_EQ(out[4], T(2));
  }
  EXPECT_EQ(first_rank_with_other_bits(c, out), -1);
}

TEST(CommMpi, AllReduceMaxNanWins) {
  check_nan_wins<float>(comm());
  check_nan_wins<double>(comm());
}

// ---------------------------------------------------------------------------------------------------------
// Argmax across vocabulary shards as an all-reduce max over packed u64 keys:
//   key = (order-preserving bits of the f32 logit) << 32 | (0xFFFFFFFF - token id),
// so the larger logit wins and, on equal logits, the smaller token id.
std::uint32_t ordered_bits(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
float from_ordered_bits(std::uint32_t o) {
  return std::bit_cast<float>((o & 0x80000000u) ? (o & 0x7FFFFFFFu) : ~o);
}
std::uint64_t pack_key(float logit, std::uint32_t token) {
  return (static_cast<std::uint64_t>(ordered_bits(logit)) << 32) | (0xFFFFFFFFull - token);
}
std::uint32_t key_token(std::uint64_t key) {
  return 0xFFFFFFFFu - static_cast<std::uint32_t>(key & 0xFFFFFFFFu);
}
float key_logit(std::uint64_t key) { return from_ordered_bits(static_cast<std::uint32_t>(key >> 32)); }

// The logit of `token` in row `row` of a vocabulary of `vocab` tokens (every rank can compute any of them).
float test_logit(int row, std::uint32_t token, std::uint32_t vocab) {
  const float base =
      static_cast<float>(static_cast<int>((token * 2654435761u + static_cast<unsigned>(row) * 97u) % 1000u)) *
          0.01f -
      20.0f;
  switch (row) {
    case 0: return token % 101 == 17 ? 50.0f : base;   // tie on every shard: smallest id wins
    case 1: return token == vocab - 2 ? 60.0f : base;  // unique max on the last shard
    case 2: return -1000.0f - base;                    // all negative
    case 3: return (token == 5 || token == 6 || token == vocab - 1) ? 7.5f : -base - 50.0f;  // tie in shard 0
    case 4: return token % 2 ? -0.0f : -1.0f;                                                // best is -0
    default: return base;
  }
}

TEST(CommMpi, AllReduceMaxPackedArgmaxKeys) {
  Comm& c = comm();
  const std::uint32_t shard = 1000;  // tokens per rank
  const std::uint32_t vocab = shard * static_cast<std::uint32_t>(c.size());
  const int rows = 6;
  std::vector<std::uint64_t> keys(rows);
  for (int row = 0; row < rows; ++row) {
    std::uint64_t best = 0;
    for (std::uint32_t t = shard * static_cast<std::uint32_t>(c.rank()); t < shard * (c.rank() + 1u); ++t) {
      best = std::max(best, pack_key(test_logit(row, t, vocab), t));
    }
    keys[static_cast<std::size_t>(row)] = best;
  }
  c.all_reduce(keys.data(), keys.data(), keys.size(), DType::kU64, ReduceOp::kMax);
  for (int row = 0; row < rows; ++row) {
    // Reference: the full-vocabulary argmax, ties to the smaller id.
    std::uint32_t want = 0;
    for (std::uint32_t t = 1; t < vocab; ++t) {
      if (test_logit(row, t, vocab) > test_logit(row, want, vocab)) want = t;
    }
    const std::uint64_t key = keys[static_cast<std::size_t>(row)];
    EXPECT_EQ(key_token(key), want) << "row " << row;
    EXPECT_EQ(std::bit_cast<std::uint32_t>(key_logit(key)),
              std::bit_cast<std::uint32_t>(test_logit(row, want, vocab)))
        << "row " << row;
  }
  EXPECT_EQ(key_token(keys[0]), 17u);
  EXPECT_EQ(key_token(keys[1]), vocab - 2);
  EXPECT_EQ(key_token(keys[3]), 5u);
  EXPECT_EQ(key_token(keys[4]), 1u);
  EXPECT_TRUE(std::signbit(key_logit(keys[4])));
}

// ---------------------------------------------------------------------------------------------------------
// all_gather / gather layouts: rank r's block at r * count.
template <class T>
void check_all_gather(Comm& c, std::size_t count) {
  const std::vector<T> in = pattern_vector<T>(c.rank(), count);
  std::vector<T> out(count * static_cast<std::size_t>(c.size()), T(0));
  c.all_gather(in.data(), out.data(), count, dtype_of<T>());
  for (int r = 0; r < c.size(); ++r) {
    const std::vector<T> want = pattern_vector<T>(r, count);
    EXPECT_TRUE(same_bits(out.data() + static_cast<std::size_t>(r) * count, want.data(), count))
        << ddtree::dtype_name(dtype_of<T>()) << " count " << count << " block of rank " << r;
  }
}

template <class T>
void check_gather(Comm& c, std::size_t count) {
  const std::vector<T> in = pattern_vector<T>(c.rank(), count);
  for (int root = 0; root < c.size(); ++root) {
    // Non-roots alternate between passing null and passing a buffer that must stay untouched.
    const bool pass_null = c.rank() != root && (root + c.rank()) % 2 == 0;
    const std::vector<T> sentinel(count * static_cast<std::size_t>(c.size()), T(3));
    std::vector<T> out = sentinel;
    c.gather(in.data(), pass_null ? nullptr : out.data(), count, dtype_of<T>(), root);
    if (c.rank() == root) {
      for (int r = 0; r < c.size(); ++r) {
        const std::vector<T> want = pattern_vector<T>(r, count);
        EXPECT_TRUE(same_bits(out.data() + static_cast<std::size_t>(r) * count, want.data(), count))
            << ddtree::dtype_name(dtype_of<T>()) << " count " << count << " root " << root << " block " << r;
      }
    } else {
      EXPECT_TRUE(same_bits(out, sentinel)) << "gather wrote recvbuf on a non-root rank";
    }
  }
}

TEST(CommMpi, AllGatherLayout) {
  for (std::size_t count : {std::size_t{1}, std::size_t{3}, std::size_t{1001}}) {
    check_all_gather<std::int64_t>(comm(), count);
    check_all_gather<float>(comm(), count);
    check_all_gather<std::uint8_t>(comm(), count);
  }
  auto small = make_small_comm(4096, 1000);  // 2501 elements per rank: three MPI calls, the last short
  check_all_gather<double>(*small, 2501);
  check_all_gather<std::uint8_t>(*small, 2000);
}

TEST(CommMpi, GatherLayoutEveryRoot) {
  for (std::size_t count : {std::size_t{1}, std::size_t{5}, std::size_t{1001}}) {
    check_gather<std::int32_t>(comm(), count);
    check_gather<double>(comm(), count);
  }
  auto small = make_small_comm(4096, 1000);
  check_gather<double>(*small, 2501);
  check_gather<std::uint64_t>(*small, 1000);
}

// ---------------------------------------------------------------------------------------------------------
// check_same_everywhere.
TEST(CommMpi, CheckSameEverywherePassesWhenEqual) {
  Comm& c = comm();
  EXPECT_NO_THROW(c.check_same_everywhere("build", ddtree::build_id()));
  EXPECT_NO_THROW(c.check_same_everywhere("empty", ""));
  EXPECT_NO_THROW(c.check_same_everywhere(
      "config", std::string(100000, 'x') + "|model=kimi-k2|tp=" + std::to_string(c.size())));
  // At np1 any fingerprint agrees with itself.
  if (c.size() == 1) {
    EXPECT_NO_THROW(c.check_same_everywhere("per-rank", "rank " + std::to_string(c.rank())));
  }
}

// Returns the message every rank got (empty if it did not throw).
std::string same_everywhere_error(Comm& c, const std::string& what, const std::string& fingerprint) {
  try {
    c.check_same_everywhere(what, fingerprint);
  } catch (const CommError& e) {
    return e.what();
  }
  return "";
}

TEST(CommMpi, CheckSameEverywhereThrowsOnEveryRank) {
  Comm& c = comm();
  if (c.size() == 1) GTEST_SKIP() << "needs two or more ranks (a single rank always agrees with itself)";
  const int last = c.size() - 1;
  {  // the last rank differs, same length
    const std::string msg = same_everywhere_error(c, "engine flags", c.rank() == last ? "cfg-B" : "cfg-A");
    ASSERT_FALSE(msg.empty()) << "no CommError on rank " << c.rank();
    EXPECT_NE(msg.find("engine flags"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank " + std::to_string(last) + " has \"cfg-B\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 0 has \"cfg-A\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("1 of " + std::to_string(c.size())), std::string::npos) << msg;
  }
  {  // the last rank differs in length only
    const std::string msg = same_everywhere_error(c, "build", c.rank() == last ? "abc-extra" : "abc");
    EXPECT_NE(msg.find("rank " + std::to_string(last) + " has \"abc-extra\""), std::string::npos) << msg;
  }
  {  // every rank differs: the first differing rank (1) is named
    const std::string msg = same_everywhere_error(c, "model", "model-" + std::to_string(c.rank()));
    EXPECT_NE(msg.find("rank 1 has \"model-1\" but rank 0 has \"model-0\""), std::string::npos) << msg;
  }
  {  // rank 0 has an empty fingerprint, the others do not
    const std::string msg = same_everywhere_error(c, "empty", c.rank() == 0 ? "" : "x");
    EXPECT_NE(msg.find("rank 1 has \"x\" but rank 0 has \"\""), std::string::npos) << msg;
  }
  // Every rank threw and the comm is still usable.
  c.barrier();
  EXPECT_NO_THROW(c.check_same_everywhere("after", "same"));
}

// ---------------------------------------------------------------------------------------------------------
// Chunked all_reduce: scratch bounded by max_scratch_bytes, same bits as one unchunked fold.
template <class T>
void check_chunked_matches(Comm& small, Comm& big, std::size_t count, ReduceOp op) {
  // mixed_inputs (rounding-sensitive sums) only for floats: their magnitudes do not fit integers.
  const bool mixed = op == ReduceOp::kSum && std::is_floating_point_v<T>;
  const std::vector<T> in =
      mixed ? mixed_inputs<T>(small.rank(), count) : pattern_vector<T>(small.rank(), count);
  std::vector<T> chunked(count), whole(count);
  small.all_reduce(in.data(), chunked.data(), count, dtype_of<T>(), op);
  big.all_reduce(in.data(), whole.data(), count, dtype_of<T>(), op);
  EXPECT_TRUE(same_bits(chunked, whole))
      << ddtree::dtype_name(dtype_of<T>()) << " count " << count << " first difference at "
      << first_difference(chunked.data(), whole.data(), count);
  if (mixed) {
    EXPECT_TRUE(same_bits(whole, fold_sum<T>(small.size(), count, false)));
  }
}

TEST(CommMpi, ChunkedAllReduceMatchesUnchunked) {
  Comm& c = comm();
  // 4 KiB of scratch: 4096 / (size * 8) f64 per chunk, i.e. 512 at np1 (not chunked: size 1 copies), 256 at
  // np2, 128 at np4. Counts around chunk multiples and odd ones.
  auto small = make_small_comm(4096, std::size_t{1} << 30);
  const std::size_t chunk64 = 4096 / (static_cast<std::size_t>(c.size()) * 8);
  for (std::size_t count : {chunk64 - 1, chunk64, chunk64 + 1, 3 * chunk64, 10007 * std::size_t{1}}) {
    check_chunked_matches<double>(*small, c, count, ReduceOp::kSum);
    check_chunked_matches<float>(*small, c, count, ReduceOp::kSum);
    check_chunked_matches<double>(*small, c, count, ReduceOp::kMax);
    check_chunked_matches<std::int32_t>(*small, c, count, ReduceOp::kSum);
  }
  // Scratch smaller than one element per rank: chunks of one element.
  auto tiny = make_small_comm(1, 1000);
  check_chunked_matches<double>(*tiny, c, 37, ReduceOp::kSum);
  // Fewer elements per MPI call than the scratch allows: the message bound sets the chunk.
  auto short_messages = make_small_comm(std::size_t{1} << 20, 10);
  check_chunked_matches<float>(*short_messages, c, 1001, ReduceOp::kSum);
  check_chunked_matches<std::int64_t>(*short_messages, c, 1001, ReduceOp::kMax);  // MPI_MAX, split
}

TEST(CommMpi, AllReduceLargerThanDefaultScratch) {
  // The default bound (64 MiB) with f32: chunks of 64 MiB / (size * 4) elements; count is one chunk and a
  // bit, so the default comm folds in two rounds. Checked against the local rank-order fold.
  Comm& c = comm();
  const std::size_t chunk =
      ddtree::MpiCommOptions{}.max_scratch_bytes / (static_cast<std::size_t>(c.size()) * 4);
  const std::size_t count = chunk + 4099;
  const std::vector<float> in = mixed_inputs<float>(c.rank(), count);
  std::vector<float> out(count);
  c.all_reduce(in.data(), out.data(), count, DType::kF32, ReduceOp::kSum);
  const std::vector<float> want = fold_sum<float>(c.size(), count, false);
  EXPECT_TRUE(same_bits(out, want)) << "first difference at "
                                    << first_difference(out.data(), want.data(), count);
}

// ---------------------------------------------------------------------------------------------------------
TEST(CommMpi, ZeroCountIsNoOp) {
  Comm& c = comm();
  // Null buffers are fine with count 0, and non-null ones are not touched.
  double sentinel = 42.0;
  for (DType dt : {DType::kF32, DType::kF64, DType::kI32, DType::kI64, DType::kU64, DType::kU8}) {
    for (int root = 0; root < c.size(); ++root) {
      EXPECT_NO_THROW(c.broadcast(nullptr, 0, dt, root));
      EXPECT_NO_THROW(c.gather(nullptr, nullptr, 0, dt, root));
      EXPECT_NO_THROW(c.broadcast(&sentinel, 0, dt, root));
    }
    EXPECT_NO_THROW(c.all_reduce(nullptr, nullptr, 0, dt, ReduceOp::kSum));
    EXPECT_NO_THROW(c.all_reduce(nullptr, nullptr, 0, dt, ReduceOp::kMax));
    EXPECT_NO_THROW(c.all_reduce(&sentinel, &sentinel, 0, dt, ReduceOp::kSum));
    EXPECT_NO_THROW(c.all_gather(nullptr, nullptr, 0, dt));
    EXPECT_NO_THROW(c.all_gather(&sentinel, &sentinel, 0, dt));
  }
  EXPECT_EQ(sentinel, 42.0);
  c.barrier();
}

TEST(CommMpi, InvalidArgumentsThrowOnEveryRank) {
  // All checked before any MPI call, from arguments that are the same on every rank: every rank throws
  // and nobody is left inside a collective.
  Comm& c = comm();
  double x[4] = {};
  EXPECT_THROW(c.broadcast(x, 1, DType::kF64, c.size()), CommError);
  EXPECT_THROW(c.broadcast(x, 1, DType::kF64, -1), CommError);
  EXPECT_THROW(c.gather(x, x, 1, DType::kF64, c.size()), CommError);
  EXPECT_THROW(c.broadcast(x, 1, static_cast<DType>(42), 0), CommError);
  EXPECT_THROW(c.all_reduce(x, x, 1, static_cast<DType>(42), ReduceOp::kSum), CommError);
  EXPECT_THROW(c.all_reduce(x, x, 1, DType::kF64, static_cast<ReduceOp>(7)), CommError);
  EXPECT_THROW(c.all_reduce(nullptr, x, 1, DType::kF64, ReduceOp::kSum), CommError);
  EXPECT_THROW(c.all_gather(x, nullptr, 1, DType::kF64), CommError);
  EXPECT_THROW(c.broadcast(nullptr, 1, DType::kF64, 0), CommError);
  EXPECT_THROW(make_small_comm(0, 1000), CommError);
  EXPECT_THROW(make_small_comm(4096, 0), CommError);
  EXPECT_THROW(make_small_comm(4096, std::size_t{1} << 31), CommError);
  c.barrier();
}

// The macro names the call, file:line and MPI's error string.
int fake_mpi_call(int rc) { return rc; }

TEST(CommMpi, MpiErrorsBecomeCommError) {
  EXPECT_NO_THROW(DDTREE_MPI_CHECK(fake_mpi_call(MPI_SUCCESS)));
  try {
    DDTREE_MPI_CHECK(fake_mpi_call(MPI_ERR_TRUNCATE));
    ADD_FAILURE() << "no CommError";
  } catch (const CommError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("fake_mpi_call(MPI_ERR_TRUNCATE) failed at "), std::string::npos) << msg;
    EXPECT_NE(msg.find("test_comm_mpi.cpp:"), std::string::npos) << msg;
    EXPECT_NE(msg.find("truncat"), std::string::npos) << msg;  // MPI's own text
  }
  // A real failing call, on a communicator with MPI_ERRORS_RETURN (as MpiComm's are): a send to a rank that
  // does not exist fails locally, before anything is sent.
  MPI_Comm dup = MPI_COMM_NULL;
  ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &dup), MPI_SUCCESS);
  ASSERT_EQ(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN), MPI_SUCCESS);
  int value = 0;
  try {
    DDTREE_MPI_CHECK(MPI_Send(&value, 1, MPI_INT, comm().size() + 5, 0, dup));
    ADD_FAILURE() << "no CommError";
  } catch (const CommError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("MPI_Send(&value, 1, MPI_INT, comm().size() + 5, 0, dup) failed"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("on rank " + std::to_string(comm().rank())), std::string::npos) << msg;
  }
  MPI_Comm_free(&dup);
}

TEST(CommMpi, SeveralCommsCoexist) {
  // A second comm (MPI already initialised) works alongside the first, is independent of it, and does
  // not finalise MPI when it goes away.
  Comm& c = comm();
  {
    auto second = make_small_comm(4096, 1000);
    EXPECT_EQ(second->rank(), c.rank());
    EXPECT_EQ(second->size(), c.size());
    std::int64_t a = c.rank() + 1, b = 10 * (c.rank() + 1), sa = 0, sb = 0;
    second->all_reduce(&b, &sb, 1, DType::kI64, ReduceOp::kSum);
    c.all_reduce(&a, &sa, 1, DType::kI64, ReduceOp::kSum);
    const std::int64_t n = c.size();
    EXPECT_EQ(sa, n * (n + 1) / 2);
    EXPECT_EQ(sb, 10 * n * (n + 1) / 2);
  }
  std::int32_t one = 1, total = 0;
  c.all_reduce(&one, &total, 1, DType::kI32, ReduceOp::kSum);
  EXPECT_EQ(total, c.size());
}

// Not run by default: ctest comm_mpi_harness_np2 runs it alone to show that a failure on one rank fails
// the whole job and that rank 0 reports it.
TEST(CommMpi, DISABLED_FailsOnLastRankOnly) {
  Comm& c = comm();
  EXPECT_NE(c.rank(), c.size() - 1) << "failing on purpose on the last rank";
  c.barrier();
}

// ---------------------------------------------------------------------------------------------------------
// Output and exit status across ranks.

// On ranks other than 0 (whose gtest output is silenced): print this rank's failures, marked with the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::printf("[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                r.message());
    std::fflush(stdout);
  }
  void OnTestEnd(const ::testing::TestInfo& t) override {
    if (!t.result()->Failed()) return;
    std::printf("[rank %d] [  FAILED  ] %s.%s\n", rank_, t.test_suite_name(), t.name());
    std::fflush(stdout);
  }

 private:
  int rank_;
};

// On every rank, after each test (a collective: all ranks run the same tests): rank 0 names the ranks on
// which the test failed, so its summary is complete even though it prints only its own gtest output.
class CrossRankTestSummary : public ::testing::EmptyTestEventListener {
 public:
  void OnTestEnd(const ::testing::TestInfo& t) override {
    Comm& c = comm();
    const std::int32_t failed = t.result()->Failed() ? 1 : 0;
    std::vector<std::int32_t> all(static_cast<std::size_t>(c.size()));
    try {
      c.all_gather(&failed, all.data(), 1, DType::kI32);
    } catch (const CommError& e) {
      c.abort(3, std::string("test harness: all_gather after ") + t.name() + " failed: " + e.what());
    }
    if (c.rank() != 0 || std::count(all.begin(), all.end(), 1) == 0) return;
    std::string ranks;
    for (int r = 0; r < c.size(); ++r) {
      if (all[static_cast<std::size_t>(r)]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    }
    std::printf("[ ranks  ] %s.%s failed on rank(s) %s\n", t.test_suite_name(), t.name(), ranks.c_str());
    std::fflush(stdout);
  }
};

// Ends the job if the tests take longer than `seconds` (a collective that hangs, a rank that stopped), so
// mpirun exits non-zero with a message instead of ctest killing it at its timeout.
class Watchdog {
 public:
  explicit Watchdog(int seconds)
      : thread_([this, seconds] {
          std::unique_lock<std::mutex> lock(mutex_);
          if (cv_.wait_for(lock, std::chrono::seconds(seconds), [this] { return done_; })) return;
          const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
          comm().abort(4, "test watchdog: no result after " + std::to_string(seconds) + " s, in " +
                              (test ? std::string(test->test_suite_name()) + "." + test->name() : "no test"));
        }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: started after the members it uses
};

}  // namespace

int main(int argc, char** argv) {
  // The comm first: MPI_Init may rewrite argc/argv, and the listeners below make collective calls.
  std::unique_ptr<Comm> owned;
  try {
    owned = ddtree::make_mpi_comm(&argc, &argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "test_comm_mpi: cannot create the MPI comm: %s\n", e.what());
    return 2;
  }
  g_comm = owned.get();
  ::testing::InitGoogleTest(&argc, argv);

  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (g_comm->rank() != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(g_comm->rank()));
  }
  listeners.Append(new CrossRankTestSummary);

  const char* watchdog_env = std::getenv("DDTREE_TEST_WATCHDOG_S");
  const int watchdog_s = watchdog_env ? std::atoi(watchdog_env) : 100;  // under ctest's TIMEOUT of 120
  std::int32_t failed = 0;
  {
    Watchdog watchdog(watchdog_s > 0 ? watchdog_s : 100);
    failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  }

  // One exit status for the whole job: non-zero everywhere if any rank failed.
  std::int32_t any_failed = 0;
  g_comm->all_reduce(&failed, &any_failed, 1, DType::kI32, ReduceOp::kMax);
  if (g_comm->rank() == 0 && any_failed && !failed) {
    std::printf("[ ranks  ] rank 0 passed, but other ranks failed (their [rank N] lines above)\n");
  }
  std::fflush(stdout);
  g_comm = nullptr;
  owned.reset();  // finalises MPI
  return any_failed ? 1 : 0;
}
