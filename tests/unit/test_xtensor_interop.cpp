// xtensor expressions on low-precision data: reductions of xt::cast<float>(data) equal the float
// computation, reductions over the data themselves accumulate in float, a minifloat mixed with
// another type computes as float does, and the forms that read the data back (value(),
// cast<float>(a).data(), xt::cast<float>(a.data())). Operators on two arrays of one minifloat
// format are rejected at compile time: tests/compile_fail/minifloat_xtensor_arithmetic.cpp.
#include <scalify/scalify.hpp>

#include <catch2/catch.hpp>
#include <xtensor/xio.hpp>
#include <xtensor/xnorm.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <sstream>
#include <type_traits>
#include <vector>

using namespace scalify;

namespace {

// Values that every tested type holds exactly (e5m2 keeps 2 mantissa bits) and whose sums,
// squares and sums of squares float computes exactly, so that the checks below can be equalities.
const std::vector<float> exact_values = {-3.0f, -1.5f, -0.25f, 0.0f, 0.5f, 1.0f, 1.75f, 2.0f, 3.5f, 6.0f, 12.0f, -8.0f};

template <class T>
xt::xarray<T> low_precision_array(const std::vector<float>& values, const std::vector<std::size_t>& shape)
{
    xt::xarray<float> wide = xt::xarray<float>::from_shape(shape);
    std::copy(values.begin(), values.end(), wide.begin());
    return xt::cast<T>(wide);
}

float sum_of(const std::vector<float>& values)
{
    return std::accumulate(values.begin(), values.end(), 0.0f);
}

float sum_of_squares(const std::vector<float>& values)
{
    return std::accumulate(values.begin(), values.end(), 0.0f, [](float sum, float x) { return sum + x * x; });
}

template <class Expression>
using value_type_of = typename std::decay_t<Expression>::value_type;

}  // namespace

TEMPLATE_TEST_CASE("xtensor reductions of xt::cast<float>(data) equal the float computation", "[xtensor]",
                   float8_e4m3fn, float8_e5m2, Eigen::half, Eigen::bfloat16)
{
    const auto a = make_scaled_array<pow2_scale>(low_precision_array<TestType>(exact_values, {3, 4}), 0.25f);
    const auto widened = xt::cast<float>(a.data());
    REQUIRE(std::equal(widened.begin(), widened.end(), exact_values.begin()));

    // Independent of xtensor: the sums in float.
    const float sum = sum_of(exact_values), squares = sum_of_squares(exact_values);
    const double count = static_cast<double>(exact_values.size());
    CHECK(xt::sum(widened)() == sum);
    CHECK(xt::mean(widened)() == static_cast<double>(sum) / count);
    // The form that failed to compile before: mean of the squares of the widened data.
    CHECK(xt::mean(xt::square(xt::cast<float>(a.data())))() == static_cast<double>(squares) / count);
    CHECK(xt::norm_l2(widened)() == std::sqrt(static_cast<double>(squares)));

    // The same reductions over float data of the same values.
    const xt::xarray<float> reference = low_precision_array<float>(exact_values, {3, 4});
    CHECK(xt::amax(widened)() == xt::amax(reference)());
    CHECK(xt::amin(widened)() == xt::amin(reference)());
    CHECK(xt::norm_l1(widened)() == xt::norm_l1(reference)());
    CHECK(xt::norm_linf(widened)() == xt::norm_linf(reference)());
    CHECK(xt::variance(widened)() == xt::variance(reference)());
    CHECK(xt::stddev(widened)() == xt::stddev(reference)());
    const xt::xarray<float> row_sums = xt::sum(widened, {1}), reference_row_sums = xt::sum(reference, {1});
    CHECK((row_sums == reference_row_sums));
    const xt::xarray<double> column_means = xt::mean(widened, {0}), reference_column_means = xt::mean(reference, {0});
    CHECK((column_means == reference_column_means));
    const xt::xarray<float> column_max = xt::amax(widened, {0}), reference_column_max = xt::amax(reference, {0});
    CHECK((column_max == reference_column_max));

    // The value (data times scale) in float, three ways.
    const xt::xarray<float> value = xt::cast<float>(a.data()) * 0.25f;
    CHECK((a.value() == value));
    const auto as_float = cast<float>(a);
    CHECK(as_float.scale() == 0.25f);
    CHECK((as_float.data() == widened));
    CHECK(xt::mean(xt::square(a.value()))() == static_cast<double>(squares / 16.0f) / count);
}

TEMPLATE_TEST_CASE("xtensor reductions over low-precision data accumulate in float", "[xtensor]", float8_e4m3fn,
                   float8_e5m2, Eigen::half, Eigen::bfloat16)
{
    // 4096 ones: a sum kept in the type would stop growing once the total's spacing reaches 2
    // (at 16 in e4m3fn, 8 in e5m2, 2048 in half, 256 in bfloat16).
    const xt::xarray<TestType> ones = low_precision_array<TestType>(std::vector<float>(4096, 1.0f), {4096});
    if constexpr (!std::is_same_v<TestType, Eigen::bfloat16>) {
        // (bfloat16's sums fail to compile: tests/compile_fail/xtensor_sum_bfloat16.cpp.)
        const auto sum = xt::sum(ones);
        STATIC_REQUIRE(std::is_same_v<value_type_of<decltype(sum)>, float>);
        CHECK(sum() == 4096.0f);
        CHECK(xt::mean(ones)() == 1.0);

        const xt::xarray<TestType> rows = low_precision_array<TestType>(std::vector<float>(2 * 4096, 1.0f), {2, 4096});
        const xt::xarray<float> row_sums = xt::sum(rows, {1});
        CHECK((row_sums == xt::xarray<float>{4096.0f, 4096.0f}));
    }
    CHECK(xt::norm_sq(ones)() == 4096.0);
    CHECK(xt::norm_l1(ones)() == 4096.0);
    CHECK(xt::norm_l2(ones)() == 64.0);

    // 2^10 overflows e4m3fn (max 448): the product is taken in float.
    const xt::xarray<TestType> twos = low_precision_array<TestType>(std::vector<float>(10, 2.0f), {10});
    const auto product = xt::prod(twos);
    STATIC_REQUIRE(std::is_same_v<value_type_of<decltype(product)>, float>);
    CHECK(product() == 1024.0f);

    // amax and amin select exactly, and keep the element type.
    const xt::xarray<TestType> data = low_precision_array<TestType>(exact_values, {3, 4});
    const auto largest = xt::amax(data);
    STATIC_REQUIRE(std::is_same_v<value_type_of<decltype(largest)>, TestType>);
    CHECK(static_cast<float>(largest()) == 12.0f);
    CHECK(static_cast<float>(xt::amin(data)()) == -8.0f);
    const xt::xarray<TestType> row_max = xt::amax(data, {1});
    CHECK((xt::cast<float>(row_max) == xt::xarray<float>{0.0f, 2.0f, 12.0f}));
    CHECK(xt::norm_linf(data)() == 12.0f);
}

TEST_CASE("a minifloat mixed with another type computes as float does", "[xtensor]")
{
    const float8_e4m3fn x(1.5f);
    const float8_e5m2 y(0.25f);

    STATIC_REQUIRE(std::is_same_v<decltype(x * 2.0), double>);
    STATIC_REQUIRE(std::is_same_v<decltype(x * 2.0f), float>);
    STATIC_REQUIRE(std::is_same_v<decltype(2 * x), float>);
    STATIC_REQUIRE(std::is_same_v<decltype(x + y), float>);
    STATIC_REQUIRE(std::is_same_v<decltype(x - Eigen::half(1.0f)), float>);
    STATIC_REQUIRE(std::is_same_v<decltype(Eigen::bfloat16(1.0f) / x), float>);
    STATIC_REQUIRE(std::is_same_v<decltype(x + x), float8_e4m3fn>);  // one format: rounded once, as before
    STATIC_REQUIRE(std::is_same_v<std::common_type_t<float8_e4m3fn, float>, float>);
    STATIC_REQUIRE(std::is_same_v<std::common_type_t<double, float8_e4m3fn>, double>);
    STATIC_REQUIRE(std::is_same_v<std::common_type_t<float8_e4m3fn, int>, float>);
    STATIC_REQUIRE(std::is_same_v<std::common_type_t<float8_e4m3fn, float8_e5m2>, float>);
    STATIC_REQUIRE(std::is_same_v<std::common_type_t<Eigen::half, float8_e5m2>, float>);
    STATIC_REQUIRE(std::is_same_v<xtl::promote_type_t<float8_e4m3fn, double>, double>);

    // 1.5 + 0.1 is not an e4m3fn value: the sum is float's, not rounded to the format.
    CHECK(x + 0.1f == 1.5f + 0.1f);
    CHECK(x * 2.0 == 3.0);
    CHECK(3 - x == 1.5f);
    CHECK(x / 4 == 0.375f);
    CHECK(x + y == 1.75f);
    CHECK(Eigen::half(0.5f) * x == 0.75f);
    CHECK(x == 1.5);
    CHECK(x != 1);
    CHECK(x < 2);
    CHECK(1.25f < x);
    CHECK(x > y);
    CHECK(y != x);
    CHECK_FALSE(float8_e4m3fn(std::numeric_limits<float>::quiet_NaN()) == 0.0f);  // NaN is unordered

    // Element-wise, the same promotion.
    const auto a = make_scaled_array<pow2_scale>(low_precision_array<float8_e4m3fn>(exact_values, {3, 4}), 0.5f);
    const auto widened = xt::cast<float>(a.data());
    const auto doubled = a.data() * 2.0;
    STATIC_REQUIRE(std::is_same_v<value_type_of<decltype(doubled)>, double>);
    CHECK((xt::xarray<double>(doubled) == xt::xarray<double>(xt::cast<double>(widened) * 2.0)));
    const auto shifted = 1 + a.data();
    STATIC_REQUIRE(std::is_same_v<value_type_of<decltype(shifted)>, float>);
    CHECK((xt::xarray<float>(shifted) == xt::xarray<float>(widened + 1.0f)));
    CHECK((xt::xarray<bool>(a.data() < 1.0) == xt::xarray<bool>(widened < 1.0f)));
    CHECK(xt::mean(a.data() * 0.5f)() == xt::mean(widened * 0.5f)());

    // Two formats meet in float.
    const auto b = low_precision_array<float8_e5m2>(exact_values, {3, 4});
    const auto mixed = a.data() + b;
    STATIC_REQUIRE(std::is_same_v<value_type_of<decltype(mixed)>, float>);
    CHECK((xt::xarray<float>(mixed) == xt::xarray<float>(widened * 2.0f)));
    CHECK(xt::sum(xt::cast<float>(a.data()) - xt::cast<float>(b))() == 0.0f);
}

TEST_CASE("exact element-wise xtensor functions keep the minifloat", "[xtensor]")
{
    const auto data = low_precision_array<float8_e4m3fn>(exact_values, {3, 4});
    const auto widened = xt::cast<float>(data);

    const xt::xarray<float8_e4m3fn> magnitude = xt::abs(data), negated = -data;
    CHECK((xt::cast<float>(magnitude) == xt::abs(widened)));
    CHECK((xt::cast<float>(negated) == -widened));
    CHECK((xt::cast<float>(xt::maximum(data, negated)) == xt::abs(widened)));
    CHECK((xt::cast<float>(xt::where(data < 0, negated, data)) == xt::abs(widened)));
    CHECK((xt::xarray<bool>(xt::equal(data, data)) == xt::xarray<bool>(xt::equal(widened, widened))));

    // xtensor's printer shows the widened values (operator<< from scalify/io/format.hpp).
    std::ostringstream printed;
    printed << xt::xarray<float8_e4m3fn>(low_precision_array<float8_e4m3fn>({1.5f, -2.0f, 0.25f}, {3}));
    CHECK(printed.str() == "{ 1.5,   -2, 0.25}");
}

TEST_CASE("xtensor operators reject two operands of one minifloat format", "[xtensor]")
{
    // The static_assert itself is tests/compile_fail/minifloat_xtensor_arithmetic.cpp; this is
    // which operand pairs it takes.
    using e4m3_array = const xt::xarray<float8_e4m3fn>&;
    STATIC_REQUIRE(detail::same_minifloat_xtensor_operands<e4m3_array, e4m3_array>);
    STATIC_REQUIRE(detail::same_minifloat_xtensor_operands<e4m3_array, float8_e4m3fn>);
    STATIC_REQUIRE(detail::same_minifloat_xtensor_operands<float8_e4m3fn, xt::xarray<float8_e4m3fn>>);
    STATIC_REQUIRE_FALSE(detail::same_minifloat_xtensor_operands<float8_e4m3fn, float8_e4m3fn>);  // scalars
    STATIC_REQUIRE_FALSE(detail::same_minifloat_xtensor_operands<e4m3_array, const xt::xarray<float8_e5m2>&>);
    STATIC_REQUIRE_FALSE(detail::same_minifloat_xtensor_operands<e4m3_array, double>);
    STATIC_REQUIRE_FALSE(detail::same_minifloat_xtensor_operands<e4m3_array, const xt::xarray<float>&>);
    STATIC_REQUIRE_FALSE(
        detail::same_minifloat_xtensor_operands<const xt::xarray<Eigen::half>&, const xt::xarray<Eigen::half>&>);
}
