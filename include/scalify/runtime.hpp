#pragma once
/// \file runtime.hpp
/// Process-wide settings a training program may opt into; the library itself never changes them.

#include <cstddef>
#include <limits>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace scalify {

/// Asks the C library's allocator to keep freed memory for reuse rather than hand it back to the
/// operating system, so that a training loop, which frees and allocates the same temporaries
/// every step, stops paying a page fault per 4 KiB page it writes. With glibc's defaults an array
/// above the mmap threshold (128 KiB at first, rising to the largest one freed) is a fresh mapping,
/// and the top of the heap is trimmed whenever 2x that threshold lies free at it: a char_lm step
/// then spends ~10 % of its CPU time in the kernel's page-fault path (docs/benchmarks.md). This
/// sets the mmap threshold to glibc's ceiling (32 MiB) and the trim threshold to `retain` bytes:
/// the process keeps up to that much free memory mapped. Returns whether the allocator took the
/// settings (false off glibc, where nothing changes). Call it once, at the start of main.
inline bool retain_freed_memory(std::size_t retain = std::size_t{1} << 30) noexcept
{
#if defined(__GLIBC__)
    constexpr int mmap_ceiling = 32 << 20;  // glibc's HEAP_MAX / 2 on 64-bit targets
    const int trim = retain > static_cast<std::size_t>(std::numeric_limits<int>::max())
                         ? std::numeric_limits<int>::max()
                         : static_cast<int>(retain);
    return mallopt(M_MMAP_THRESHOLD, mmap_ceiling) == 1 && mallopt(M_TRIM_THRESHOLD, trim) == 1;
#else
    (void)retain;
    return false;
#endif
}

}  // namespace scalify
