#pragma once
/// \file error.hpp
/// The exception types of scalify. Every runtime misuse ends in one of them, thrown through
/// SCALIFY_THROW, with a message that names the offending values.

#include <scalify/config.hpp>

#include <stdexcept>
#include <string>

namespace scalify {

/// Base of every scalify exception.
class error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// Sizes or shapes that do not fit together (lengths of spans, array shapes).
class shape_error : public error {
public:
    using error::error;
};

/// An index outside its range (an embedding id that is negative or not below the table's rows).
class index_error : public error {
public:
    using error::error;
};

/// A scale that is negative, NaN, infinite, or not a power of two where one is required.
class scale_error : public error {
public:
    using error::error;
};

/// Misuse of the autodiff layer: a value used after its tape is gone, values of two tapes mixed,
/// the gradient of a non-scalar output without a seed, a parameter the output does not depend on.
class autodiff_error : public error {
public:
    using error::error;
};

/// An invalid configuration parameter (history length 0, growth factor <= 1, ...).
class config_error : public error {
public:
    using error::error;
};

/// A NaN or inf met inside a check_finite_scope (strategy/non_finite.hpp): the message names the
/// op and the tensor's statistics.
class non_finite_error : public error {
public:
    using error::error;
};

/// Ranks of a data-parallel job that cannot agree: a failed collective (MPI's error string is in
/// the message), gradients whose shapes or types differ between ranks, another rank of a
/// dist::thread_group that failed while this one waited for it.
class distributed_error : public error {
public:
    using error::error;
};

}  // namespace scalify
