#!/usr/bin/env bash
# Runs the character-level language model example (examples/char_lm.cpp) over modes x seeds in
# its default configuration and draws docs/figures/char_lm_loss.png (validation bits per character
# against steps, mean over seeds, per mode) with gnuplot.
#
#   tools/char_lm_runs.sh BUILD_DIR [OUT_DIR]
#
# BUILD_DIR holds examples/char_lm (cmake -P cmake/demo.cmake builds it in build/). Two runs go at
# a time, one thread each (the machine has 2 cores), so the ms_per_step in these logs are not the
# example's speed (docs/training.md has a run alone for that). Logs and summary.csv go to OUT_DIR
# (default build/char-lm-runs). Needs gnuplot (apt-get install gnuplot-nox) for the figure.
# MODES and SEEDS choose the runs (default: all six modes, seeds 0 1 2); runs whose log already
# ends in a summary are not repeated; PLOT_ONLY=1 only summarises the logs there and draws.
set -euo pipefail
build=${1:?usage: tools/char_lm_runs.sh BUILD_DIR [OUT_DIR]}
out=${2:-build/char-lm-runs}
exe="$build/examples/char_lm"
modes=${MODES:-"fp32 fp16 bf16 fp8 fp8-current fp8-unscaled"}
seeds=${SEEDS:-"0 1 2"}
mkdir -p "$out"

run() {  # mode seed
    local log="$out/$1_s$2.log"
    [[ -s "$log" ]] && grep -q '^summary' "$log" && return 0
    OMP_NUM_THREADS=1 "$exe" --mode "$1" --seed "$2" > "$log" 2>&1
}
export -f run
export exe out
jobs_list=()
for seed in $seeds; do
    for mode in $modes; do jobs_list+=("$mode $seed"); done
done
if [[ -z "${PLOT_ONLY:-}" ]]; then
    printf '%s\n' "${jobs_list[@]}" | xargs -P 2 -L 1 bash -c 'run "$0" "$1"'
fi

summary="$out/summary.csv"
echo "mode,seed,val_bpc,ms_per_step" > "$summary"
for log in "$out"/*.log; do
    name=$(basename "$log" .log)
    bpc=$(sed -n 's/^summary .*val_bpc=\([0-9.na]*\).*/\1/p' "$log")
    ms=$(grep -o 'ms_per_step=[0-9.]*' "$log" | tail -n 1 | cut -d= -f2)
    echo "${name%_s*},${name##*_s},$bpc,$ms" >> "$summary"
done
cat "$summary"

# Mean validation curve per mode: step, mean val_bpc over the seeds that reached that step.
curves="$out/curves.dat"
: > "$curves"
for mode in $modes; do
    echo "# $mode" >> "$curves"
    cat "$out"/"${mode}"_s[0-9]*.log | sed -n 's/^step *\([0-9]*\) .*val_bpc=\([0-9.]*\).*/\1 \2/p' |
        awk '{sum[$1] += $2; n[$1]++} END {for (s in sum) printf "%d %.4f\n", s, sum[s] / n[s]}' | sort -n >> "$curves"
    printf '\n\n' >> "$curves"
done
if command -v gnuplot > /dev/null; then
    gnuplot -e "data='$curves'; modes='$modes'; output='docs/figures/char_lm_loss.png'" tools/char_lm_loss.gp
    echo "wrote docs/figures/char_lm_loss.png"
else
    echo "gnuplot not found (apt-get install gnuplot-nox): no figure"
fi
