#pragma once
// Reader for the packed public tensor-core captures (tests/data/tensor_core_public/, written by
// tools/pack_tensor_core_public.py) and their comparison with the scalify::tensor_core models.
// Used by the unit test (the vendored quarter) and by tools/tensor_core_match (any packed set,
// the held-back lines included).
//
// A packed set: a 256-byte ASCII header of key=value words (kind=tensor_core_public, gpu, format,
// K, elem_bytes, lines, record_bytes, source), then one record per line: K codes of a, K codes of
// b (uint8 for fp8, little-endian uint16 for fp16/bf16), C and D as little-endian float32 bit
// patterns. D is the GPU's C + sum a[k] b[k] over the line (the H100 and H200 fp8 sets: with
// C = 0, whatever C says).
#include <scalify/tensor_core.hpp>

#include <bit>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace tensor_core_public {

struct vector_set {
    std::string gpu, format;
    std::size_t k = 0, elem_bytes = 0, lines = 0, record_bytes = 0;
    std::vector<std::uint8_t> bytes;  // the records, header removed

    [[nodiscard]] const std::uint8_t* record(std::size_t i) const { return bytes.data() + i * record_bytes; }
    /// Code k of line i's a (operand 0) or b (operand 1).
    [[nodiscard]] unsigned code(std::size_t i, std::size_t operand, std::size_t kk) const
    {
        const std::uint8_t* p = record(i) + (operand * k + kk) * elem_bytes;
        return elem_bytes == 1 ? p[0] : static_cast<unsigned>(p[0] | p[1] << 8);
    }
    /// Line i's C (which = 0) or D (which = 1), float32 bits.
    [[nodiscard]] std::uint32_t word(std::size_t i, std::size_t which) const
    {
        std::uint32_t v;
        std::memcpy(&v, record(i) + 2 * k * elem_bytes + 4 * which, 4);
        return v;
    }
    /// The H100 and H200 fp8 sets were captured with C = 0 (wgmma), whatever their C says.
    [[nodiscard]] bool zero_c() const { return (gpu == "H100" || gpu == "H200") && (format == "E4M3" || format == "E5M2"); }
};

/// Whether a file starts with a packed set's header.
inline bool is_packed_set(const std::string& path)
{
    const std::string tag = "kind=tensor_core_public";
    std::ifstream in(path, std::ios::binary);
    std::string head(tag.size(), '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    return in && head == tag;
}

inline vector_set read_set_file(const std::string& path)
{
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open " + path);
    std::vector<std::uint8_t> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (bytes.size() < 256) throw std::runtime_error(path + ": no header");
    std::map<std::string, std::string> keys;
    std::istringstream words(std::string(bytes.begin(), bytes.begin() + 256));
    std::string word;
    while (words >> word) {
        const auto eq = word.find('=');
        if (eq != std::string::npos) keys[word.substr(0, eq)] = word.substr(eq + 1);
    }
    if (keys["kind"] != "tensor_core_public") throw std::runtime_error(path + ": not a packed tensor_core_public set");
    vector_set s;
    s.gpu = keys.at("gpu");
    s.format = keys.at("format");
    s.k = std::stoul(keys.at("K"));
    s.elem_bytes = std::stoul(keys.at("elem_bytes"));
    s.lines = std::stoul(keys.at("lines"));
    s.record_bytes = std::stoul(keys.at("record_bytes"));
    if (s.record_bytes != 2 * s.k * s.elem_bytes + 8 || bytes.size() != 256 + s.lines * s.record_bytes) {
        throw std::runtime_error(path + ": header and size disagree");
    }
    s.bytes.assign(bytes.begin() + 256, bytes.end());
    return s;
}

template <class T>
T from_code(unsigned code)
{
    using storage = typename scalify::float_traits<T>::format::storage_type;
    return std::bit_cast<T>(static_cast<storage>(code));
}

struct match_result {
    std::string model;
    std::size_t equal = 0, lines = 0;
    std::string first_miss;  // the first mismatching line, described
};

/// Every line of a set through Model: the line's K products in blocks of Model::k, each block's
/// result the next one's accumulator, starting from the line's C (or 0 where zero_c).
template <scalify::tensor_core::InnerProductModel Model, class T>
match_result match(const vector_set& s, bool zero_c)
{
    if (s.k % Model::k != 0) throw std::runtime_error(std::string(Model::name) + ": K per line is not a multiple of its K");
    match_result r;
    r.model = Model::name;
    r.lines = s.lines;
    std::vector<T> a(s.k), b(s.k);
    for (std::size_t i = 0; i < s.lines; ++i) {
        for (std::size_t kk = 0; kk < s.k; ++kk) {
            a[kk] = from_code<T>(s.code(i, 0, kk));
            b[kk] = from_code<T>(s.code(i, 1, kk));
        }
        float acc = zero_c ? 0.0f : std::bit_cast<float>(s.word(i, 0));
        for (std::size_t first = 0; first < s.k; first += Model::k) {
            acc = scalify::tensor_core::dot<Model>(std::span<const T>(a).subspan(first, Model::k),
                                                   std::span<const T>(b).subspan(first, Model::k), acc);
        }
        const std::uint32_t got = std::bit_cast<std::uint32_t>(acc);
        if (got == s.word(i, 1)) {
            ++r.equal;
        } else if (r.first_miss.empty()) {
            std::ostringstream text;
            text << "line " << i << ": model " << std::hex << got << ", GPU " << s.word(i, 1);
            r.first_miss = text.str();
        }
    }
    return r;
}

template <scalify::tensor_core::InnerProductModel Model>
match_result match_format(const vector_set& s)
{
    using namespace scalify;
    if (s.format == "fp16") return match<Model, Eigen::half>(s, s.zero_c());
    if constexpr (Model::template takes<Eigen::bfloat16, Eigen::bfloat16>) {
        if (s.format == "bf16") return match<Model, Eigen::bfloat16>(s, s.zero_c());
    }
    throw std::runtime_error(std::string(Model::name) + " does not take " + s.format);
}

template <scalify::tensor_core::InnerProductModel Model>
match_result match_fp8(const vector_set& s)
{
    using namespace scalify;
    if (s.format == "E4M3") return match<Model, float8_e4m3fn>(s, s.zero_c());
    if (s.format == "E5M2") return match<Model, float8_e5m2>(s, s.zero_c());
    throw std::runtime_error(std::string(Model::name) + " does not take " + s.format);
}

/// The set through the model of its GPU's unit for its format (docs/tensor_core.md's table).
inline match_result match_unit(const vector_set& s)
{
    namespace tc = scalify::tensor_core;
    const bool fp8 = s.format == "E4M3" || s.format == "E5M2";
    if (s.gpu == "V100" && !fp8) return match_format<tc::v100_hmma>(s);
    if ((s.gpu == "A100" || s.gpu == "A2") && !fp8) return match_format<tc::a100_hmma>(s);
    if (s.gpu == "Ada" || s.gpu == "L40S") return fp8 ? match_fp8<tc::ada_qmma>(s) : match_format<tc::ada_hmma>(s);
    if (s.gpu == "H100" || s.gpu == "H200") return fp8 ? match_fp8<tc::h100_qgmma>(s) : match_format<tc::h100_hmma>(s);
    if (s.gpu == "B200") return fp8 ? match_fp8<tc::b200_qmma>(s) : match_format<tc::b200_hmma>(s);
    throw std::runtime_error("no model for " + s.gpu + " " + s.format);
}

}  // namespace tensor_core_public
