// Autodiff gradients of random chains (>= 3 ops, shapes 1..17, scales 2^-40..2^40) equal the
// hand-composed backward rules bit for bit, for float32 and float64 data, both scale policies.
// The chains are split over two files by element type, so the halves compile in parallel.
#include "../support/autodiff_checks.hpp"

using namespace scalify;

TEST_CASE("autodiff gradients of random chains equal the hand-composed backward rules bit for bit (wide types)",
          "[autodiff]")
{
    std::mt19937 rng(2024);
    for (int trial = 0; trial < 12; ++trial) {
        testing::check_chain_bits<default_scaling, float, float_scale>(rng);
        testing::check_chain_bits<default_scaling, float, pow2_scale>(rng);
        testing::check_chain_bits<default_scaling, double, float_scale>(rng);
    }
}
