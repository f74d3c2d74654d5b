#pragma once
/// \file config.hpp
/// Version macros and user-overridable switches. CMake parses the version from this file.

#define SCALIFY_VERSION_MAJOR 0
#define SCALIFY_VERSION_MINOR 1
#define SCALIFY_VERSION_PATCH 0
/// One integer, comparable: MAJOR * 10000 + MINOR * 100 + PATCH (as fmt's FMT_VERSION).
#define SCALIFY_VERSION (SCALIFY_VERSION_MAJOR * 10000 + SCALIFY_VERSION_MINOR * 100 + SCALIFY_VERSION_PATCH)

/// How the library reports runtime misuse. Override before including scalify to, e.g., abort in
/// builds without exceptions: `#define SCALIFY_THROW(e) (std::fprintf(stderr, "%s\n", (e).what()), std::abort())`.
#ifndef SCALIFY_THROW
#define SCALIFY_THROW(e) throw(e)
#endif
