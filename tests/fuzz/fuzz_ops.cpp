// libFuzzer target: ScaledArray construction and every primitive on fuzzer-chosen shapes, scales
// (0, subnormal, huge, NaN, inf) and data. Invalid input must end in a scalify::error (never a
// crash, UB or out-of-bounds access); valid results must have the right shape and a valid scale,
// and add/mul must agree with the double computation where everything is finite and in range.
// all_reduce_gradients joins them, over one process and two thread ranks. In the checked mode
// (check_finite_scope) an op either throws non_finite_error or returns finite data; quantize<T>
// returns a valid scale for any input.
#include "fuzz_support.hpp"

#include <scalify/scalify.hpp>

#include <algorithm>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

namespace fuzz_ops {

using namespace scalify;

namespace {

using fuzz::fail;
using fuzz::reader;

float fuzz_scale(reader& in)
{
    switch (in.byte() % 10) {
    case 0: return 0.0f;
    case 1: return std::numeric_limits<float>::denorm_min();
    case 2: return std::numeric_limits<float>::max();
    case 3: return std::numeric_limits<float>::quiet_NaN();
    case 4: return std::numeric_limits<float>::infinity();
    case 5: return -2.0f;
    case 6: return std::ldexp(1.0f, static_cast<int>(in.byte() % 250) - 125);
    default: return in.any_float();
    }
}

template <class T, class P>
void check_result(const ScaledArray<T, P>& r)
{
    if (!(r.scale() >= 0.0f) || !std::isfinite(r.scale())) fail("result scale finite and >= 0");
    if (P::power_of_two && !is_pow2_or_zero(r.scale())) fail("pow2 result scale");
    if (r.data().size() != detail::element_count(r.shape())) fail("result size matches shape");
}

/// In the checked mode: a result that got through holds no NaN or inf (a zero scale means zeros).
template <class T, class P>
void check_finite_result(const ScaledArray<T, P>& r)
{
    check_result(r);
    if (r.scale() == 0.0f) return;
    for (const auto& x : r.data()) {
        if (!std::isfinite(static_cast<double>(detail::load(x)))) fail("checked mode: a result with NaN or inf got through");
    }
}

template <class F>
void guarded(F f)
{
    try {
        f();
    } catch (const scalify::error&) {
        // documented rejection
    }
}

/// all_reduce_gradients of `a` (one process, or two thread ranks both holding `a`) in a fuzzer-chosen
/// wire type: the mean of equal tensors is the tensor. A valid scale always; NaN where `a` holds
/// inf or NaN; and for float32 data in float32 on the wire, the value itself (to a float rounding
/// where the common scale's ratio to a's is not a power of two).
template <class T, class P>
void all_reduce_two_ways(reader& in, const ScaledArray<T, P>& a)
{
    if constexpr (ad::GradientElement<T>) {
        const int ranks = in.byte() % 2 == 0 ? 1 : 2;
        const dtype wires[] = {dtype::float32, dtype::float16, dtype::bfloat16, dtype::float8_e4m3fn, dtype::float8_e5m2};
        dist::all_reduce_options options;
        if (const auto choice = in.byte() % 6; choice < 5) options.wire = wires[choice];
        std::vector<std::vector<ad::gradient<P>>> results(static_cast<std::size_t>(ranks));
        const auto reduce = [&](dist::reducer& world) {
            std::vector<ad::gradient<P>> grads{ad::gradient<P>(a)};
            (void)dist::all_reduce_gradients(grads, options, world);
            results[static_cast<std::size_t>(world.rank())] = std::move(grads);
        };
        if (ranks == 1) {
            reduce(dist::single_process_reducer());  // no threads: they would halve the executions per second
        } else {
            dist::thread_group group(ranks);
            group.run(reduce);
        }
        const xt::xarray<float> before = a.value();
        const xt::xarray<float> after = results[0][0].value();
        check_result(results[0][0].template as<float>());
        if (ranks == 2 && !std::ranges::equal(results[1][0].value(), after, [](float x, float y) {
                return std::bit_cast<std::uint32_t>(x) == std::bit_cast<std::uint32_t>(y);
            })) {
            fail("all_reduce_gradients: the same bits on both ranks");
        }
        const bool exact_wire = std::same_as<T, float> && (!options.wire || *options.wire == dtype::float32);
        // The values' amax in double: a.value() overflows float where data x scale does, and the
        // common scale follows the true amax (a tensor spanning more than float's range loses
        // its smallest values, relative to the largest, as any one-scale format does).
        double amax = 0.0;
        for (const auto& x : a.data()) {
            const double m = std::abs(static_cast<double>(detail::load(x))) * static_cast<double>(a.scale());
            amax = std::isfinite(m) ? std::max(amax, m) : amax;
        }
        for (std::size_t i = 0; i < before.size(); ++i) {
            const float v = a.scale() == 0.0f ? 0.0f : static_cast<float>(detail::load(a.data().data()[i])) * a.scale();
            if (a.scale() != 0.0f && !std::isfinite(static_cast<float>(detail::load(a.data().data()[i])))) {
                if (!std::isnan(after.data()[i])) fail("all_reduce_gradients: inf and NaN reduce to NaN");
            } else if (exact_wire && std::isfinite(v) && std::isfinite(amax) &&
                       std::abs(double(after.data()[i]) - double(v)) > std::ldexp(amax, -23) + 2 * double(std::numeric_limits<float>::denorm_min())) {
                std::fprintf(stderr, "element %zu: %.9g became %.9g (amax %g)\n", i, double(v), double(after.data()[i]), amax);
                fail("all_reduce_gradients: float32 on the wire keeps the mean of equal tensors");
            }
        }
    }
}

template <class T, class P>
void exercise(reader& in)
{
    std::vector<std::size_t> shape_a, shape_b;
    const std::size_t rank_a = in.byte() % 3, rank_b = in.byte() % 3;
    for (std::size_t i = 0; i < rank_a; ++i) shape_a.push_back(in.byte() % 5);
    for (std::size_t i = 0; i < rank_b; ++i) shape_b.push_back(in.byte() % 5);
    xt::xarray<T> da = xt::xarray<T>::from_shape(shape_a), db = xt::xarray<T>::from_shape(shape_b);
    for (auto& x : da) x = detail::store<T>(in.any_float());
    for (auto& x : db) x = detail::store<T>(in.any_float());
    const float sa = fuzz_scale(in), sb = fuzz_scale(in);
    guarded([&] {
        const ScaledArray<T, P> a(da, sa);
        const ScaledArray<T, P> b(db, sb);
        guarded([&] {
            const auto r = add(a, b);
            check_result(r);
            // Agreement with double where every input and the result are finite and the result is normal.
            if constexpr (std::same_as<T, float>) {
                if (a.shape() == b.shape() && a.scale() > 1e-30f && b.scale() > 1e-30f) {
                    const auto va = a.value(), vb = b.value(), vr = r.value();
                    for (std::size_t i = 0; i < vr.size(); ++i) {
                        const double want = double(va.data()[i]) + double(vb.data()[i]);
                        const double got = vr.data()[i];
                        if (std::isfinite(want) && std::isfinite(got) && std::abs(want) < 1e30 && std::abs(want) > 1e-30 &&
                            std::abs(got - want) > 1e-5 * (std::abs(double(va.data()[i])) + std::abs(double(vb.data()[i]))) +
                                                       // the result's data cannot hold less than scale * denorm_min
                                                       double(r.scale()) * std::numeric_limits<float>::denorm_min())
                        {
                            std::fprintf(stderr, "a %g (scale %g) + b %g (scale %g): got %.9g, want %.9g\n", double(a.data().data()[i]),
                                         double(a.scale()), double(b.data().data()[i]), double(b.scale()), got, want);
                            fail("add agrees with double");
                        }
                    }
                }
            }
        });
        guarded([&] { check_result(sub(a, b)); });
        guarded([&] { check_result(mul(a, b)); });
        guarded([&] { check_result(div(a, b)); });
        guarded([&] { check_result(maximum(a, b)); });
        guarded([&] { check_result(minimum(a, b)); });
        guarded([&] { check_result(matmul(a, b)); });
        guarded([&] { check_result(matmul<dynamic_abs<float8_e4m3fn>>(a, b)); });
        // runtime_scaling: the chosen strategy's scale and bits (the list computes the raw amax
        // dynamic_abs reads whichever is chosen), and where the direct form throws, so does it.
        {
            using rules = runtime_scaling<unit_scaling, dynamic_abs<float8_e4m3fn>>;
            const std::size_t chosen = in.byte() % rules::size;
            std::optional<ScaledArray<float, P>> picked, direct;
            guarded([&] {
                const rules::scope rule(chosen);
                picked = matmul<rules, float>(a, b);
            });
            guarded([&] { direct = chosen == 0 ? matmul<unit_scaling, float>(a, b) : matmul<dynamic_abs<float8_e4m3fn>, float>(a, b); });
            if (picked.has_value() != direct.has_value() ||
                (picked && (picked->scale() != direct->scale() || picked->shape() != direct->shape() ||
                            (direct->size() != 0 &&
                             std::memcmp(picked->data().data(), direct->data().data(), direct->size() * sizeof(float)) != 0)))) {
                fail("runtime_scaling gives the chosen strategy's result");
            }
        }
        // linear with a bias row of b's width (b's first row): the scale of add(matmul), and where
        // either form throws, both do.
        if (b.dimension() == 2 && b.shape()[0] > 0) {
            xt::xarray<T> row = xt::xarray<T>::from_shape({b.shape()[1]});
            std::copy_n(b.data().data(), row.size(), row.data());
            const ScaledArray<T, P> bias(std::move(row), b.scale());
            std::optional<float> fused_scale, composed_scale;
            guarded([&] {
                const auto r = linear<unit_scaling>(a, b, bias);
                check_result(r);
                fused_scale = r.scale();
            });
            guarded([&] { composed_scale = add<unit_scaling>(matmul<unit_scaling>(a, b), bias).scale(); });
            if (fused_scale.has_value() != composed_scale.has_value() ||
                (fused_scale && !(*fused_scale == *composed_scale))) {
                fail("linear's scale is add(matmul)'s, and it throws where the composition does");
            }
        }
        // layer_norm with a gain and a bias over a's last axis (b's first elements, a's last
        // ones): the composition's bits and scale, and where either form throws, both do.
        if (a.dimension() >= 1 && b.size() >= a.shape()[a.dimension() - 1] && a.size() >= a.shape()[a.dimension() - 1]) {
            const std::size_t n = a.shape()[a.dimension() - 1];
            xt::xarray<T> gain_data = xt::xarray<T>::from_shape({n}), bias_data = xt::xarray<T>::from_shape({n});
            std::copy_n(b.data().data(), n, gain_data.data());
            std::copy_n(a.data().data() + (a.size() - n), n, bias_data.data());
            const ScaledArray<T, P> gain(std::move(gain_data), b.scale()), bias(std::move(bias_data), fuzz_scale(in));
            std::optional<ScaledArray<T, P>> fused, composed;
            guarded([&] { fused = layer_norm<unit_scaling>(a, gain, bias); });
            guarded([&] { composed = add<unit_scaling>(mul<unit_scaling>(layer_norm<unit_scaling>(a), gain), bias); });
            // The same bits, a NaN matching any NaN (its sign is the compiler's operand order's).
            const auto same = [](const ScaledArray<T, P>& x, const ScaledArray<T, P>& y) {
                if (x.scale() != y.scale() || x.shape() != y.shape()) return false;
                for (std::size_t i = 0; i < x.size(); ++i) {
                    const T& u = x.data().data()[i];
                    const T& v = y.data().data()[i];
                    if (std::memcmp(&u, &v, sizeof(T)) != 0 &&
                        !(std::isnan(static_cast<double>(detail::load(u))) && std::isnan(static_cast<double>(detail::load(v))))) {
                        return false;
                    }
                }
                return true;
            };
            if (fused.has_value() != composed.has_value() || (fused && !same(*fused, *composed))) {
                fail("layer_norm(a, gain, bias) gives the composition's bits and scale, and throws where it does");
            }
            if (fused) check_result(*fused);
        }
        // split: the slices, in order, making up a
        guarded([&] {
            const std::size_t axis = in.byte() % 3, sections = 1 + in.byte() % 3;
            const auto parts = split(a, sections, axis);
            std::size_t elements = 0;
            for (const auto& part : parts) {
                check_result(part);
                if (part.scale() != a.scale()) fail("split keeps the scale");
                elements += part.size();
            }
            if (elements != a.size() || parts.size() != sections) fail("split's parts make up the array");
        });
        // embedding_vjp of a as the cotangent (one id per row of its leading axes, ids from -1 to
        // 9 over 0-8 table rows): every id outside the rows throws; otherwise the rows named are
        // a's rows summed in id order, the others zeros, at a's scale (a zero scale: zeros).
        guarded([&] {
            if (a.dimension() == 0) return;
            const std::size_t width = a.shape()[a.dimension() - 1], rows = in.byte() % 9;
            xt::xarray<std::int16_t> ids = xt::xarray<std::int16_t>::from_shape(
                std::vector<std::size_t>(a.shape().begin(), a.shape().end() - 1));
            for (auto& id : ids) id = static_cast<std::int16_t>(static_cast<int>(in.byte() % 11) - 1);
            const auto r = embedding_vjp(a, ids, rows);
            check_result(r);
            using C = compute_t<T>;
            std::vector<C> sums(rows * width, C(0));
            for (std::size_t i = 0; i < ids.size(); ++i) {
                for (std::size_t j = 0; j < width; ++j)
                    sums[static_cast<std::size_t>(ids.data()[i]) * width + j] += detail::load(a.data().data()[i * width + j]);
            }
            if (r.scale() != a.scale() || r.size() != sums.size()) fail("embedding_vjp keeps the cotangent's scale");
            for (std::size_t k = 0; k < sums.size(); ++k) {
                const T want = detail::store<T>(a.scale() == 0.0f ? C(0) : sums[k]);
                const T& got = r.data().data()[k];
                if (std::memcmp(&want, &got, sizeof(T)) != 0 && !(std::isnan(static_cast<double>(detail::load(want))) &&
                                                                  std::isnan(static_cast<double>(detail::load(got))))) {
                    fail("embedding_vjp sums the looked-up rows in id order, zeros elsewhere");
                }
            }
        });
        guarded([&] { check_result(add<unit_scaling>(a, b)); });
        // An expiring operand (either side, any broadcast) gives the bits of the copying form.
        guarded([&] {
            const auto same_bits = [&](const auto& moved, const auto& copied, const char* what) {
                if (moved.scale() != copied.scale() || moved.shape() != copied.shape() ||
                    (copied.size() != 0 &&
                     std::memcmp(moved.data().data(), copied.data().data(), copied.size() * sizeof(T)) != 0)) {
                    fail(what);
                }
            };
            same_bits(add<unit_scaling>(ScaledArray<T, P>(a), b), add<unit_scaling>(a, b), "add over an expiring a");
            same_bits(sub(a, ScaledArray<T, P>(b)), sub(a, b), "sub over an expiring b");
            same_bits(mul(ScaledArray<T, P>(a), -0.7), mul(a, -0.7), "mul by a scalar in place");
        });
        guarded([&] { check_result(neg(a)); });
        guarded([&] { check_result(abs(a)); });
        guarded([&] { check_result(relu(a)); });
        guarded([&] { check_result(gelu(a)); });
        guarded([&] { check_result(exp(a)); });
        guarded([&] { check_result(log(a)); });
        guarded([&] { check_result(sqrt(a)); });
        guarded([&] { check_result(reduce_sum(a)); });
        guarded([&] { check_result(reduce_max(a, {static_cast<std::size_t>(in.byte() % 3)})); });
        guarded([&] { check_result(softmax(a, in.byte() % 3)); });
        guarded([&] { check_result(cast<float8_e5m2>(a)); });
        guarded([&] { check_result(cast<float8_e4m3fn, round_stochastic>(a, in.byte())); });
        guarded([&] { check_result(rebalance_scale(a, fuzz_scale(in))); });
        guarded([&] { check_result(mul(a, static_cast<double>(in.any_float()))); });
        guarded([&] { check_result(transpose(a)); });
        guarded([&] { check_result(reshape(a, {in.byte() % 7u})); });
        guarded([&] {  // the rvalue form (moves the data) gives what the copying form gives
            const std::vector<std::size_t> shape{in.byte() % 7u};
            auto moved = reshape(ScaledArray(a), shape);
            const auto copied = reshape(a, shape);
            check_result(moved);
            if (moved.shape() != copied.shape() || moved.scale() != copied.scale() ||
                (copied.size() != 0 &&
                 std::memcmp(moved.data().data(), copied.data().data(), copied.size() * sizeof(*copied.data().data())) != 0)) {
                std::abort();
            }
        });
        guarded([&] { check_result(slice(a, in.byte() % 3, in.byte() % 5, in.byte() % 6)); });
        guarded([&] { check_result(concatenate({a, b}, in.byte() % 3)); });
        guarded([&] { check_result(dynamic_rescale_l2(a)); });
        guarded([&] {
            const xt::xarray<bool> cond = xt::xarray<bool>::from_shape(a.shape());
            check_result(where(xt::xarray<bool>(xt::zeros<bool>(a.shape())), a, b));
            (void)cond;
        });
        {
            // The run-time target gives the typed target's statistics.
            const auto typed = tensor_stats<float8_e4m3fn>(a);
            const auto chosen = tensor_stats(a, dtype::float8_e4m3fn);
            if (chosen.count != typed.count || chosen.zeros != typed.zeros || chosen.non_finite != typed.non_finite ||
                !(chosen.amax == typed.amax) || chosen.saturate_fraction != typed.saturate_fraction ||
                chosen.underflow_fraction != typed.underflow_fraction || chosen.exponent_histogram != typed.exponent_histogram) {
                fuzz::fail("tensor_stats(a, dtype) differs from tensor_stats<T>(a)");
            }
        }
        {
            const check_finite_scope checked;
            guarded([&] { check_finite_result(add(a, b)); });
            guarded([&] { check_finite_result(matmul<dynamic_abs<float8_e4m3fn>>(a, b)); });
            guarded([&] { check_finite_result(mul<natural_scaling, float8_e4m3fn>(a, b)); });
            guarded([&] { check_finite_result(dynamic_rescale_l2(a)); });
            guarded([&] { check_finite_result(cast<float8_e4m3fn>(a)); });
        }
        guarded([&] {
            const auto q = quantize<float8_e4m3fn>(a.value());
            check_result(q);
            if (!(q.scale() > 0.0f)) fail("quantize: scale > 0");
        });
        guarded([&] { all_reduce_two_ways(in, a); });
    });
}

}  // namespace

/// The target's body; fuzz_ops's LLVMFuzzerTestOneInput (generated) calls it.
int test_one_input(const std::uint8_t* data, std::size_t size)
{
    reader in{data, size};
    switch (in.byte() % 4) {
    case 0: exercise<float, float_scale>(in); break;
    case 1: exercise<float, pow2_scale>(in); break;
    case 2: exercise<float8_e4m3fn, pow2_scale>(in); break;
    default: exercise<Eigen::half, float_scale>(in); break;
    }
    return 0;
}

}  // namespace fuzz_ops
