// Eigen's sgemm against the system BLAS (cblas_sgemm; on Debian the libblas.so.3 alternative,
// OpenBLAS when libopenblas0-pthread is installed) on the GEMM shapes of one training step,
// transposes read in place as scalify's matmul_vjp reads them: would a BLAS under Eigen pay? This
// answers it for the build flags this file is compiled with (CMake builds it twice: -march=native
// and portable) and the kernels the BLAS picks (OpenBLAS: OPENBLAS_CORETYPE=SkylakeX selects its
// AVX-512 ones on a CPU it does not know as such, e.g. AMD Zen 4 and 5 under 0.3.21).
//   --model mlp      the Fashion-MNIST MLP (784-512-512-10, batch 128): the three forward
//                    products, two input gradients (g . W^T), three weight gradients (X^T . g)
//   --model char_lm  char_lm's default transformer (2 layers, d_model 128, 4 heads, context 64,
//                    batch 16, 114 symbols): each distinct product, times its count in a step
//
//   bench_gemm[_portable] [--model mlp|char_lm] [--threads N] [--repeat N]
#include <scalify/detail/eigen_core.hpp>  // <Eigen/Core>, past GCC 12's AVX-512 false positive
#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace {

using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct shape {
    const char* what;
    int m, k, n;
    bool transpose_a, transpose_b;  // the stored operand is transposed: a is k x m, b is n x k
    int count = 1;                  // products of this shape in one step
};

// One step: forward X.W1, H1.W2, H2.W3; input gradients G3.W3^T, G2.W2^T; weight gradients
// X^T.G1, H1^T.G2, H2^T.G3.
constexpr shape mlp_shapes[] = {
    {"x.w1", 128, 784, 512, false, false},      {"h1.w2", 128, 512, 512, false, false},
    {"h2.w3", 128, 512, 10, false, false},      {"g3.w3^T", 128, 10, 512, false, true},
    {"g2.w2^T", 128, 512, 512, false, true},    {"x^T.g1", 784, 128, 512, true, false},
    {"h1^T.g2", 512, 128, 512, true, false},    {"h2^T.g3", 512, 128, 10, true, false},
};

// One step of 1024 tokens: per layer the q/k/v, output and MLP products, forward, input gradient
// and weight gradient; per layer and head of each of the 16 sequences the scores q.k^T, p.v and
// their four backward products (k^T's gradient as q^T.gs: q.k^T reads k transposed in place); the
// output head once.
constexpr shape char_lm_shapes[] = {
    {"x.wqkv", 1024, 128, 384, false, false, 2},  {"g.wqkv^T", 1024, 384, 128, false, true, 2},
    {"x^T.g qkv", 128, 1024, 384, true, false, 2}, {"o.wo", 1024, 128, 128, false, false, 2},
    {"g.wo^T", 1024, 128, 128, false, true, 2},   {"o^T.g", 128, 1024, 128, true, false, 2},
    {"x.w1", 1024, 128, 512, false, false, 2},    {"g.w1^T", 1024, 512, 128, false, true, 2},
    {"x^T.g1", 128, 1024, 512, true, false, 2},   {"h.w2", 1024, 512, 128, false, false, 2},
    {"g.w2^T", 1024, 128, 512, false, true, 2},   {"h^T.g2", 512, 1024, 128, true, false, 2},
    {"x.head", 1024, 128, 114, false, false, 1},  {"g.head^T", 1024, 114, 128, false, true, 1},
    {"x^T.g head", 128, 1024, 114, true, false, 1}, {"q.k^T", 64, 32, 64, false, true, 128},
    {"p.v", 64, 64, 32, false, false, 128},       {"g.v^T", 64, 32, 64, false, true, 128},
    {"p^T.g", 64, 64, 32, true, false, 128},      {"gs.k", 64, 64, 32, false, false, 128},
    {"q^T.gs", 32, 64, 64, true, false, 128},
};

template <class F>
double best_seconds(int repeat, F f)
{
    double best = 1e30;
    for (int r = 0; r < repeat; ++r) {
        const auto start = std::chrono::steady_clock::now();
        f();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return best;
}

}  // namespace

int main(int argc, char** argv)
{
    int threads = 1, repeat = 200;
    std::string model = "mlp";
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string flag = argv[i];
        if (flag == "--threads") threads = std::atoi(argv[i + 1]);
        else if (flag == "--repeat") repeat = std::atoi(argv[i + 1]);
        else if (flag == "--model" && (std::string(argv[i + 1]) == "mlp" || std::string(argv[i + 1]) == "char_lm"))
            model = argv[i + 1];
        else {
            fmt::print(stderr, "bench_gemm: unknown option {}\n", flag);
            return 2;
        }
    }
#if defined(_OPENMP)
    omp_set_num_threads(threads);
#endif
    Eigen::setNbThreads(threads);
#if defined(OPENBLAS_VERSION)
    openblas_set_num_threads(threads);  // OpenBLAS's own pool: it ignores OpenMP's setting
#endif
#if defined(OPENBLAS_VERSION)
    const char* blas = OPENBLAS_VERSION;
#else
    const char* blas = "cblas";
#endif
#if defined(OPENBLAS_VERSION)
    const std::string kernels = fmt::format(" ({} kernels)", openblas_get_corename());
#else
    const std::string kernels;
#endif
    fmt::print("bench_gemm: Eigen {}.{}.{} ({}) vs{}{}, {} thread(s), {} step, best of {} per shape\n", EIGEN_WORLD_VERSION,
               EIGEN_MAJOR_VERSION, EIGEN_MINOR_VERSION, Eigen::SimdInstructionSetsInUse(), blas, kernels, threads, model, repeat);
    fmt::print("{:<10} {:>16} {:>6} {:>10} {:>10} {:>12}\n", "product", "m x k x n", "count", "Eigen us", "BLAS us", "BLAS/Eigen");
    double eigen_total = 0.0, blas_total = 0.0;
    const auto shapes = model == "mlp" ? std::vector<shape>(std::begin(mlp_shapes), std::end(mlp_shapes))
                                       : std::vector<shape>(std::begin(char_lm_shapes), std::end(char_lm_shapes));
    for (const shape& s : shapes) {
        const matrix a = matrix::Random(s.transpose_a ? s.k : s.m, s.transpose_a ? s.m : s.k);
        const matrix b = matrix::Random(s.transpose_b ? s.n : s.k, s.transpose_b ? s.k : s.n);
        matrix c_eigen(s.m, s.n), c_blas(s.m, s.n);
        const double eigen = best_seconds(repeat, [&] {
            if (s.transpose_a) c_eigen.noalias() = a.transpose() * b;
            else if (s.transpose_b) c_eigen.noalias() = a * b.transpose();
            else c_eigen.noalias() = a * b;
        });
        const double blas = best_seconds(repeat, [&] {
            cblas_sgemm(CblasRowMajor, s.transpose_a ? CblasTrans : CblasNoTrans, s.transpose_b ? CblasTrans : CblasNoTrans,
                        s.m, s.n, s.k, 1.0f, a.data(), static_cast<int>(a.cols()), b.data(), static_cast<int>(b.cols()), 0.0f,
                        c_blas.data(), static_cast<int>(c_blas.cols()));
        });
        const float difference = (c_eigen - c_blas).cwiseAbs().maxCoeff();
        if (!(difference <= 1e-3f * std::max(1.0f, c_eigen.cwiseAbs().maxCoeff()))) {
            fmt::print(stderr, "bench_gemm: {} differs between Eigen and BLAS by {}\n", s.what, difference);
            return 1;
        }
        eigen_total += s.count * eigen;
        blas_total += s.count * blas;
        fmt::print("{:<10} {:>16} {:>6} {:>10.1f} {:>10.1f} {:>12.2f}\n", s.what, fmt::format("{}x{}x{}", s.m, s.k, s.n), s.count,
                   eigen * 1e6, blas * 1e6, blas / eigen);
    }
    fmt::print("{:<10} {:>16} {:>6} {:>10.1f} {:>10.1f} {:>12.2f}\n", "one step", "", "", eigen_total * 1e6, blas_total * 1e6,
               blas_total / eigen_total);
    fmt::print("summary model={} threads={} eigen_step_us={:.0f} blas_step_us={:.0f} blas/eigen={:.2f}\n", model, threads,
               eigen_total * 1e6, blas_total * 1e6, blas_total / eigen_total);
    return 0;
}
