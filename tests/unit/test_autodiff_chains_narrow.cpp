// Autodiff gradients of random chains (>= 3 ops, shapes 1..17, scales 2^-40..2^40) equal the
// hand-composed backward rules bit for bit, for fp8, fp16 and bf16 data under unit and natural scaling.
// The chains are split over two files by element type, so the halves compile in parallel.
#include "../support/autodiff_checks.hpp"

using namespace scalify;

TEST_CASE("autodiff gradients of random chains equal the hand-composed backward rules bit for bit (narrow types)",
          "[autodiff]")
{
    std::mt19937 rng(2025);
    for (int trial = 0; trial < 12; ++trial) {
        testing::check_chain_bits<unit_scaling, float8_e4m3fn, pow2_scale>(rng);
        testing::check_chain_bits<unit_scaling, Eigen::half, float_scale>(rng);
        testing::check_chain_bits<natural_scaling, Eigen::bfloat16, pow2_scale>(rng);
    }
}
