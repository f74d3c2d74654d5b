#!/bin/sh
# Compile time of scalify programs, one TU at a time, as a ratio to baseline.cpp (Eigen, xtensor
# and fmt and an Eigen GEMM) compiled in the same run. Prints a markdown table: CPU seconds
# (user + sys), peak memory, and the ratio. Usage, from the repository root:
#   benchmarks/compile_time/compile_time.sh [-O2] [source.cpp ...]
# With no sources: the baseline, the MLP program, fashion_mnist.cpp, char_lm.cpp and the five
# tour examples. Needs GNU time (Debian package `time`) and g++. With SCALIFY_COMPILED=1 in the
# environment the sources compile as a program linking scalify::compiled does
# (-DSCALIFY_SEPARATE_COMPILATION: the heavy kernels are the library's); the baseline is unchanged.
set -eu
opt=-O2
case "${1:-}" in -O*) opt=$1; shift ;; esac
cxx=${CXX:-g++}
here=benchmarks/compile_time
sources=${*:-"$here/mlp_program.cpp examples/fashion_mnist.cpp examples/char_lm.cpp examples/01_minifloat_tour.cpp examples/02_scaled_matmul_chain.cpp examples/03_loss_scaling.cpp examples/04_tensor_core.cpp examples/05_scaled_autodiff.cpp"}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flags="-std=c++20 $opt -Iinclude -Iexamples -isystem /usr/include/eigen3"
[ "${SCALIFY_COMPILED:-0}" = 1 ] && flags="$flags -DSCALIFY_SEPARATE_COMPILATION"

measure() {  # prints "cpu_seconds peak_MB" for compiling $1
    /usr/bin/time -f "%U %S %M" -o "$out/time" $cxx $flags -c "$1" -o "$out/object.o"
    awk '{ printf "%.1f %.0f\n", $1 + $2, $3 / 1024 }' "$out/time"
}

set -- $(measure $here/baseline.cpp)
base=$1
echo "$cxx $($cxx -dumpversion) $opt$([ "${SCALIFY_COMPILED:-0}" = 1 ] && echo ' -DSCALIFY_SEPARATE_COMPILATION'), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo
echo "| translation unit | CPU s | peak MB | x baseline |"
echo "|---|---:|---:|---:|"
echo "| baseline.cpp (Eigen + xtensor + fmt, one Eigen GEMM) | $1 | $2 | 1.0 |"
for source in $sources; do
    set -- $(measure "$source")
    echo "| $(basename "$source") | $1 | $2 | $(awk -v a="$1" -v b="$base" 'BEGIN { printf "%.1f", a / b }') |"
done
