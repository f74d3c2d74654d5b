// Passes by compiling: conversions are constexpr, policies and formats are closed by concepts.
#include <scalify/scalify.hpp>

namespace {
using namespace scalify;

static_assert(static_cast<float>(float8_e4m3fn(1.5f)) == 1.5f);
static_assert(float8_e4m3fn(448.0f).bits() == 0x7e);
static_assert(float8_e4m3fn::from_bits(0x7e).bits() == 0x7e);
static_assert(convert<float8_e4m3fn, round_nearest_even, saturate_finite>(1e10f).bits() == 0x7e);
static_assert(convert<float8_e5m2, round_toward_zero>(1.49f).bits() == 0x3d);
static_assert(convert<float8_e5m2, round_stochastic>(1.1f, 0u).bits() == 0x3d);
static_assert(convert<float8_e4m3fn>(1.0625 + 1e-12).bits() == 0x39);  // from double, one rounding
static_assert(convert<float>(float8_e5m2::from_bits(0x01)) == 1.0f / 65536.0f);
static_assert(static_cast<float>((std::numeric_limits<float8_e4m3fn>::max)()) == 448.0f);
static_assert(isnan(float8_e4m3fn(1000.0f)));
static_assert(float8_e4m3fn(1.5f) + float8_e4m3fn(2.0f) == float8_e4m3fn(3.5f));
static_assert(sizeof(float8_e4m3fn) == 1 && std::is_trivially_copyable_v<float8_e4m3fn>);

static_assert(RoundingPolicy<round_stochastic> && !RoundingPolicy<int>);
static_assert(SaturationPolicy<saturate_finite> && !SaturationPolicy<round_toward_zero>);
static_assert(FloatFormat<formats::e4m3fn> && !FloatFormat<float>);
static_assert(Minifloat<float6_e3m2fn> && !Minifloat<Eigen::half>);
}  // namespace
