#!/usr/bin/env bash
# The Fashion-MNIST example as the demo command builds it (build/examples/fashion_mnist), next to
# the PyTorch peer (benchmarks/pytorch_mlp.py: same model, data, recipe, float32) in one run, on
# the same thread count: seconds per epoch and the ratio to PyTorch for each mode.
#
#   cmake -P cmake/demo.cmake                     # builds build/examples/fashion_mnist
#   apt-get install python3-torch libopenblas0-pthread   # the peer (never needed by demo or tests)
#   benchmarks/demo_vs_pytorch.sh [threads=2] [epochs=2] [modes="fp32 fp8"]
#
# fashion_mnist prints the mean training time of the epochs so far after each epoch; the figure
# here is its last epoch alone (n * mean_n - (n-1) * mean_(n-1)), as PyTorch's is a steady-state
# epoch after warm-up steps. Both means are printed too.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
epochs=${2:-2}
modes=${3:-"fp32 fp8"}
example=build/examples/fashion_mnist
[[ -x $example ]] || { echo "build $example first: cmake -P cmake/demo.cmake" >&2; exit 1; }

peer=$(/usr/bin/python3 benchmarks/pytorch_mlp.py --threads "$threads" --epochs 2 | grep '^pytorch_mlp' || true)
if [[ -z $peer ]]; then
    echo "skipped: PyTorch not installed (apt-get install python3-torch libopenblas0-pthread)"
    exit 0
fi
peer_seconds=$(sed -n 's/.*seconds_per_epoch=\([0-9.]*\).*/\1/p' <<<"$peer")
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; threads=$threads epochs=$epochs"
echo "pytorch fp32: ${peer_seconds} s per epoch ($peer)"
for mode in $modes; do
    log=$(OMP_NUM_THREADS=$threads "$example" --mode "$mode" --epochs "$epochs" --loss-weight 1 --seed 0)
    means=($(sed -n 's/.*epoch_seconds=\([0-9.]*\).*/\1/p' <<<"$log"))
    n=${#means[@]}
    last=$(awk -v n="$n" -v a="${means[n-1]}" -v b="${means[n-2]:-0}" 'BEGIN { printf "%.2f", n * a - (n - 1) * b }')
    ratio=$(awk -v a="$last" -v b="$peer_seconds" 'BEGIN { printf "%.2f", a / b }')
    accuracy=$(sed -n 's/.*summary.*test_acc=\([0-9.]*\).*/\1/p' <<<"$log")
    echo "scalify $mode: last epoch ${last} s (mean of $n: ${means[n-1]} s), ${ratio}x PyTorch fp32; test_acc=$accuracy"
done
