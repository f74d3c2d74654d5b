#include <scalify/scalify.hpp>

int main()
{
    using namespace scalify;
    const float8_e4m3fn max{448.0f};
    const auto saturated = convert<float8_e4m3fn, round_nearest_even, saturate_finite>(1000.0f);
    fmt::print("e4m3fn(448) = {}, saturated 1000 -> {}\n", max, saturated);
    // A matmul: with scalify::compiled its GEMM kernel comes from the library.
    const auto a = as_scaled_array(xt::xarray<float>{{1.0f, 2.0f}, {3.0f, 4.0f}});
    const auto product = matmul<natural_scaling>(a, a).value();
    fmt::print("[[1, 2], [3, 4]]^2 = [[{}, {}], [{}, {}]]\n", product(0, 0), product(0, 1), product(1, 0), product(1, 1));
    return max == saturated && product(1, 1) == 22.0f ? 0 : 1;
}
