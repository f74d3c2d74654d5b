// Must not compile: add needs per-tensor operands.
#include <scalify/block/block_ops.hpp>
#include <scalify/block/quantize.hpp>

int main()
{
    const auto a = scalify::quantize_mx<scalify::float8_e4m3fn>(xt::xarray<float>(xt::ones<float>({2, 32})), 1);
    (void)scalify::add(a, a);
}
