// The corpus of the character-level language model example: the fortunes of Debian's `fortunes`
// package as bytes, a fixed train / validation split, a byte vocabulary, batches of windows, and
// sampling from the model's logits.
#pragma once

#include <xtensor/xarray.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace char_lm {

inline constexpr const char* default_dir = "/usr/share/games/fortunes";

struct corpus {
    std::string train, validation;
    std::vector<unsigned char> symbols;  ///< token -> byte, sorted
    std::array<int, 256> token_of{};     ///< byte -> token, -1 for a byte the corpus lacks

    [[nodiscard]] std::size_t vocabulary() const { return symbols.size(); }

    [[nodiscard]] std::vector<std::int32_t> encode(std::string_view text) const
    {
        std::vector<std::int32_t> tokens;
        tokens.reserve(text.size());
        for (const char c : text) {
            const int token = token_of[static_cast<unsigned char>(c)];
            if (token < 0) {
                throw std::runtime_error(
                    fmt::format("byte {} is not in the corpus' vocabulary", int(static_cast<unsigned char>(c))));
            }
            tokens.push_back(token);
        }
        return tokens;
    }

    [[nodiscard]] std::string decode(std::span<const std::int32_t> tokens) const
    {
        std::string text;
        text.reserve(tokens.size());
        for (const std::int32_t token : tokens) {
            if (token < 0 || static_cast<std::size_t>(token) >= symbols.size()) {
                throw std::runtime_error(fmt::format("token {} is outside the vocabulary of {}", token, symbols.size()));
            }
            text.push_back(static_cast<char>(symbols[static_cast<std::size_t>(token)]));
        }
        return text;
    }
};

/// Every fortune of every regular, extension-less file of dir (art, computers, ...; not the *.dat
/// indexes nor the *.u8 symlinks), files in name order, so the corpus is the same on every machine.
/// In a file, fortunes are separated by lines holding only `%`. A fortune is its lines joined by
/// '\n', without its last newline; empty ones are dropped. Counting the fortunes of all files in
/// order from 0, fortune i goes to validation when i % 10 == 9, else to train, as its text followed
/// by "\n\n" (so the model sees where fortunes end). The vocabulary is every byte of both splits
/// (a validation byte always has a token), sorted.
inline corpus load_corpus(const std::string& dir = default_dir)
{
    namespace fs = std::filesystem;
    std::vector<fs::path> files;
    std::error_code failed;
    for (fs::directory_iterator it(dir, failed), end; !failed && it != end; it.increment(failed)) {
        const auto& path = it->path();
        if (it->symlink_status().type() == fs::file_type::regular && !path.has_extension()) files.push_back(path);
    }
    if (files.empty()) {
        throw std::runtime_error(fmt::format(
            "cannot read {}: install Debian's `fortunes` package (apt-get install fortunes; cmake -P cmake/demo.cmake "
            "does it when run as root) or pass --data DIR",
            dir));
    }
    std::sort(files.begin(), files.end());

    corpus out;
    std::size_t index = 0;
    const auto add = [&](std::string& fortune) {
        while (!fortune.empty() && fortune.back() == '\n') fortune.pop_back();
        if (fortune.empty()) return;
        (index++ % 10 == 9 ? out.validation : out.train) += fortune + "\n\n";
        fortune.clear();
    };
    for (const auto& file : files) {
        std::ifstream in(file, std::ios::binary);
        if (!in) throw std::runtime_error(fmt::format("cannot open {}", file.string()));
        const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
        std::string fortune;
        for (std::size_t at = 0; at < text.size();) {
            const std::size_t newline = std::min(text.find('\n', at), text.size());
            const std::string_view line(text.data() + at, newline - at);
            if (line == "%") add(fortune);
            else fortune.append(line).push_back('\n');
            at = newline + 1;
        }
        add(fortune);  // the last fortune of a file that does not end in "%"
    }

    std::array<bool, 256> seen{};
    for (const std::string* split : {&out.train, &out.validation}) {
        for (const char c : *split) seen[static_cast<unsigned char>(c)] = true;
    }
    out.token_of.fill(-1);
    for (int byte = 0; byte < 256; ++byte) {
        if (!seen[byte]) continue;
        out.token_of[byte] = static_cast<int>(out.symbols.size());
        out.symbols.push_back(static_cast<unsigned char>(byte));
    }
    return out;
}

/// B windows of T tokens; targets are the inputs shifted by one (the next token at every position).
struct batch {
    xt::xarray<std::int32_t> inputs, targets;  // (B, T) each
};

/// The context tokens from `start` into row `row` of b's inputs, the ones a token later into its targets.
inline void copy_window(batch& b, std::size_t row, const std::vector<std::int32_t>& tokens, std::size_t start)
{
    const std::size_t context = b.inputs.shape()[1];
    std::copy_n(tokens.begin() + static_cast<std::ptrdiff_t>(start), context, b.inputs.data() + row * context);
    std::copy_n(tokens.begin() + static_cast<std::ptrdiff_t>(start + 1), context, b.targets.data() + row * context);
}

/// (B, T) arrays to fill; runtime_error naming the sizes when the text holds no window of T + 1 tokens.
inline batch empty_batch(const std::vector<std::int32_t>& tokens, std::size_t batch_size, std::size_t context)
{
    if (batch_size == 0 || context == 0 || tokens.size() < context + 1) {
        throw std::runtime_error(fmt::format("cannot cut {} windows of {} + 1 tokens from a text of {} tokens", batch_size,
                                             context, tokens.size()));
    }
    using tokens_array = xt::xarray<std::int32_t>;
    return {tokens_array::from_shape({batch_size, context}), tokens_array::from_shape({batch_size, context})};
}

/// batch_size windows at starts uniform in [0, size - context - 1].
inline batch sample_batch(const std::vector<std::int32_t>& tokens, std::size_t batch_size, std::size_t context,
                          std::mt19937_64& rng)
{
    batch b = empty_batch(tokens, batch_size, context);
    const std::uint64_t starts = tokens.size() - context;
    // rng() % starts rather than uniform_int_distribution, whose algorithm is the standard
    // library's: the same seed then gives the same windows with libstdc++ and libc++ (the
    // modulo bias is below starts / 2^64).
    for (std::size_t row = 0; row < batch_size; ++row) copy_window(b, row, tokens, static_cast<std::size_t>(rng() % starts));
    return b;
}

/// count batches of batch_size windows at starts spread evenly over [0, size - context - 1]: no
/// randomness, so every run and every precision mode is evaluated on exactly the same characters.
inline std::vector<batch> validation_batches(const std::vector<std::int32_t>& tokens, std::size_t batch_size,
                                             std::size_t context, std::size_t count)
{
    std::vector<batch> out;
    const std::size_t windows = count * batch_size;
    const std::size_t last_start = tokens.size() < context + 1 ? 0 : tokens.size() - context - 1;
    for (std::size_t k = 0; k < count; ++k) {
        batch b = empty_batch(tokens, batch_size, context);
        for (std::size_t row = 0; row < batch_size; ++row) {
            const std::size_t window = k * batch_size + row;
            copy_window(b, row, tokens, windows == 1 ? 0 : window * last_start / (windows - 1));
        }
        out.push_back(std::move(b));
    }
    return out;
}

/// A token drawn from softmax(logits / temperature); temperature 0 takes the argmax (the first).
inline std::int32_t sample_token(std::span<const float> logits, double temperature, std::mt19937_64& rng)
{
    if (logits.empty()) throw std::runtime_error("sample_token: no logits");
    if (!(temperature >= 0.0) || !std::isfinite(temperature)) {
        throw std::runtime_error(fmt::format("sample_token: temperature must be finite and >= 0, got {}", temperature));
    }
    if (std::any_of(logits.begin(), logits.end(), [](float x) { return std::isnan(x); })) {
        throw std::runtime_error("sample_token: a logit is NaN");
    }
    const auto largest = std::max_element(logits.begin(), logits.end());
    if (!std::isfinite(*largest)) throw std::runtime_error(fmt::format("sample_token: the largest logit is {}", *largest));
    if (temperature == 0.0) return static_cast<std::int32_t>(largest - logits.begin());

    std::vector<double> weights(logits.size());
    double total = 0.0;
    for (std::size_t i = 0; i < logits.size(); ++i) {
        weights[i] = std::exp((double(logits[i]) - double(*largest)) / temperature);  // the largest weighs 1: no overflow
        total += weights[i];
    }
    // 53 random bits as a double in [0, 1): like the windows, the same draw with any standard library.
    double remaining = static_cast<double>(rng() >> 11) * 0x1p-53 * total;
    std::size_t last = 0;
    for (std::size_t i = 0; i < weights.size(); ++i) {
        remaining -= weights[i];
        if (remaining < 0.0) return static_cast<std::int32_t>(i);
        if (weights[i] > 0.0) last = i;
    }
    return static_cast<std::int32_t>(last);  // rounding left a sliver past the last weight: the last drawable token
}

}  // namespace char_lm
