// Train a 784-512-512-10 ReLU MLP on Fashion-MNIST with SGD (lr 0.1, batch 128, inputs / 255),
// the model written once (fashion_mnist.hpp) and differentiated by scalify's autodiff. Modes:
//   fp32          float32 reference
//   fp16, bf16    scalify's method: unit-scaling rules, scales propagated through forward and
//                 backward, matmul operands and cotangents cast to fp16 / bf16 at their scales
//   fp8           the same with E4M3 forward and E5M2 gradients; no loss scaler
//   fp8-current   per-tensor current scaling (amax) at every cast, TransformerEngine style
//   fp8-unscaled  the same casts at scale 1: plain fp8
//   fp8-autoscale AutoScale (docs/scaling_over_time.md): each matmul's forward and backward products
//                 hold a propagation scale, on_off(1/3, 1/20); prints the per-op report at the end
//
//   fashion_mnist --mode M --epochs N --loss-weight W --seed S [--accumulate GPU]
//                 [--train-limit N] [--data DIR] [--min-accuracy A] [--max-accuracy A]
//                 [--autoscale-history FILE]   (fp8-autoscale: the scale history as CSV)
//                 [--autoscale-strategy on-off|conservative]   (fp8-autoscale; default on-off)
//                 [--wire storage|fp32|fp16|bf16|e4m3|e5m2] [--check-replicas]   (under mpirun)
//                 [--inspect[=FILE.csv]]
//
// --inspect runs one step (the first batch of the first epoch) under the mode with ad::inspect
// and prints its report instead of training: every op's output and cotangent (type, scale, data
// RMS, amax, zeros, subnormals, saturation) and the mode's matmul casts (E4M3 operands, E5M2
// cotangents, their scales, how much flushed to zero); =FILE.csv also writes it as CSV
// (tools/inspect_scales.gp plots that; docs/inspect.md).
//
// Under mpirun (built with MPI: docs/distributed.md) each rank trains on its share of every
// global batch of 128 and the gradients are averaged across ranks (dist::all_reduce_gradients,
// crossing as --wire: each gradient's own type by default); every scale decision is taken over
// the global batch. Rank 0 prints. --check-replicas asserts after every step that all ranks hold
// the same parameters and scales.
//
// --accumulate picks how the matmuls (forward and backward) accumulate: exact float32 (default),
// or as a GPU's tensor cores do for each operand pair (v100, a100, ada, h100, h100-fast, b200, amx,
// b200-f8f6f4, mi100, mi250, mi300; h100: cuBLASLt's fp8 partial sums promoted to float32 every
// 128 products, h100-fast: one fp8 chain, use_fast_accum=True; b200-f8f6f4: fp8 on tcgen05.mma;
// "+tf32" after a GPU with a tf32 unit runs float32 products as tf32, as xf32 on the mi300);
// see docs/tensor_core.md, "matmul's accumulation model".
//
// --loss-weight W multiplies the loss by W and divides the learning rate by W: the same training
// in exact arithmetic, and a classic underflow stress for narrow gradient formats (W may be
// written 2^-14). Parameters are float32 masters (ScaledArray<float, pow2_scale>); the recipe
// casts them at each matmul.
#include "fashion_mnist.hpp"

#ifdef SCALIFY_HAS_MPI
#include <scalify/dist/mpi.hpp>
#endif

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <optional>
#include <utility>

using namespace scalify;
using namespace fashion;

namespace {

struct options {
    std::string mode = "fp32";
    int epochs = 10;
    double loss_weight = 1.0;
    std::string loss_weight_text = "1";
    unsigned seed = 0;
    std::string accumulate = "exact";
    std::size_t train_limit = 60000;
    std::string data = default_data_dir;
    double min_accuracy = 0.0;
    double max_accuracy = 1.0;  ///< for checks that a run collapses
    std::string autoscale_history;  ///< fp8-autoscale: write the scale history here (CSV)
    bool autoscale_conservative = false;  ///< fp8-autoscale: every op on (the default strategy) instead of on_off
    std::string wire = "storage";  ///< under mpirun: the type gradients cross as
    bool check_replicas = false;   ///< under mpirun: assert identical replicas after every step
    bool inspect = false;          ///< --inspect: report one step instead of training
    std::string inspect_csv;       ///< --inspect=FILE: also write the report there as CSV
};

/// --wire: nothing for each gradient's own type, else a dtype.
std::optional<dtype> parse_wire(const std::string& name)
{
    if (name == "storage") return std::nullopt;
    const std::pair<const char*, dtype> names[] = {{"fp32", dtype::float32}, {"fp16", dtype::float16}, {"bf16", dtype::bfloat16},
                                                   {"e4m3", dtype::float8_e4m3fn}, {"e5m2", dtype::float8_e5m2}};
    for (const auto& [text, type] : names) {
        if (name == text) return type;
    }
    throw std::runtime_error("--wire must be storage, fp32, fp16, bf16, e4m3 or e5m2, got " + name);
}

double correct_predictions(const xt::xarray<float>& logits, const std::vector<std::uint8_t>& labels, std::size_t offset)
{
    std::size_t correct = 0;
    for (std::size_t b = 0; b < logits.shape()[0]; ++b) {
        std::size_t best = 0;
        for (std::size_t c = 1; c < logits.shape()[1]; ++c) best = logits(b, c) > logits(b, best) ? c : best;
        correct += best == labels[offset + b] ? 1 : 0;
    }
    return static_cast<double>(correct);
}

/// How the logits' cotangent of the first step fares in the gradient format, as the mode casts it.
void print_gradient_diagnostics(const mlp<array>& params, const array& x, const std::vector<std::uint8_t>& y,
                                const options& opt, const mode& m)
{
    const fashion::mode_scaling::scope natural(fashion::mode_scaling::index_of<natural_scaling>);
    const auto logits = fashion::predict<fashion::mode_scaling>(params, x);
    const auto ce = softmax_cross_entropy(as_scaled_array<pow2_scale>(logits), y);
    const auto cotangent = dynamic_rescale_l2(mul(ce.grad, opt.loss_weight));
    const auto cast_data = ad::detail::rescale_for_cast(cotangent, m.scaling, format_range_of(m.gradient).max).data();
    const auto stats = tensor_stats(as_scaled_array<pow2_scale>(xt::xarray<float>(cast_data)), m.gradient, "logits gradient");
    fmt::print("first-step logits gradient as cast ({} scaling): {}\n",
               m.scaling == ad::cast_scaling::unscaled ? "no" : m.scaling == ad::cast_scaling::current ? "current" : "propagated",
               stats);
    if (stats.underflow_fraction > 0.1) {
        fmt::print("  warning: {:.0f}% of the loss gradient flushes to zero in {}\n", 100 * stats.underflow_fraction,
                   m.gradient == dtype::float8_e5m2 ? "e5m2" : stats.target);
    }
}

/// --inspect: the first step's report (ad::inspect) on `x`, `y`, printed by rank 0; nothing is
/// trained.
template <class Strategy>
int inspect_step(const options& opt, const mlp<array>& params, const array& x, const std::vector<std::uint8_t>& y,
                 autoscale::scaling_context<pow2_scale>* autoscaling, bool speaker)
{
    std::optional<autoscale::graph_scope<pow2_scale>> step;
    if (autoscaling != nullptr) step.emplace(*autoscaling);
    const auto inspected = ad::inspect<Strategy>(ad::inspect_options{{"w1", "b1", "w2", "b2", "w3", "b3"}},
                                                 [&](const auto& p) { return objective(p, x, y, opt.loss_weight); }, params);
    if (!speaker) return 0;
    fmt::print("inspect: one step on the first batch ({} rows, seed {}, loss weight {})\n{}", x.shape()[0], opt.seed,
               opt.loss_weight_text, inspected.report);
    if (!opt.inspect_csv.empty()) {
        inspected.report.write_csv(opt.inspect_csv);
        fmt::print("wrote {}\n", opt.inspect_csv);
    }
    return 0;
}

template <class Strategy>
int train(const options& opt, const mode& m)
{
    const dataset train_set = load(opt.data, "train", opt.train_limit);
    mlp<array> params = initial_parameters(opt.seed, m.unit_scaled);
    const auto rules = fashion::scaling_of(m);
    const ad::matmul_precision_scope recipe(m.forward, m.gradient, m.scaling);
    const tensor_core::accumulation_scope<> accumulation(opt.accumulate);
    constexpr std::size_t batch = 128;
    const ad::sgd optimizer(0.1 / opt.loss_weight);
    auto autoscaling = autoscale_context(opt.autoscale_conservative);
    const bool autoscaled = fashion::is_autoscaled(m);
    auto* const context = autoscaled ? &autoscaling : nullptr;
    // Data parallel (under mpirun): every rank shuffles alike and takes its rows of each batch.
    dist::reducer& world = dist::current_reducer();
    const auto ranks = static_cast<std::size_t>(world.size());
    const auto rank = static_cast<std::size_t>(world.rank());
    const bool speaker = rank == 0;
    if (batch % ranks != 0) throw std::runtime_error(fmt::format("the global batch of {} does not split over {} ranks", batch, ranks));
    const std::size_t local_batch = batch / ranks;
    fashion::data_parallel parallel;
    parallel.reduce.wire = parse_wire(opt.wire);
    parallel.check_replicas = opt.check_replicas;
    std::size_t total_steps = 0;
    std::mt19937 shuffle_rng(opt.seed + 1);
    std::vector<std::size_t> order(train_set.labels.size());
    std::iota(order.begin(), order.end(), 0);
    if (opt.inspect) {
        std::shuffle(order.begin(), order.end(), shuffle_rng);  // the first epoch's first batch
        const std::size_t mine = rank * local_batch;
        const array x = as_scaled_array<pow2_scale>(rows_of(train_set.images, order, mine, local_batch));
        std::vector<std::uint8_t> y(local_batch);
        for (std::size_t i = 0; i < local_batch; ++i) y[i] = train_set.labels[order[mine + i]];
        return inspect_step<Strategy>(opt, params, x, y, context, speaker);
    }
    const dataset test_set = load(opt.data, "t10k", 10000);
    double test_acc = 0.0;
    double total_seconds = 0.0;

    for (int epoch = 1; epoch <= opt.epochs; ++epoch) {
        const auto start = std::chrono::steady_clock::now();
        std::shuffle(order.begin(), order.end(), shuffle_rng);
        double loss_sum = 0.0;
        std::size_t steps = 0;
        for (std::size_t first = 0; first + batch <= order.size(); first += batch, ++steps) {
            const std::size_t mine = first + rank * local_batch;
            const array x = as_scaled_array<pow2_scale>(rows_of(train_set.images, order, mine, local_batch));
            std::vector<std::uint8_t> y(local_batch);
            for (std::size_t i = 0; i < local_batch; ++i) y[i] = train_set.labels[order[mine + i]];
            if (epoch == 1 && steps == 0 && m.gradient != dtype::float32 && speaker) {
                const dist::reduction_scope alone(dist::single_process_reducer());  // rank 0's rows, told by rank 0
                print_gradient_diagnostics(params, x, y, opt, m);
            }
            if (autoscaled && epoch == opt.epochs && first + 2 * batch > order.size()) autoscaling.final_check();
            loss_sum += train_step<Strategy>(params, x, y, opt.loss_weight, optimizer, context, &parallel) / opt.loss_weight;
        }
        total_steps += steps;
        total_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        loss_sum = world.sum(loss_sum) / static_cast<double>(ranks);
        // Test batches of 1000 round-robin over the ranks, each decided alone (as one process
        // decides per batch), the correct counts summed.
        double correct = 0.0;
        {
            const dist::reduction_scope alone(dist::single_process_reducer());
            for (std::size_t first = rank * 1000; first < test_set.labels.size(); first += 1000 * ranks) {
                const std::size_t count = std::min<std::size_t>(1000, test_set.labels.size() - first);
                const array x = as_scaled_array<pow2_scale>(xt::xarray<float>(xt::view(test_set.images, xt::range(first, first + count), xt::all())));
                correct += correct_predictions(fashion::predict<Strategy>(params, x, context), test_set.labels, first);
            }
        }
        correct = world.sum(correct);
        test_acc = correct / static_cast<double>(test_set.labels.size());
        if (speaker) {
            fmt::print("epoch {:2}  train_loss={:.4f}  test_acc={:.4f}  epoch_seconds={:.2f}\n", epoch,
                       loss_sum / static_cast<double>(steps), test_acc, total_seconds / epoch);
        }
    }
    if (ranks > 1 && speaker) {
        const auto traffic = world.traffic();
        const auto& r = parallel.last;
        const double per_step = static_cast<double>(traffic.payload_bytes) / static_cast<double>(total_steps);
        fmt::print("data parallel: {} ranks x {} rows; rank 0 sent {:.0f} bytes per step in {:.1f} collectives{}: gradient data {} "
                   "bytes on the wire ({}), {} bytes in their storage types, {} elements; per step / storage = {:.4f}\n",
                   ranks, local_batch, per_step, static_cast<double>(traffic.collectives) / static_cast<double>(total_steps),
                   opt.check_replicas ? " (replica checks included)" : "", r.wire_bytes, opt.wire, r.storage_bytes, r.elements,
                   per_step / static_cast<double>(r.storage_bytes));
    }
    if (autoscaled && speaker) {
        fmt::print("{}", autoscaling.report());
        if (!opt.autoscale_history.empty()) {
            std::ofstream csv(opt.autoscale_history);
            autoscaling.report().write_history_csv(csv);
        }
    }
    if (!speaker) return test_acc < opt.min_accuracy || test_acc > opt.max_accuracy ? 1 : 0;
    fmt::print("summary mode={} loss_weight={} epochs={} test_acc={:.4f}{}{}\n", opt.mode, opt.loss_weight_text, opt.epochs,
               test_acc, opt.accumulate == "exact" ? "" : " accumulate=" + opt.accumulate,
               ranks == 1 ? "" : fmt::format(" ranks={} wire={}", ranks, opt.wire));
    if (test_acc < opt.min_accuracy) {
        fmt::print("test accuracy {:.4f} is below the required {:.4f}\n", test_acc, opt.min_accuracy);
        return 1;
    }
    if (test_acc > opt.max_accuracy) {
        fmt::print("test accuracy {:.4f} is above the expected {:.4f}\n", test_acc, opt.max_accuracy);
        return 1;
    }
    return 0;
}

double parse_weight(const std::string& text)
{
    if (text.rfind("2^", 0) == 0) return std::ldexp(1.0, std::stoi(text.substr(2)));
    return std::stod(text);
}

}  // namespace

int main(int argc, char** argv)
{
    // Each step frees and allocates the same temporaries: keep them mapped (runtime.hpp).
    scalify::retain_freed_memory();
    options opt;
#ifdef SCALIFY_HAS_MPI
    // Launched by mpirun: the ranks of MPI_COMM_WORLD reduce every scale decision and gradient.
    std::optional<dist::mpi_session> mpi;
    std::optional<dist::mpi_reducer> world;
    std::optional<dist::reduction_scope> across_ranks;
#endif
    try {
#ifdef SCALIFY_HAS_MPI
        if (dist::launched_by_mpi()) {
            mpi.emplace(argc, argv);
            world.emplace();
            across_ranks.emplace(*world);
        }
#endif
        for (int i = 1; i < argc; ++i) {
            const std::string flag = argv[i];
            if (flag == "--check-replicas") {
                opt.check_replicas = true;
                continue;
            }
            if (examples::read_inspect_flag(flag, opt.inspect, opt.inspect_csv)) continue;
            if (i + 1 >= argc) throw std::runtime_error("missing value after " + flag);
            const std::string value = argv[++i];
            if (flag == "--mode") opt.mode = value;
            else if (flag == "--epochs") opt.epochs = std::stoi(value);
            else if (flag == "--loss-weight") {
                opt.loss_weight = parse_weight(value);
                opt.loss_weight_text = value;
            } else if (flag == "--seed") opt.seed = static_cast<unsigned>(std::stoul(value));
            else if (flag == "--accumulate") opt.accumulate = to_string(examples::parse_accumulate(value));
            else if (flag == "--train-limit") opt.train_limit = std::stoul(value);
            else if (flag == "--data") opt.data = value;
            else if (flag == "--min-accuracy") opt.min_accuracy = std::stod(value);
            else if (flag == "--max-accuracy") opt.max_accuracy = std::stod(value);
            else if (flag == "--autoscale-history") opt.autoscale_history = value;
            else if (flag == "--wire") opt.wire = value;
            else if (flag == "--autoscale-strategy") {
                if (value != "on-off" && value != "conservative")
                    throw std::runtime_error("--autoscale-strategy must be on-off or conservative, got " + value);
                opt.autoscale_conservative = value == "conservative";
            }
            else throw std::runtime_error("unknown option " + flag);
        }
        if (!(opt.loss_weight > 0.0) || !std::isfinite(opt.loss_weight)) throw std::runtime_error("--loss-weight must be > 0");
        const mode& m = find_mode(opt.mode);
        (void)parse_wire(opt.wire);
        if (dist::current_reducer().rank() == 0) fmt::print("mode {}: {}\n", m.name, m.about);
        return train<fashion::mode_scaling>(opt, m);
    } catch (const std::exception& e) {
        fmt::print(stderr, "fashion_mnist: {}\n", e.what());
#ifdef SCALIFY_HAS_MPI
        if (world) MPI_Abort(world->communicator(), 2);  // the other ranks may wait in a collective
#endif
        return 2;
    }
}
