// Plain data given where value_and_grad takes parameter trees of ScaledArrays: one static_assert
// naming what a parameter tree is, and nothing of the autodiff layer instantiated behind it.
#include <scalify/scalify.hpp>

int main()
{
    using namespace scalify;
    const xt::xarray<float> w{1.0f, 2.0f};
    auto [loss, grads] = ad::value_and_grad<unit_scaling>([](const auto& p) { return reduce_sum(p); }, w);
    (void)loss;
    (void)grads;
}
