// Must not compile: `double` is not a scaling strategy.
#include <scalify/ops/matmul.hpp>

int main()
{
    const auto a = scalify::as_scaled_array(xt::xarray<float>(xt::ones<float>({1, 1})));
    return static_cast<int>(scalify::matmul<double>(a, a).scale());
}
