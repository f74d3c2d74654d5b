// Autodiff gradients of random chains (>= 3 ops, shapes 1..17, scales 2^-40..2^40) equal the
// hand-composed backward rules bit for bit, for every element type and both scale policies.
#include "../support/autodiff_checks.hpp"

using namespace scalify;

TEST_CASE("autodiff gradients of random chains equal the hand-composed backward rules bit for bit", "[autodiff]")
{
    std::mt19937 rng(2024);
    for (int trial = 0; trial < 12; ++trial) {
        testing::check_chain_bits<default_scaling, float, float_scale>(rng);
        testing::check_chain_bits<default_scaling, float, pow2_scale>(rng);
        testing::check_chain_bits<unit_scaling, float8_e4m3fn, pow2_scale>(rng);
        testing::check_chain_bits<unit_scaling, Eigen::half, float_scale>(rng);
        testing::check_chain_bits<natural_scaling, Eigen::bfloat16, pow2_scale>(rng);
        testing::check_chain_bits<default_scaling, double, float_scale>(rng);
    }
}
