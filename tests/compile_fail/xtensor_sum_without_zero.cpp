// Must not compile: xt::sum over a minifloat format without zero, where the sum's start, 0, is NaN.
#include <scalify/scalify.hpp>

int main()
{
    const xt::xarray<scalify::float8_e8m0fnu> data = xt::cast<scalify::float8_e8m0fnu>(xt::xarray<float>{1.0f, 2.0f});
    const float sum = xt::sum(data)();
    (void)sum;
}
