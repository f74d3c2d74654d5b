#pragma once
/// \file mpi.hpp
/// dist::mpi_reducer: the ranks of an MPI communicator as a dist::reducer. Optional: include it
/// only where MPI is (CMake: link scalify::mpi, defined when find_package(MPI) succeeds); the rest
/// of scalify never includes it.
///
///     int main(int argc, char** argv) {
///         dist::mpi_session mpi(argc, argv);             // MPI_Init_thread / MPI_Finalize
///         dist::mpi_reducer world;                       // MPI_COMM_WORLD, duplicated
///         dist::reduction_scope scope(world);            // scale decisions agree across ranks
///         ...
///     }
///
/// Every collective is an MPI_Allgather of bytes; the folds happen in rank order on every rank
/// (reducer.hpp). Byte blocks are exchanged as they are, so all ranks must share one byte order
/// and one float format (any cluster of x86-64 or AArch64 machines does). MPI errors are
/// returned, not fatal, on the reducer's communicator, and become distributed_error with MPI's
/// error string.

#include <scalify/dist/reducer.hpp>
#include <scalify/error.hpp>

#include <fmt/format.h>

// The C API only: Open MPI's and MPICH's deprecated C++ bindings do not compile warning-free.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace scalify::dist {

namespace detail {

inline void check_mpi(int code, const char* call)
{
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
    SCALIFY_THROW(distributed_error(fmt::format("{} failed: {}", call, std::string(text, static_cast<std::size_t>(length)))));
}

}  // namespace detail

/// Whether an MPI launcher (mpirun / mpiexec of Open MPI or MPICH, srun with PMI) started this
/// process. A program can then initialise MPI only when it was launched as a job, and run as a
/// plain single process otherwise (Open MPI's singleton start forks a daemon).
[[nodiscard]] inline bool launched_by_mpi() noexcept
{
    for (const char* variable : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"}) {
        if (std::getenv(variable) != nullptr) return true;
    }
    return false;
}

/// MPI_Init_thread (MPI_THREAD_FUNNELED: MPI calls come from one thread) for the object's
/// lifetime; MPI_Finalize at the end unless MPI was initialised before.
class mpi_session {
public:
    mpi_session(int& argc, char**& argv)
    {
        int initialised = 0;
        detail::check_mpi(MPI_Initialized(&initialised), "MPI_Initialized");
        if (initialised != 0) return;
        int provided = 0;
        detail::check_mpi(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
        m_owner = true;
    }
    ~mpi_session()
    {
        int finalised = 0;
        if (m_owner && MPI_Finalized(&finalised) == MPI_SUCCESS && finalised == 0) MPI_Finalize();
    }
    mpi_session(const mpi_session&) = delete;
    mpi_session& operator=(const mpi_session&) = delete;

private:
    bool m_owner = false;
};

/// The ranks of `communicator` (duplicated, so scalify's collectives never match the caller's).
/// distributed_error when MPI is not initialised or a call fails.
class mpi_reducer final : public reducer {
public:
    explicit mpi_reducer(MPI_Comm communicator = MPI_COMM_WORLD)
    {
        int initialised = 0;
        detail::check_mpi(MPI_Initialized(&initialised), "MPI_Initialized");
        if (initialised == 0) SCALIFY_THROW(distributed_error("mpi_reducer: MPI is not initialised (see dist::mpi_session)"));
        detail::check_mpi(MPI_Comm_dup(communicator, &m_communicator), "MPI_Comm_dup");
        detail::check_mpi(MPI_Comm_set_errhandler(m_communicator, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
        detail::check_mpi(MPI_Comm_rank(m_communicator, &m_rank), "MPI_Comm_rank");
        detail::check_mpi(MPI_Comm_size(m_communicator, &m_size), "MPI_Comm_size");
    }
    ~mpi_reducer() override
    {
        int finalised = 0;
        if (MPI_Finalized(&finalised) == MPI_SUCCESS && finalised == 0) MPI_Comm_free(&m_communicator);
    }
    mpi_reducer(const mpi_reducer&) = delete;
    mpi_reducer& operator=(const mpi_reducer&) = delete;

    [[nodiscard]] MPI_Comm communicator() const noexcept { return m_communicator; }

private:
    [[nodiscard]] int do_rank() const noexcept override { return m_rank; }
    [[nodiscard]] int do_size() const noexcept override { return m_size; }

    void do_all_gather(std::span<const std::byte> mine, std::span<std::byte> all) override
    {
        // MPI counts are int: blocks above INT_MAX bytes go in pieces, each gathered into a
        // staging buffer and spread to the ranks' blocks.
        const std::size_t block = mine.size();
        const auto ranks = static_cast<std::size_t>(m_size);
        if (block <= static_cast<std::size_t>(INT_MAX)) {
            detail::check_mpi(MPI_Allgather(mine.data(), static_cast<int>(block), MPI_BYTE, all.data(), static_cast<int>(block),
                                            MPI_BYTE, m_communicator),
                              "MPI_Allgather");
            return;
        }
        constexpr std::size_t piece = std::size_t{1} << 30;
        std::vector<std::byte> staging(piece * ranks);
        for (std::size_t first = 0; first < block; first += piece) {
            const std::size_t length = std::min(piece, block - first);
            detail::check_mpi(MPI_Allgather(mine.data() + first, static_cast<int>(length), MPI_BYTE, staging.data(),
                                            static_cast<int>(length), MPI_BYTE, m_communicator),
                              "MPI_Allgather");
            for (std::size_t r = 0; r < ranks; ++r) std::memcpy(all.data() + r * block + first, staging.data() + r * length, length);
        }
    }

    MPI_Comm m_communicator = MPI_COMM_NULL;
    int m_rank = 0;
    int m_size = 1;
};

}  // namespace scalify::dist
