// Exact helpers shared by both backends: order bits, packed keys, the portable log and the Gumbel noise.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ddtree/kernels.h"
#include "kernels/common/numerics.h"
#include "test_util.h"

using namespace ddtree;

TEST(Numerics, OrderBitsAreMonotoneAndInvertible) {
  std::mt19937_64 rng(1);
  std::normal_distribution<float> nd(0.0f, 100.0f);
  std::vector<float> xs = {-test::kInf, -1e30f, -1.0f, -1e-30f, -0.0f, 0.0f, 1e-30f, 1.0f, 3e38f, test::kInf};
  for (int i = 0; i < 1000; ++i) xs.push_back(nd(rng));
  std::sort(xs.begin(), xs.end());
  for (size_t i = 1; i < xs.size(); ++i) {
    if (xs[i - 1] < xs[i]) EXPECT_LT(num::order_bits(xs[i - 1]), num::order_bits(xs[i]));
    else EXPECT_EQ(num::order_bits(xs[i - 1]), num::order_bits(xs[i]));
  }
  for (float x : xs) EXPECT_EQ(num::from_order_bits(num::order_bits(x)), x);  // -0 comes back as +0
  EXPECT_EQ(num::order_bits(-0.0f), num::order_bits(0.0f));  // equal, as for plain argmax
  EXPECT_EQ(num::order_bits(std::nanf("")), num::order_bits(-test::kInf));  // NaN ranks as -inf
  EXPECT_GT(num::order_bits(-test::kInf), 0u);                              // key 0 means "empty"
}

TEST(Numerics, PackedKeysTieToSmallerId) {
  EXPECT_GT(ddt_pack_key(1.0f, 5), ddt_pack_key(1.0f, 6));
  EXPECT_GT(ddt_pack_key(1.5f, 9), ddt_pack_key(1.0f, 0));
  EXPECT_GT(ddt_pack_key(-test::kInf, 163839), 0u);
  EXPECT_EQ(ddt_key_token(ddt_pack_key(-2.5f, 163839)), 163839);
  EXPECT_EQ(num::key_value(ddt_pack_key(-2.5f, 7)), -2.5f);
}

TEST(Numerics, PortableLogMatchesLibm) {
  std::mt19937_64 rng(2);
  std::uniform_real_distribution<double> ue(-80.0, 80.0);
  double worst = 0.0;
  for (int i = 0; i < 200000; ++i) {
    const float x = float(std::exp2(ue(rng)));
    const double err = std::fabs(double(num::portable_log(x)) - std::log(double(x)));
    worst = std::max(worst, err / std::max(1.0, std::fabs(std::log(double(x)))));
  }
  EXPECT_LT(worst, 3e-7) << "relative-or-absolute error of portable_log";
  EXPECT_EQ(num::portable_log(1.0f), 0.0f);
  EXPECT_EQ(num::portable_log(0.0f), -test::kInf);
}

TEST(Numerics, GumbelNoiseHasGumbelMoments) {
  // Gumbel(0,1): mean = Euler-Mascheroni 0.5772, variance pi^2 / 6 = 1.6449.
  const int n = 400000;
  double s = 0, s2 = 0;
  for (int i = 0; i < n; ++i) {
    const double g = ddt_gumbel(1234, i / 97, i % 97);
    s += g; s2 += g * g;
  }
  const double mean = s / n, var = s2 / n - mean * mean;
  EXPECT_NEAR(mean, 0.5772157, 0.01);
  EXPECT_NEAR(var, 1.6449341, 0.02);
  // Keyed, not stateful: same (seed, position, token) -> same bits; any change -> different.
  EXPECT_EQ(num::f32_bits(ddt_gumbel(7, 100, 3)), num::f32_bits(ddt_gumbel(7, 100, 3)));
  EXPECT_NE(ddt_gumbel(7, 100, 3), ddt_gumbel(8, 100, 3));
  EXPECT_NE(ddt_gumbel(7, 100, 3), ddt_gumbel(7, 101, 3));
  EXPECT_NE(ddt_gumbel(7, 100, 3), ddt_gumbel(7, 100, 4));
}

TEST(Numerics, PortableExpMatchesLibm) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> uy(-87.0f, 0.0f);
  double worst = 0.0;
  for (int i = 0; i < 200000; ++i) {
    const float y = i < 1000 ? -float(i) * 1e-4f : uy(rng);
    const double want = std::exp(double(y));
    worst = std::max(worst, std::fabs(double(num::portable_exp(y)) - want) / want);
  }
  EXPECT_LT(worst, 4e-7) << "relative error of portable_exp";
  EXPECT_EQ(num::portable_exp(0.0f), 1.0f);
  EXPECT_EQ(num::portable_exp(-test::kInf), 0.0f);
  EXPECT_EQ(num::portable_exp(std::nanf("")), 0.0f);
  EXPECT_EQ(num::portable_exp(-100.0f), 0.0f);
}
