// Must not compile: xtensor arithmetic on two arrays of one minifloat format, which would round
// every element to that format.
#include <scalify/scalify.hpp>

int main()
{
    const auto a = scalify::cast<scalify::float8_e4m3fn>(scalify::as_scaled_array(xt::xarray<float>{1.0f, 2.0f}));
    const xt::xarray<scalify::float8_e4m3fn> sum = a.data() + a.data();
    (void)sum;
}
