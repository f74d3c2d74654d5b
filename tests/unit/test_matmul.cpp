// matmul: the 16-layer fp8 chain that motivates scaling, and the H100 cuBLASLt FP8 GEMM vectors.
#include <scalify/scalify.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace scalify;

namespace {

xt::xarray<double> to_double(const xt::xarray<float>& x) { return xt::cast<double>(x); }

xt::xarray<double> matmul_double(const xt::xarray<double>& a, const xt::xarray<double>& b)
{
    const std::size_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
    xt::xarray<double> c = xt::zeros<double>({m, n});
    for (std::size_t i = 0; i < m; ++i)
        for (std::size_t p = 0; p < k; ++p)
            for (std::size_t j = 0; j < n; ++j) c(i, j) += a(i, p) * b(p, j);
    return c;
}

double relative_rms(const xt::xarray<double>& got, const xt::xarray<double>& want)
{
    double num = 0, den = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
        const double d = got.data()[i] - want.data()[i];
        num += d * d;
        den += want.data()[i] * want.data()[i];
    }
    return std::sqrt(num / den);
}

}  // namespace

TEST_CASE("a 16-layer fp8 matmul chain stays in range only when scaled", "[matmul][chain]")
{
    constexpr std::size_t width = 256, batch = 8, depth = 16;
    std::mt19937 rng(2024);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<ScaledArray<float8_e4m3fn, pow2_scale>> weights;
    for (std::size_t l = 0; l < depth; ++l) {
        xt::xarray<float> w = xt::xarray<float>::from_shape({width, width});
        for (auto& x : w) x = normal(rng);
        weights.push_back(cast<float8_e4m3fn>(as_scaled_array<pow2_scale>(w)));
    }
    xt::xarray<float> input = xt::xarray<float>::from_shape({batch, width});
    for (auto& x : input) x = normal(rng);
    const auto x0 = cast<float8_e4m3fn>(as_scaled_array<pow2_scale>(input));

    // float64 reference on the same (fp8-rounded) weights and input.
    xt::xarray<double> reference = to_double(x0.value());
    for (const auto& w : weights) reference = matmul_double(reference, to_double(w.value()));

    // Unscaled: the natural scale stays 1, so the data carry the whole 16x-per-layer growth.
    auto unscaled = x0;
    std::size_t first_overflow = depth;
    for (std::size_t l = 0; l < depth; ++l) {
        unscaled = matmul<natural_scaling, float8_e4m3fn>(unscaled, weights[l]);
        CHECK(unscaled.scale() == 1.0f);
        bool overflowed = false;
        for (const auto& d : unscaled.data()) overflowed = overflowed || isnan(d);
        if (overflowed && first_overflow == depth) first_overflow = l + 1;
    }
    INFO("unscaled chain first produced NaN after layer " << first_overflow);
    CHECK(first_overflow <= 4);

    // Default strategy: the scale takes the growth (2^4 per layer), the data stay unit variance.
    auto scaled = x0;
    for (const auto& w : weights) scaled = matmul(scaled, w);
    CHECK(scaled.scale() == std::ldexp(1.0f, 4 * static_cast<int>(depth)));
    float amax = 0;
    for (const auto& d : scaled.data()) amax = std::max(amax, std::abs(static_cast<float>(d)));
    CHECK(amax < 64.0f);
    const double error = relative_rms(to_double(scaled.value()), reference);
    INFO("relative RMS error of the scaled fp8 chain vs float64: " << error);
    CHECK(error < 0.15);
}

namespace {

struct gemm_vector {
    std::size_t m = 0, k = 0, n = 0;
    std::string a_type, b_type;
    float scale_a = 1, scale_b = 1;
    std::vector<unsigned> a, bt;
    std::map<std::string, std::vector<std::uint32_t>> outputs;
};

gemm_vector read_gemm(const std::string& name)
{
    std::ifstream in(std::string(SCALIFY_TEST_DATA_DIR) + "/gemm/" + name);
    REQUIRE(in.good());
    gemm_vector v;
    std::string line, current_out;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::istringstream words(line);
        std::string key;
        words >> key;
        if (key == "M") words >> v.m;
        else if (key == "K") words >> v.k;
        else if (key == "N") words >> v.n;
        else if (key == "a_type") words >> v.a_type;
        else if (key == "b_type") words >> v.b_type;
        else if (key == "scale_a") words >> v.scale_a;
        else if (key == "scale_b") words >> v.scale_b;
        else if (key == "A" || key == "BT") {
            auto& codes = key == "A" ? v.a : v.bt;
            std::string hex;
            while (words >> hex) codes.push_back(static_cast<unsigned>(std::stoul(hex, nullptr, 16)));
        } else if (key == "out") {
            words >> current_out;
        } else if (!current_out.empty()) {
            auto& bits = v.outputs[current_out];
            std::istringstream all(line);
            std::string hex;
            while (all >> hex) bits.push_back(static_cast<std::uint32_t>(std::stoul(hex, nullptr, 16)));
        }
    }
    return v;
}

template <class A, class B>
void check_gemm(const std::string& name)
{
    const gemm_vector v = read_gemm(name);
    REQUIRE(v.a.size() == v.m * v.k);
    REQUIRE(v.bt.size() == v.n * v.k);
    xt::xarray<A> a = xt::xarray<A>::from_shape({v.m, v.k});
    xt::xarray<B> b = xt::xarray<B>::from_shape({v.k, v.n});
    for (std::size_t i = 0; i < v.m * v.k; ++i) a.data()[i] = A::from_bits(static_cast<std::uint8_t>(v.a[i]));
    for (std::size_t j = 0; j < v.n; ++j)
        for (std::size_t p = 0; p < v.k; ++p) b(p, j) = B::from_bits(static_cast<std::uint8_t>(v.bt[j * v.k + p]));
    const auto sa = make_scaled_array(a, v.scale_a);
    const auto sb = make_scaled_array(b, v.scale_b);

    const xt::xarray<double> exact = matmul_double(to_double(sa.value()), to_double(sb.value()));
    double exact_max = 0;
    for (double x : exact) exact_max = std::max(exact_max, std::abs(x));
    const auto max_error = [&](const xt::xarray<double>& d) {
        double worst = 0;
        for (std::size_t i = 0; i < d.size(); ++i) worst = std::max(worst, std::abs(d.data()[i] - exact.data()[i]));
        return worst / exact_max;
    };
    xt::xarray<double> h100 = xt::zeros<double>({v.m, v.n});
    const auto& bits = v.outputs.at("float32_fast0");
    REQUIRE(bits.size() == v.m * v.n);
    for (std::size_t i = 0; i < bits.size(); ++i) h100.data()[i] = std::bit_cast<float>(bits[i]);

    const double h100_error = max_error(h100);
    const double ours = max_error(to_double(matmul<default_scaling, float>(sa, sb).value()));
    const double ours_natural = max_error(to_double(matmul<natural_scaling, float>(sa, sb).value()));
    INFO(name << ": H100 default accumulation max rel error " << h100_error << ", scalify " << ours
              << " (natural scaling " << ours_natural << ")");
    CHECK(ours <= h100_error);
    CHECK(ours_natural <= h100_error);
}

}  // namespace

TEST_CASE("fp8 matmul is at least as close to exact as the H100 (cuBLASLt, default accumulation)", "[matmul][gemm]")
{
    check_gemm<float8_e4m3fn, float8_e4m3fn>("scaled_mm_e4m3fnxe4m3fn_16x32x16.txt");
    check_gemm<float8_e4m3fn, float8_e4m3fn>("scaled_mm_e4m3fnxe4m3fn_64x256x128.txt");
    check_gemm<float8_e5m2, float8_e4m3fn>("scaled_mm_e5m2xe4m3fn_16x32x16.txt");
    check_gemm<float8_e5m2, float8_e4m3fn>("scaled_mm_e5m2xe4m3fn_64x256x128.txt");
}

TEST_CASE("matmul over every operand type pairing agrees with double", "[matmul]")
{
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    xt::xarray<float> x = xt::xarray<float>::from_shape({5, 24});
    xt::xarray<float> y = xt::xarray<float>::from_shape({24, 7});
    for (auto& e : x) e = normal(rng);
    for (auto& e : y) e = normal(rng);
    const auto check = [&](const auto& a, const auto& b, double tolerance) {
        const auto c = matmul<default_scaling, float>(a, b);
        const double error = relative_rms(to_double(c.value()), matmul_double(to_double(a.value()), to_double(b.value())));
        CHECK(error < tolerance);
    };
    const auto xf = make_scaled_array<pow2_scale>(x, 0.5f);
    const auto yf = make_scaled_array(y, 3.0f);
    check(xf, yf, 1e-6);
    check(cast<Eigen::half>(xf), cast<Eigen::bfloat16>(yf), 1e-6);
    check(cast<float8_e5m2>(xf), cast<float8_e4m3fn>(yf), 1e-6);
    check(cast<double>(xf), cast<double>(yf), 1e-6);  // result stored as float
    check(cast<float4_e2m1fn>(xf), yf, 1e-6);
}

TEST_CASE("matmul can reuse the previous result's memory", "[matmul]")
{
    const auto a = make_scaled_array<pow2_scale>(xt::xarray<float>{{1, 2}, {3, 4}}, 2.0f);
    auto c = matmul(a, a);
    const float* memory = c.data().data();
    const xt::xarray<float> first = c.value();
    c = matmul(a, a, std::move(c).release_data());
    CHECK(c.data().data() == memory);
    CHECK((c.value() == first));
    // A buffer of another size is replaced.
    c = matmul(a, make_scaled_array<pow2_scale>(xt::xarray<float>{{1, 0, 0}, {0, 1, 0}}, 1.0f), std::move(c).release_data());
    CHECK(c.shape()[1] == 3);
    CHECK(c.value()(1, 1) == 8.0f);
}

TEST_CASE("a matmul stored after its scale is known reads no earlier product", "[matmul]")
{
    // Amax-scaled products and those stored in another type go through a per-thread raw product
    // that outlives them: an empty K after a product with data must still give zeros.
    xt::xarray<float> data = xt::xarray<float>::from_shape({2, 6, 6});
    for (std::size_t i = 0; i < data.size(); ++i) data.flat(i) = 1.0f + static_cast<float>(i % 7);
    const auto full = make_scaled_array<pow2_scale>(data, 1.0f);
    const auto full_2d = make_scaled_array<pow2_scale>(xt::xarray<float>(xt::view(data, 0)), 1.0f);
    const auto is_zero = [](const auto& x) { return xt::all(xt::equal(x.value(), 0.0f)); };
    const auto empty_a = make_scaled_array<pow2_scale>(xt::xarray<float>::from_shape({6, 0}), 1.0f);
    const auto empty_b = make_scaled_array<pow2_scale>(xt::xarray<float>::from_shape({0, 6}), 1.0f);
    const auto empty_batch_a = make_scaled_array<pow2_scale>(xt::xarray<float>::from_shape({2, 6, 0}), 1.0f);
    const auto empty_batch_b = make_scaled_array<pow2_scale>(xt::xarray<float>::from_shape({2, 0, 6}), 1.0f);

    CHECK(xt::amax(matmul<dynamic_abs<float8_e4m3fn>>(full_2d, full_2d).value())() > 0.0f);
    const auto dynamic_2d = matmul<dynamic_abs<float8_e4m3fn>>(empty_a, empty_b);
    CHECK(dynamic_2d.shape() == std::vector<std::size_t>{6, 6});
    CHECK(is_zero(dynamic_2d));

    CHECK(xt::amax(matmul<default_scaling, float8_e4m3fn>(full_2d, full_2d).value())() > 0.0f);
    CHECK(is_zero(matmul<default_scaling, float8_e4m3fn>(empty_a, empty_b)));

    CHECK(xt::amax(matmul<dynamic_abs<float8_e4m3fn>>(full, full).value())() > 0.0f);
    const auto dynamic_batched = matmul<dynamic_abs<float8_e4m3fn>>(empty_batch_a, empty_batch_b);
    CHECK(dynamic_batched.shape() == std::vector<std::size_t>{2, 6, 6});
    CHECK(is_zero(dynamic_batched));
}

#if !defined(EIGEN_USE_BLAS)  // with it Eigen's general_matrix_matrix_product is the BLAS's sgemm
TEST_CASE("scalify's GEMM loop gives the bits of Eigen's sequential product", "[matmul]")
{
    // detail::gemm_slab writes out Eigen 3.4's general_matrix_matrix_product (EIGEN_USE_BLAS
    // replaces that function by the BLAS): the same blocking, packing and kernel, so the same
    // bits, for every layout and for shapes across the kernel's tile edges and depth blocks.
    std::mt19937 rng(11);
    std::normal_distribution<float> normal;
    const auto check = [&]<bool TransposeA, bool TransposeB>(std::size_t m, std::size_t k, std::size_t n) {
        std::vector<float> a(m * k), b(k * n), ours(m * n), eigens(m * n);
        for (auto& x : a) x = normal(rng);
        for (auto& x : b) x = normal(rng);
        const std::size_t lda = TransposeA ? m : k, ldb = TransposeB ? k : n;
        const float alpha = 0.375f;
        detail::gemm_slab<float, TransposeA, TransposeB>(a.data(), lda, b.data(), ldb, ours.data(), n, m, k, n, alpha, false);
        using Eigen::Index;
        Eigen::internal::gemm_blocking_space<Eigen::RowMajor, float, float, Eigen::Dynamic, Eigen::Dynamic, Eigen::Dynamic>
            blocking(Index(m), Index(n), Index(k), 1, true);
        Eigen::internal::general_matrix_matrix_product<Index, float, TransposeA ? Eigen::ColMajor : Eigen::RowMajor, false, float,
                                                       TransposeB ? Eigen::ColMajor : Eigen::RowMajor, false, Eigen::RowMajor,
                                                       1>::run(Index(m), Index(n), Index(k), a.data(), Index(lda), b.data(),
                                                               Index(ldb), eigens.data(), 1, Index(n), alpha, blocking, nullptr);
        INFO("m " << m << " k " << k << " n " << n << " transposed " << TransposeA << TransposeB);
        CHECK(std::memcmp(ours.data(), eigens.data(), ours.size() * sizeof(float)) == 0);
    };
    for (const std::size_t m : {1, 5, 48, 131})
        for (const std::size_t k : {1, 17, 300})
            for (const std::size_t n : {2, 33, 70}) {
                check.operator()<false, false>(m, k, n);
                check.operator()<true, false>(m, k, n);
                check.operator()<false, true>(m, k, n);
                check.operator()<true, true>(m, k, n);
            }
}
#endif

TEST_CASE("OpenBLAS's AVX-512 kernels are told apart by their core name", "[matmul]")
{
    // Under EIGEN_USE_BLAS, code compiled for AVX-512 keeps Eigen's kernel over an OpenBLAS whose
    // kernels lack it (blas_runs_products); OpenBLAS names its kernels in either case.
    for (const char* name : {"SkylakeX", "SKYLAKEX", "Cooperlake", "COOPERLAKE", "SapphireRapids", "sapphirerapids"}) {
        INFO(name);
        CHECK(detail::openblas_core_has_avx512(name));
    }
    for (const char* name : {"Haswell", "HASWELL", "Zen", "ZEN", "Sandybridge", "Excavator", "NeoverseN1", "", "SkylakeXX", "Skylake"}) {
        INFO(name);
        CHECK_FALSE(detail::openblas_core_has_avx512(name));
    }
#if !defined(EIGEN_USE_BLAS)
    CHECK_FALSE(detail::blas_runs_products());
#endif
}
