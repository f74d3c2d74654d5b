// Must not compile: scalify's kernels accumulate in float32, so a rule asking for another
// accumulation type is refused with a sentence.
#include <scalify/amp/policy.hpp>

struct double_accumulating_policy : scalify::half_policy {};

template <>
struct scalify::op_precision<scalify::ops::matmul, double_accumulating_policy> {
    static constexpr precision_class value = precision_class::allow;
    using accumulate = double;
    using output = Eigen::half;
};

int main()
{
    const scalify::any_scaled_array<> a = scalify::as_scaled_array(xt::xarray<float>(xt::ones<float>({1, 1})));
    return static_cast<int>(scalify::amp<double_accumulating_policy>::matmul(a, a).scale());
}
