// The compile-time baseline: a TU that includes what every scalify program includes (Eigen,
// xtensor, fmt) and runs an Eigen GEMM on xtensor data. compile_time.sh reports every other TU's
// CPU time as a ratio to this one, compiled in the same run.
#include <Eigen/Core>
#include <fmt/format.h>
#include <xtensor/xarray.hpp>
#include <xtensor/xrandom.hpp>

int main()
{
    const xt::xarray<float> a = xt::random::randn<float>({64, 32}), b = xt::random::randn<float>({32, 16});
    using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    const Eigen::Map<const matrix> ma(a.data(), 64, 32), mb(b.data(), 32, 16);
    const matrix c = ma * mb;
    fmt::print("sum of the product: {:.4f}\n", c.sum());
}
