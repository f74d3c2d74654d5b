// The non-finite rule (docs/errors.md, "Non-finite input to a scale decision"): one test per
// row of its table, then the checked mode.
#include <scalify/scalify.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>

using namespace scalify;
using Catch::Matchers::Contains;

namespace {

constexpr float nan_value = std::numeric_limits<float>::quiet_NaN();
constexpr float inf_value = std::numeric_limits<float>::infinity();

/// n N(0, stddev) values; the same draw for a seed.
xt::xarray<float> draw(float stddev, unsigned seed = 21, std::size_t n = 1000)
{
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, stddev);
    xt::xarray<float> x = xt::xarray<float>::from_shape({n});
    for (auto& v : x) v = normal(rng);
    return x;
}

/// x with a NaN at 1, +inf at 2 and -inf at 3.
xt::xarray<float> spoiled(xt::xarray<float> x)
{
    x(1) = nan_value;
    x(2) = inf_value;
    x(3) = -inf_value;
    return x;
}

/// The elements from 4 on agree (bit for bit) between two arrays.
template <class A, class B>
bool rest_equal(const A& a, const B& b)
{
    for (std::size_t i = 4; i < a.size(); ++i) {
        if (static_cast<float>(a.data()[i]) != static_cast<float>(b.data()[i])) return false;
    }
    return true;
}

}  // namespace

TEST_CASE("non-finite: quantize and current_scaling take the scale from the finite elements", "[non_finite]")
{
    const auto x = draw(1e-3f);
    const auto clean = quantize<float8_e4m3fn>(x);
    const auto q = quantize<float8_e4m3fn>(spoiled(x));
    CHECK(q.scale() == clean.scale());
    CHECK(rest_equal(q.data(), clean.data()));
    CHECK(isnan(q.data()(1)));
    CHECK(static_cast<float>(q.data()(2)) == 448.0f);  // saturate_finite
    CHECK(static_cast<float>(q.data()(3)) == -448.0f);
    const auto c = current_scaling<float8_e4m3fn>{}.quantize(spoiled(x));
    CHECK(c.scale() == current_scaling<float8_e4m3fn>{}.quantize(x).scale());
    CHECK(quantize<float8_e4m3fn>(xt::xarray<float>(xt::zeros<float>({5}))).scale() == 1.0f);
}

TEST_CASE("non-finite: delayed_scaling records the finite amax", "[non_finite]")
{
    const auto x = draw(2.0f);
    delayed_scaling<float8_e5m2> recipe, reference;
    (void)recipe.quantize(spoiled(x));
    (void)reference.quantize(x);
    CHECK(recipe.history().back() == reference.history().back());
    CHECK(recipe.multiplier() == reference.multiplier());
    const auto next = recipe.quantize(spoiled(x));
    CHECK(isnan(next.data()(1)));
    CHECK(static_cast<float>(next.data()(2)) == 57344.0f);
    // All zero: amax 0 is recorded and the multiplier is kept.
    const float before = recipe.multiplier();
    (void)recipe.quantize(xt::xarray<float>(xt::zeros<float>({4})));
    CHECK(recipe.multiplier() == before);
}

TEST_CASE("non-finite: dynamic_rescale_* take the statistic of the finite elements", "[non_finite]")
{
    const auto x = as_scaled_array<pow2_scale>(draw(1e-3f));
    const auto bad = as_scaled_array<pow2_scale>(spoiled(draw(1e-3f)));
    // The statistic of the 996 finite elements, not NaN: the scale moves as it would without them.
    const auto finite_only = as_scaled_array<pow2_scale>(xt::xarray<float>(xt::view(draw(1e-3f), xt::range(4, 1000))));
    CHECK(dynamic_rescale_l2(bad).scale() == dynamic_rescale_l2(finite_only).scale());
    CHECK(dynamic_rescale_l1(bad).scale() == dynamic_rescale_l1(finite_only).scale());
    CHECK(dynamic_rescale_max(bad).scale() == dynamic_rescale_max(finite_only).scale());
    CHECK(dynamic_rescale_l2(bad).scale() != 1.0f);
    const auto r = dynamic_rescale_l2(bad);
    CHECK(std::isnan(r.value()(1)));
    CHECK(r.value()(2) == inf_value);
    // The next cast keeps the other values' precision (it lost 56 % of them when the NaN kept scale 1).
    const auto fp8 = cast<float8_e4m3fn, round_nearest_even, saturate_finite>(r).value();
    double err = 0, norm = 0;
    for (std::size_t i = 4; i < 1000; ++i) {
        err += (fp8(i) - x.value()(i)) * (fp8(i) - x.value()(i));
        norm += x.value()(i) * x.value()(i);
    }
    CHECK(std::sqrt(err / norm) < 0.03);
    const auto zeros = as_scaled_array<pow2_scale>(xt::xarray<float>(xt::zeros<float>({8})));
    CHECK(dynamic_rescale_l2(zeros).scale() == 1.0f);
}

TEST_CASE("non-finite: dynamic_abs scales from the finite amax; NaN and inf propagate as IEEE arithmetic", "[non_finite]")
{
    xt::xarray<float> a_data = xt::reshape_view(draw(1.0f), {40, 25});
    const auto a = as_scaled_array<pow2_scale>(a_data);
    xt::xarray<float> spoiled_data = a_data;
    spoiled_data(0, 0) = nan_value;
    spoiled_data(1, 0) = inf_value;
    const auto b = as_scaled_array<pow2_scale>(xt::xarray<float>(xt::reshape_view(draw(1.0f, 5, 200), {25, 8})));
    const auto clean = matmul<dynamic_abs<float8_e4m3fn>, float8_e4m3fn>(a, b);
    const auto y = matmul<dynamic_abs<float8_e4m3fn>, float8_e4m3fn>(as_scaled_array<pow2_scale>(spoiled_data), b);
    // Row 0 is NaN, row 1 is +-inf or NaN (inf times b's signs, and inf - inf); the other rows
    // decide the scale as before (their amax is unchanged unless rows 0-1 held it).
    const auto v = y.value();
    for (std::size_t j = 0; j < 8; ++j) CHECK(std::isnan(v(0, j)));
    for (std::size_t j = 0; j < 8; ++j) CHECK(!std::isfinite(v(1, j)));
    const auto clean_rest = xt::view(clean.value(), xt::range(2, 40), xt::all());
    const float rest_amax = xt::amax(xt::abs(clean_rest))();
    const float all_amax = xt::amax(xt::abs(clean.value()))();
    if (rest_amax == all_amax) {
        CHECK(y.scale() == clean.scale());
        CHECK(bool(xt::view(v, xt::range(2, 40), xt::all()) == clean_rest));
    }
    CHECK(std::isfinite(y.scale()));
    CHECK(y.scale() > 0.0f);
    // All zero: the natural scale.
    const auto z = as_scaled_array<pow2_scale>(xt::xarray<float>(xt::zeros<float>({40, 25})));
    CHECK(matmul<dynamic_abs<float8_e4m3fn>, float8_e4m3fn>(z, b).scale() == matmul<natural_scaling>(z, b).scale());
}

TEST_CASE("non-finite: the matmul recipe's current casts scale from the finite amax", "[non_finite]")
{
    const auto x = as_scaled_array<pow2_scale>(draw(1e-3f));
    const auto bad = as_scaled_array<pow2_scale>(spoiled(draw(1e-3f)));
    const auto clean = ad::detail::recipe_cast_array<float8_e4m3fn>(x, ad::cast_scaling::current);
    const auto cast = ad::detail::recipe_cast_array<float8_e4m3fn>(bad, ad::cast_scaling::current);
    CHECK(cast.scale() == clean.scale());
    CHECK(rest_equal(cast.data(), clean.data()));
    CHECK(isnan(cast.data()(1)));
    CHECK(static_cast<float>(cast.data()(2)) == 448.0f);  // the recipe's casts saturate
    const auto grid = ad::detail::recipe_grid_array<float8_e4m3fn>(bad, ad::cast_scaling::current);
    CHECK(grid.scale() == clean.scale());
    CHECK(std::isnan(grid.data()(1)));
}

TEST_CASE("non-finite: a block holding NaN or inf is NaN, the other blocks keep their scales", "[non_finite][block]")
{
    xt::xarray<float> x = xt::reshape_view(draw(1.0f), {10, 100});
    const auto clean = quantize<float8_e4m3fn>(x, mx_blocks{.axis = 1, .size = 20});
    x(0, 5) = nan_value;
    x(3, 50) = inf_value;
    const auto mx = quantize<float8_e4m3fn>(x, mx_blocks{.axis = 1, .size = 20});
    const auto v = mx.value(), c = clean.value();
    for (std::size_t j = 0; j < 20; ++j) CHECK(std::isnan(v(0, j)));
    for (std::size_t j = 40; j < 60; ++j) CHECK(std::isnan(v(3, j)));
    CHECK(v(0, 20) == c(0, 20));
    CHECK(v(3, 39) == c(3, 39));
    CHECK(v(9, 99) == c(9, 99));
    const auto blocks = quantize<float8_e4m3fn>(x, per_block{1, 20}).value();
    CHECK(std::isnan(blocks(0, 0)));
    CHECK(blocks(0, 20) == quantize<float8_e4m3fn>(xt::xarray<float>(xt::reshape_view(draw(1.0f), {10, 100})), per_block{1, 20}).value()(0, 20));
}

TEST_CASE("non-finite: static strategies keep their rule's scale; NaN and inf propagate", "[non_finite]")
{
    const auto a = as_scaled_array<pow2_scale>(spoiled(draw(1.0f)));
    const auto clean = as_scaled_array<pow2_scale>(draw(1.0f));
    const auto y = relu<unit_scaling>(a);
    CHECK(y.scale() == relu<unit_scaling>(clean).scale());
    CHECK(std::isnan(y.value()(1)));
    CHECK(y.value()(2) == inf_value);
    CHECK(y.value()(3) == 0.0f);
}

TEST_CASE("non-finite: the checked mode throws at the first op or scale decision that meets one", "[non_finite]")
{
    const auto bad = as_scaled_array<pow2_scale>(spoiled(draw(1.0f)));
    const auto good = as_scaled_array<pow2_scale>(draw(1.0f));
    const auto b = as_scaled_array<pow2_scale>(xt::xarray<float>(xt::reshape_view(draw(1.0f, 5, 3000), {1000, 3})));
    CHECK_FALSE(checking_finite());
    {
        const check_finite_scope checked;
        CHECK(checking_finite());
        CHECK_NOTHROW(relu(good));
        CHECK_THROWS_AS(relu(bad), non_finite_error);
        CHECK_THROWS_WITH(relu(bad), Contains("relu: its result holds 1 NaN and 1 inf among 1000 elements"));
        CHECK_THROWS_WITH(dynamic_rescale_l2(bad), Contains("dynamic_rescale_l2: the input of its scale decision holds 1 NaN and 2 inf"));
        CHECK_THROWS_WITH(quantize<float8_e4m3fn>(bad.data()), Contains("quantize: the input of its scale decision"));
        CHECK_THROWS_WITH(current_scaling<float8_e5m2>{}.quantize(bad.data()), Contains("current_scaling::quantize"));
        const auto row = as_scaled_array<pow2_scale>(xt::xarray<float>(xt::reshape_view(bad.data(), {1, 1000})));
        CHECK_THROWS_WITH(matmul(row, b), Contains("matmul: its result holds 3 NaN"));
        CHECK_THROWS_AS(quantize<float8_e4m3fn>(xt::xarray<float>(xt::reshape_view(bad.data(), {10, 100})), mx_blocks{}), non_finite_error);
        // An fp8 store that overflows without saturation (natural scaling, scale 1) is where a
        // chain's NaN is born: the op that stored it is named.
        const auto big = make_scaled_array<pow2_scale>(xt::xarray<float>{1000.0f, 1.0f}, 1.0f);
        CHECK_THROWS_WITH((mul<natural_scaling, float8_e4m3fn>(big, big)), Contains("mul: its result holds 1 NaN"));
        CHECK_THROWS_WITH((cast<float8_e4m3fn>(big)), Contains("cast: its result holds 1 NaN"));
        {
            const check_finite_scope nested;
            CHECK(checking_finite());
        }
        CHECK(checking_finite());
    }
    CHECK_FALSE(checking_finite());
    CHECK_NOTHROW(relu(bad));
}
