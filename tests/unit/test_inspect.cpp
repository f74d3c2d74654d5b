// ad::inspect: the report of one step against values computed directly (the forward output of a
// known op, the cotangents the rules give, the precision scope's casts recomputed here), the
// loss and gradients against value_and_grad's bit for bit, the CSV and the table, and that
// nothing is reported while no inspection is active.
#include <scalify/scalify.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace inspect_tests {

using namespace scalify;
using array = ScaledArray<float, pow2_scale>;

template <class A>
struct two_layer {
    A w1, b1, w2;
    template <class F>
    friend void for_each_parameter(two_layer& self, F&& f)
    {
        f(self.w1), f(self.b1), f(self.w2);
    }
};

array normal_array(std::mt19937& rng, std::vector<std::size_t> shape, float scale)
{
    std::normal_distribution<float> dist(0.0f, 1.0f);
    xt::xarray<float> data = xt::xarray<float>::from_shape(shape);
    for (auto& v : data) v = dist(rng);
    return array(std::move(data), scale);
}

struct fixture {
    std::mt19937 rng{5};
    array x = normal_array(rng, {16, 12}, 1.0f);
    two_layer<array> params{normal_array(rng, {12, 8}, 0.25f), normal_array(rng, {8}, 0.125f), normal_array(rng, {8, 4}, 0.5f)};
    std::vector<std::uint8_t> labels = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
    static constexpr double loss_weight = 1.0 / 1024;

    [[nodiscard]] auto objective() const
    {
        return [this](const auto& p) {
            const auto h = relu(matmul(x, p.w1) + p.b1);
            return softmax_cross_entropy(dynamic_rescale_l2_grad(matmul(h, p.w2)), labels) * loss_weight;
        };
    }
};

/// RMS of an array's data in double, and max |data| x scale: what the report must hold.
template <class T, class P>
double data_rms(const ScaledArray<T, P>& a)
{
    double sum = 0;
    for (const auto& v : a.data()) sum += double(scalify::detail::load(v)) * double(scalify::detail::load(v));
    return std::sqrt(sum / double(a.size()));
}
template <class T, class P>
double value_amax(const ScaledArray<T, P>& a)
{
    double m = 0;
    for (const auto& v : a.data()) m = std::max(m, std::abs(double(scalify::detail::load(v))));
    return m * double(a.scale());
}

template <class P>
bool same_bits(const ad::gradient<P>& x, const ad::gradient<P>& y)
{
    if (x.type_name() != y.type_name() || x.scale() != y.scale() || x.shape() != y.shape()) return false;
    return x.visit([&](const auto& a) {
        using A = std::remove_cvref_t<decltype(a)>;
        const auto& b = std::get<A>(y.variant());
        return std::memcmp(a.data().data(), b.data().data(), a.size() * sizeof(typename A::value_type)) == 0;
    });
}

void check_same_step(const auto& inspected, const auto& reference)
{
    CHECK(inspected.value.scale() == reference.value.scale());
    CHECK(inspected.value.data()() == reference.value.data()());
    CHECK(inspected.report.loss == double(reference.value.data()()) * double(reference.value.scale()));
    CHECK(same_bits(inspected.grads.w1, reference.grads.w1));
    CHECK(same_bits(inspected.grads.b1, reference.grads.b1));
    CHECK(same_bits(inspected.grads.w2, reference.grads.w2));
}

/// Counts what a tape reports.
struct counting_observer final : ad::detail::tape_observer {
    int records = 0, cotangents = 0;
    void recorded(std::size_t, const char*, const ad::detail::erased_array&, std::span<const ad::detail::erased_input>) override
    {
        ++records;
    }
    void reached(std::size_t, const ad::detail::erased_array&) override { ++cotangents; }
};

TEST_CASE("inspect: the same step as value_and_grad, and its ops as computed directly", "[autodiff][inspect]")
{
    const fixture f;
    auto inspected = ad::inspect<unit_scaling>(f.objective(), f.params);
    const auto reference = ad::value_and_grad<unit_scaling>(f.objective(), f.params);
    check_same_step(inspected, reference);
    const ad::inspection& report = inspected.report;
    CHECK(report.precision == ad::full_precision);

    // The ops in recording order; the three parameters are nodes 0..2.
    const std::vector<std::string> names{"matmul", "add", "relu", "matmul", "dynamic_rescale_l2_grad", "softmax_cross_entropy", "mul"};
    REQUIRE(report.ops.size() == names.size());
    for (std::size_t i = 0; i < names.size(); ++i) {
        CHECK(report.ops[i].op == names[i]);
        CHECK(report.ops[i].node == i + 3);
        CHECK(report.ops[i].casts.empty());
    }
    CHECK(report.ops[0].inputs == std::vector<std::string>{"const", "0"});
    CHECK(report.ops[1].inputs == std::vector<std::string>{"#3", "1"});
    CHECK(report.ops[0].label() == "matmul(const, 0)");
    CHECK(&report.op(4) == &report.ops[1]);
    CHECK(report.ops_named("matmul").size() == 2);

    // The first matmul's output, computed directly.
    const auto product = matmul<unit_scaling>(f.x, f.params.w1);
    const ad::tensor_summary& first = report.ops[0].forward;
    CHECK(first.type == "float32");
    CHECK(first.shape == std::vector<std::size_t>{16, 8});
    CHECK(first.size == 128);
    CHECK(first.scale == product.scale());
    CHECK(first.data_rms == data_rms(product));
    CHECK(first.amax == value_amax(product));
    CHECK(first.zero_fraction == 0.0);
    CHECK(first.saturated_fraction == 0.0);

    // relu's output holds its zeros.
    const auto hidden = relu<unit_scaling>(add<unit_scaling>(product, f.params.b1));
    std::size_t zeros = 0;
    for (const float v : hidden.data()) zeros += v == 0.0f ? 1 : 0;
    CHECK(report.ops[2].forward.zero_fraction == double(zeros) / double(hidden.size()));
    CHECK(report.ops[2].forward.data_rms == data_rms(hidden));

    // Backward: the seed (1 at scale 1) reaches the loss weight's mul; the cross entropy gets it
    // times the weight, folded into the scale; dynamic_rescale_l2_grad returns unit-RMS data.
    const ad::op_summary& weight = report.ops[6];
    REQUIRE(weight.backward);
    CHECK(weight.backward->type == "float32");
    CHECK(weight.backward->scale == 1.0f);
    CHECK(weight.backward->data_rms == 1.0);
    CHECK(weight.backward->shape.empty());
    REQUIRE(report.ops[5].backward);
    CHECK(report.ops[5].backward->scale == float(fixture::loss_weight));
    CHECK(report.ops[5].backward->data_rms == 1.0);
    // The cotangent reaching the first matmul: every op reached one.
    for (const auto& op : report.ops) CHECK(op.backward.has_value());

    // The parameters, named by position, and their gradients.
    REQUIRE(report.parameters.size() == 3);
    CHECK(report.parameters[0].name == "0");
    CHECK(report.parameters[2].node == 2);
    CHECK(report.parameters[0].value.scale == 0.25f);
    CHECK(report.parameters[0].value.data_rms == data_rms(f.params.w1));
    const auto g_w1 = inspected.grads.w1.as<float>();
    CHECK(report.parameters[0].gradient.type == inspected.grads.w1.type_name());
    CHECK(report.parameters[0].gradient.scale == inspected.grads.w1.scale());
    CHECK(report.parameters[0].gradient.data_rms == data_rms(g_w1));
    CHECK(report.parameters[0].gradient.amax == value_amax(g_w1));
}

TEST_CASE("inspect under the fp8 recipe shows the E4M3 operand casts and the E5M2 cotangent cast", "[autodiff][inspect]")
{
    const fixture f;
    for (const auto scaling : {ad::cast_scaling::propagated, ad::cast_scaling::current}) {
        INFO("scaling " << int(scaling));
        const ad::matmul_precision_scope fp8(dtype::float8_e4m3fn, dtype::float8_e5m2, scaling);
        auto inspected = ad::inspect<unit_scaling>(ad::inspect_options{{"w1", "b1", "w2"}}, f.objective(), f.params);
        const auto reference = ad::value_and_grad<unit_scaling>(f.objective(), f.params);
        check_same_step(inspected, reference);
        const ad::inspection& report = inspected.report;
        CHECK(report.precision == ad::matmul_precision{dtype::float8_e4m3fn, dtype::float8_e5m2, scaling});

        const ad::op_summary& first = report.ops[0];
        CHECK(first.op == "matmul");
        CHECK(first.inputs == std::vector<std::string>{"const", "w1"});
        REQUIRE(first.casts.size() == 3);
        // The operands' casts, recomputed here with the recipe's function.
        const ScaledArray<float, pow2_scale> x_grid = ad::detail::recipe_grid(f.x, dtype::float8_e4m3fn, scaling);
        const ScaledArray<float, pow2_scale> w_grid = ad::detail::recipe_grid(f.params.w1, dtype::float8_e4m3fn, scaling);
        const ad::cast_summary* a = first.cast("a");
        const ad::cast_summary* b = first.cast("b");
        REQUIRE(a != nullptr);
        REQUIRE(b != nullptr);
        CHECK(a->source_type == "float32");
        CHECK(a->result.type == "float8_e4m3fn");
        CHECK(a->result.scale == x_grid.scale());
        CHECK(a->result.data_rms == data_rms(x_grid));
        CHECK(b->result.scale == w_grid.scale());
        CHECK(b->result.amax == value_amax(w_grid));
        if (scaling == ad::cast_scaling::current) {
            CHECK(b->result.scale != f.params.w1.scale());  // the amax moved to E4M3's 448
            CHECK(std::abs(b->result.amax - value_amax(f.params.w1)) <= value_amax(f.params.w1) / 8);
        } else {
            CHECK(b->result.scale == f.params.w1.scale());
        }
        std::size_t flushed = 0, nonzero = 0;
        for (std::size_t i = 0; i < w_grid.size(); ++i) {
            nonzero += f.params.w1.data().data()[i] != 0.0f ? 1 : 0;
            flushed += f.params.w1.data().data()[i] != 0.0f && w_grid.data().data()[i] == 0.0f ? 1 : 0;
        }
        CHECK(b->flushed_fraction == double(flushed) / double(nonzero));

        // The cotangent reaching the product is float32; its cast is E5M2, at the cotangent's
        // scale (propagated) or with its amax at E5M2's largest value (current).
        REQUIRE(first.backward);
        CHECK(first.backward->type == "float32");
        const ad::cast_summary* g = first.cast("cotangent");
        REQUIRE(g != nullptr);
        CHECK(g->result.type == "float8_e5m2");
        CHECK(g->source_type == "float32");
        CHECK(g->result.shape == first.backward->shape);
        if (scaling == ad::cast_scaling::propagated) CHECK(g->result.scale == first.backward->scale);
        else CHECK(g->result.amax <= first.backward->amax * 1.25);
        CHECK(g->result.saturated_fraction <= 1.0 / double(g->result.size));

        // Ops between the matmuls have no casts; the second matmul has its own.
        CHECK(report.ops[1].casts.empty());
        CHECK(report.ops[3].op == "matmul");
        CHECK(report.ops[3].casts.size() == 3);
        CHECK(report.ops[3].inputs == std::vector<std::string>{"#5", "w2"});
        CHECK(report.parameter("w2").node == 2);
    }
    CHECK(ad::detail::active_tape_observer() == nullptr);
}

TEST_CASE("inspect: statistics in the stored type (subnormals, saturation) and a gradient-only cast", "[autodiff][inspect]")
{
    using E4 = float8_e4m3fn;
    // 448 is E4M3's largest value, 2^-7 and 2^-9 are subnormal (the smallest normal is 2^-6).
    xt::xarray<E4> data = {E4(448.0f), E4(-448.0f), E4(0.0f), E4(0.0078125f), E4(-0.001953125f), E4(1.0f), E4(-2.0f), E4(0.5f)};
    const ScaledArray<E4, pow2_scale> w(data, 0.5f);
    const ad::matmul_precision_scope e5m2_gradients(dtype::float32, dtype::float8_e5m2);
    const ScaledArray<float, pow2_scale> x(xt::xarray<float>{{1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f}}, 1.0f);
    auto inspected = ad::inspect<default_scaling>([&](const auto& p) { return reduce_sum(matmul(x, reshape(p, {8, 1}))); }, w);
    const ad::inspection& report = inspected.report;
    const ad::parameter_summary& p = report.parameters.at(0);
    CHECK(p.name == "param");
    CHECK(p.value.type == "float8_e4m3fn");
    CHECK(p.value.zero_fraction == 1.0 / 8);
    CHECK(p.value.subnormal_fraction == 2.0 / 8);
    CHECK(p.value.saturated_fraction == 2.0 / 8);
    CHECK(p.value.amax == 224.0);
    CHECK(p.value.data_rms == std::sqrt((2 * 448.0 * 448.0 + 0.0078125 * 0.0078125 + 0.001953125 * 0.001953125 + 1 + 4 + 0.25) / 8));
    // Forward float32: no operand casts; the cotangent cast alone.
    const auto matmuls = report.ops_named("matmul");
    REQUIRE(matmuls.size() == 1);
    REQUIRE(matmuls[0]->casts.size() == 1);
    CHECK(matmuls[0]->casts[0].operand == "cotangent");
    CHECK(matmuls[0]->casts[0].result.type == "float8_e5m2");
    CHECK(matmuls[0]->casts[0].flushed_fraction == 0.0);
    CHECK(p.gradient.shape == std::vector<std::size_t>{8});
}

TEST_CASE("inspect names the leaves of several trees by position, or by the names given", "[autodiff][inspect]")
{
    std::mt19937 rng(3);
    const std::vector<array> layers{normal_array(rng, {4, 4}, 1.0f), normal_array(rng, {4, 4}, 1.0f)};
    const std::map<std::string, array> extra{{"bias", normal_array(rng, {4}, 1.0f)}};
    const array x = normal_array(rng, {2, 4}, 1.0f);
    const auto f = [&](const auto& ls, const auto& e) { return reduce_sum(matmul(matmul(x, ls[0]), ls[1]) + e.at("bias")); };
    const auto inspected = ad::inspect(f, layers, extra);
    std::vector<std::string> names;
    for (const auto& p : inspected.report.parameters) names.push_back(p.name);
    CHECK(names == std::vector<std::string>{"0.0", "0.1", "1.bias"});
    CHECK(inspected.report.ops[1].inputs == std::vector<std::string>{"#3", "0.1"});
    const auto reference = ad::value_and_grad(f, layers, extra);
    CHECK(same_bits(std::get<0>(inspected.grads)[1], std::get<0>(reference.grads)[1]));
    CHECK(same_bits(std::get<1>(inspected.grads).at("bias"), std::get<1>(reference.grads).at("bias")));

    const auto named = ad::inspect(ad::inspect_options{{"first", "second", "bias"}}, f, layers, extra);
    CHECK(named.report.parameters[1].name == "second");
    CHECK(named.report.ops[1].inputs == std::vector<std::string>{"#3", "second"});
    try {
        (void)ad::inspect(ad::inspect_options{{"one", "two"}}, f, layers, extra);
        FAIL("two names for three leaves were accepted");
    } catch (const config_error& e) {
        CHECK(std::string(e.what()) == "ad::inspect: 2 parameter names for 3 parameter leaves");
    }
    CHECK_THROWS_AS(inspected.report.op(0), config_error);  // node 0 is a parameter
    CHECK_THROWS_AS(inspected.report.parameter("w9"), config_error);
}

TEST_CASE("inspect: the CSV and the table", "[autodiff][inspect]")
{
    const fixture f;
    const ad::matmul_precision_scope fp8(dtype::float8_e4m3fn, dtype::float8_e5m2);
    const auto inspected = ad::inspect<unit_scaling>(ad::inspect_options{{"w1", "b1", "w2"}}, f.objective(), f.params);
    const ad::inspection& report = inspected.report;

    std::ostringstream csv;
    report.write_csv(csv);
    std::vector<std::string> lines;
    std::istringstream in(csv.str());
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    // 2 rows per parameter; per op a value and a cotangent row, per matmul 3 casts more.
    REQUIRE(lines.size() == 1 + 2 * 3 + 2 * 7 + 2 * 3);
    CHECK(lines[0] ==
          "node,op,name,inputs,tensor,pass,type,shape,size,scale,log2_scale,data_rms,amax,zero_pct,subnormal_pct,saturated_pct,"
          "non_finite_pct,flushed_pct");
    CHECK(lines[1].rfind("0,parameter,w1,,value,fwd,float32,12x8,96,0.25,-2,", 0) == 0);
    CHECK(lines[7].rfind("3,matmul,,const w1,value,fwd,float32,16x8,128,", 0) == 0);
    CHECK(lines[8].rfind("3,matmul,,const w1,cast_a,fwd,float8_e4m3fn,16x12,192,1,0,", 0) == 0);
    CHECK(lines[9].rfind("3,matmul,,const w1,cast_b,fwd,float8_e4m3fn,12x8,96,0.25,-2,", 0) == 0);
    CHECK(lines[10].rfind("3,matmul,,const w1,cotangent,bwd,float32,16x8,128,", 0) == 0);
    CHECK(lines[11].rfind("3,matmul,,const w1,cast_cotangent,bwd,float8_e5m2,16x8,128,", 0) == 0);
    for (std::size_t i = 1; i < lines.size(); ++i) {
        INFO(lines[i]);
        CHECK(std::count(lines[i].begin(), lines[i].end(), ',') == 17);
        const bool cast = lines[i].find(",cast_") != std::string::npos;
        CHECK((lines[i].back() == ',') == !cast);  // flushed_pct for casts only
    }
    const std::string path = std::string(SCALIFY_TEST_DATA_DIR) + "/no such directory/report.csv";
    try {
        report.write_csv(path);
        FAIL("a CSV was written into a missing directory");
    } catch (const config_error& e) {
        CHECK(std::string(e.what()).find("no such directory/report.csv") != std::string::npos);
    }

    const std::string table = fmt::format("{}", report);
    CHECK(table.rfind("loss ", 0) == 0);
    CHECK(table.find("matmul_precision_scope: operands float8_e4m3fn, cotangents float8_e5m2, propagated scaling") != std::string::npos);
    CHECK(table.find("#3 matmul(const, w1)") != std::string::npos);
    CHECK(table.find("cast b          float8_e4m3fn  12x8            2^-2") != std::string::npos);
    CHECK(table.find("cast cotangent  float8_e5m2    16x8") != std::string::npos);
    CHECK(table.find("\nw2 ") != std::string::npos);
}

TEST_CASE("without an inspection nothing is reported, and an inspection observes its own tape only", "[autodiff][inspect]")
{
    const fixture f;
    CHECK(ad::detail::active_tape_observer() == nullptr);
    // An observer of another tape (here: none that exists) sees nothing of value_and_grad's tape.
    counting_observer other;
    const int elsewhere = 0;
    other.tape = &elsewhere;
    ad::detail::active_tape_observer() = &other;
    const auto plain = ad::value_and_grad<unit_scaling>(f.objective(), f.params);
    CHECK(other.records == 0);
    CHECK(other.cotangents == 0);
    // An inspection inside reports its own ops and restores the observer before.
    const auto inspected = ad::inspect<unit_scaling>(f.objective(), f.params);
    CHECK(ad::detail::active_tape_observer() == &other);
    CHECK(other.records == 0);
    CHECK(inspected.report.ops.size() == 7);
    // Also when f throws.
    CHECK_THROWS_AS(ad::inspect<unit_scaling>([&](const auto& p) { return p.w1 * 2.0; }, f.params), autodiff_error);
    CHECK(ad::detail::active_tape_observer() == &other);
    ad::detail::active_tape_observer() = nullptr;

    // An explicit tape with an observer: the ops recorded and the cotangents swept.
    counting_observer counting;
    ad::tape<pow2_scale> tape;
    const ad::detail::observing_scope observing(&counting, tape);
    const auto w = tape.watch<unit_scaling>(f.params.w1);
    const auto out = reduce_sum(relu(matmul(f.x, w)));
    CHECK(counting.records == 3);
    tape.backward(out);
    CHECK(counting.cotangents == 3);
}

}  // namespace inspect_tests
