// Must not compile: QGMMA multiplies fp8 codes; a tensor-core model refuses operand types its
// instruction does not take with a sentence naming the ones it does.
#include <scalify/tensor_core.hpp>

#include <vector>

int main()
{
    const std::vector<Eigen::half> a(32), b(32);
    return static_cast<int>(scalify::tensor_core::dot<scalify::tensor_core::h100_qgmma>(a, b, 0.0f));
}
