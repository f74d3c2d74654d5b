#pragma once
/// \file reducer.hpp
/// What the ranks of a data-parallel job must agree on, and the one interface scalify asks it
/// through: the decisions that become shared state or that the fp8 recipes take per tensor, i.e.
/// the amax of current and delayed scaling and of the autodiff recipe's current scaling (as
/// TransformerEngine reduces its amax), AutoScale's measurements (its held multipliers), the loss
/// scaler's found-inf. scalify's own rescalings (dynamic_rescale_*, the dynamic_abs strategy) stay
/// local, as the design document wants ("every rescaling is purely local, no need anymore for
/// global reduce of statistics"): a power-of-two rebalance moves no value, and the gradient
/// all-reduce respects each rank's scales. The default is one process, where every reduction is
/// the identity and costs nothing.
///
/// One primitive, all_gather of equal-size byte blocks. max, sum and any are built on it and fold
/// the gathered blocks in rank order on every rank, so every rank computes the same bits (an MPI
/// all-reduce promises neither the order nor the same result on every rank). Implementations:
/// single_process_reducer() (the default), dist::thread_group (ranks as threads of one process,
/// thread_group.hpp) and dist::mpi_reducer (optional, dist/mpi.hpp).
///
///     dist::reduction_scope scope(world);          // this thread's reductions now span the ranks
///     auto [loss, grads] = ad::value_and_grad<unit_scaling>(f, params);   // on the local batch
///     dist::all_reduce_gradients(grads);           // the mean over ranks, the same bits everywhere
///
/// Contract, as for any collective: every rank calls the same reductions, in the same order, with
/// blocks of the same size.

#include <scalify/detail/scoped_setting.hpp>
#include <scalify/error.hpp>

#include <fmt/format.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

namespace scalify::dist {

/// What one rank handed to collectives since the last reset.
struct traffic_stats {
    std::size_t collectives = 0;
    std::size_t payload_bytes = 0;  ///< the bytes of this rank's own blocks (an all-gather ring forwards (size - 1) times that)
};

/// The ranks of a job, as collectives over them. Public functions are non-virtual (they check,
/// count and fold); an implementation provides rank, size and all_gather.
class reducer {
public:
    virtual ~reducer() = default;

    [[nodiscard]] int rank() const noexcept { return do_rank(); }
    [[nodiscard]] int size() const noexcept { return do_size(); }

    /// `all` receives size() blocks of mine.size() bytes, rank 0 first. shape_error unless
    /// all.size() == size() * mine.size().
    void all_gather(std::span<const std::byte> mine, std::span<std::byte> all)
    {
        if (all.size() != mine.size() * static_cast<std::size_t>(size())) {
            SCALIFY_THROW(shape_error(fmt::format("reducer::all_gather: {} ranks of {} bytes need {} bytes, got {}", size(),
                                                  mine.size(), mine.size() * static_cast<std::size_t>(size()), all.size())));
        }
        if (size() == 1) {
            if (!mine.empty()) std::memcpy(all.data(), mine.data(), mine.size());
            return;
        }
        ++m_traffic.collectives;
        m_traffic.payload_bytes += mine.size();
        do_all_gather(mine, all);
    }

    /// Element-wise maximum over the ranks, in place; NaN when any rank holds NaN.
    void max(std::span<double> values)
    {
        fold(values, [](double a, double b) { return std::isnan(a) || std::isnan(b) ? a + b : (b > a ? b : a); });
    }
    /// Element-wise sum over the ranks, in place, rank 0 first on every rank.
    void sum(std::span<double> values)
    {
        fold(values, [](double a, double b) { return a + b; });
    }
    [[nodiscard]] double max(double value)
    {
        max(std::span<double>(&value, 1));
        return value;
    }
    [[nodiscard]] double sum(double value)
    {
        sum(std::span<double>(&value, 1));
        return value;
    }
    /// Whether any rank's flag is set.
    [[nodiscard]] bool any(bool flag) { return max(flag ? 1.0 : 0.0) != 0.0; }

    [[nodiscard]] traffic_stats traffic() const noexcept { return m_traffic; }
    void reset_traffic() noexcept { m_traffic = {}; }

protected:
    reducer() = default;
    reducer(const reducer&) = default;
    reducer& operator=(const reducer&) = default;

private:
    [[nodiscard]] virtual int do_rank() const noexcept = 0;
    [[nodiscard]] virtual int do_size() const noexcept = 0;
    /// Sizes are checked and size() > 1.
    virtual void do_all_gather(std::span<const std::byte> mine, std::span<std::byte> all) = 0;

    template <class Op>
    void fold(std::span<double> values, Op op)
    {
        const auto ranks = static_cast<std::size_t>(size());
        if (ranks == 1 || values.empty()) return;
        std::vector<double> gathered(values.size() * ranks);
        all_gather(std::as_bytes(values), std::as_writable_bytes(std::span<double>(gathered)));
        for (std::size_t i = 0; i < values.size(); ++i) {
            double folded = gathered[i];
            for (std::size_t r = 1; r < ranks; ++r) folded = op(folded, gathered[r * values.size() + i]);
            values[i] = folded;
        }
    }

    traffic_stats m_traffic;
};

namespace detail {

class single_process final : public reducer {
    [[nodiscard]] int do_rank() const noexcept override { return 0; }
    [[nodiscard]] int do_size() const noexcept override { return 1; }
    void do_all_gather(std::span<const std::byte>, std::span<std::byte>) override {}  // never called: size() == 1
};

inline reducer*& current_reducer_slot() noexcept
{
    thread_local reducer* current = nullptr;
    return current;
}

}  // namespace detail

/// This thread's reducer (single_process_reducer() outside any reduction_scope).
[[nodiscard]] reducer& current_reducer() noexcept;

namespace detail {

/// An amax agreed over the ranks of current_reducer(), in this rank's data units: the largest
/// data_amax x scale of any rank, divided by this rank's scale. With one process, or a zero
/// scale here (the array is zeros), data_amax itself. Every rank calls it, whatever its data.
[[nodiscard]] inline double global_data_amax(double data_amax, double scale)
{
    reducer& world = current_reducer();
    if (world.size() == 1) return data_amax;
    const double value_amax = world.max(scale > 0.0 ? data_amax * scale : 0.0);
    return scale > 0.0 ? value_amax / scale : data_amax;
}

}  // namespace detail

/// The reducer of one process alone: rank 0 of 1, every reduction the identity.
[[nodiscard]] inline reducer& single_process_reducer() noexcept
{
    static detail::single_process instance;
    return instance;
}

inline reducer& current_reducer() noexcept
{
    reducer* current = detail::current_reducer_slot();
    return current != nullptr ? *current : single_process_reducer();
}

/// Makes `r` this thread's reducer for the scope's lifetime (scopes nest). `r` must outlive it.
class reduction_scope {
public:
    explicit reduction_scope(reducer& r) noexcept : m_reducer(detail::current_reducer_slot(), &r) {}

private:
    scalify::detail::scoped_setting<reducer*> m_reducer;
};

}  // namespace scalify::dist
