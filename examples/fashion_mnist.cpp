// Train a 784-512-512-10 ReLU MLP on Fashion-MNIST with SGD (lr 0.1, batch 128, inputs / 255) in
// float32, scaled fp16, scaled fp8 (E4M3 weights and activations forward, E5M2 gradients,
// per-tensor current scaling) or unscaled fp8 (the same casts at scale 1).
//
//   fashion_mnist --mode <fp32|fp16|fp8|fp8-unscaled> --epochs <N> --loss-weight <W> --seed <S>
//                 [--train-limit N] [--data DIR] [--min-accuracy A] [--max-accuracy A]
//
// --loss-weight W multiplies the loss by W and divides the learning rate by W: the same training
// in exact arithmetic, and a classic underflow stress for narrow gradient formats. W may be
// written 2^-14. Weights keep a float32 master copy; every step casts them to the forward format.
#include <scalify/scalify.hpp>

#include <fmt/format.h>
#include <zlib.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using namespace scalify;

namespace {

constexpr const char* default_data_dir = "/usr/share/datasets/fashion-mnist";

// ---- data ----------------------------------------------------------------------------------

struct dataset {
    xt::xarray<float> images;  // n x 784, in [0, 1]
    std::vector<std::uint8_t> labels;
};

std::vector<unsigned char> read_gz(const std::string& path)
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

std::uint32_t big_endian(const std::vector<unsigned char>& b, std::size_t at)
{
    if (at + 4 > b.size()) throw std::runtime_error("IDX header truncated");
    return (std::uint32_t(b[at]) << 24) | (std::uint32_t(b[at + 1]) << 16) | (std::uint32_t(b[at + 2]) << 8) | b[at + 3];
}

dataset load(const std::string& dir, const std::string& prefix, std::size_t limit)
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

// ---- precision modes --------------------------------------------------------------------------

using farray = ScaledArray<float, pow2_scale>;

struct options {
    std::string mode = "fp32";
    int epochs = 10;
    double loss_weight = 1.0;
    std::string loss_weight_text = "1";
    unsigned seed = 0;
    std::size_t train_limit = 60000;
    std::string data = default_data_dir;
    double min_accuracy = 0.0;
    double max_accuracy = 1.0;  ///< for checks that a run collapses
};

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

double accuracy(const xt::xarray<float>& logits, const std::vector<std::uint8_t>& labels, std::size_t offset)
{
    std::size_t correct = 0;
    for (std::size_t b = 0; b < logits.shape()[0]; ++b) {
        std::size_t best = 0;
        for (std::size_t c = 1; c < logits.shape()[1]; ++c) best = logits(b, c) > logits(b, best) ? c : best;
        correct += best == labels[offset + b] ? 1 : 0;
    }
    return static_cast<double>(correct);
}

xt::xarray<float> rows_of(const xt::xarray<float>& x, const std::vector<std::size_t>& order, std::size_t first, std::size_t count)
{
    xt::xarray<float> out = xt::xarray<float>::from_shape({count, x.shape()[1]});
    const std::size_t width = x.shape()[1];
    for (std::size_t i = 0; i < count; ++i) std::copy_n(x.data() + order[first + i] * width, width, out.data() + i * width);
    return out;
}

template <class F, class G>
int train(const options& opt, bool scaled)
{
    const dataset train_set = load(opt.data, "train", opt.train_limit);
    const dataset test_set = load(opt.data, "t10k", 10000);
    mlp model(opt.seed);
    const trainer<F, G> recipe{scaled};
    constexpr std::size_t batch = 128;
    const float lr = static_cast<float>(0.1 / opt.loss_weight);
    std::mt19937 shuffle_rng(opt.seed + 1);
    std::vector<std::size_t> order(train_set.labels.size());
    std::iota(order.begin(), order.end(), 0);
    std::vector<xt::xarray<float>> dw(3), db(3);
    double test_acc = 0.0;
    double total_seconds = 0.0;

    for (int epoch = 1; epoch <= opt.epochs; ++epoch) {
        const auto start = std::chrono::steady_clock::now();
        std::shuffle(order.begin(), order.end(), shuffle_rng);
        double loss_sum = 0.0;
        std::size_t steps = 0;
        for (std::size_t first = 0; first + batch <= order.size(); first += batch, ++steps) {
            const xt::xarray<float> x = rows_of(train_set.images, order, first, batch);
            std::vector<std::uint8_t> y(batch);
            for (std::size_t i = 0; i < batch; ++i) y[i] = train_set.labels[order[first + i]];
            const auto act = recipe.forward(model, x);
            const auto ce = softmax_cross_entropy(make_scaled_array<pow2_scale>(act.logits, 1.0f), y);
            loss_sum += ce.loss;
            // The loss is multiplied by the loss weight, so is its gradient.
            const xt::xarray<float> dlogits = ce.grad.value() * static_cast<float>(opt.loss_weight);
            if (epoch == 1 && steps == 0 && !std::is_same_v<G, float>) {
                const auto stats = tensor_stats<G>(as_scaled_array<pow2_scale>(dlogits),
                                                   std::is_same_v<G, float8_e5m2> ? "e5m2" : "fp16");
                fmt::print("first-step gradient diagnostics (unscaled values): {}\n", stats);
                if (stats.underflow_fraction > 0.1) {
                    fmt::print("  warning: {:.0f}% of the loss gradient flushes to zero in {} without a scale\n",
                               100 * stats.underflow_fraction, stats.target);
                }
            }
            recipe.backward(act, dlogits, dw, db);
            for (std::size_t l = 0; l < 3; ++l) {
                model.weights[l] -= lr * dw[l];
                model.biases[l] -= lr * db[l];
            }
        }
        total_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        double correct = 0.0;
        for (std::size_t first = 0; first < test_set.labels.size(); first += 1000) {
            const std::size_t count = std::min<std::size_t>(1000, test_set.labels.size() - first);
            xt::xarray<float> x = xt::view(test_set.images, xt::range(first, first + count), xt::all());
            correct += accuracy(recipe.forward(model, x).logits, test_set.labels, first);
        }
        test_acc = correct / static_cast<double>(test_set.labels.size());
        fmt::print("epoch {:2}  train_loss={:.4f}  test_acc={:.4f}  epoch_seconds={:.1f}\n", epoch,
                   loss_sum / static_cast<double>(steps), test_acc,
                   total_seconds / epoch);
    }
    fmt::print("summary mode={} loss_weight={} epochs={} test_acc={:.4f}\n", opt.mode, opt.loss_weight_text, opt.epochs, test_acc);
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
    options opt;
    try {
        for (int i = 1; i < argc; ++i) {
            const std::string flag = argv[i];
            if (i + 1 >= argc) throw std::runtime_error("missing value after " + flag);
            const std::string value = argv[++i];
            if (flag == "--mode") opt.mode = value;
            else if (flag == "--epochs") opt.epochs = std::stoi(value);
            else if (flag == "--loss-weight") {
                opt.loss_weight = parse_weight(value);
                opt.loss_weight_text = value;
            } else if (flag == "--seed") opt.seed = static_cast<unsigned>(std::stoul(value));
            else if (flag == "--train-limit") opt.train_limit = std::stoul(value);
            else if (flag == "--data") opt.data = value;
            else if (flag == "--min-accuracy") opt.min_accuracy = std::stod(value);
            else if (flag == "--max-accuracy") opt.max_accuracy = std::stod(value);
            else throw std::runtime_error("unknown option " + flag);
        }
        if (!(opt.loss_weight > 0.0) || !std::isfinite(opt.loss_weight)) throw std::runtime_error("--loss-weight must be > 0");
        if (opt.mode == "fp32") return train<float, float>(opt, false);
        if (opt.mode == "fp16") return train<Eigen::half, Eigen::half>(opt, true);
        if (opt.mode == "fp8") return train<float8_e4m3fn, float8_e5m2>(opt, true);
        if (opt.mode == "fp8-unscaled") return train<float8_e4m3fn, float8_e5m2>(opt, false);
        throw std::runtime_error("--mode must be fp32, fp16, fp8 or fp8-unscaled, got " + opt.mode);
    } catch (const std::exception& e) {
        fmt::print(stderr, "fashion_mnist: {}\n", e.what());
        return 2;
    }
}
