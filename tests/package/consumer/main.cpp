#include <scalify/scalify.hpp>

int main()
{
    using namespace scalify;
    const float8_e4m3fn max{448.0f};
    const auto saturated = convert<float8_e4m3fn, round_nearest_even, saturate_finite>(1000.0f);
    fmt::print("e4m3fn(448) = {}, saturated 1000 -> {}\n", max, saturated);
    return max == saturated ? 0 : 1;
}
