// The Fashion-MNIST MLP of examples/fashion_mnist.cpp, shared with benchmarks/bench_training.cpp:
// data loading, the model written once, the precision modes, and one training step.
#pragma once

#include "precision_modes.hpp"

#include <scalify/scalify.hpp>

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace fashion {

using namespace scalify;

inline constexpr const char* default_data_dir = "/usr/share/datasets/fashion-mnist";

// ---- data ----------------------------------------------------------------------------------

struct dataset {
    xt::xarray<float> images;  // n x 784, in [0, 1]
    std::vector<std::uint8_t> labels;
};

inline std::vector<unsigned char> read_gz(const std::string& path)
{
    gzFile file = gzopen(path.c_str(), "rb");
    if (file == nullptr) {
        throw std::runtime_error(fmt::format(
            "cannot open {}: install the Fashion-MNIST IDX files with `apt-get install dataset-fashion-mnist` "
            "(cmake -P cmake/demo.cmake does it when run as root) or pass --data DIR",
            path));
    }
    std::vector<unsigned char> bytes;
    unsigned char buffer[1 << 16];
    int got = 0;
    while ((got = gzread(file, buffer, sizeof buffer)) > 0) bytes.insert(bytes.end(), buffer, buffer + got);
    gzclose(file);
    if (got < 0) throw std::runtime_error(fmt::format("{}: gzip data is corrupt", path));
    return bytes;
}

inline std::uint32_t big_endian(const std::vector<unsigned char>& b, std::size_t at)
{
    if (at + 4 > b.size()) throw std::runtime_error("IDX header truncated");
    return (std::uint32_t(b[at]) << 24) | (std::uint32_t(b[at + 1]) << 16) | (std::uint32_t(b[at + 2]) << 8) | b[at + 3];
}

inline dataset load(const std::string& dir, const std::string& prefix, std::size_t limit)
{
    const auto images = read_gz(dir + "/" + prefix + "-images-idx3-ubyte.gz");
    const auto labels = read_gz(dir + "/" + prefix + "-labels-idx1-ubyte.gz");
    if (big_endian(images, 0) != 0x803 || big_endian(labels, 0) != 0x801) throw std::runtime_error("not IDX image/label files");
    const std::size_t count = big_endian(images, 4), rows = big_endian(images, 8), cols = big_endian(images, 12);
    if (big_endian(labels, 4) != count || rows * cols != 784 || images.size() != 16 + count * 784 || labels.size() != 8 + count) {
        throw std::runtime_error(fmt::format("IDX sizes do not match ({} images of {}x{})", count, rows, cols));
    }
    const std::size_t n = std::min(count, limit);
    dataset d;
    d.images = xt::xarray<float>::from_shape({n, std::size_t{784}});
    for (std::size_t i = 0; i < n * 784; ++i) d.images.data()[i] = static_cast<float>(images[16 + i]) / 255.0f;
    d.labels.assign(labels.begin() + 8, labels.begin() + 8 + static_cast<std::ptrdiff_t>(n));
    return d;
}

/// Rows order[first .. first + count) of x.
inline xt::xarray<float> rows_of(const xt::xarray<float>& x, const std::vector<std::size_t>& order, std::size_t first,
                                 std::size_t count)
{
    xt::xarray<float> out = xt::xarray<float>::from_shape({count, x.shape()[1]});
    const std::size_t width = x.shape()[1];
    for (std::size_t i = 0; i < count; ++i) std::copy_n(x.data() + order[first + i] * width, width, out.data() + i * width);
    return out;
}

// ---- the model, written once ------------------------------------------------------------------

/// 784-512-512-10 ReLU MLP parameters; A is a ScaledArray (parameters, inference), an ad::var
/// (inside value_and_grad) or an ad::gradient (the gradients).
template <class A>
struct mlp {
    A w1, b1, w2, b2, w3, b3;
    template <class F>
    friend void for_each_parameter(mlp& self, F&& f)
    {
        f(self.w1), f(self.b1), f(self.w2), f(self.b2), f(self.w3), f(self.b3);
    }
};

/// Logits of a batch x; the same code for ScaledArrays and vars.
template <class Params, class X>
auto forward(const Params& p, const X& x)
{
    const auto h1 = relu(matmul(x, p.w1) + p.b1);
    const auto h2 = relu(matmul(h1, p.w2) + p.b2);
    return matmul(h2, p.w3) + p.b3;
}

/// The training objective: mean cross-entropy times the loss weight. The logits' cotangent is
/// brought back to unit RMS (the one dynamic rescale of scalify's recipe: the cross-entropy
/// gradient's magnitude depends on how well the model fits, which no static rule can know).
template <class Params, class X, class Labels>
auto objective(const Params& p, const X& x, const Labels& labels, double loss_weight)
{
    return softmax_cross_entropy(dynamic_rescale_l2_grad(forward(p, x)), labels) * loss_weight;
}

using array = ScaledArray<float, pow2_scale>;

/// PyTorch's nn.Linear default initialisation, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and
/// biases, as float32 masters. With unit_data the data are normalised to unit RMS and the
/// magnitude (a power of two) moves into the scale, as unit scaling stores parameters; the values
/// are the same up to float32 rounding.
inline mlp<array> initial_parameters(unsigned seed, bool unit_data)
{
    std::mt19937 rng(seed);
    const std::size_t sizes[] = {784, 512, 512, 10};
    std::vector<array> made;
    for (int l = 0; l < 3; ++l) {
        const float bound = 1.0f / std::sqrt(static_cast<float>(sizes[l]));
        std::uniform_real_distribution<float> uniform(-bound, bound);
        xt::xarray<float> w = xt::xarray<float>::from_shape({sizes[l], sizes[l + 1]});
        xt::xarray<float> b = xt::xarray<float>::from_shape({sizes[l + 1]});
        for (auto& e : w) e = uniform(rng);
        for (auto& e : b) e = uniform(rng);
        for (auto* values : {&w, &b}) {
            array a = as_scaled_array<pow2_scale>(std::move(*values));
            made.push_back(unit_data ? dynamic_rescale_l2(a) : std::move(a));
        }
    }
    return {made[0], made[1], made[2], made[3], made[4], made[5]};
}

// ---- precision modes --------------------------------------------------------------------------

using mode = examples::precision_mode;

/// fashion_mnist's own mode beside examples::precision_modes.
inline constexpr mode autoscale_mode[] = {
    {"fp8-autoscale", dtype::float8_e4m3fn, dtype::float8_e5m2, ad::cast_scaling::propagated, true,
     "AutoScale on_off(1/3, 1/20): E4M3 forward / E5M2 gradients, every matmul's y, grad_x, grad_w with a held multiplier"},
};

inline const mode& find_mode(std::string_view name) { return examples::find_mode(name, autoscale_mode); }

/// fp8-autoscale's vars: unit_scaling's rules, and every matmul an AutoScale layer (E4M3 operands,
/// E5M2 cotangents and input gradients, float32 products and weight gradients) of a scaling context.
using autoscale_strategy = autoscale::autoscaled<unit_scaling>;

/// Every mode's rules, fp8-autoscale's among them, chosen when the program runs: the model, its
/// backward rules and the optimiser compile once for all modes (AutoScale's matmuls become layers
/// while its strategy is the choice).
using mode_scaling = runtime_scaling<unit_scaling, natural_scaling, autoscale_strategy>;

[[nodiscard]] inline bool is_autoscaled(const mode& m) { return m.name == autoscale_mode[0].name; }

/// Runs mode m's rules on this thread while the result lives.
[[nodiscard]] inline mode_scaling::scope scaling_of(const mode& m)
{
    if (is_autoscaled(m)) return mode_scaling::scope(mode_scaling::index_of<autoscale_strategy>);
    return mode_scaling::scope(m.unit_scaled ? mode_scaling::index_of<unit_scaling> : mode_scaling::index_of<natural_scaling>);
}

/// fp8-autoscale's context: the design's on/off example, on_off(1/3, 1/20), after 10 analysis
/// steps; or the conservative default (every op re-measured at every use), for comparison.
inline autoscale::scaling_context<pow2_scale> autoscale_context(bool conservative = false)
{
    if (conservative) return {autoscale::context_config{}, autoscale::conservative{}};
    return {autoscale::context_config{}, autoscale::on_off(1.0 / 3, 1.0 / 20)};
}

/// How a data-parallel step reduces its gradients (docs/distributed.md), and what it reports.
struct data_parallel {
    dist::all_reduce_options reduce;      ///< the wire type; the mean over ranks
    dist::all_reduce_report last;         ///< the last step's reduction
    bool check_replicas = false;          ///< assert every step that all ranks hold the same scales and parameters
    std::size_t step = 0;
};

/// Every rank's gradient scales, parameter scales and parameter bits must be the same after a
/// step: distributed_error naming the step and the tensor when they are not.
inline void check_replicas(mlp<array>& params, mlp<ad::gradient<pow2_scale>>& grads, std::size_t step)
{
    std::vector<double> local;
    for_each_parameter(params, [&](const array& a) {
        std::uint64_t hash = 14695981039346656037ull;  // FNV-1a over the data's bits
        for (const float v : a.data()) hash = (hash ^ std::bit_cast<std::uint32_t>(v)) * 1099511628211ull;
        local.insert(local.end(), {double(a.scale()), double(hash >> 32), double(hash & 0xffffffffu)});
    });
    for_each_parameter(grads, [&](const ad::gradient<pow2_scale>& a) { local.push_back(double(a.scale())); });
    std::vector<double> high = local, low(local.size());
    for (std::size_t i = 0; i < local.size(); ++i) low[i] = -local[i];
    dist::current_reducer().max(high);
    dist::current_reducer().max(low);
    for (std::size_t i = 0; i < local.size(); ++i) {
        if (high[i] != -low[i]) {
            const bool gradient = i >= 18;
            SCALIFY_THROW(distributed_error(fmt::format(
                "step {}: the ranks' replicas differ at {} {} ({} .. {})", step, gradient ? "the scale of gradient" : "parameter",
                gradient ? i - 18 : i / 3, -low[i], high[i])));
        }
    }
}

/// One SGD step of the objective on a batch: forward and backward on the tape, then the update
/// of the float32 masters. Returns the (weighted) loss. With a context (fp8-autoscale), the step's
/// matmuls are its layers. Across the ranks of dist::current_reducer() (more than one: a
/// data-parallel job, x is this rank's share of the global batch) the gradients are averaged by
/// dist::all_reduce_gradients before the update, so every rank updates alike.
template <class Strategy, class Labels>
double train_step(mlp<array>& params, const array& x, const Labels& labels, double loss_weight, const ad::sgd& optimizer,
                  autoscale::scaling_context<pow2_scale>* autoscaling = nullptr, data_parallel* parallel = nullptr)
{
    std::optional<autoscale::graph_scope<pow2_scale>> step;
    if (autoscaling != nullptr) step.emplace(*autoscaling);
    auto [loss, grads] = ad::value_and_grad<Strategy>(
        [&](const auto& p) { return objective(p, x, labels, loss_weight); }, params);
    if (dist::current_reducer().size() > 1) {
        const auto report = dist::all_reduce_gradients(grads, parallel != nullptr ? parallel->reduce : dist::all_reduce_options{});
        if (parallel != nullptr) parallel->last = report;
    }
    optimizer.step(params, grads);
    if (parallel != nullptr && parallel->check_replicas) check_replicas(params, grads, parallel->step);
    if (parallel != nullptr) ++parallel->step;
    return static_cast<double>(loss.value()());
}

/// Logits of x without a tape (the parameters enter as constants), in the mode's arithmetic; with a
/// context, as its layers in inference mode (not counted, not measured).
template <class Strategy>
xt::xarray<float> predict(const mlp<array>& params, const array& x, autoscale::scaling_context<pow2_scale>* autoscaling = nullptr)
{
    std::optional<autoscale::graph_scope<pow2_scale>> scope;
    if (autoscaling != nullptr) scope.emplace(*autoscaling, /*inference*/ true);
    using constant = ad::var<float, pow2_scale, Strategy>;
    const mlp<constant> p{params.w1, params.b1, params.w2, params.b2, params.w3, params.b3};
    return forward(p, constant(x)).value().value();
}

}  // namespace fashion
