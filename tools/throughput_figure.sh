#!/usr/bin/env bash
# Draws docs/figures/training_throughput.png (seconds per epoch per mode, scalify and PyTorch,
# 1 and 2 threads) from the tables two bench_training runs printed, and writes the data next to it.
#
#   build/benchmarks/bench_training --threads 1 --pytorch-file build/pytorch_mlp.txt > build/bench-1.txt
#   build/benchmarks/bench_training --threads 2 --pytorch-file build/pytorch_mlp.txt > build/bench-2.txt
#   tools/throughput_figure.sh build/bench-1.txt build/bench-2.txt
#
# The bar is the fastest run (the table's s/epoch column). Needs gnuplot (apt-get install gnuplot-nox).
set -euo pipefail
one=${1:?usage: tools/throughput_figure.sh BENCH_1_THREAD.txt BENCH_2_THREADS.txt}
two=${2:?usage: tools/throughput_figure.sh BENCH_1_THREAD.txt BENCH_2_THREADS.txt}
data=docs/figures/training_throughput.dat
mkdir -p docs/figures

# The summary table starts at the header line "mode  s/epoch ..."; rows are "<mode> <s/epoch> ...",
# PyTorch's row is "PyTorch fp32 <s/epoch> ...".
table() {
    awk '/^mode +s\/epoch/ { on = 1; next }
         on && /^summary/ { on = 0 }
         on && NF >= 2 {
             if ($1 == "PyTorch") print "PyTorch-fp32", $3; else print $1, $2 }' "$1"
}
{
    echo "# mode seconds_per_epoch_1_thread seconds_per_epoch_2_threads (bench_training, fastest run)"
    joined=$(join <(table "$one" | sort) <(table "$two" | sort))
    for mode in PyTorch-fp32 fp32 fp8 fp8-autoscale fp8-current fp16 bf16 hand-fp32; do
        grep "^$mode " <<< "$joined" || true
    done
} > "$data"

gnuplot <<GP
set terminal pngcairo size 900,420 font "DejaVu Sans,11"
set output "docs/figures/training_throughput.png"
set title "Fashion-MNIST MLP, one epoch (468 steps of batch 128): lower is faster"
set ylabel "seconds per epoch"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set yrange [0:*]
set grid ytics
set key outside right top
set xtics rotate by -25 noenhanced
plot "$data" using 2:xtic(1) title "1 thread", "" using 3 title "2 threads"
GP
echo "wrote $data and docs/figures/training_throughput.png"
