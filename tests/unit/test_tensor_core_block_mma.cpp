// The B200's tcgen05 fp8/fp6/fp4 units (tensor_core/blackwell.hpp): b200_f8f6f4, b200_mxf8f6f4,
// b200_nvfp4, b200_mxf4 and b200_mxf4_block16 against MMA-Sim's outputs (tests/data/block_mma/,
// made by tools/gen_block_mma_vectors.py), bit for bit; the special cases by hand; the GEMMs
// against loops of their instruction; and b200_f8f6f4 on the public B200 mma.sync fp8 capture.
#include <scalify/scalify.hpp>
#include <scalify/tensor_core/blackwell.hpp>

#include "../support/tensor_core_public.hpp"

#include <catch2/catch.hpp>
#include <xtensor/xview.hpp>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace block_mma_test {

using namespace scalify;
namespace tc = scalify::tensor_core;

using bmma_e8m0 = float8_e8m0fnu;
using bmma_ue4m3 = float8_e4m3fn;

/// One line of block_mma_vectors.txt.
struct bmma_vec {
    std::string kind, src, cls, ta, tb;
    std::uint32_t c = 0, d = 0;
    std::vector<unsigned> sa, sb, a, b;
};

inline std::vector<unsigned> bmma_parse_codes(const std::string& hex, std::size_t digits)
{
    std::vector<unsigned> out;
    for (std::size_t i = 0; i + digits <= hex.size(); i += digits) out.push_back(std::stoul(hex.substr(i, digits), nullptr, 16));
    return out;
}

inline std::vector<bmma_vec> bmma_read_vectors()
{
    const std::string path = std::string(SCALIFY_TEST_DATA_DIR) + "/block_mma/block_mma_vectors.txt";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path);
    std::vector<bmma_vec> out;
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::istringstream words(line);
        bmma_vec v;
        std::string c, sa, sb, a, b, d;
        words >> v.kind >> v.src >> v.cls >> v.ta >> v.tb >> c >> sa >> sb >> a >> b >> d;
        if (!words) throw std::runtime_error("bad line: " + line);
        v.c = static_cast<std::uint32_t>(std::stoul(c, nullptr, 16));
        v.d = static_cast<std::uint32_t>(std::stoul(d, nullptr, 16));
        v.sa = bmma_parse_codes(sa, 2);
        v.sb = bmma_parse_codes(sb, 2);
        v.a = bmma_parse_codes(a, v.ta == "e2m1" ? 1 : 2);
        v.b = bmma_parse_codes(b, v.tb == "e2m1" ? 1 : 2);
        out.push_back(std::move(v));
    }
    return out;
}

template <class T>
std::vector<T> bmma_as(const std::vector<unsigned>& codes)
{
    std::vector<T> out;
    for (unsigned x : codes) out.push_back(T::from_bits(static_cast<typename T::storage_type>(x)));
    return out;
}

inline std::uint32_t bmma_bits(float x) { return std::bit_cast<std::uint32_t>(x); }
inline float bmma_from_bits(std::uint32_t x) { return std::bit_cast<float>(x); }

/// The result of a f8f6f4 / mxf8f6f4 line under Model (Scaled: pass the line's E8M0 scales).
template <class Model, bool Scaled, class TA, class TB>
std::uint32_t bmma_run_f8(const bmma_vec& v)
{
    const auto a = bmma_as<TA>(v.a);
    const auto b = bmma_as<TB>(v.b);
    if constexpr (Scaled) {
        return bmma_bits(tc::dot<Model>(a, b, bmma_from_bits(v.c), bmma_e8m0::from_bits(static_cast<std::uint8_t>(v.sa[0])),
                                   bmma_e8m0::from_bits(static_cast<std::uint8_t>(v.sb[0]))));
    } else {
        return bmma_bits(tc::dot<Model>(a, b, bmma_from_bits(v.c)));
    }
}

template <class Model, bool Scaled, class TA>
std::uint32_t bmma_run_f8_b(const bmma_vec& v)
{
    if (v.tb == "e4m3") return bmma_run_f8<Model, Scaled, TA, float8_e4m3fn>(v);
    if (v.tb == "e5m2") return bmma_run_f8<Model, Scaled, TA, float8_e5m2>(v);
    if (v.tb == "e2m3") return bmma_run_f8<Model, Scaled, TA, float6_e2m3fn>(v);
    if (v.tb == "e3m2") return bmma_run_f8<Model, Scaled, TA, float6_e3m2fn>(v);
    if (v.tb == "e2m1") return bmma_run_f8<Model, Scaled, TA, float4_e2m1fn>(v);
    throw std::runtime_error("format " + v.tb);
}

template <class Model, bool Scaled>
std::uint32_t bmma_run_f8_any(const bmma_vec& v)
{
    if (v.ta == "e4m3") return bmma_run_f8_b<Model, Scaled, float8_e4m3fn>(v);
    if (v.ta == "e5m2") return bmma_run_f8_b<Model, Scaled, float8_e5m2>(v);
    if (v.ta == "e2m3") return bmma_run_f8_b<Model, Scaled, float6_e2m3fn>(v);
    if (v.ta == "e3m2") return bmma_run_f8_b<Model, Scaled, float6_e3m2fn>(v);
    if (v.ta == "e2m1") return bmma_run_f8_b<Model, Scaled, float4_e2m1fn>(v);
    throw std::runtime_error("format " + v.ta);
}

template <class Model>
std::uint32_t bmma_run_f4(const bmma_vec& v)
{
    using S = typename Model::scale_type;
    return bmma_bits(tc::dot<Model>(bmma_as<float4_e2m1fn>(v.a), bmma_as<float4_e2m1fn>(v.b), bmma_from_bits(v.c), bmma_as<S>(v.sa), bmma_as<S>(v.sb)));
}

/// The block-scaled units with the template's convention for zeros (zero products, zero group
/// sums and C = 0 take no part): how much MMA-Sim's convention matters on the vectors.
using bmma_no_part = tc::block_rules<tc::zero_terms::take_no_part>;
struct bmma_mxf8f6f4_no_part : tc::block_scaled_model<25, 32, 32, tc::f8f6f4_operands, tc::scale_format::ue8m0,
                                                 tc::block_adder::fused, 16, bmma_no_part> {
    static constexpr const char* name = "bmma_mxf8f6f4_no_part";
};
struct bmma_nvfp4_no_part : tc::block_scaled_model<35, 64, 16, tc::any_pair_of<float4_e2m1fn>, tc::scale_format::ue4m3,
                                              tc::block_adder::two_level, 16, bmma_no_part> {
    static constexpr const char* name = "bmma_nvfp4_no_part";
};
/// nvfp4 with one fused adder over all 64 products (no exact groups), F = 35: the two levels matter.
struct bmma_nvfp4_fused : tc::block_scaled_model<35, 64, 16, tc::any_pair_of<float4_e2m1fn>, tc::scale_format::ue4m3,
                                            tc::block_adder::fused> {
    static constexpr const char* name = "bmma_nvfp4_fused";
};

/// F one off.
template <int F>
struct bmma_mxf8f6f4_f : tc::block_scaled_model<F, 32, 32, tc::f8f6f4_operands, tc::scale_format::ue8m0, tc::block_adder::fused> {
    static constexpr const char* name = "bmma_mxf8f6f4_f";
};
template <int F>
struct bmma_nvfp4_f : tc::block_scaled_model<F, 64, 16, tc::any_pair_of<float4_e2m1fn>, tc::scale_format::ue4m3,
                                        tc::block_adder::two_level> {
    static constexpr const char* name = "bmma_nvfp4_f";
};

struct bmma_tally {
    std::size_t equal = 0, lines = 0;
    std::string first_miss;
    void add(const bmma_vec& v, std::uint32_t got)
    {
        ++lines;
        if (got == v.d) {
            ++equal;
        } else if (first_miss.empty()) {
            std::ostringstream text;
            text << v.kind << " " << v.cls << " " << v.ta << "x" << v.tb << ": model " << std::hex << got << ", MMA-Sim "
                 << v.d;
            first_miss = text.str();
        }
    }
};

}  // namespace block_mma_test

TEST_CASE("Blackwell block-scaled units reproduce MMA-Sim's vectors bit for bit", "[tensor_core][block_mma]")
{
    using namespace block_mma_test;
    const std::vector<bmma_vec> vs = bmma_read_vectors();
    REQUIRE(vs.size() == 1100);

    std::map<std::string, bmma_tally> t;
    for (const bmma_vec& v : vs) {
        if (v.kind == "f8f6f4") {
            // The template tag, and the block engine with unit scales (MMA-Sim calls one function).
            t[v.cls.rfind("zero_", 0) == 0 ? "f8f6f4 tag, all-zero products" : "f8f6f4 tag"].add(
                v, bmma_run_f8_any<tc::b200_f8f6f4, false>(v));
            t["f8f6f4 as mxf8f6f4, scales 1"].add(v, bmma_run_f8_any<tc::b200_mxf8f6f4, true>(v));
            t[std::string("f8f6f4 ") + v.src].add(v, bmma_run_f8_any<tc::b200_f8f6f4, false>(v));
            if ((v.ta == "e4m3" || v.ta == "e5m2") && (v.tb == "e4m3" || v.tb == "e5m2")) {
                // The B200's mma.sync fp8 rule (rounded to nearest, F = 40) on MMA-Sim's tcgen05 lines.
                using e4 = float8_e4m3fn;
                using e5 = float8_e5m2;
                const bool a4 = v.ta == "e4m3", b4 = v.tb == "e4m3";
                const std::uint32_t q = a4 ? (b4 ? bmma_run_f8<tc::b200_qmma, false, e4, e4>(v) : bmma_run_f8<tc::b200_qmma, false, e4, e5>(v))
                                           : (b4 ? bmma_run_f8<tc::b200_qmma, false, e5, e4>(v) : bmma_run_f8<tc::b200_qmma, false, e5, e5>(v));
                const bool random = v.cls == "uniform" || v.cls == "narrow" || v.cls == "subnormal" || v.cls == "cancel";
                t[random ? "f8f6f4 fp8 random lines under b200_qmma" : "f8f6f4 fp8 special lines under b200_qmma"].add(v, q);
            }
        } else if (v.kind == "mxf8f6f4") {
            t["mxf8f6f4"].add(v, bmma_run_f8_any<tc::b200_mxf8f6f4, true>(v));
            t["mxf8f6f4 " + v.src].add(v, bmma_run_f8_any<tc::b200_mxf8f6f4, true>(v));
            t["mxf8f6f4, zeros take no part"].add(v, bmma_run_f8_any<bmma_mxf8f6f4_no_part, true>(v));
            t["mxf8f6f4, F = 24"].add(v, bmma_run_f8_any<bmma_mxf8f6f4_f<24>, true>(v));
            t["mxf8f6f4, F = 26"].add(v, bmma_run_f8_any<bmma_mxf8f6f4_f<26>, true>(v));
        } else if (v.kind == "nvf4") {
            t["nvf4"].add(v, bmma_run_f4<tc::b200_nvfp4>(v));
            t["nvf4, zeros take no part"].add(v, bmma_run_f4<bmma_nvfp4_no_part>(v));
            t["nvf4, one fused adder"].add(v, bmma_run_f4<bmma_nvfp4_fused>(v));
            t["nvf4, F = 34"].add(v, bmma_run_f4<bmma_nvfp4_f<34>>(v));
            t["nvf4, F = 36"].add(v, bmma_run_f4<bmma_nvfp4_f<36>>(v));
        } else if (v.kind == "mxf4") {
            t["mxf4"].add(v, bmma_run_f4<tc::b200_mxf4>(v));
        } else if (v.kind == "mxf4b16") {
            t["mxf4b16"].add(v, bmma_run_f4<tc::b200_mxf4_block16>(v));
        } else {
            FAIL("unknown kind " << v.kind);
        }
    }

    const auto all = [&](const char* name, std::size_t lines) {
        const bmma_tally& r = t[name];
        INFO(name << ": " << r.equal << "/" << r.lines << "; first miss: " << r.first_miss);
        CHECK(r.lines == lines);
        CHECK(r.equal == r.lines);
    };
    all("f8f6f4 tag", 340);
    all("f8f6f4 as mxf8f6f4, scales 1", 344);
    all("mxf8f6f4", 355);
    all("nvf4", 257);
    all("mxf4", 72);
    all("mxf4b16", 72);
    // Lines with fp6/fp4 operands in f8f6f4 (MMA-Sim's rule, extrapolated) and the rest.
    CHECK(t["f8f6f4 m"].lines == 68);
    CHECK(t["f8f6f4 x"].lines == 276);
    CHECK(t["mxf8f6f4 m"].equal == 78);
    CHECK(t["mxf8f6f4 x"].equal == 277);

    // The template tag lets zero products take no part: of the four all-zero lines it differs on
    // one, c = 3 * 2^-149 with b = 57344 (MMA-Sim's zeros bring 2^(-126 + 15), cutting c away).
    CHECK(t["f8f6f4 tag, all-zero products"].lines == 4);
    CHECK(t["f8f6f4 tag, all-zero products"].equal == 3);
    // How tightly the vectors pin the rule: MMA-Sim's convention for zeros, the two levels of
    // mxf4nvf4 and F one off each change these many lines.
    CHECK(t["mxf8f6f4, zeros take no part"].equal == 353);
    CHECK(t["nvf4, zeros take no part"].equal == 250);
    CHECK(t["nvf4, one fused adder"].equal == 227);
    // The B200's mma.sync fp8 unit (b200_qmma: rounded to nearest, F = 40) differs from
    // MMA-Sim's tcgen05 rule on about half of its e4m3/e5m2 lines.
    CHECK(t["f8f6f4 fp8 random lines under b200_qmma"].lines == 48);
    CHECK(t["f8f6f4 fp8 random lines under b200_qmma"].equal == 25);
    CHECK(t["f8f6f4 fp8 special lines under b200_qmma"].lines == 20);
    CHECK(t["f8f6f4 fp8 special lines under b200_qmma"].equal == 18);
    CHECK(t["mxf8f6f4, F = 24"].equal == 302);
    CHECK(t["mxf8f6f4, F = 26"].equal == 318);
    CHECK(t["nvf4, F = 34"].equal == 236);
    CHECK(t["nvf4, F = 36"].equal == 243);
}

TEST_CASE("b200_f8f6f4 against the public B200 mma.sync fp8 capture", "[tensor_core][block_mma][public]")
{
    using namespace block_mma_test;
    namespace pub = tensor_core_public;
    for (const char* format : {"E4M3", "E5M2"}) {
        const std::string path = std::string(SCALIFY_TEST_DATA_DIR) + "/tensor_core_public/B200/" + format + "/B200_" +
                                 format + "_fp32.bin";
        const pub::vector_set s = pub::read_set_file(path);
        REQUIRE(s.lines == 1250);
        const auto r = std::string(format) == "E4M3" ? pub::match<tc::b200_f8f6f4, float8_e4m3fn>(s, false)
                                                     : pub::match<tc::b200_f8f6f4, float8_e5m2>(s, false);
        // MMA-Sim's tcgen05 kind::f8f6f4 rule is not what the B200's mma.sync fp8 unit computes
        // (b200_qmma, rounded to nearest, matches all 1,250 of each).
        CHECK(r.equal == (std::string(format) == "E4M3" ? 804u : 813u));
    }
}

TEST_CASE("Blackwell block-scaled units: special cases", "[tensor_core][block_mma]")
{
    using namespace block_mma_test;
    const float nan_bits = std::bit_cast<float>(0x7fffffffu);
    const float inf = std::numeric_limits<float>::infinity();
    const auto e8 = [](unsigned code) { return bmma_e8m0::from_bits(static_cast<std::uint8_t>(code)); };
    const bmma_e8m0 one = e8(127);
    std::array<float8_e4m3fn, 32> a{}, b{};
    a.fill(float8_e4m3fn(1.0f));
    b.fill(float8_e4m3fn(1.0f));

    SECTION("scales multiply exactly; 32 ones give 32")
    {
        CHECK(tc::dot<tc::b200_mxf8f6f4>(a, b, 0.0f, one, one) == 32.0f);
        CHECK(tc::dot<tc::b200_mxf8f6f4>(a, b, 0.0f, e8(130), e8(120)) == 32.0f / 16.0f);
        CHECK(tc::dot<tc::b200_mxf8f6f4>(a, b, 1.0f, e8(127 + 100), e8(127 - 100)) == 33.0f);
    }
    SECTION("NaN: E8M0 0xff, operands, C; inf * 0; +inf - inf")
    {
        CHECK(bmma_bits(tc::dot<tc::b200_mxf8f6f4>(a, b, 0.0f, e8(0xff), one)) == bmma_bits(nan_bits));
        std::array<float8_e4m3fn, 32> z{};
        CHECK(bmma_bits(tc::dot<tc::b200_mxf8f6f4>(z, z, 0.0f, one, e8(0xff))) == bmma_bits(nan_bits));
        CHECK(bmma_bits(tc::dot<tc::b200_mxf8f6f4>(a, b, std::numeric_limits<float>::quiet_NaN(), one, one)) == bmma_bits(nan_bits));
        std::array<float8_e5m2, 32> x{}, y{};
        y.fill(float8_e5m2(1.0f));
        x[0] = float8_e5m2::from_bits(0x7c);  // +inf
        CHECK(tc::dot<tc::b200_mxf8f6f4>(x, y, 1.0f, one, one) == inf);
        CHECK(tc::dot<tc::b200_mxf8f6f4>(x, y, 1.0f, e8(0), e8(0)) == inf);  // inf * 2^-254 stays inf
        CHECK(bmma_bits(tc::dot<tc::b200_mxf8f6f4>(x, y, -inf, one, one)) == bmma_bits(nan_bits));
        y[0] = float8_e5m2(0.0f);
        CHECK(bmma_bits(tc::dot<tc::b200_mxf8f6f4>(x, y, 1.0f, one, one)) == bmma_bits(nan_bits));
        CHECK(bmma_bits(tc::dot<tc::b200_f8f6f4>(x, y, 1.0f)) == bmma_bits(nan_bits));
    }
    SECTION("overflow to inf at 2^128, subnormal results cut toward zero")
    {
        CHECK(tc::dot<tc::b200_mxf8f6f4>(a, b, 0.0f, e8(254), e8(127 + 1)) == inf);   // 32 * 2^128
        CHECK(tc::dot<tc::b200_mxf8f6f4>(a, b, 0.0f, e8(254), e8(127 - 5)) == 0x1p127f);  // 32 * 2^122
        CHECK(tc::dot<tc::b200_mxf8f6f4>(a, b, -0x1p127f, e8(254), e8(127 - 5)) == 0.0f);
        // 32 * 2^-140: a float32 subnormal, exact
        CHECK(tc::dot<tc::b200_mxf8f6f4>(a, b, 0.0f, e8(127 - 70), e8(127 - 70)) == std::ldexp(32.0f, -140));
        // MMA-Sim's zeros: C = 0 joins at 2^-126, so products below 2^(-126 - 25) vanish.
        CHECK(tc::dot<tc::b200_mxf8f6f4>(a, b, 0.0f, e8(0), e8(0)) == 0.0f);
    }
    SECTION("MMA-Sim's zeros: an all-zero A with large scales cuts C away")
    {
        std::array<float8_e4m3fn, 32> z{};
        CHECK(tc::dot<tc::b200_mxf8f6f4>(z, b, 1.0f, e8(127 + 100), e8(127 + 100)) == 0.0f);
        CHECK(tc::dot<block_mma_test::bmma_mxf8f6f4_no_part>(z, b, 1.0f, e8(127 + 100), e8(127 + 100)) == 1.0f);
        CHECK(tc::dot<tc::b200_mxf8f6f4>(z, b, 1.0f, one, one) == 1.0f);
        CHECK(bmma_bits(tc::dot<tc::b200_mxf8f6f4>(z, b, -0.0f, one, one)) == 0u);  // +0
    }
    SECTION("nvfp4: two levels, UE4M3 scales (sign ignored, 0x7f NaN, zero)")
    {
        std::array<float4_e2m1fn, 64> x{}, y{};
        x.fill(float4_e2m1fn(1.0f));
        y.fill(float4_e2m1fn(0.5f));
        const auto s = [](float v) { return bmma_ue4m3(v); };
        std::array<bmma_ue4m3, 4> sx{s(1), s(1), s(1), s(1)}, sy{s(2), s(2), s(2), s(2)};
        CHECK(tc::dot<tc::b200_nvfp4>(x, y, 0.0f, sx, sy) == 64.0f);
        sx[1] = s(-1.0f);  // the sign bit of a UE4M3 scale is ignored
        CHECK(tc::dot<tc::b200_nvfp4>(x, y, 0.0f, sx, sy) == 64.0f);
        sx[2] = bmma_ue4m3::from_bits(0);  // a zero scale: its group is dropped
        CHECK(tc::dot<tc::b200_nvfp4>(x, y, 0.0f, sx, sy) == 48.0f);
        sx[3] = bmma_ue4m3::from_bits(0x7f);
        CHECK(bmma_bits(tc::dot<tc::b200_nvfp4>(x, y, 0.0f, sx, sy)) == bmma_bits(nan_bits));
        sx = {s(1), s(1), s(1), s(1)};
        CHECK(tc::dot<tc::b200_nvfp4>(x, y, inf, sx, sy) == inf);  // decided: MMA-Sim stops here
        CHECK(tc::dot<tc::b200_nvfp4>(x, y, -inf, sx, sy) == -inf);
        // A group joins with its scales' exponents, not its sum's: 1 + 2^-30 * (group of 16 * 0.5)
        // keeps bmma_bits that a normalised group would lose? Both: F = 35 keeps 2^-27 below 2^8.
        std::array<bmma_ue4m3, 4> big{s(448), s(1), s(1), s(1)};
        x.fill(float4_e2m1fn(0.0f));
        x[0] = float4_e2m1fn(0.5f);
        x[16] = float4_e2m1fn(0.5f);
        y.fill(float4_e2m1fn(0.5f));
        // 0.25 * 448 + 0.25 = 112.25: exact (the groups' exponents 8 and 0, F = 35)
        CHECK(tc::dot<tc::b200_nvfp4>(x, y, 0.0f, big, std::array<bmma_ue4m3, 4>{s(1), s(1), s(1), s(1)}) == 112.25f);
    }
    SECTION("shape errors")
    {
        std::vector<float8_e4m3fn> short_a(16);
        CHECK_THROWS_AS(tc::dot<tc::b200_mxf8f6f4>(short_a, b, 0.0f, one, one), shape_error);
        std::array<float4_e2m1fn, 64> x{};
        std::array<bmma_ue4m3, 3> three{};
        std::array<bmma_ue4m3, 4> four{};
        CHECK_THROWS_AS(tc::dot<tc::b200_nvfp4>(x, x, 0.0f, std::span<const bmma_ue4m3>(three), std::span<const bmma_ue4m3>(four)),
                        shape_error);
    }
}

TEST_CASE("Blackwell block-scaled GEMMs chain their instruction along K", "[tensor_core][block_mma]")
{
    using namespace block_mma_test;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    const std::size_t m = 3, k = 96, n = 2;
    xt::xarray<float> p = xt::xarray<float>::from_shape({m, k}), q = xt::xarray<float>::from_shape({k, n});
    for (auto& x : p) x = u(rng) * (rng() % 4 == 0 ? 64.0f : 1.0f);
    for (auto& x : q) x = u(rng);

    SECTION("MXFP8 through quantize_mx: gemm = chained dot")
    {
        const auto a = quantize_mx<float8_e4m3fn>(p, 1);
        const auto b = quantize_mx<float8_e5m2>(q, 0);
        const xt::xarray<float> z = tc::gemm<tc::b200_mxf8f6f4_chain>(a, b);
        for (std::size_t i = 0; i < m; ++i) {
            for (std::size_t j = 0; j < n; ++j) {
                float acc = 0.0f;
                for (std::size_t s = 0; s < k; s += 32) {
                    std::vector<float8_e4m3fn> x(32);
                    std::vector<float8_e5m2> y(32);
                    for (std::size_t t = 0; t < 32; ++t) {
                        x[t] = a.data()(i, s + t);
                        y[t] = b.data()(s + t, j);
                    }
                    acc = tc::dot<tc::b200_mxf8f6f4>(x, y, acc, a.scales()(i, s / 32), b.scales()(s / 32, j));
                }
                CHECK(bmma_bits(z(i, j)) == bmma_bits(acc));
                // and close to the float product of the dequantised values
                double ref = 0;
                for (std::size_t t = 0; t < k; ++t) ref += double(a.value()(i, t)) * double(b.value()(t, j));
                CHECK(std::abs(z(i, j) - ref) <= 1e-5 * (std::abs(ref) + 1.0));
            }
        }
        CHECK_THROWS_AS(tc::gemm<tc::b200_mxf8f6f4_chain>(quantize_mx<float8_e4m3fn>(p, 1, 16), b), shape_error);
    }
    SECTION("NVFP4 through block_gemm (K = 96: one instruction and a half-empty one)")
    {
        xt::xarray<float4_e2m1fn> a = xt::xarray<float4_e2m1fn>::from_shape({m, k});
        xt::xarray<float4_e2m1fn> b = xt::xarray<float4_e2m1fn>::from_shape({k, n});
        for (auto& x : a) x = float4_e2m1fn(u(rng));
        for (auto& x : b) x = float4_e2m1fn(u(rng));
        xt::xarray<bmma_ue4m3> sa = xt::xarray<bmma_ue4m3>::from_shape({m, k / 16});
        xt::xarray<bmma_ue4m3> sb = xt::xarray<bmma_ue4m3>::from_shape({k / 16, n});
        for (auto& x : sa) x = bmma_ue4m3(std::ldexp(1.0f + float(rng() % 8) / 8, int(rng() % 9) - 4));
        for (auto& x : sb) x = bmma_ue4m3(std::ldexp(1.0f + float(rng() % 8) / 8, int(rng() % 9) - 4));
        const xt::xarray<float> z = tc::block_gemm<tc::b200_nvfp4_chain>(a, sa, b, sb);
        for (std::size_t i = 0; i < m; ++i) {
            for (std::size_t j = 0; j < n; ++j) {
                double ref = 0;
                for (std::size_t t = 0; t < k; ++t) {
                    ref += double(float(a(i, t))) * double(float(sa(i, t / 16))) * double(float(b(t, j))) *
                           double(float(sb(t / 16, j)));
                }
                CHECK(std::abs(z(i, j) - ref) <= 1e-5 * (std::abs(ref) + 1.0));
            }
        }
        // the first 64 of K alone: one instruction
        std::vector<float4_e2m1fn> x(64), y(64);
        std::array<bmma_ue4m3, 4> qx{}, qy{};
        for (std::size_t t = 0; t < 64; ++t) {
            x[t] = a(0, t);
            y[t] = b(t, 1);
        }
        for (std::size_t g = 0; g < 4; ++g) {
            qx[g] = sa(0, g);
            qy[g] = sb(g, 1);
        }
        const xt::xarray<float> z64 = tc::block_gemm<tc::b200_nvfp4_chain>(
            xt::xarray<float4_e2m1fn>(xt::view(a, xt::all(), xt::range(0, 64))), xt::xarray<bmma_ue4m3>(xt::view(sa, xt::all(), xt::range(0, 4))),
            xt::xarray<float4_e2m1fn>(xt::view(b, xt::range(0, 64), xt::all())), xt::xarray<bmma_ue4m3>(xt::view(sb, xt::range(0, 4), xt::all())));
        CHECK(bmma_bits(z64(0, 1)) == bmma_bits(tc::dot<tc::b200_nvfp4>(x, y, 0.0f, qx, qy)));
    }
    SECTION("b200_f8f6f4_chain: fp6 x fp4 GEMM = chained dot")
    {
        xt::xarray<float6_e3m2fn> a = xt::xarray<float6_e3m2fn>::from_shape({m, k});
        xt::xarray<float4_e2m1fn> b = xt::xarray<float4_e2m1fn>::from_shape({k, n});
        for (auto& x : a) x = float6_e3m2fn(u(rng));
        for (auto& x : b) x = float4_e2m1fn(u(rng));
        const xt::xarray<float> z = tc::gemm<tc::b200_f8f6f4_chain>(a, b);
        for (std::size_t i = 0; i < m; ++i) {
            for (std::size_t j = 0; j < n; ++j) {
                float acc = 0.0f;
                for (std::size_t s = 0; s < k; s += 32) {
                    std::vector<float6_e3m2fn> x(32);
                    std::vector<float4_e2m1fn> y(32);
                    for (std::size_t t = 0; t < 32; ++t) {
                        x[t] = a(i, s + t);
                        y[t] = b(s + t, j);
                    }
                    acc = tc::dot<tc::b200_f8f6f4>(x, y, acc);
                }
                CHECK(bmma_bits(z(i, j)) == bmma_bits(acc));
            }
        }
    }
}

namespace block_mma_test {

/// A code of T: anything (mode 0), a third zeros (1), small magnitudes (2), or all zero (3).
template <class T>
T bmma_random_code(std::mt19937& rng, int mode)
{
    using storage = typename float_traits<T>::format::storage_type;
    const unsigned bits = float_traits<T>::format::total_bits;
    unsigned c = rng() & ((1u << bits) - 1);
    if (mode == 1 && rng() % 3 == 0) c = 0;
    if (mode == 2 && rng() % 2 == 0) c &= ~((1u << (bits - 1)) - 1) | 7u;
    if (mode == 3) c = 0;
    return float_traits<T>::from_bits(static_cast<storage>(c));
}

/// A scale: near 1 (mode 0), any code, NaN included (1), the extremes (2), any finite (3).
template <class S>
S bmma_random_scale(std::mt19937& rng, int mode)
{
    unsigned c = 0;
    if constexpr (std::same_as<S, bmma_ue4m3>) {
        c = mode == 0 ? 40 + rng() % 30 : mode == 2 ? (rng() % 2 ? rng() % 12 : 0x70 + rng() % 15) : rng() % 256;
    } else {
        c = mode == 0 ? 120 + rng() % 16 : mode == 1 ? rng() % 256 : mode == 2 ? (rng() % 2 ? rng() % 8 : 250 + rng() % 5) : rng() % 255;
    }
    return S::from_bits(static_cast<std::uint8_t>(c));
}

/// block_gemm (the lanes, the reference engine where they leave an output) against the reference
/// engine alone, output by output, bit for bit.
template <class Model, class TA, class TB>
void bmma_check_lanes(std::size_t m, std::size_t k, std::size_t n, unsigned seed)
{
    using S = typename Model::instruction::scale_type;
    constexpr std::size_t B = Model::instruction::scale_block;
    for (int mode = 0; mode < 4; ++mode) {
        for (int scale_mode = 0; scale_mode < 4; ++scale_mode) {
            std::mt19937 rng(seed + 10 * static_cast<unsigned>(mode) + static_cast<unsigned>(scale_mode));
            xt::xarray<TA> a = xt::xarray<TA>::from_shape({m, k});
            xt::xarray<TB> b = xt::xarray<TB>::from_shape({k, n});
            xt::xarray<S> sa = xt::xarray<S>::from_shape({m, k / B});
            xt::xarray<S> sb = xt::xarray<S>::from_shape({k / B, n});
            for (auto& x : a) x = bmma_random_code<TA>(rng, mode);
            for (auto& x : b) x = bmma_random_code<TB>(rng, mode == 3 ? static_cast<int>(rng() % 2) * 3 : mode);
            for (auto& x : sa) x = bmma_random_scale<S>(rng, scale_mode);
            for (auto& x : sb) x = bmma_random_scale<S>(rng, scale_mode);
            const xt::xarray<float> z = tc::block_gemm<Model>(a, sa, b, sb);
            std::size_t differ = 0;
            for (std::size_t i = 0; i < m; ++i)
                for (std::size_t j = 0; j < n; ++j) {
                    const float r = tc::detail::block_gemm_output<Model>(a.data(), sa.data(), b.data(), sb.data(), i, j, k, n);
                    differ += bmma_bits(r) != bmma_bits(z(i, j)) ? 1 : 0;
                }
            INFO(Model::name << " data mode " << mode << ", scale mode " << scale_mode);
            CHECK(differ == 0);
        }
    }
}

struct bmma_take_no_part_mx
    : tc::block_scaled_model<25, 32, 32, tc::f8f6f4_operands, tc::scale_format::ue8m0, tc::block_adder::fused, 16,
                             tc::block_rules<tc::zero_terms::take_no_part>> {
    static constexpr const char* name = "take_no_part_mxf8f6f4";
};
struct bmma_take_no_part_mx_chain : tc::block_gemm_model<bmma_take_no_part_mx> {
    static constexpr const char* name = "take_no_part_mxf8f6f4_chain";
};
struct bmma_take_no_part_nvfp4
    : tc::block_scaled_model<35, 64, 16, tc::any_pair_of<float4_e2m1fn>, tc::scale_format::ue4m3,
                             tc::block_adder::two_level, 16, tc::block_rules<tc::zero_terms::take_no_part>> {
    static constexpr const char* name = "take_no_part_nvfp4";
};
struct bmma_take_no_part_nvfp4_chain : tc::block_gemm_model<bmma_take_no_part_nvfp4> {
    static constexpr const char* name = "take_no_part_nvfp4_chain";
};

}  // namespace block_mma_test

TEST_CASE("Blackwell block-scaled GEMMs: the lanes give the reference engine's bits", "[tensor_core][block_mma]")
{
    using namespace block_mma_test;
    STATIC_REQUIRE(tc::detail::block_lane_fit<tc::b200_mxf8f6f4, float8_e4m3fn, float8_e5m2>::usable);
    STATIC_REQUIRE(tc::detail::block_lane_fit<tc::b200_nvfp4, float4_e2m1fn, float4_e2m1fn>::usable);
    // K = 96: a last, shorter instruction for the K = 64 units (zeros and the last block's scales).
    bmma_check_lanes<tc::b200_mxf8f6f4_chain, float8_e4m3fn, float8_e4m3fn>(5, 96, 37, 1);
    bmma_check_lanes<tc::b200_mxf8f6f4_chain, float8_e5m2, float6_e3m2fn>(4, 64, 33, 2);
    bmma_check_lanes<tc::b200_mxf8f6f4_chain, float6_e2m3fn, float4_e2m1fn>(3, 32, 40, 3);
    bmma_check_lanes<tc::b200_nvfp4_chain, float4_e2m1fn, float4_e2m1fn>(5, 96, 37, 4);
    bmma_check_lanes<tc::b200_mxf4_chain, float4_e2m1fn, float4_e2m1fn>(4, 160, 35, 5);
    bmma_check_lanes<bmma_take_no_part_mx_chain, float8_e4m3fn, float8_e5m2>(4, 96, 33, 6);
    bmma_check_lanes<bmma_take_no_part_nvfp4_chain, float4_e2m1fn, float4_e2m1fn>(4, 112, 33, 7);
}
