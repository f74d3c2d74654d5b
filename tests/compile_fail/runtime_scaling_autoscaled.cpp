// AutoScale's strategy listed in runtime_scaling: its matmuls are layers, not scale rules, so the
// list would silently run them as plain matmuls; one static_assert says to name it directly.
#include <scalify/scalify.hpp>

int main()
{
    using namespace scalify;
    using rules = runtime_scaling<unit_scaling, autoscale::autoscaled<unit_scaling>>;
    const rules::scope chosen(1);
    const auto w = as_scaled_array<pow2_scale>(xt::xarray<float>({1.0f, 2.0f}));
    auto [loss, grads] = ad::value_and_grad<rules>([](const auto& p) { return reduce_sum(p); }, w);
    (void)loss;
    (void)grads;
}
