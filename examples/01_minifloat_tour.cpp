// A tour of scalify's minifloat types: formats, rounding and saturation policies, bulk
// conversion, and why stochastic rounding matters (the unbiased-mean demo).
#include <scalify/scalify.hpp>

#include <numeric>
#include <vector>

using namespace scalify;

template <class T>
void print_format(const char* name)
{
    using L = std::numeric_limits<T>;
    fmt::print("{:<20} {:>2} bits  max {:<10} min normal {:<12} smallest {:<12} inf {:<3} NaN {}\n", name,
               T::format::total_bits, (L::max)(), L::min(), L::denorm_min(), L::has_infinity ? "yes" : "no",
               L::has_quiet_NaN ? "yes" : "no");
}

int main()
{
    fmt::print("== formats (ml_dtypes names and encodings)\n");
    print_format<float8_e4m3fn>("float8_e4m3fn");
    print_format<float8_e5m2>("float8_e5m2");
    print_format<float8_e4m3fnuz>("float8_e4m3fnuz");
    print_format<float8_e5m2fnuz>("float8_e5m2fnuz");
    print_format<float8_e4m3b11fnuz>("float8_e4m3b11fnuz");
    print_format<float8_e3m4>("float8_e3m4");
    print_format<float8_e4m3>("float8_e4m3");
    print_format<float8_e8m0fnu>("float8_e8m0fnu");
    print_format<float6_e2m3fn>("float6_e2m3fn");
    print_format<float6_e3m2fn>("float6_e3m2fn");
    print_format<float4_e2m1fn>("float4_e2m1fn");

    fmt::print("\n== one value, three roundings, two saturations (float8_e4m3fn)\n");
    for (float x : {1.0625f, 1.1f, 300.0f, 470.0f, 1e6f}) {
        const auto rne = convert<float8_e4m3fn, round_nearest_even, no_saturation>(x);
        const auto sat = convert<float8_e4m3fn, round_nearest_even, saturate_finite>(x);
        const auto rtz = convert<float8_e4m3fn, round_toward_zero, saturate_finite>(x);
        fmt::print("x = {:<8} nearest-even {:<5} (0x{:02x})  satfinite {:<5}  toward-zero+sat {}\n", x, rne,
                   rne.bits(), sat, rtz);
    }

    fmt::print("\n== bulk conversion: encode, decode, fake-quantize\n");
    const std::vector<float> activations{0.013f, -0.51f, 2.7f, 97.0f, -1000.0f};
    std::vector<float8_e4m3fn> codes(activations.size());
    std::vector<float> dequantized(activations.size());
    convert_n<float8_e4m3fn, round_nearest_even, saturate_finite>(activations, codes);
    convert_n(codes, dequantized);
    for (std::size_t i = 0; i < activations.size(); ++i) {
        fmt::print("{:>8} -> 0x{:02x} -> {}\n", activations[i], codes[i].bits(), dequantized[i]);
    }

    fmt::print("\n== stochastic rounding keeps the mean (42.5 into float8_e5m2, neighbours 40 and 48)\n");
    const std::size_t n = 1'000'000;
    const std::vector<float> same(n, 42.5f);
    std::vector<float8_e5m2> rounded(n);
    convert_n<float8_e5m2, round_stochastic>(same, rounded, /*seed=*/2024);
    const double mean = std::accumulate(rounded.begin(), rounded.end(), 0.0,
                                        [](double s, float8_e5m2 x) { return s + static_cast<double>(x); }) / n;
    fmt::print("nearest-even: every value -> {} (mean error {:+.3f})\n", float8_e5m2(42.5f),
               static_cast<float>(float8_e5m2(42.5f)) - 42.5);
    fmt::print("stochastic:   mean of {} draws = {:.3f} (|error| {} 4 sigma = {:.4f})\n", n, mean,
               std::abs(mean - 42.5) < 4 * 8 * std::sqrt(0.3125 * 0.6875 / n) ? "<" : ">=",
               4 * 8 * std::sqrt(0.3125 * 0.6875 / n));
}
