// Eigen's sgemm against the system BLAS (cblas_sgemm; on Debian the libblas.so.3 alternative,
// OpenBLAS when libopenblas0-pthread is installed) on the GEMM shapes of one Fashion-MNIST
// training step (784-512-512-10 MLP, batch 128): the three forward products, the two input
// gradients (g . W^T) and the three weight gradients (X^T . g), transposes read in place as
// scalify's matmul_vjp reads them: would a BLAS under Eigen pay? This answers
// it for the build flags this file is compiled with (CMake builds it twice: -march=native and
// portable).
//
//   bench_gemm[_portable] [--threads N] [--repeat N]
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
};

// One step: forward X.W1, H1.W2, H2.W3; input gradients G3.W3^T, G2.W2^T; weight gradients
// X^T.G1, H1^T.G2, H2^T.G3.
constexpr shape step_shapes[] = {
    {"x.w1", 128, 784, 512, false, false},      {"h1.w2", 128, 512, 512, false, false},
    {"h2.w3", 128, 512, 10, false, false},      {"g3.w3^T", 128, 10, 512, false, true},
    {"g2.w2^T", 128, 512, 512, false, true},    {"x^T.g1", 784, 128, 512, true, false},
    {"h1^T.g2", 512, 128, 512, true, false},    {"h2^T.g3", 512, 128, 10, true, false},
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
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string flag = argv[i];
        if (flag == "--threads") threads = std::atoi(argv[i + 1]);
        else if (flag == "--repeat") repeat = std::atoi(argv[i + 1]);
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
    fmt::print("bench_gemm: Eigen {}.{}.{} ({}) vs{}, {} thread(s), best of {} per shape\n", EIGEN_WORLD_VERSION,
               EIGEN_MAJOR_VERSION, EIGEN_MINOR_VERSION, Eigen::SimdInstructionSetsInUse(), blas, threads, repeat);
    fmt::print("{:<10} {:>16} {:>10} {:>10} {:>12}\n", "product", "m x k x n", "Eigen us", "BLAS us", "BLAS/Eigen");
    double eigen_total = 0.0, blas_total = 0.0;
    for (const shape& s : step_shapes) {
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
        eigen_total += eigen;
        blas_total += blas;
        fmt::print("{:<10} {:>16} {:>10.1f} {:>10.1f} {:>12.2f}\n", s.what, fmt::format("{}x{}x{}", s.m, s.k, s.n), eigen * 1e6,
                   blas * 1e6, blas / eigen);
    }
    fmt::print("{:<10} {:>16} {:>10.1f} {:>10.1f} {:>12.2f}\n", "one step", "", eigen_total * 1e6, blas_total * 1e6,
               blas_total / eigen_total);
    fmt::print("summary threads={} eigen_step_us={:.0f} blas_step_us={:.0f} blas/eigen={:.2f} epoch_gemm_seconds eigen={:.2f} blas={:.2f}\n",
               threads, eigen_total * 1e6, blas_total * 1e6, blas_total / eigen_total, eigen_total * 468, blas_total * 468);
    return 0;
}
