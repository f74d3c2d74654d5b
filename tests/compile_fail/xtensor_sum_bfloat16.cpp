// Must not compile: xt::sum over bfloat16 data, whose float sum would go on as the ambiguous
// float + Eigen::bfloat16.
#include <scalify/scalify.hpp>

int main()
{
    const xt::xarray<Eigen::bfloat16> data = xt::cast<Eigen::bfloat16>(xt::xarray<float>{1.0f, 2.0f});
    const float sum = xt::sum(data)();
    (void)sum;
}
