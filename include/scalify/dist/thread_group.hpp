#pragma once
/// \file thread_group.hpp
/// Ranks as threads of one process: a dist::reducer per thread over shared memory. What a test or
/// a one-machine experiment needs to run the data-parallel code path without MPI, and what
/// checks that R ranks compute what one process does.
///
///     dist::thread_group group(2);
///     group.run([&](dist::reducer& world) {        // one thread per rank, world current in each
///         auto grads = local_gradients(world.rank());
///         dist::all_reduce_gradients(grads);
///     });                                           // joins; rethrows the first rank's exception
///
/// When a rank fails (throws) inside run(), the others' pending and later collectives throw
/// distributed_error instead of waiting for it forever.

#include <scalify/dist/reducer.hpp>
#include <scalify/error.hpp>

#include <fmt/format.h>

#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

namespace scalify::dist {

class thread_group {
public:
    /// config_error unless size >= 1.
    explicit thread_group(int size)
    {
        if (size < 1) SCALIFY_THROW(config_error(fmt::format("thread_group: size must be >= 1, got {}", size)));
        m_blocks.resize(static_cast<std::size_t>(size));
        for (int r = 0; r < size; ++r) m_members.push_back(std::make_unique<member>(*this, r));
    }
    thread_group(const thread_group&) = delete;
    thread_group& operator=(const thread_group&) = delete;

    [[nodiscard]] int size() const noexcept { return static_cast<int>(m_members.size()); }

    /// The reducer of rank `rank` (config_error outside [0, size)). Each rank's collectives must
    /// come from one thread at a time.
    [[nodiscard]] reducer& member_at(int rank)
    {
        if (rank < 0 || rank >= size()) {
            SCALIFY_THROW(config_error(fmt::format("thread_group: rank {} outside [0, {})", rank, size())));
        }
        return *m_members[static_cast<std::size_t>(rank)];
    }

    /// f(reducer&) on size() new threads, one per rank, each under a reduction_scope of its
    /// member; returns when all have; rethrows the exception of the rank that failed first (the
    /// others then fail with distributed_error, released from their collectives).
    template <class F>
    void run(F&& f)
    {
        std::exception_ptr first_failure;
        {
            std::vector<std::jthread> threads;
            for (std::size_t r = 0; r < m_members.size(); ++r) {
                threads.emplace_back([&, r] {
                    reducer& world = *m_members[r];
                    try {
                        const reduction_scope scope(world);
                        f(world);
                    } catch (...) {
                        abandon(std::current_exception(), first_failure);
                    }
                });
            }
        }
        if (first_failure) std::rethrow_exception(first_failure);
    }

    /// Marks the group broken: every waiting and later collective throws distributed_error.
    void abandon()
    {
        std::exception_ptr ignored;
        abandon(nullptr, ignored);
    }

private:
    class member final : public reducer {
    public:
        member(thread_group& group, int rank) noexcept : m_group(&group), m_rank(rank) {}

    private:
        [[nodiscard]] int do_rank() const noexcept override { return m_rank; }
        [[nodiscard]] int do_size() const noexcept override { return m_group->size(); }
        void do_all_gather(std::span<const std::byte> mine, std::span<std::byte> all) override
        {
            m_group->exchange(m_rank, mine, all);
        }

        thread_group* m_group;
        int m_rank;
    };

    void abandon(std::exception_ptr failure, std::exception_ptr& first_failure)
    {
        const std::lock_guard lock(m_mutex);
        if (!first_failure) first_failure = std::move(failure);
        m_broken = true;
        m_changed.notify_all();
    }

    // Two barriers per exchange: after the first every block is posted, after the second every
    // rank has copied them, so no block's owner returns (and frees it) while another reads it.
    void exchange(int rank, std::span<const std::byte> mine, std::span<std::byte> all)
    {
        std::unique_lock lock(m_mutex);
        m_blocks[static_cast<std::size_t>(rank)] = mine;
        wait_for_all(lock);
        for (std::size_t r = 0; r < m_blocks.size(); ++r) {
            if (m_blocks[r].size() != mine.size()) {
                SCALIFY_THROW(distributed_error(fmt::format("thread_group: rank {} gathers {} bytes, rank {} {}", rank,
                                                            mine.size(), r, m_blocks[r].size())));
            }
        }
        lock.unlock();  // the blocks stay put until the second barrier: copy without the lock
        for (std::size_t r = 0; r < m_blocks.size(); ++r) {
            if (!mine.empty()) std::memcpy(all.data() + r * mine.size(), m_blocks[r].data(), mine.size());
        }
        lock.lock();
        wait_for_all(lock);
    }

    void wait_for_all(std::unique_lock<std::mutex>& lock)
    {
        const std::size_t generation = m_generation;
        if (++m_arrived == m_members.size()) {
            m_arrived = 0;
            ++m_generation;
            m_changed.notify_all();
        } else {
            m_changed.wait(lock, [&] { return m_generation != generation || m_broken; });
        }
        if (m_broken) SCALIFY_THROW(distributed_error("thread_group: another rank failed; this collective cannot complete"));
    }

    std::vector<std::unique_ptr<member>> m_members;
    std::vector<std::span<const std::byte>> m_blocks;
    std::mutex m_mutex;
    std::condition_variable m_changed;
    std::size_t m_arrived = 0;
    std::size_t m_generation = 0;
    bool m_broken = false;
};

}  // namespace scalify::dist
