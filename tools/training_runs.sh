#!/usr/bin/env bash
# Runs the Fashion-MNIST example over modes x seeds x loss weights and draws docs/figures/
# training_accuracy.png (test accuracy per epoch per mode, mean over seeds) with gnuplot.
#
#   tools/training_runs.sh BUILD_DIR [OUT_DIR]
#
# BUILD_DIR holds examples/fashion_mnist (cmake -P cmake/demo.cmake builds it in build/). Two runs
# go at a time, one thread each (the machine has 2 cores). Logs, a CSV per run and summary.csv go
# to OUT_DIR (default build/training-runs). Needs gnuplot (apt-get install gnuplot-nox).
set -euo pipefail
build=${1:?usage: tools/training_runs.sh BUILD_DIR [OUT_DIR]}
out=${2:-build/training-runs}
exe="$build/examples/fashion_mnist"
modes=${MODES:-"fp32 fp16 bf16 fp8 fp8-current fp8-unscaled"}
seeds=${SEEDS:-"0 1 2"}
mkdir -p "$out"

run() {  # mode seed weight epochs
    local log="$out/$1_w$3_s$2.log"
    [[ -s "$log" ]] && grep -q '^summary' "$log" && return 0
    OMP_NUM_THREADS=1 "$exe" --mode "$1" --epochs "$4" --loss-weight "$3" --seed "$2" > "$log" 2>&1
}
export -f run
export exe out
jobs_list=()
for weight_epochs in "1:10" "2^-14:5"; do
    for mode in $modes; do
        for seed in $seeds; do
            jobs_list+=("$mode $seed ${weight_epochs%%:*} ${weight_epochs##*:}")
        done
    done
done
# PLOT_ONLY=1 skips the runs and draws what OUT_DIR already holds.
if [[ -z "${PLOT_ONLY:-}" ]]; then
    printf '%s\n' "${jobs_list[@]}" | xargs -P 2 -I{} bash -c 'run {}'
fi

# summary.csv: mode,weight,seed,epoch,test_acc,epoch_seconds
echo "mode,weight,seed,epoch,test_acc,epoch_seconds" > "$out/summary.csv"
for log in "$out"/*.log; do
    name=$(basename "$log" .log)
    mode=${name%_w*}; rest=${name#*_w}; weight=${rest%_s*}; seed=${rest##*_s}
    awk -v m="$mode" -v w="$weight" -v s="$seed" '/^epoch/ {
        split($3, a, "="); split($4, t, "="); split($5, e, "=");
        printf "%s,%s,%s,%d,%s,%s\n", m, w, s, $2, t[2], e[2] }' "$log" >> "$out/summary.csv"
done

# Mean test accuracy per epoch for each mode, one data file per (mode, weight).
for weight in 1 "2^-14"; do
    for mode in $modes; do
        awk -F, -v m="$mode" -v w="$weight" '$1 == m && $2 == w { sum[$4] += $5; n[$4]++ }
            END { for (e in sum) printf "%d %.4f\n", e, sum[e] / n[e] }' "$out/summary.csv" | sort -n \
            > "$out/mean_${mode}_w${weight}.dat"
    done
done

mkdir -p docs/figures
plot=""
for mode in $modes; do
    [[ -s "$out/mean_${mode}_w1.dat" ]] && plot+="'$out/mean_${mode}_w1.dat' using 1:2 with linespoints title '$mode',"
done
plot2=""
for mode in $modes; do
    [[ -s "$out/mean_${mode}_w2^-14.dat" ]] && plot2+="'$out/mean_${mode}_w2^-14.dat' using 1:2 with linespoints title '$mode',"
done
gnuplot <<GP
set terminal pngcairo size 1100,420 font 'DejaVu Sans,10'
set output 'docs/figures/training_accuracy.png'
set multiplot layout 1,2
set key bottom right
set grid
set xlabel 'epoch'
set ylabel 'test accuracy (mean over the seeds run)'
set title 'loss weight 1'
set yrange [0.78:0.90]
plot ${plot%,}
set title 'loss weight 2^{-14}'
set yrange [0:0.90]
plot ${plot2%,}
unset multiplot
GP
echo "wrote $out/summary.csv and docs/figures/training_accuracy.png"
