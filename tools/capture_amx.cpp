// capture_amx: runs Intel AMX TDPBF16PS (and AVX512_BF16 VDPBF16PS) on crafted and random bf16
// inputs and writes the test vectors, one output per line, for scalify's AMX models
// (include/scalify/tensor_core/amx.hpp, tests/data/amx/README.md).
//
// Standalone: not part of the library or its CMake build. On a CPU with AMX-BF16 (Sapphire Rapids
// or later: /proc/cpuinfo flags amx_tile, amx_bf16) and AVX512_BF16, Linux >= 5.16:
//
//     g++ -std=c++20 -O2 -mamx-tile -mamx-bf16 -mavx512f -mavx512bf16 tools/capture_amx.cpp -o capture_amx
//     ./capture_amx [--tiles N] [--seed S] > amx_bf16.txt
//
// --tiles N: tiles of 16 x 16 outputs per input class and K (default 2). AMX-FP16 (TDPFP16PS,
// Granite Rapids, flag amx_fp16) is not captured: g++ 12 has no -mamx-fp16, and the CPU this ran
// on does not have it.
//
// Line format (hex codes, lowercase):
//     <instruction> <class> <K> <c: float32> <a[0..K): bf16> <b[0..K): bf16> <d: float32>
// instruction: amx_bf16 (one TDPBF16PS, K = 2 * pairs, pairs = the A tile's colsb / 4) or
// avx512_bf16 (one VDPBF16PS lane, K = 2). For amx_bf16, a[2i + j] is A.row[m].bf16[2i + j] and
// b[2i + j] is B.row[i].bf16[2n + j]: the product pairs are (a[2i], b[2i]), (a[2i+1], b[2i+1]).
// Each instruction runs twice, under the default MXCSR (0x1f80) and under MXCSR = 0xffc0 (round
// toward zero, FTZ, DAZ); the header says whether any output differed (the SDM: MXCSR is neither
// consulted nor updated). Classes: uniform, wide, cancel, order, subnormal, tiny, special and
// overflow are random (seeded); crafted holds hand-made vectors (the flush-to-zero boundary, signed
// zeros, ties, overflow, NaN precedence), written once each, for amx_bf16 with K = 4 and for
// avx512_bf16 with K = 2.
#include <immintrin.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int arch_req_xcomp_perm = 0x1023;
constexpr int xfeature_xtiledata = 18;

struct alignas(64) tile_config {
    std::uint8_t palette_id = 1;
    std::uint8_t start_row = 0;
    std::uint8_t reserved[14] = {};
    std::uint16_t colsb[16] = {};
    std::uint8_t rows[16] = {};
};

using bf16 = std::uint16_t;

std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }
float float_of(std::uint32_t b) { return std::bit_cast<float>(b); }
/// bf16 of a float, rounded to nearest even (NaN kept quiet).
bf16 to_bf16(float x)
{
    std::uint32_t b = bits_of(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16>((b >> 16) | 0x40);
    b += 0x7fffu + ((b >> 16) & 1u);
    return static_cast<bf16>(b >> 16);
}
bf16 bf16_of(int sign, int field, int mantissa) { return static_cast<bf16>(sign << 15 | field << 7 | mantissa); }

std::mt19937_64 rng;
int uniform_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
double normal() { return std::normal_distribution<double>(0.0, 1.0)(rng); }

/// A random bf16 of exponent in [lo, hi] (nominal), random sign and mantissa.
bf16 random_bf16(int lo, int hi)
{
    const int e = uniform_int(lo, hi);
    return bf16_of(uniform_int(0, 1), e + 127, uniform_int(0, 127));
}
/// A random float32 of exponent in [lo, hi], random sign and mantissa.
std::uint32_t random_f32(int lo, int hi)
{
    const int e = uniform_int(lo, hi);
    return static_cast<std::uint32_t>(uniform_int(0, 1)) << 31 | static_cast<std::uint32_t>(e + 127) << 23 |
           (static_cast<std::uint32_t>(rng()) & 0x7fffffu);
}

/// One output's operands: K values of a and of b, and the accumulator.
struct vec {
    std::vector<bf16> a, b;
    std::uint32_t c = 0;
};

const char* const class_names[] = {"uniform", "wide", "cancel", "order", "subnormal", "tiny", "special", "overflow", "crafted"};
constexpr int class_count = 8;  // the random ones
constexpr int crafted_class = 8;

/// Values with few bits at chosen exponents: how terms are grouped and where they are rounded.
bf16 order_value()
{
    static const int exps[] = {0, 0, 0, -7, -8, -16, -23, -24, -25, -26, -30, 8, 16, 23, 24, 25};
    const int e = exps[uniform_int(0, 15)];
    const int mant = std::array<int, 6>{0, 0, 0, 64, 1, 65}[uniform_int(0, 5)];
    return bf16_of(uniform_int(0, 1), e + 127, mant);
}

/// A vector of class cls, K products.
vec make_vec(int cls, int k)
{
    vec v;
    v.a.resize(k);
    v.b.resize(k);
    switch (cls) {
    case 0:  // uniform: bf16 of N(0,1) values, C of N(0, K)
        for (int i = 0; i < k; ++i) {
            v.a[i] = to_bf16(static_cast<float>(normal()));
            v.b[i] = to_bf16(static_cast<float>(normal()));
        }
        v.c = uniform_int(0, 3) == 0 ? 0u : bits_of(static_cast<float>(normal() * std::sqrt(double(k))));
        break;
    case 1:  // wide: exponents over +-30, C over +-40
        for (int i = 0; i < k; ++i) {
            v.a[i] = random_bf16(-30, 30);
            v.b[i] = random_bf16(-30, 30);
        }
        v.c = uniform_int(0, 3) == 0 ? 0u : random_f32(-40, 40);
        break;
    case 2: {  // cancel: products in pairs of (nearly) opposite values, C cancelling too
        for (int i = 0; i < k; i += 2) {
            const int e = uniform_int(-8, 8);
            v.a[i] = random_bf16(e, e);
            v.b[i] = random_bf16(-2, 2);
            v.a[i + 1] = v.a[i] ^ 0x8000;
            v.b[i + 1] = uniform_int(0, 1) ? v.b[i] : static_cast<bf16>(v.b[i] + uniform_int(-2, 2));
        }
        const float p0 = float_of(std::uint32_t{v.a[0]} << 16) * float_of(std::uint32_t{v.b[0]} << 16);
        v.c = uniform_int(0, 1) ? bits_of(-p0 * (1.0f + std::ldexp(float(uniform_int(-64, 64)), -20))) : random_f32(-30, 5);
        break;
    }
    case 3:  // order: few-bit values at exponents 2^-30 .. 2^25, most products zero or one
        for (int i = 0; i < k; ++i) {
            const int what = uniform_int(0, 4);
            v.a[i] = what == 0 ? 0 : order_value();
            v.b[i] = uniform_int(0, 2) == 0 ? order_value() : bf16_of(uniform_int(0, 1), 127, 0);
        }
        v.c = uniform_int(0, 2) == 0 ? 0u : bits_of(float_of(std::uint32_t{order_value()} << 16) *
                                                      (uniform_int(0, 1) ? 1.0f : 1.0f + std::ldexp(1.0f, -uniform_int(8, 23))));
        break;
    case 4:  // subnormal bf16 inputs next to normals that make their products visible
        for (int i = 0; i < k; ++i) {
            const int what = uniform_int(0, 3);
            if (what == 0) v.a[i] = bf16_of(uniform_int(0, 1), 0, uniform_int(1, 127));  // subnormal
            else if (what == 1) v.a[i] = random_bf16(-126, -120);                         // small normal
            else v.a[i] = random_bf16(-4, 4);
            v.b[i] = what <= 1 ? random_bf16(100, 127) : random_bf16(-4, 4);
            if (uniform_int(0, 3) == 0) std::swap(v.a[i], v.b[i]);
        }
        v.c = uniform_int(0, 2) == 0 ? 0u
            : uniform_int(0, 1)     ? random_f32(-10, 10)
                                    : static_cast<std::uint32_t>(uniform_int(0, 1)) << 31 | (static_cast<std::uint32_t>(rng()) & 0x7fffffu);
        break;
    case 5:  // tiny: products and C near and below float32's normal range
        for (int i = 0; i < k; ++i) {
            v.a[i] = uniform_int(0, 2) == 0 ? 0 : random_bf16(-80, -50);
            v.b[i] = random_bf16(-80, -60);
        }
        {
            const int what = uniform_int(0, 3);
            v.c = what == 0   ? 0u
                : what == 1 ? static_cast<std::uint32_t>(uniform_int(0, 1)) << 31 | (static_cast<std::uint32_t>(rng()) & 0x7fffffu)
                            : random_f32(-130, -110);
            if ((v.c & 0x7f800000u) == 0x7f800000u || (v.c & 0x7f800000u) == 0) v.c &= 0x807fffffu;
        }
        break;
    case 6:  // special: NaN, inf, zero codes among ordinary values; C special too
        for (int i = 0; i < k; ++i) {
            auto pick = [] {
                switch (uniform_int(0, 9)) {
                case 0: return bf16_of(uniform_int(0, 1), 255, 0);                       // inf
                case 1: return bf16_of(uniform_int(0, 1), 255, uniform_int(1, 127));    // NaN (quiet or signalling)
                case 2: return bf16_of(uniform_int(0, 1), 0, 0);                         // zero
                case 3: return random_bf16(120, 127);                                    // huge
                default: return random_bf16(-3, 3);
                }
            };
            v.a[i] = pick();
            v.b[i] = pick();
        }
        switch (uniform_int(0, 5)) {
        case 0: v.c = 0x7f800000u; break;
        case 1: v.c = 0xff800000u; break;
        case 2: v.c = 0x7fc00000u | (uniform_int(0, 1) ? 0x80000000u : 0u) | (static_cast<std::uint32_t>(rng()) & 0x3fffffu); break;
        case 3: v.c = 0x7f800001u | (static_cast<std::uint32_t>(rng()) & 0x3fffffu); break;  // signalling NaN
        default: v.c = random_f32(-3, 3);
        }
        break;
    case 7:  // overflow: products near float32's largest values
        for (int i = 0; i < k; ++i) {
            v.a[i] = uniform_int(0, 2) == 0 ? random_bf16(-2, 2) : random_bf16(60, 64);
            v.b[i] = random_bf16(60, 64);
        }
        v.c = uniform_int(0, 1) ? random_f32(120, 127) : random_f32(-3, 3);
        break;
    }
    return v;
}

/// bf16 code of a value that bf16 holds exactly.
bf16 exact_bf16(float x) { return static_cast<bf16>(bits_of(x) >> 16); }

/// Hand-made vectors of K products: C as float32 bits, then (a, b) values that bf16 holds exactly.
struct crafted_vec {
    std::uint32_t c;
    std::array<float, 4> a, b;
};
const float inf = INFINITY;
const float p126 = 0x1p-126f, p63 = 0x1p-63f;
// AMX: products 0 and 2 go to the even lane's FMA chain, 1 and 3 to the odd one's.
const crafted_vec amx_crafted[] = {
    {0u, {p63, 0, -1.5f * 0x1p-75f, 0}, {p63, 0, 0x1p-76f, 0}},  // 2^-126 - 1.5 * 2^-151: FTZ after rounding?
    {0u, {p63, 0, -0x1p-77f, 0}, {p63, 0, 0x1p-75f, 0}},         // 2^-126 - 2^-152
    {0u, {p63, 0, -0x1p-75f, 0}, {p63, 0, 0x1p-75f, 0}},         // 2^-126 - 2^-150
    {0u, {p63, -1.5f * 0x1p-75f, 0, 0}, {p63, 0x1p-76f, 0, 0}},  // the two in different lanes
    {0x80000000u, {0, 0, 0, 0}, {1, 1, 1, 1}},                   // C = -0, zero products
    {0x80000000u, {-0.0f, 0, 0, 0}, {1, 1, 1, 1}},               // C = -0, a -0 product
    {0x80000000u, {-0.0f, -0.0f, -0.0f, -0.0f}, {1, 1, 1, 1}},   // C = -0, all products -0
    {0xbf800000u, {1, 0, 0, 0}, {1, 0, 0, 0}},                   // -1 + 1: exact zero
    {0x807fffffu, {0, 0, 0, 0}, {0, 0, 0, 0}},                   // C a negative subnormal
    {0x807fffffu, {-0.0f, 0, 0, 0}, {1, 0, 0, 0}},
    {0x00800000u, {-p63, 0, 0, 0}, {0x1p-64f, 0, 0, 0}},         // 2^-126 - 2^-127: subnormal sum
    {0x00800000u, {-p63, 0, 0, 0}, {0x1p-63f, 0, 0, 0}},         // 2^-126 - 2^-126 = +0
    {0x3f800000u, {0x1p-12f, 0, 0, 0}, {0x1p-12f, 0, 0, 0}},     // 1 + 2^-24: tie, to even
    {0x3f800000u, {0x1p-12f, 0, 0x1p-12f, 0}, {0x1p-12f, 0, 0x1p-12f, 0}},  // 2^-24 twice, one lane
    {0x3f800000u, {0x1p-12f, 0x1p-12f, 0, 0}, {0x1p-12f, 0x1p-12f, 0, 0}},  // 2^-24 in each lane
    {0x3f800001u, {0x1p-12f, 0, 0, 0}, {0x1p-12f, 0, 0, 0}},     // 1 + 2^-23 + 2^-24: tie, up
    {0x7f400000u, {0x1p127f, 0, 0, 0}, {1, 0, 0, 0}},            // overflow
    {0x7f7fffffu, {0x1p103f, 0, 0, 0}, {1, 0, 0, 0}},            // largest + half an ulp: tie, to inf
    {0x7f7fffffu, {0x1p102f, 0, 0, 0}, {1, 0, 0, 0}},            // largest + a quarter ulp
    {0x7f7fffffu, {0x1p127f, 0, -0x1p127f, 0}, {1, 0, 1, 0}},    // 2^127 - 2^127 in one lane: max stays
    {0u, {inf, 0, -inf, 0}, {1, 0, 1, 0}},                       // inf - inf in one lane
    {0u, {inf, -inf, 0, 0}, {1, 1, 0, 0}},                       // inf and -inf in two lanes
    {0xff800000u, {inf, 0, 0, 0}, {1, 0, 0, 0}},                 // -inf C, +inf product
    {0u, {inf, 0, 0, 0}, {0, 0, 0, 0}},                          // inf * 0
    {0u, {0, 0, 0, 0}, {inf, 0, 0, 0}},                          // 0 * inf
    {0x7fa00000u, {inf, 0, 0, 0}, {0, 0, 0, 0}},                 // signalling NaN C, inf * 0
    {0xffc12345u, {0, 0, 0, 0}, {1, 0, 0, 0}},                   // quiet NaN C
};
// AVX512_BF16: one lane, c + a[1]*b[1], then + a[0]*b[0] (the SDM's order).
const crafted_vec avx_crafted[] = {
    {0x00800000u, {-1.5f * 0x1p-75f, 0}, {0x1p-76f, 0}},  // 2^-126 - 1.5 * 2^-151
    {0x00800000u, {-0x1p-77f, 0}, {0x1p-75f, 0}},         // 2^-126 - 2^-152
    {0u, {-1.5f * 0x1p-75f, p63}, {0x1p-76f, p63}},       // 2^-126 first (odd), then the tiny one
    {0u, {p63, -1.5f * 0x1p-75f}, {p63, 0x1p-76f}},       // the tiny one first
    {0x80000000u, {0, 0}, {1, 1}},
    {0x80000000u, {-0.0f, -0.0f}, {1, 1}},
    {0x807fffffu, {0, 0}, {0, 0}},
    {0x3f800000u, {0x1p-12f, 0x1p-12f}, {0x1p-12f, 0x1p-12f}},  // 1 + 2^-24 + 2^-24: two ties
    {0x3f800000u, {0x1p-12f, 0}, {0x1p-12f, 0}},
    {0x7f7fffffu, {0x1p103f, 0}, {1, 0}},
    {0u, {inf, -inf}, {1, 1}},
    {0u, {inf, 0}, {0, 0}},
    {0xffc12345u, {0, 0}, {1, 0}},
};

std::FILE* out = stdout;

void write_line(const char* instruction, int cls, const vec& v, std::uint32_t d)
{
    const int k = static_cast<int>(v.a.size());
    std::fprintf(out, "%s %s %d %08x", instruction, class_names[cls], k, v.c);
    for (int i = 0; i < k; ++i) std::fprintf(out, " %04x", v.a[i]);
    for (int i = 0; i < k; ++i) std::fprintf(out, " %04x", v.b[i]);
    std::fprintf(out, " %08x\n", d);
}

constexpr unsigned mxcsr_default = 0x1f80;
constexpr unsigned mxcsr_rz_ftz_daz = 0x1f80 | 0x6000 | 0x8000 | 0x0040;
int mxcsr_differences = 0;

/// One TDPBF16PS: C (16 x 16 float32) += A (16 x 2*pairs bf16) . B (pairs x 32 bf16).
void tdpbf16ps(int pairs, const bf16* a, const bf16* b, const std::uint32_t* c_in, std::uint32_t* d)
{
    tile_config cfg;
    cfg.colsb[0] = 64;
    cfg.rows[0] = 16;
    cfg.colsb[1] = static_cast<std::uint16_t>(pairs * 4);
    cfg.rows[1] = 16;
    cfg.colsb[2] = 64;
    cfg.rows[2] = static_cast<std::uint8_t>(pairs);
    _tile_loadconfig(&cfg);
    _tile_loadd(0, c_in, 64);
    _tile_loadd(1, a, pairs * 4);
    _tile_loadd(2, b, 64);
    _tile_dpbf16ps(0, 1, 2);
    _tile_stored(0, d, 64);
    _tile_release();
}

void run_amx(int cls, int pairs)
{
    const int k = 2 * pairs;
    std::vector<vec> rows(16), columns(16);
    for (int i = 0; i < 16; ++i) {
        rows[i] = make_vec(cls, k);
        columns[i] = make_vec(cls, k);
    }
    // The accumulators: each output's own, from the row's vector or the column's.
    std::vector<bf16> a(16 * k), b(pairs * 32);
    std::array<std::uint32_t, 256> c{}, d{}, d_mxcsr{};
    for (int m = 0; m < 16; ++m)
        for (int i = 0; i < k; ++i) a[m * k + i] = rows[m].a[i];
    for (int n = 0; n < 16; ++n)
        for (int p = 0; p < pairs; ++p) {
            b[p * 32 + 2 * n] = columns[n].b[2 * p];
            b[p * 32 + 2 * n + 1] = columns[n].b[2 * p + 1];
        }
    for (int m = 0; m < 16; ++m)
        for (int n = 0; n < 16; ++n) c[m * 16 + n] = (m + n) % 2 ? rows[m].c : columns[n].c;
    tdpbf16ps(pairs, a.data(), b.data(), c.data(), d.data());
    _mm_setcsr(mxcsr_rz_ftz_daz);
    tdpbf16ps(pairs, a.data(), b.data(), c.data(), d_mxcsr.data());
    _mm_setcsr(mxcsr_default);
    for (int m = 0; m < 16; ++m)
        for (int n = 0; n < 16; ++n) {
            if (d[m * 16 + n] != d_mxcsr[m * 16 + n]) ++mxcsr_differences;
            vec v;
            v.a = rows[m].a;
            v.b = columns[n].b;
            v.c = c[m * 16 + n];
            write_line("amx_bf16", cls, v, d[m * 16 + n]);
        }
}

/// The crafted vectors, one per row and column on the diagonal (the outputs written).
void run_amx_crafted()
{
    constexpr int pairs = 2, k = 4;
    std::vector<bf16> a(16 * k), b(pairs * 32);
    std::array<std::uint32_t, 256> c{}, d{};
    const int count = static_cast<int>(std::size(amx_crafted));
    for (int base = 0; base < count; base += 16) {
        std::fill(a.begin(), a.end(), bf16{0});
        std::fill(b.begin(), b.end(), bf16{0});
        c.fill(0);
        for (int m = 0; m < 16 && base + m < count; ++m) {
            const crafted_vec& v = amx_crafted[base + m];
            for (int i = 0; i < k; ++i) {
                a[m * k + i] = exact_bf16(v.a[i]);
                b[(i / 2) * 32 + 2 * m + i % 2] = exact_bf16(v.b[i]);
            }
            c[m * 16 + m] = v.c;
        }
        tdpbf16ps(pairs, a.data(), b.data(), c.data(), d.data());
        for (int m = 0; m < 16 && base + m < count; ++m) {
            vec v;
            for (int i = 0; i < k; ++i) {
                v.a.push_back(a[m * k + i]);
                v.b.push_back(b[(i / 2) * 32 + 2 * m + i % 2]);
            }
            v.c = c[m * 16 + m];
            write_line("amx_bf16", crafted_class, v, d[m * 16 + m]);
        }
    }
}

/// 16 VDPBF16PS lanes: lane i: c[i] + a[2i]*b[2i] + a[2i+1]*b[2i+1].
void vdpbf16ps(const bf16* a, const bf16* b, const std::uint32_t* c, std::uint32_t* d)
{
    __m512 acc;
    __m512bh va, vb;
    std::memcpy(&acc, c, 64);
    std::memcpy(&va, a, 64);
    std::memcpy(&vb, b, 64);
    acc = _mm512_dpbf16_ps(acc, va, vb);
    std::memcpy(d, &acc, 64);
}

void run_avx512_crafted()
{
    std::array<bf16, 32> a{}, b{};
    std::array<std::uint32_t, 16> c{}, d{};
    const int count = static_cast<int>(std::size(avx_crafted));
    for (int i = 0; i < count; ++i) {
        for (int j = 0; j < 2; ++j) {
            a[2 * i + j] = exact_bf16(avx_crafted[i].a[j]);
            b[2 * i + j] = exact_bf16(avx_crafted[i].b[j]);
        }
        c[i] = avx_crafted[i].c;
    }
    vdpbf16ps(a.data(), b.data(), c.data(), d.data());
    for (int i = 0; i < count; ++i) {
        vec v;
        v.a = {a[2 * i], a[2 * i + 1]};
        v.b = {b[2 * i], b[2 * i + 1]};
        v.c = c[i];
        write_line("avx512_bf16", crafted_class, v, d[i]);
    }
}

void run_avx512(int cls)
{
    std::array<vec, 16> v;
    std::array<bf16, 32> a{}, b{};
    std::array<std::uint32_t, 16> c{}, d{}, d_mxcsr{};
    for (int i = 0; i < 16; ++i) {
        v[i] = make_vec(cls, 2);
        a[2 * i] = v[i].a[0];
        a[2 * i + 1] = v[i].a[1];
        b[2 * i] = v[i].b[0];
        b[2 * i + 1] = v[i].b[1];
        c[i] = v[i].c;
    }
    vdpbf16ps(a.data(), b.data(), c.data(), d.data());
    _mm_setcsr(mxcsr_rz_ftz_daz);
    vdpbf16ps(a.data(), b.data(), c.data(), d_mxcsr.data());
    _mm_setcsr(mxcsr_default);
    for (int i = 0; i < 16; ++i) {
        if (d[i] != d_mxcsr[i]) ++mxcsr_differences;
        write_line("avx512_bf16", cls, v[i], d[i]);
    }
}

std::string cpuinfo_field(const char* name)
{
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind(name, 0) == 0) {
            const auto colon = line.find(':');
            return colon == std::string::npos ? line : line.substr(colon + 2);
        }
    }
    return "?";
}

}  // namespace

int main(int argc, char** argv)
{
    int tiles = 2;
    unsigned long long seed = 20261126;
    std::string command;
    for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--tiles" && i + 1 < argc) tiles = std::atoi(argv[++i]);
        else if (arg == "--seed" && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 0);
        else {
            std::fprintf(stderr, "usage: %s [--tiles N] [--seed S] > vectors.txt\n", argv[0]);
            return 2;
        }
    }
    rng.seed(seed);
    if (syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) != 0) {
        std::perror("arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)");
        return 1;
    }

    // Lines go to a buffer first: the header's MXCSR line needs the whole run.
    char* body = nullptr;
    std::size_t body_size = 0;
    out = open_memstream(&body, &body_size);
    for (int cls = 0; cls < class_count; ++cls) {
        for (int pairs : {16, 1, 2, 3, 8}) {
            const int n = pairs == 16 ? tiles : std::max(1, tiles / 2);
            for (int t = 0; t < n; ++t) run_amx(cls, pairs);
        }
        for (int t = 0; t < 16 * tiles; ++t) run_avx512(cls);
    }
    run_amx_crafted();
    run_avx512_crafted();
    std::fclose(out);

    utsname u{};
    uname(&u);
    char date[64];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    std::printf("# scalify AMX capture (tools/capture_amx.cpp): TDPBF16PS and VDPBF16PS on this CPU\n");
    std::printf("# cpu: %s (family %s, model %s, stepping %s)\n", cpuinfo_field("model name").c_str(),
                cpuinfo_field("cpu family").c_str(), cpuinfo_field("model\t").c_str(), cpuinfo_field("stepping").c_str());
    std::printf("# microcode: %s\n", cpuinfo_field("microcode").c_str());
    {
        // The flags that say which units exist (amx_fp16 marks Granite Rapids' AMX-FP16).
        std::string flags = " " + cpuinfo_field("flags") + " ", wanted;
        for (const char* f : {"amx_tile", "amx_bf16", "amx_int8", "amx_fp16", "avx512_bf16", "avx512_fp16"})
            wanted += flags.find(" " + std::string(f) + " ") != std::string::npos ? std::string(" ") + f : std::string(" no-") + f;
        std::printf("# flags:%s\n", wanted.c_str());
    }
    std::printf("# kernel: %s %s %s\n", u.sysname, u.release, u.machine);
    std::printf("# date: %s\n", date);
    std::printf("# command: %s (seed %llu)\n", command.c_str(), seed);
    std::printf("# compiler: g++ %s\n", __VERSION__);
    std::printf("# mxcsr: each instruction also ran under MXCSR 0x%04x (RZ, FTZ, DAZ): %d outputs differed\n",
                mxcsr_rz_ftz_daz, mxcsr_differences);
    std::printf("# format: instruction class K c a[0..K) b[0..K) d (hex codes; c, d float32, a, b bf16)\n");
    std::fwrite(body, 1, body_size, stdout);
    std::free(body);
    return 0;
}
