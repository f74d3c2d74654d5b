#pragma once
// Shared by the fuzz targets: a byte reader over the fuzzer's input and the property-failure exit.
// Each target's code lives in namespace fuzz_<target>, with its body in test_one_input: the six
// compile as one unity source, and CMake generates each program's LLVMFuzzerTestOneInput.
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace fuzz {

struct reader {
    const std::uint8_t* data;
    std::size_t size;
    std::uint8_t byte() { return size ? (--size, *data++) : 0; }
    /// Four bytes, most significant first, as a float bit pattern (any: NaN, inf, subnormal).
    float any_float()
    {
        std::uint32_t bits = 0;
        for (int i = 0; i < 4; ++i) bits = bits << 8 | byte();
        return std::bit_cast<float>(bits);
    }
};

[[noreturn]] inline void fail(const char* what)
{
    std::fprintf(stderr, "property violated: %s\n", what);
    std::abort();
}

}  // namespace fuzz
