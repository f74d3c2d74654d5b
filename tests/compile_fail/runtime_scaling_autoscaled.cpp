// A strategy that changes ops beyond their scales, listed in runtime_scaling while its ops do not
// look the list's choice up at run time (no `runtime_dispatch`, as autoscale::autoscaled has): the
// list would silently run them as plain ops; one static_assert says to name it directly.
#include <scalify/scalify.hpp>

struct layered_scaling : scalify::unit_scaling {
    static constexpr bool changes_ops = true;  // say its matmuls ran as layers of some kind
};

int main()
{
    using namespace scalify;
    using rules = runtime_scaling<unit_scaling, layered_scaling>;
    const rules::scope chosen(1);
    const auto w = as_scaled_array<pow2_scale>(xt::xarray<float>({1.0f, 2.0f}));
    auto [loss, grads] = ad::value_and_grad<rules>([](const auto& p) { return reduce_sum(p); }, w);
    (void)loss;
    (void)grads;
}
