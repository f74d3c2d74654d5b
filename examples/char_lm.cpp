// A character-level language model: a small decoder-only transformer (pre-norm GPT: token and
// position embeddings, L blocks of causal multi-head attention and a GELU MLP, each behind a
// layer_norm and around a residual, a final layer_norm and an output matrix), trained with AdamW
// on the text of Debian's `fortunes` package (char_lm_data.hpp: a fixed split, every tenth
// fortune for validation). The model is written once as a template (forward() below) and
// differentiated by scalify's autodiff; every mode runs the same code:
//   fp32          float32 reference
//   fp16, bf16    scalify's method: unit-scaling rules, scales propagated through forward and
//                 backward, every matmul's operands and cotangents cast to fp16 / bf16 at their scales
//   fp8           the same with E4M3 forward and E5M2 gradients (the attention products too)
//   fp8-current   per-tensor current scaling (amax) at every cast, TransformerEngine style
//   fp8-unscaled  the same casts at scale 1: plain fp8
//
//   char_lm --mode M --steps N --seed S [--layers L --d-model D --heads H --context T --batch B]
//           [--learning-rate LR] [--eval-every N] [--eval-batches N] [--sample-chars N]
//           [--data DIR] [--max-val-bpc X] [--accumulate GPU] [--inspect[=FILE.csv]]
//
// Prints the train and validation loss in bits per character every --eval-every steps, a few
// sampled lines at the end, and then `summary mode=<m> steps=<N> val_bpc=<x>`. --max-val-bpc
// makes the exit status 1 when the final validation loss is above X (the ctest check).
// --accumulate GPU runs every matmul (forward, backward, the attention's products) as that GPU's
// tensor cores accumulate (tensor_core::parse_accumulation's names, as fashion_mnist takes them;
// docs/tensor_core.md, "matmul's accumulation model"); exact float32 by default.
// --inspect prints, instead of training, the report of the first step under the mode
// (ad::inspect, docs/inspect.md): every op's output and cotangent and the matmul casts the mode
// makes; =FILE.csv also writes it as CSV.
#include "char_lm_data.hpp"
#include "precision_modes.hpp"

#include <scalify/scalify.hpp>

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <limits>
#include <numbers>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

using namespace scalify;

namespace {

// ---- the model, written once ------------------------------------------------------------------

/// One pre-norm transformer block; A is a ScaledArray (parameters), an ad::var (inside
/// value_and_grad) or an ad::gradient.
template <class A>
struct block {
    A norm1_gain, norm1_bias, w_qkv, b_qkv, w_attention_out, b_attention_out;
    A norm2_gain, norm2_bias, w_fc, b_fc, w_proj, b_proj;
    template <class F>
    friend void for_each_parameter(block& self, F&& f)
    {
        f(self.norm1_gain), f(self.norm1_bias), f(self.w_qkv), f(self.b_qkv), f(self.w_attention_out), f(self.b_attention_out);
        f(self.norm2_gain), f(self.norm2_bias), f(self.w_fc), f(self.b_fc), f(self.w_proj), f(self.b_proj);
    }
};

/// What is not a block: the embeddings, the final norm and the output matrix.
template <class A>
struct ends {
    A tokens, positions, norm_gain, norm_bias, w_logits;
    template <class F>
    friend void for_each_parameter(ends& self, F&& f)
    {
        f(self.tokens), f(self.positions), f(self.norm_gain), f(self.norm_bias), f(self.w_logits);
    }
};

struct shape_config {
    std::size_t layers = 2, d_model = 128, heads = 4, context = 64, batch = 16;
};

/// Causal self-attention of x (B, T, D) over `heads` heads.
template <class Block, class X>
auto self_attention(const Block& p, const X& x, std::size_t heads)
{
    const std::size_t b = x.shape()[0], t = x.shape()[1], d = x.shape()[2], dh = d / heads;
    // Temporaries are passed on as they are: an op whose argument expires reuses its memory
    // (the reshape takes the linear layer's).
    auto qkv = split(transpose(reshape(linear(x, p.w_qkv, p.b_qkv), {b, t, 3, heads, dh}), {2, 0, 3, 1, 4}), 3);  // 3 x (1, B, H, T, dh)
    const auto part = [&](std::size_t i) { return reshape(std::move(qkv[i]), {b, heads, t, dh}); };
    const auto mixed = attention(part(0), part(1), part(2), /*causal*/ true);     // (B, H, T, dh)
    return linear(reshape(transpose(mixed, {0, 2, 1, 3}), {b, t, d}), p.w_attention_out, p.b_attention_out);
}

/// Logits (B T, V) of the next character after each of the inputs (B, T).
template <class Ends, class Blocks>
auto forward(const Ends& e, const Blocks& blocks, const xt::xarray<std::int32_t>& inputs, std::size_t heads)
{
    const std::size_t b = inputs.shape()[0], t = inputs.shape()[1];
    auto x = embedding(e.tokens, inputs) + slice(e.positions, 0, 0, t);
    for (const auto& p : blocks) {
        x = x + self_attention(p, layer_norm(x, p.norm1_gain, p.norm1_bias), heads);
        x = x + linear(gelu(linear(layer_norm(x, p.norm2_gain, p.norm2_bias), p.w_fc, p.b_fc)), p.w_proj, p.b_proj);
    }
    const auto logits = matmul(layer_norm(x, e.norm_gain, e.norm_bias), e.w_logits);
    return reshape(logits, {b * t, e.w_logits.shape()[1]});
}

/// Mean cross-entropy (nats) of the next characters. The logits' cotangent is brought back to
/// unit RMS (scalify's one dynamic rescale, as in the Fashion-MNIST example: its size depends on
/// how well the model fits, which no static rule knows).
template <class Ends, class Blocks>
auto objective(const Ends& e, const Blocks& blocks, const char_lm::batch& data, const std::vector<std::int32_t>& targets,
               std::size_t heads)
{
    return softmax_cross_entropy(dynamic_rescale_l2_grad(forward(e, blocks, data.inputs, heads)), targets);
}

using array = ScaledArray<float, pow2_scale>;

struct model {
    ends<array> outer;
    std::vector<block<array>> blocks;
};

/// GPT-2's initialisation: N(0, 0.02) weights and token embeddings, N(0, 0.01) positions, the
/// residual projections N(0, 0.02 / sqrt(2 L)), zero biases, unit gains. In the unit-scaled modes
/// the random tensors hold unit-RMS data and their magnitude (a power of two) in the scale, as
/// unit scaling stores parameters; zero biases start at scale 1/16, about the size the first
/// hundred Adam steps give them (a zero-valued scale 1 would swell every sum it joins).
model initial_model(const shape_config& c, std::size_t vocabulary, unsigned seed, bool unit_data)
{
    std::mt19937_64 rng(seed);
    const auto normal = [&](std::vector<std::size_t> shape, double std_dev) {
        std::normal_distribution<float> sample(0.0f, static_cast<float>(std_dev));
        xt::xarray<float> data = xt::xarray<float>::from_shape(shape);
        for (auto& v : data) v = sample(rng);
        array a = as_scaled_array<pow2_scale>(std::move(data));
        return unit_data ? dynamic_rescale_l2(a) : a;
    };
    const auto constant = [&](std::size_t n, float value) {
        xt::xarray<float> data = xt::xarray<float>::from_shape({n});
        data.fill(value);
        return array(std::move(data), value == 0.0f && unit_data ? 0.0625f : 1.0f);
    };
    const std::size_t d = c.d_model;
    const double projection = 0.02 / std::sqrt(2.0 * double(c.layers));
    model m;
    m.outer = {normal({vocabulary, d}, 0.02), normal({c.context, d}, 0.01), constant(d, 1.0f), constant(d, 0.0f),
               normal({d, vocabulary}, 0.02)};
    for (std::size_t l = 0; l < c.layers; ++l) {
        m.blocks.push_back({constant(d, 1.0f), constant(d, 0.0f), normal({d, 3 * d}, 0.02), constant(3 * d, 0.0f),
                            normal({d, d}, projection), constant(d, 0.0f), constant(d, 1.0f), constant(d, 0.0f),
                            normal({d, 4 * d}, 0.02), constant(4 * d, 0.0f), normal({4 * d, d}, projection), constant(d, 0.0f)});
    }
    return m;
}

// ---- precision modes: examples::precision_modes (precision_modes.hpp) -----------------------

using examples::find_mode;
using mode = examples::precision_mode;

// ---- training ---------------------------------------------------------------------------------

struct options {
    std::string mode = "fp32";
    std::size_t steps = 2000;
    unsigned seed = 0;
    shape_config shape;
    double learning_rate = 3e-3;
    std::size_t eval_every = 250;
    std::size_t eval_batches = 16;
    std::size_t sample_chars = 320;
    std::string data = char_lm::default_dir;
    double max_val_bpc = 0.0;  ///< 0: no check
    std::string accumulate = "exact";  ///< --accumulate: the GPU whose tensor cores the matmuls model
    bool inspect = false;      ///< --inspect: report the first step instead of training
    std::string inspect_csv;   ///< --inspect=FILE: also write the report there as CSV
};

/// The parameters as constants of Strategy (no tape): the mode's arithmetic, nothing recorded.
template <class Strategy, template <class> class S>
S<ad::var<float, pow2_scale, Strategy>> constants(const S<array>& tree)
{
    S<array> source = tree;
    std::vector<const array*> fields;
    for_each_parameter(source, [&](array& a) { fields.push_back(&a); });
    S<ad::var<float, pow2_scale, Strategy>> out;
    std::size_t i = 0;
    for_each_parameter(out, [&](ad::var<float, pow2_scale, Strategy>& v) { v = ad::var<float, pow2_scale, Strategy>(*fields[i++]); });
    return out;
}

template <class Strategy>
struct inference_model {
    ends<ad::var<float, pow2_scale, Strategy>> outer;
    std::vector<block<ad::var<float, pow2_scale, Strategy>>> blocks;
    explicit inference_model(const model& m) : outer(constants<Strategy>(m.outer))
    {
        for (const auto& b : m.blocks) blocks.push_back(constants<Strategy>(b));
    }
};

std::vector<std::int32_t> flat(const xt::xarray<std::int32_t>& a) { return {a.begin(), a.end()}; }

/// Mean validation loss in bits per character over the fixed validation windows.
template <class Strategy>
double validation_bpc(const model& m, const std::vector<char_lm::batch>& batches, std::size_t heads)
{
    const inference_model<Strategy> constant(m);
    double total = 0.0;
    for (const auto& b : batches) total += double(objective(constant.outer, constant.blocks, b, flat(b.targets), heads).value().value()());
    return total / double(batches.size()) / std::numbers::ln2;
}

/// `count` characters after `prompt`, sampled at temperature 0.8 from the model's last logits.
template <class Strategy>
std::string sample_text(const model& m, const char_lm::corpus& text, std::string_view prompt, std::size_t count,
                        const shape_config& c, std::mt19937_64& rng)
{
    const inference_model<Strategy> constant(m);
    std::vector<std::int32_t> tokens = text.encode(prompt);
    for (std::size_t i = 0; i < count; ++i) {
        const std::size_t window = std::min(tokens.size(), c.context);
        xt::xarray<std::int32_t> inputs = xt::xarray<std::int32_t>::from_shape({1, window});
        std::copy(tokens.end() - static_cast<std::ptrdiff_t>(window), tokens.end(), inputs.begin());
        const xt::xarray<float> logits = forward(constant.outer, constant.blocks, inputs, c.heads).value().value();
        const std::size_t v = logits.shape()[1];
        tokens.push_back(char_lm::sample_token(std::span<const float>(logits.data() + (window - 1) * v, v), 0.8, rng));
    }
    return text.decode(std::span<const std::int32_t>(tokens).subspan(text.encode(prompt).size()));
}

/// The parameters' names in leaf order (the ends, then each block's fields), for ad::inspect.
std::vector<std::string> parameter_names(const model& m)
{
    std::vector<std::string> names{"tokens", "positions", "norm_gain", "norm_bias", "w_logits"};
    const char* fields[] = {"norm1_gain", "norm1_bias", "w_qkv", "b_qkv", "w_attention_out", "b_attention_out",
                            "norm2_gain", "norm2_bias", "w_fc",  "b_fc",  "w_proj",          "b_proj"};
    for (std::size_t l = 0; l < m.blocks.size(); ++l) {
        for (const char* field : fields) names.push_back(fmt::format("block{}.{}", l, field));
    }
    return names;
}

/// Linear warm-up over the first 5 % of the steps, then cosine decay to a tenth.
double learning_rate_at(const options& opt, std::size_t step)
{
    const double warmup = std::max(1.0, 0.05 * double(opt.steps));
    if (double(step) < warmup) return opt.learning_rate * (double(step) + 1.0) / warmup;
    const double progress = (double(step) - warmup) / std::max(1.0, double(opt.steps) - warmup);
    return opt.learning_rate * (0.1 + 0.45 * (1.0 + std::cos(std::numbers::pi * progress)));
}

template <class Strategy>
int train(const options& opt, const mode& md)
{
    const shape_config& c = opt.shape;
    const char_lm::corpus text = char_lm::load_corpus(opt.data);
    const std::vector<std::int32_t> train_tokens = text.encode(text.train), validation_tokens = text.encode(text.validation);
    const auto validation = char_lm::validation_batches(validation_tokens, c.batch, c.context, opt.eval_batches);
    fmt::print("corpus: {} train and {} validation characters, {} symbols; model: {} layers, d_model {}, {} heads, context {}, "
               "batch {}\n",
               train_tokens.size(), validation_tokens.size(), text.vocabulary(), c.layers, c.d_model, c.heads, c.context, c.batch);
    model m = initial_model(c, text.vocabulary(), opt.seed, md.unit_scaled);
    const auto rules = examples::scaling_of(md);
    const ad::matmul_precision_scope recipe(md.forward, md.gradient, md.scaling);
    const tensor_core::accumulation_scope<> accumulation(opt.accumulate);
    ad::adam outeroptimizer({.learning_rate = opt.learning_rate, .beta2 = 0.99, .weight_decay = 0.01});
    ad::adam blocks_optimizer(outeroptimizer.options());
    std::mt19937_64 rng(opt.seed + 1);
    if (opt.inspect) {  // the first step's batch and objective, reported instead of trained on
        const char_lm::batch data = char_lm::sample_batch(train_tokens, c.batch, c.context, rng);
        const std::vector<std::int32_t> targets = flat(data.targets);
        const auto inspected = ad::inspect<Strategy>(
            ad::inspect_options{parameter_names(m)},
            [&](const auto& e, const auto& b) { return objective(e, b, data, targets, c.heads); }, m.outer, m.blocks);
        fmt::print("inspect: one step on the first batch (seed {})\n{}", opt.seed, inspected.report);
        if (!opt.inspect_csv.empty()) {
            inspected.report.write_csv(opt.inspect_csv);
            fmt::print("wrote {}\n", opt.inspect_csv);
        }
        return 0;
    }

    double val_bpc = validation_bpc<Strategy>(m, validation, c.heads);
    fmt::print("step {:5}  val_bpc={:.4f}\n", 0, val_bpc);
    double train_sum = 0.0, seconds = 0.0;
    // Since the last line: wall seconds, and the process's CPU seconds (all threads), which a
    // busy machine stretches far less than the wall clock.
    double interval_seconds = 0.0, interval_cpu = 0.0;
    std::size_t since_eval = 0;
    for (std::size_t step = 0; step < opt.steps; ++step) {
        const auto start = std::chrono::steady_clock::now();
        const std::clock_t cpu_start = std::clock();
        const char_lm::batch data = char_lm::sample_batch(train_tokens, c.batch, c.context, rng);
        const std::vector<std::int32_t> targets = flat(data.targets);
        auto [loss, grads] = ad::value_and_grad<Strategy>(
            [&](const auto& e, const auto& b) { return objective(e, b, data, targets, c.heads); }, m.outer, m.blocks);
        const double rate = learning_rate_at(opt, step);
        outeroptimizer.set_learning_rate(rate);
        blocks_optimizer.set_learning_rate(rate);
        outeroptimizer.step(m.outer, std::get<0>(grads));
        blocks_optimizer.step(m.blocks, std::get<1>(grads));
        const double step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        seconds += step_seconds;
        interval_seconds += step_seconds;
        interval_cpu += double(std::clock() - cpu_start) / CLOCKS_PER_SEC;
        train_sum += double(loss.value()()) / std::numbers::ln2;
        ++since_eval;
        if (!std::isfinite(double(loss.value()()))) {
            fmt::print("step {:5}  the loss is not finite: training diverged\n", step + 1);
            val_bpc = std::numeric_limits<double>::quiet_NaN();
            break;
        }
        if ((step + 1) % opt.eval_every == 0 || step + 1 == opt.steps) {
            val_bpc = validation_bpc<Strategy>(m, validation, c.heads);
            fmt::print("step {:5}  train_bpc={:.4f}  val_bpc={:.4f}  ms_per_step={:.1f}  interval_ms={:.1f}  "
                       "interval_cpu_ms={:.1f}\n",
                       step + 1, train_sum / double(since_eval), val_bpc, 1000.0 * seconds / double(step + 1),
                       1000.0 * interval_seconds / double(since_eval), 1000.0 * interval_cpu / double(since_eval));
            train_sum = 0.0;
            since_eval = 0;
            interval_seconds = interval_cpu = 0.0;
        }
    }
    if (opt.sample_chars > 0 && std::isfinite(val_bpc)) {
        std::mt19937_64 sample_rng(opt.seed + 2);
        fmt::print("samples (temperature 0.8):\n{}\n", sample_text<Strategy>(m, text, "\n\n", opt.sample_chars, c, sample_rng));
    }
    fmt::print("summary mode={} steps={} val_bpc={:.4f}{}\n", md.name, opt.steps, val_bpc,
               opt.accumulate == "exact" ? "" : " accumulate=" + opt.accumulate);
    if (opt.max_val_bpc > 0.0 && !(val_bpc <= opt.max_val_bpc)) {
        fmt::print("validation loss {:.4f} bits per character is above the required {:.4f}\n", val_bpc, opt.max_val_bpc);
        return 1;
    }
    return 0;
}

std::size_t positive(const std::string& flag, const std::string& value)
{
    const unsigned long long parsed = std::stoull(value);
    if (parsed == 0) throw std::runtime_error(fmt::format("{} must be positive, got {}", flag, value));
    return static_cast<std::size_t>(parsed);
}

}  // namespace

int main(int argc, char** argv)
{
    // Each step frees and allocates the same temporaries: keep them mapped (runtime.hpp).
    scalify::retain_freed_memory();
    try {
        options opt;
        for (int i = 1; i < argc; ++i) {
            const std::string flag = argv[i];
            if (examples::read_inspect_flag(flag, opt.inspect, opt.inspect_csv)) continue;
            if (i + 1 >= argc) throw std::runtime_error("missing value after " + flag);
            const std::string value = argv[++i];
            if (flag == "--mode") opt.mode = value;
            else if (flag == "--steps") opt.steps = positive(flag, value);
            else if (flag == "--seed") opt.seed = static_cast<unsigned>(std::stoul(value));
            else if (flag == "--layers") opt.shape.layers = positive(flag, value);
            else if (flag == "--d-model") opt.shape.d_model = positive(flag, value);
            else if (flag == "--heads") opt.shape.heads = positive(flag, value);
            else if (flag == "--context") opt.shape.context = positive(flag, value);
            else if (flag == "--batch") opt.shape.batch = positive(flag, value);
            else if (flag == "--learning-rate") opt.learning_rate = std::stod(value);
            else if (flag == "--eval-every") opt.eval_every = positive(flag, value);
            else if (flag == "--eval-batches") opt.eval_batches = positive(flag, value);
            else if (flag == "--sample-chars") opt.sample_chars = static_cast<std::size_t>(std::stoull(value));
            else if (flag == "--data") opt.data = value;
            else if (flag == "--max-val-bpc") opt.max_val_bpc = std::stod(value);
            else if (flag == "--accumulate") opt.accumulate = to_string(examples::parse_accumulate(value));
            else throw std::runtime_error("unknown option " + flag);
        }
        if (opt.shape.d_model % opt.shape.heads != 0) {
            throw std::runtime_error(fmt::format("--d-model {} does not split into {} heads", opt.shape.d_model, opt.shape.heads));
        }
        const mode& m = find_mode(opt.mode);
        fmt::print("mode {}: {}\n", m.name, m.about);
        return train<examples::mode_scaling>(opt, m);
    } catch (const std::exception& e) {
        fmt::print(stderr, "char_lm: {}\n", e.what());
        return 2;
    }
}
