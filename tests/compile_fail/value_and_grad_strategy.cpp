// A scale policy given where value_and_grad takes a strategy: one static_assert naming the fix,
// and nothing of the autodiff layer instantiated behind it.
#include <scalify/scalify.hpp>

int main()
{
    using namespace scalify;
    const auto w = as_scaled_array<pow2_scale>(xt::xarray<float>({1.0f, 2.0f}));
    auto [loss, grads] = ad::value_and_grad<pow2_scale>([](const auto& p) { return reduce_sum(p); }, w);
    (void)loss;
    (void)grads;
}
