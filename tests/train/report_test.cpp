// The training report's axis ticks: 1-2-5 × 10^k steps covering the data, for ordinary and degenerate ranges.
#include "train/report.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

namespace trl {
namespace {

void expect_ticks(const AxisTicks& t, const std::vector<double>& want) {
  ASSERT_EQ(t.values.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(t.values[i], want[i], 1e-9 * t.step) << "tick " << i;
  EXPECT_EQ(t.lo, t.values.front());
  EXPECT_EQ(t.hi, t.values.back());
}

// The step is 1, 2 or 5 times a power of ten; ticks are multiples of it, in order, none NaN, covering [lo, hi].
void expect_nice_axis(const AxisTicks& t, double lo, double hi) {
  ASSERT_GE(t.values.size(), 2u);
  ASSERT_TRUE(std::isfinite(t.step) && t.step > 0) << t.step;
  const double mantissa = t.step / std::pow(10.0, std::floor(std::log10(t.step)));
  EXPECT_TRUE(std::fabs(mantissa - 1) < 1e-9 || std::fabs(mantissa - 2) < 1e-9 || std::fabs(mantissa - 5) < 1e-9) << t.step;
  for (size_t i = 0; i < t.values.size(); ++i) {
    ASSERT_TRUE(std::isfinite(t.values[i]));
    EXPECT_NEAR(t.values[i] / t.step, std::round(t.values[i] / t.step), 1e-6) << t.values[i];
    if (i > 0) {
      EXPECT_NEAR(t.values[i] - t.values[i - 1], t.step, 1e-9 * t.step);
    }
  }
  EXPECT_LE(t.lo, lo);
  EXPECT_GE(t.hi, hi);
}

TEST(ReportTicks, LossRangeTicksAtHalves) {
  const AxisTicks t = nice_ticks(5.064, 7.532);
  EXPECT_DOUBLE_EQ(t.step, 0.5);
  expect_ticks(t, {5, 5.5, 6, 6.5, 7, 7.5, 8});
  EXPECT_EQ(tick_label(t.values[1], t.step), "5.5");
}

TEST(ReportTicks, StepRangeTicksAtTwenties) {
  const AxisTicks t = nice_ticks(1, 100, 5, 1);
  expect_ticks(t, {0, 20, 40, 60, 80, 100});
  EXPECT_EQ(tick_label(t.values[5], t.step), "100");
}

TEST(ReportTicks, SmallValuesAndLabels) {
  const AxisTicks t = nice_ticks(0, 1e-3);  // a learning rate
  EXPECT_DOUBLE_EQ(t.step, 2e-4);
  expect_ticks(t, {0, 2e-4, 4e-4, 6e-4, 8e-4, 1e-3});
  EXPECT_EQ(tick_label(t.values[3], t.step), "0.0006");  // not 0.0006000000000000001
  EXPECT_EQ(tick_label(t.values[0], t.step), "0");
  expect_nice_axis(nice_ticks(0.8731, 0.8812), 0.8731, 0.8812);
  expect_nice_axis(nice_ticks(-3.7, 12345.6), -3.7, 12345.6);
}

TEST(ReportTicks, DegenerateRanges) {
  // A single logged step: an axis of whole steps around it.
  const AxisTicks one = nice_ticks(1, 1, 6, 1);
  expect_nice_axis(one, 1, 1);
  EXPECT_GE(one.step, 1);
  EXPECT_LT(one.lo, 1);
  EXPECT_GT(one.hi, 1);
  // All-equal values, zero, reversed bounds, and non-finite input.
  for (auto [lo, hi] : std::vector<std::pair<double, double>>{{2.5, 2.5}, {0, 0}, {-4e-6, -4e-6}, {7, 3}}) {
    const AxisTicks t = nice_ticks(lo, hi);
    expect_nice_axis(t, std::min(lo, hi), std::max(lo, hi));
    EXPECT_LT(t.lo, t.hi) << lo << " " << hi;
  }
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (auto [lo, hi] : std::vector<std::pair<double, double>>{{nan, 1}, {0, inf}, {nan, nan}}) {
    const AxisTicks t = nice_ticks(lo, hi);
    expect_nice_axis(t, 0, 1);
  }
}

}  // namespace
}  // namespace trl
