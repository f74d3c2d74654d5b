// Training throughput (issues 14 and 16): the Fashion-MNIST MLP (784-512-512-10, batch 128, SGD
// lr 0.1) trained for a fixed number of steps in every mode, in one process, one thread count:
//
//   eigen-gemms   the matrix products alone: the 8 Eigen sgemms one autodiff step needs (3 forward,
//                 3 weight gradients, 2 input gradients; 192.2 GFLOP per epoch) into preallocated
//                 matrices, transposes as Eigen expressions: the floor for the modes below
//   hand-fp32     the hand-written float32 trainer of commit 1140f31 (examples/fashion_mnist.cpp
//                 then), copied below as the reference the overhead ratio is measured against
//   fp32 ...      the model written once (examples/fashion_mnist.hpp) through ad::value_and_grad,
//                 in the example's modes fp32, fp16, bf16, fp8, fp8-current, fp8-unscaled, fp8-autoscale
//                 (the default list: all but fp8-unscaled)
//
// A plain timed program, not Google Benchmark: one measurement is seconds long (an epoch is 468
// steps), the modes must share data, order and thread count, and the PyTorch figure comes from
// another process (benchmarks/pytorch_mlp.py). Modes run round-robin, --repeat times, so a burst
// of load from elsewhere hits every mode alike; the table reports the minimum and the median of
// the seconds, and "/hand-fp32" is the median over rounds of a mode's time over hand-fp32's in the
// same round (the overhead ratio); "/PyTorch" divides the minimum by PyTorch's figure.
//
//   bench_training [--steps N] [--warmup N] [--repeat N] [--threads N] [--modes a,b,...]
//                  [--pytorch-fp32 SECONDS | --pytorch-file FILE] [--reset-peak-rss] [--seed S] [--data DIR]
//
// --steps defaults to a full epoch (468); fewer steps are scaled to seconds per epoch. --threads
// sets OpenMP's (and so Eigen's) thread count; without it OMP_NUM_THREADS decides. --pytorch-file
// reads the `pytorch_mlp threads=N seconds_per_epoch=S ...` lines pytorch_mlp.py prints (the one
// with this run's thread count). GFLOP/s count the model's 3 x forward FLOPs per step (the usual
// forward + backward convention, 240.3 GFLOP per epoch) for every mode, so they compare as times do.
// With --reset-peak-rss the kernel's peak-RSS mark is restarted before each run, so "run MiB" is
// the peak of that run, the float32 training set (180 MiB) included, not the loader's (235 MiB);
// it also hides the loader's peak from /usr/bin/time -v, so measure the process peak without it.
#include "../examples/fashion_mnist.hpp"

#include <Eigen/Core>
#include <sys/resource.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

// ---- the hand-written float32 trainer of commit 1140f31 ----------------------------------------
// Copied from `git show 1140f31:examples/fashion_mnist.cpp` (quantize, mlp, trainer and the body
// of train's step loop), unchanged but for the namespace and the step loop's body moved into
// step(). Its data loader and rows_of are the ones fashion_mnist.hpp now holds (the same code);
// the first-step gradient diagnostics it printed for non-float gradient types are left out (dead
// code for fp32, the mode measured here).
namespace hand_written {

using namespace scalify;

using farray = ScaledArray<float, pow2_scale>;

/// Casts into T: per-tensor current scaling (pow2 multiplier from the amax) when scaled, else at
/// scale 1; saturating, as the fp8 recipes cast.
template <class T>
ScaledArray<T, pow2_scale> quantize(const xt::xarray<float>& x, bool scaled)
{
    if (scaled) return current_scaling<T>{}.template quantize<pow2_scale>(x);
    return cast<T, round_nearest_even, saturate_finite>(as_scaled_array<pow2_scale>(x));
}

struct mlp {
    std::vector<xt::xarray<float>> weights, biases;  // float32 master copies

    explicit mlp(unsigned seed)
    {
        std::mt19937 rng(seed);
        const std::size_t sizes[] = {784, 512, 512, 10};
        for (int l = 0; l < 3; ++l) {
            // PyTorch's nn.Linear default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases.
            const float bound = 1.0f / std::sqrt(static_cast<float>(sizes[l]));
            std::uniform_real_distribution<float> uniform(-bound, bound);
            xt::xarray<float> w = xt::xarray<float>::from_shape({sizes[l], sizes[l + 1]});
            xt::xarray<float> b = xt::xarray<float>::from_shape({sizes[l + 1]});
            for (auto& e : w) e = uniform(rng);
            for (auto& e : b) e = uniform(rng);
            weights.push_back(std::move(w));
            biases.push_back(std::move(b));
        }
    }
};

/// One precision recipe: forward type F, gradient type G, scaled or not.
template <class F, class G>
struct trainer {
    bool scaled;

    template <class T>
    static farray as_float(const ScaledArray<T, pow2_scale>& a) { return cast<float>(a); }

    /// Forward pass: per layer the quantized input and weights (kept for the backward pass) and
    /// the pre-activation values.
    struct activations {
        std::vector<ScaledArray<F, pow2_scale>> inputs, weights;
        std::vector<xt::xarray<float>> pre;  // before relu
        xt::xarray<float> logits;
    };

    activations forward(const mlp& model, const xt::xarray<float>& x) const
    {
        activations act;
        xt::xarray<float> h = x;
        for (std::size_t l = 0; l < 3; ++l) {
            act.inputs.push_back(quantize<F>(h, scaled));
            act.weights.push_back(quantize<F>(model.weights[l], scaled));
            // float32 accumulation of the low-precision operands; value = data * scale.
            xt::xarray<float> z = matmul<natural_scaling, float>(act.inputs[l], act.weights[l]).value();
            z += model.biases[l];
            if (l < 2) {
                act.pre.push_back(z);
                h = xt::maximum(z, 0.0f);
            } else {
                act.logits = std::move(z);
            }
        }
        return act;
    }

    /// Gradients of the (weighted) loss for every weight and bias, in float32.
    void backward(const activations& act, const xt::xarray<float>& dlogits, std::vector<xt::xarray<float>>& dw,
                  std::vector<xt::xarray<float>>& db) const
    {
        xt::xarray<float> g = dlogits;
        for (std::size_t l = 3; l-- > 0;) {
            db[l] = xt::sum(g, {0});
            const auto gq = quantize<G>(g, scaled);  // the gradient in its narrow format
            const auto grads = matmul_vjp<natural_scaling, float>(gq, act.inputs[l], act.weights[l]);
            dw[l] = grads.second.value();
            if (l > 0) {
                const xt::xarray<float> dh = grads.first.value();
                g = xt::where(act.pre[l - 1] > 0.0f, dh, 0.0f);  // relu's backward rule
            }
        }
    }
};

/// One step of 1140f31's train loop (forward, loss, backward, update); returns the unweighted loss.
template <class F, class G>
double step(mlp& model, const trainer<F, G>& recipe, const xt::xarray<float>& x, const std::vector<std::uint8_t>& y,
            double loss_weight, float lr, std::vector<xt::xarray<float>>& dw, std::vector<xt::xarray<float>>& db)
{
    const auto act = recipe.forward(model, x);
    const auto ce = softmax_cross_entropy(make_scaled_array<pow2_scale>(act.logits, 1.0f), y);
    // The loss is multiplied by the loss weight, so is its gradient.
    const xt::xarray<float> dlogits = ce.grad.value() * static_cast<float>(loss_weight);
    recipe.backward(act, dlogits, dw, db);
    for (std::size_t l = 0; l < 3; ++l) {
        model.weights[l] -= lr * dw[l];
        model.biases[l] -= lr * db[l];
    }
    return ce.loss;
}

}  // namespace hand_written

// ---- the benchmark -------------------------------------------------------------------------------

namespace {

using namespace scalify;

constexpr std::size_t batch = 128;
constexpr std::size_t epoch_steps = 60000 / batch;  // 468, as the example's loop runs
constexpr std::size_t layer_sizes[] = {784, 512, 512, 10};

/// FLOPs of one forward pass of a batch (the three products; bias and activation are O(n)).
constexpr double forward_flops()
{
    double f = 0;
    for (int l = 0; l < 3; ++l) f += 2.0 * batch * double(layer_sizes[l]) * double(layer_sizes[l + 1]);
    return f;
}
/// The products one step needs: forward, every weight gradient, the input gradients of layers 2
/// and 3 (the first layer's input is data).
constexpr double needed_flops()
{
    return 3 * forward_flops() - 2.0 * batch * double(layer_sizes[0]) * double(layer_sizes[1]);
}

struct options {
    std::size_t steps = epoch_steps;
    std::size_t warmup = 5;
    int repeat = 1;
    int threads = 0;  ///< 0: OpenMP's default (OMP_NUM_THREADS)
    std::vector<std::string> modes{"eigen-gemms", "hand-fp32", "fp32", "fp16", "bf16", "fp8", "fp8-current", "fp8-autoscale"};
    std::optional<double> pytorch_fp32;
    std::string pytorch_file;
    bool reset_peak_rss = false;  ///< restart the kernel's peak-RSS mark before each run
    unsigned seed = 0;
    std::string data = fashion::default_data_dir;
};

/// The batches of one epoch in a fixed shuffled order, built once (every mode trains on the same
/// steps); building a batch is inside the timed loop, as in the example.
struct batches {
    const fashion::dataset& set;
    std::vector<std::size_t> order;

    batches(const fashion::dataset& s, unsigned seed) : set(s), order(s.labels.size())
    {
        std::iota(order.begin(), order.end(), std::size_t{0});
        std::mt19937 shuffle_rng(seed + 1);
        std::shuffle(order.begin(), order.end(), shuffle_rng);
    }
    [[nodiscard]] std::size_t first_of(std::size_t step) const { return (step % (order.size() / batch)) * batch; }
    [[nodiscard]] xt::xarray<float> images(std::size_t step) const
    {
        return fashion::rows_of(set.images, order, first_of(step), batch);
    }
    [[nodiscard]] std::vector<std::uint8_t> labels(std::size_t step) const
    {
        std::vector<std::uint8_t> y(batch);
        for (std::size_t i = 0; i < batch; ++i) y[i] = set.labels[order[first_of(step) + i]];
        return y;
    }
};

/// Result of one timed run: seconds for the timed steps, the mean loss over them, and the share
/// of the machine's CPU time that other processes used meanwhile (-1 when unknown).
struct run_result {
    double seconds = 0;
    double mean_loss = 0;
    double others = -1;
    double peak_mib = -1;  ///< peak RSS from the start of the run (VmHWM after a reset), -1 when unknown
};

using clock_type = std::chrono::steady_clock;

/// CPU seconds the whole machine (/proc/stat, all cores, steal included) and this process have
/// spent so far: the machine is shared, and what others take during a run is part of its result.
struct cpu_sample {
    double machine = -1;
    double self = 0;
};

cpu_sample sample_cpu()
{
    cpu_sample s;
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    s.self = double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + 1e-6 * double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
    std::ifstream stat("/proc/stat");
    std::string cpu;
    double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    if (stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal && cpu == "cpu") {
        s.machine = (user + nice + system + irq + softirq + steal) / double(sysconf(_SC_CLK_TCK));
    }
    return s;
}

/// Restarts the kernel's peak-RSS mark (VmHWM), so that it measures what follows alone (the data
/// loader's peak, 235 MiB, would hide a training step's); false where Linux does not offer it.
bool reset_peak_rss()
{
    std::ofstream clear("/proc/self/clear_refs");
    return clear && (clear << "5").flush();
}

/// VmHWM in MiB (-1 when unknown).
double peak_rss_mib()
{
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);) {
        if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
    }
    return -1;
}

/// Others' share of the machine's CPU time between two samples `seconds` apart.
double others_share(const cpu_sample& a, const cpu_sample& b, double seconds)
{
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (a.machine < 0 || b.machine < 0 || seconds <= 0 || cores < 1) return -1;
    return std::clamp(((b.machine - a.machine) - (b.self - a.self)) / (seconds * double(cores)), 0.0, 1.0);
}

/// Runs warmup untimed steps then `steps` timed ones of `step(i)` (returning the loss).
template <class Step>
run_result timed(const options& opt, Step&& step)
{
    for (std::size_t i = 0; i < opt.warmup; ++i) (void)step(i);
    double loss = 0;
    const cpu_sample before = sample_cpu();
    const auto start = clock_type::now();
    for (std::size_t i = 0; i < opt.steps; ++i) loss += step(opt.warmup + i);
    const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
    return {seconds, loss / double(opt.steps), others_share(before, sample_cpu(), seconds), -1};
}

run_result run_eigen_gemms(const options& opt)
{
    using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    const auto n = [](std::size_t i) { return static_cast<Eigen::Index>(layer_sizes[i]); };
    const auto b = static_cast<Eigen::Index>(batch);
    std::vector<matrix> w, dw, z, g, dh;
    matrix x = matrix::Random(b, n(0));
    for (int l = 0; l < 3; ++l) {
        w.push_back(matrix::Random(n(l), n(l + 1)) * 0.05f);
        dw.push_back(matrix(n(l), n(l + 1)));
        z.push_back(matrix(b, n(l + 1)));
        g.push_back(matrix::Random(b, n(l + 1)));
        dh.push_back(matrix(b, n(l)));
    }
    return timed(opt, [&](std::size_t) {
        z[0].noalias() = x * w[0];
        z[1].noalias() = z[0] * w[1];
        z[2].noalias() = z[1] * w[2];
        for (int l = 2; l >= 0; --l) {
            dw[l].noalias() = (l == 0 ? x : z[l - 1]).transpose() * g[l];
            if (l > 0) dh[l].noalias() = g[l] * w[l].transpose();
        }
        return 0.0;
    });
}

run_result run_hand_fp32(const options& opt, const batches& data)
{
    hand_written::mlp model(opt.seed);
    const hand_written::trainer<float, float> recipe{false};
    const float lr = 0.1f;
    std::vector<xt::xarray<float>> dw(3), db(3);
    return timed(opt, [&](std::size_t i) {
        const xt::xarray<float> x = data.images(i);
        const auto y = data.labels(i);
        return hand_written::step(model, recipe, x, y, 1.0, lr, dw, db);
    });
}

template <class Strategy>
run_result run_autodiff(const options& opt, const batches& data, const fashion::mode& m)
{
    fashion::mlp<fashion::array> params = fashion::initial_parameters(opt.seed, m.unit_scaled);
    const ad::matmul_precision_scope recipe(m.forward, m.gradient, m.scaling);
    const ad::sgd optimizer(0.1);
    auto autoscaling = fashion::autoscale_context();  // fp8-autoscale only
    auto* const context = std::same_as<Strategy, fashion::autoscale_strategy> ? &autoscaling : nullptr;
    return timed(opt, [&](std::size_t i) {
        const fashion::array x = as_scaled_array<pow2_scale>(data.images(i));
        const auto y = data.labels(i);
        return fashion::train_step<Strategy>(params, x, y, 1.0, optimizer, context);
    });
}

run_result run_mode(const options& opt, const batches& data, const std::string& name)
{
    if (name == "eigen-gemms") return run_eigen_gemms(opt);
    if (name == "hand-fp32") return run_hand_fp32(opt, data);
    const fashion::mode& m = fashion::find_mode(name);
    if (m.name == "fp8-autoscale") return run_autodiff<fashion::autoscale_strategy>(opt, data, m);
    return m.unit_scaled ? run_autodiff<unit_scaling>(opt, data, m) : run_autodiff<natural_scaling>(opt, data, m);
}

std::vector<std::string> split(const std::string& list)
{
    std::vector<std::string> out;
    std::stringstream in(list);
    for (std::string item; std::getline(in, item, ',');) {
        if (!item.empty()) out.push_back(item);
    }
    return out;
}

/// The seconds per epoch pytorch_mlp.py reported for `threads` (its last such line), if any.
std::optional<double> read_pytorch_file(const std::string& path, int threads)
{
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot read --pytorch-file " + path);
    std::optional<double> found;
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("pytorch_mlp ", 0) != 0) continue;
        std::map<std::string, std::string> fields;
        std::stringstream words(line);
        for (std::string word; words >> word;) {
            const auto eq = word.find('=');
            if (eq != std::string::npos) fields[word.substr(0, eq)] = word.substr(eq + 1);
        }
        if (fields.count("threads") && fields.count("seconds_per_epoch") && std::stoi(fields["threads"]) == threads) {
            found = std::stod(fields["seconds_per_epoch"]);
        }
    }
    return found;
}

[[nodiscard]] double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    const std::size_t h = v.size() / 2;
    return v.size() % 2 == 1 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

int run(const options& opt)
{
#ifdef _OPENMP
    if (opt.threads > 0) omp_set_num_threads(opt.threads);
    const int threads = omp_get_max_threads();
#else
    if (opt.threads > 1) fmt::print("note: built without OpenMP, running on one thread\n");
    const int threads = 1;
#endif
    std::optional<double> pytorch = opt.pytorch_fp32;
    if (!pytorch && !opt.pytorch_file.empty()) pytorch = read_pytorch_file(opt.pytorch_file, threads);

    const fashion::dataset train_set = fashion::load(opt.data, "train", 60000);
    const batches data(train_set, opt.seed);
    const double epoch_flops = 3 * forward_flops() * double(epoch_steps);
    fmt::print("bench_training: {} timed steps of batch {} per run (an epoch is {}), {} warm-up steps, {} repeat(s), "
               "threads={} (Eigen {})\n",
               opt.steps, batch, epoch_steps, opt.warmup, opt.repeat, threads, Eigen::nbThreads());
    fmt::print("FLOP per epoch: {:.1f} G (3 x forward, the GFLOP/s basis); products one autodiff step needs: {:.1f} G\n",
               epoch_flops * 1e-9, needed_flops() * double(epoch_steps) * 1e-9);

    std::map<std::string, std::vector<run_result>> runs;  // seconds scaled to one epoch
    const auto load = [](double others) { return others < 0 ? std::string("?") : fmt::format("{:.0f}%", 100 * others); };
    const auto mib = [](double m, const char* label) { return m < 0 ? std::string() : fmt::format("{}{:.0f} MiB", label, m); };
    for (int r = 0; r < opt.repeat; ++r) {
        for (const auto& name : opt.modes) {
            const bool peak_reset = opt.reset_peak_rss && reset_peak_rss();
            run_result result = run_mode(opt, data, name);
            result.peak_mib = peak_rss_mib();
            if (!peak_reset) result.peak_mib = -1;  // the process's peak so far says nothing of this run
            result.seconds *= double(epoch_steps) / double(opt.steps);
            runs[name].push_back(result);
            fmt::print("  run {} {:<13} {:7.3f} s/epoch  others' CPU {}{}\n", r + 1, name, result.seconds,
                       load(result.others), mib(result.peak_mib, "  run peak RSS "));
            std::fflush(stdout);
        }
    }

    /// The fastest run of a mode (the one least disturbed by the rest of the machine).
    const auto fastest = [&](const std::string& name) -> std::optional<run_result> {
        const auto it = runs.find(name);
        if (it == runs.end()) return std::nullopt;
        return *std::min_element(it->second.begin(), it->second.end(),
                                 [](const run_result& a, const run_result& b) { return a.seconds < b.seconds; });
    };
    const auto best = [&](const std::string& name) -> std::optional<double> {
        const auto r = fastest(name);
        return r ? std::optional<double>(r->seconds) : std::nullopt;
    };
    const auto ratio = [](std::optional<double> a, std::optional<double> b) {
        return a && b ? fmt::format("{:.2f}", *a / *b) : std::string("-");
    };
    /// Median over rounds of name's time over hand-fp32's in the same round: a whole round can run
    /// slower or faster with the rest of the machine, and pairing within a round cancels that.
    const auto per_round = [&](const std::string& name) -> std::optional<double> {
        if (!runs.count(name) || !runs.count("hand-fp32")) return std::nullopt;
        std::vector<double> ratios;
        for (std::size_t i = 0; i < runs[name].size(); ++i) ratios.push_back(runs[name][i].seconds / runs["hand-fp32"][i].seconds);
        return median(ratios);
    };
    const auto formatted = [](std::optional<double> v) { return v ? fmt::format("{:.2f}", *v) : std::string("-"); };
    fmt::print("\n{:<13} {:>9} {:>9} {:>8} {:>10} {:>9} {:>10} {:>7} {:>9}\n", "mode", "s/epoch", "median", "GFLOP/s",
               "/hand-fp32", "/PyTorch", "mean loss", "others", "run MiB");
    for (const auto& name : opt.modes) {
        const run_result r = *fastest(name);
        std::vector<double> seconds;
        for (const auto& each : runs[name]) seconds.push_back(each.seconds);
        fmt::print("{:<13} {:>9.3f} {:>9.3f} {:>8.1f} {:>10} {:>9} {:>10} {:>7} {:>9}\n", name, r.seconds, median(seconds),
                   epoch_flops / r.seconds * 1e-9, formatted(per_round(name)), ratio(r.seconds, pytorch),
                   name == "eigen-gemms" ? std::string("-") : fmt::format("{:.4f}", r.mean_loss), load(r.others),
                   r.peak_mib < 0 ? std::string("-") : mib(r.peak_mib, ""));
    }
    if (pytorch) {
        fmt::print("{:<13} {:>9.3f} {:>9} {:>8.1f} {:>10} {:>9}\n", "PyTorch fp32", *pytorch, "", epoch_flops / *pytorch * 1e-9,
                   ratio(pytorch, best("hand-fp32")), "1.00");
    }
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    fmt::print("summary threads={} ad_fp32/hand_fp32={} fp32/pytorch={} fp8/pytorch={} peak_rss_mib={:.0f}\n", threads,
               formatted(per_round("fp32")), ratio(best("fp32"), pytorch), ratio(best("fp8"), pytorch),
               double(usage.ru_maxrss) / 1024.0);
    return 0;
}

}  // namespace

int main(int argc, char** argv)
{
    options opt;
    try {
        for (int i = 1; i < argc; ++i) {
            const std::string flag = argv[i];
            if (flag == "--reset-peak-rss") {
                opt.reset_peak_rss = true;
                continue;
            }
            if (i + 1 >= argc) throw std::runtime_error("missing value after " + flag);
            const std::string value = argv[++i];
            if (flag == "--steps") opt.steps = std::stoul(value);
            else if (flag == "--warmup") opt.warmup = std::stoul(value);
            else if (flag == "--repeat") opt.repeat = std::stoi(value);
            else if (flag == "--threads") opt.threads = std::stoi(value);
            else if (flag == "--modes") opt.modes = split(value);
            else if (flag == "--pytorch-fp32") opt.pytorch_fp32 = std::stod(value);
            else if (flag == "--pytorch-file") opt.pytorch_file = value;
            else if (flag == "--seed") opt.seed = static_cast<unsigned>(std::stoul(value));
            else if (flag == "--data") opt.data = value;
            else throw std::runtime_error("unknown option " + flag);
        }
        if (opt.steps == 0 || opt.repeat < 1 || opt.modes.empty()) throw std::runtime_error("--steps, --repeat and --modes must be positive");
        for (const auto& name : opt.modes) {
            if (name != "eigen-gemms" && name != "hand-fp32") (void)fashion::find_mode(name);  // fail before any run
        }
        return run(opt);
    } catch (const std::exception& e) {
        fmt::print(stderr, "bench_training: {}\n", e.what());
        return 2;
    }
}
