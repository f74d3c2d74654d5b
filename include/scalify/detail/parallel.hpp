#pragma once
/// \file parallel.hpp
/// Element-wise loops split across OpenMP threads when the program is built with OpenMP and the
/// loop is long enough to pay for the fork. Each thread takes one contiguous range and a range's
/// partial results are combined in range order, so results never depend on the thread count.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <limits>
#include <utility>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace scalify::detail {

/// What an OpenMP fork and join costs here, in nanoseconds: the fastest of a few empty parallel
/// regions, measured once, at the first call (0 without OpenMP, inside a parallel region or with
/// one thread). Spinning workers (libgomp's default) answer in 1-15 us; sleeping ones
/// (OMP_WAIT_POLICY=passive, which the examples recommend on a shared machine) in 70-90 us on the
/// project's 2-vCPU VM, where a 131k-element add took 49 us on one thread and 104-120 on two.
[[nodiscard]] inline double fork_join_nanoseconds() noexcept
{
#if defined(_OPENMP)
    static const double cost = [] {
        if (omp_in_parallel() || omp_get_max_threads() < 2) return 0.0;
        double best = std::numeric_limits<double>::max();
        for (int trial = 0; trial < 4; ++trial) {
            const auto start = std::chrono::steady_clock::now();
#pragma omp parallel
            {
                asm volatile("" ::: "memory");  // a region with a body: nothing to elide
            }
            best = std::min(best, std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count());
        }
        return best;
    }();
    return cost;
#else
    return 0.0;
#endif
}

/// Elements per range below which a loop stays on the calling thread: 2^15 (about 10 us of simple
/// work), or more where a fork and join costs more, so that each thread's part takes at least as
/// long as the fork (at 0.5 ns an element of simple work: an add streams 0.4-0.7 ns an element).
/// Only the split depends on it, never a result's bits.
[[nodiscard]] inline std::size_t parallel_grain() noexcept
{
    static const std::size_t grain =
        std::max<std::size_t>(std::size_t{1} << 15, static_cast<std::size_t>(fork_join_nanoseconds() / 0.5));
    return grain;
}

/// How many ranges parallel_ranges splits `count` elements into (1 without OpenMP, inside a
/// parallel region, or for short loops).
[[nodiscard]] inline std::size_t parallel_range_count(std::size_t count) noexcept
{
#if defined(_OPENMP)
    if (omp_in_parallel()) return 1;
    const std::size_t grain = parallel_grain();
    if (count < 2 * grain) return 1;
    return std::max<std::size_t>(1, std::min<std::size_t>(count / grain, static_cast<std::size_t>(omp_get_max_threads())));
#else
    (void)count;
    return 1;
#endif
}

/// body(range, begin, end) for `ranges` contiguous ranges covering [0, count), concurrently when
/// there are several (one call body(0, 0, count) for ranges <= 1). body must not throw.
template <class Body>
void split_ranges(std::size_t ranges, std::size_t count, Body&& body)
{
    if (ranges <= 1) {
        body(std::size_t{0}, std::size_t{0}, count);
        return;
    }
#if defined(_OPENMP)
    const auto n = static_cast<std::ptrdiff_t>(ranges);
#pragma omp parallel for schedule(static) num_threads(static_cast<int>(ranges))
    for (std::ptrdiff_t r = 0; r < n; ++r) {
        const auto range = static_cast<std::size_t>(r);
        body(range, count * range / ranges, count * (range + 1) / ranges);
    }
#endif
}

/// body(range, begin, end) for the parallel_range_count(count) contiguous ranges covering
/// [0, count), concurrently when there are several. body must not throw.
template <class Body>
void parallel_ranges(std::size_t count, Body&& body)
{
    split_ranges(parallel_range_count(count), count, std::forward<Body>(body));
}

/// body(first, last) over contiguous ranges of `lanes` lanes of `length` elements each, split
/// across threads as parallel_ranges splits lanes * length elements (never a lane in two). A
/// lane's result is computed by one thread in its own order, so it never depends on the thread
/// count. body must not throw.
template <class Body>
void parallel_lanes(std::size_t lanes, std::size_t length, Body&& body)
{
    split_ranges(std::min(lanes, parallel_range_count(lanes * length)), lanes,
                 [&body](std::size_t, std::size_t first, std::size_t last) { body(first, last); });
}

/// body(i) for i in [0, count), one task per index across the OpenMP threads (for heavy tasks
/// such as a tensor-core model's output rows; no grain).
template <class Body>
void parallel_for(std::size_t count, Body&& body)
{
#if defined(_OPENMP)
    const auto n = static_cast<std::ptrdiff_t>(count);
#pragma omp parallel for schedule(static) if (n > 1)
    for (std::ptrdiff_t i = 0; i < n; ++i) body(static_cast<std::size_t>(i));
#else
    for (std::size_t i = 0; i < count; ++i) body(i);
#endif
}

/// parallel_for where `fork` says whether the tasks together pay for a fork and join; on the
/// calling thread otherwise.
template <class Body>
void parallel_for(std::size_t count, bool fork, Body&& body)
{
    if (fork) {
        parallel_for(count, std::forward<Body>(body));
        return;
    }
    for (std::size_t i = 0; i < count; ++i) body(i);
}

/// Whether GEMM work of `multiply_adds` pays for a fork and join: at least 2^20 of them (50-100
/// us on one thread at the 10-20 per ns that small products reach), or 40 per nanosecond of the
/// fork's cost, where forking costs more (a sleeping team: OMP_WAIT_POLICY=passive), so that
/// each thread's part lasts at least as long as the fork.
[[nodiscard]] inline bool gemm_work_pays_fork(double multiply_adds) noexcept
{
    return multiply_adds >= std::max(double(1 << 20), 40.0 * fork_join_nanoseconds());
}

/// Whether the caller already runs inside an active OpenMP parallel region.
[[nodiscard]] inline bool in_parallel_region() noexcept
{
#if defined(_OPENMP)
    return omp_in_parallel() != 0;
#else
    return false;
#endif
}

/// body(task) for task in [0, count), round-robin over min(threads, count) OpenMP threads but
/// never fewer than two: code that forks only outside a parallel region (Eigen's GEMM) then runs
/// sequentially in every task, even when there is one. body must not throw.
template <class Body>
void parallel_tasks_in_region(std::size_t count, int threads, Body&& body)
{
#if defined(_OPENMP)
    const int team = std::max(2, count < static_cast<std::size_t>(threads) ? static_cast<int>(count) : threads);
#pragma omp parallel num_threads(team)
    for (auto task = static_cast<std::size_t>(omp_get_thread_num()); task < count;
         task += static_cast<std::size_t>(omp_get_num_threads())) {
        body(task);
    }
#else
    (void)threads;
    for (std::size_t task = 0; task < count; ++task) body(task);
#endif
}

}  // namespace scalify::detail
