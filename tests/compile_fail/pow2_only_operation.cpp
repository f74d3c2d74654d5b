// Must not compile: decoupled_exp is a pow2_scale-only operation.
#include <scalify/amp/decoupled.hpp>
#include <scalify/ops/elementwise.hpp>

int main()
{
    const auto a = scalify::cast<Eigen::half>(scalify::as_scaled_array(xt::xarray<float>{1.0f}));  // float_scale
    return static_cast<int>(scalify::decoupled_exp(a).scale());
}
