#!/usr/bin/env bash
# The char_lm example as the demo command builds it (build/examples/char_lm, scalify fp32 and fp8)
# next to its PyTorch peer (benchmarks/pytorch_char_lm.py: same model, corpus, windows, recipe,
# float32), interleaved in one run, on the same thread counts: ms per training step and the ratio
# to PyTorch within each round.
#
#   cmake -P cmake/demo.cmake                     # builds build/examples/char_lm and fashion_mnist
#   apt-get install python3-torch libopenblas0-pthread   # the peer (never needed by demo or tests)
#   benchmarks/char_lm_vs_pytorch.sh [--load] [--rounds R=2] [--omp-wait-policy passive|active|unset]
#                                    [threads="1 2"] [steps=100]
#
# ms per step is each program's mean over all its steps from the first (char_lm's own figure; the
# peer times batch, forward, backward and update the same way); the evaluations are not timed.
# others% is the share of the machine's CPU time that other processes took during the run (from
# /proc/stat and the program's own CPU time): a shared VM's noise shows there.
#
# --load measures each program quiet and then beside one CPU-bound process (a shell loop this
# script starts and kills), and prints the slowdown loaded/quiet: char_lm fp32 / fp8 against its
# peer, and fashion_mnist fp32 / fp8 (--epochs 1 --train-limit 20000: 156 steps) against
# pytorch_mlp.py (156 timed steps, no warm-up, as fashion_mnist's first epoch).
#
# OMP_WAIT_POLICY is passive for every program by default: spinning OpenMP workers take the core a
# busy neighbour or the BLAS's own threads need (pytorch_mlp.py's comment has the numbers).
set -euo pipefail
cd "$(dirname "$0")/.."
load=0 rounds=2 policy=passive
while [[ ${1:-} == --* ]]; do
    case $1 in
        --load) load=1 ;;
        --rounds) rounds=$2; shift ;;
        --omp-wait-policy) policy=$2; shift ;;
        *) echo "usage: $0 [--load] [--rounds R] [--omp-wait-policy passive|active|unset] [threads] [steps]" >&2; exit 2 ;;
    esac
    shift
done
threads_list=${1:-"1 2"}
steps=${2:-100}
python=/usr/bin/python3  # Debian's torch is installed for the system interpreter, not pyenv's
for example in build/examples/char_lm build/examples/fashion_mnist; do
    [[ -x $example ]] || { echo "build $example first: cmake -P cmake/demo.cmake" >&2; exit 1; }
done
if ! $python -c 'import torch' 2>/dev/null; then
    echo "skipped: PyTorch not installed (apt-get install python3-torch libopenblas0-pthread)"
    exit 0
fi
if [[ $policy == unset ]]; then unset OMP_WAIT_POLICY; else export OMP_WAIT_POLICY=$policy; fi

tmp=$(mktemp -d)
spinner=
trap '[[ -n $spinner ]] && kill "$spinner" 2>/dev/null; rm -rf "$tmp"' EXIT
hz=$(getconf CLK_TCK)
busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }  # machine CPU jiffies, steal included

# measure PROGRAM THREADS: runs it, sets $value (ms per step, or s per epoch for the MLPs) and
# $others (% of the machine's CPU time taken by other processes meanwhile).
measure() {
    local figure cmd
    case $1 in
        lm-fp32 | lm-fp8)
            cmd=(env OMP_NUM_THREADS="$2" build/examples/char_lm --mode "${1#lm-}" --steps "$steps" --seed 0
                 --eval-every "$steps" --eval-batches 2 --sample-chars 0)
            figure='s/.* ms_per_step=\([0-9.]*\).*/\1/p' ;;
        lm-pytorch)
            cmd=("$python" benchmarks/pytorch_char_lm.py --threads "$2" --steps "$steps" --seed 0
                 --eval-every "$steps" --eval-batches 2 --omp-wait-policy "$policy")
            figure='s/^summary.* ms_per_step=\([0-9.]*\).*/\1/p' ;;
        mlp-fp32 | mlp-fp8)
            cmd=(env OMP_NUM_THREADS="$2" build/examples/fashion_mnist --mode "${1#mlp-}" --epochs 1
                 --train-limit 20000 --loss-weight 1 --seed 0)
            figure='s/.*epoch_seconds=\([0-9.]*\).*/\1/p' ;;
        mlp-pytorch)  # its seconds_per_epoch is scaled to 468 steps: / 3 gives the 156 it ran
            cmd=("$python" benchmarks/pytorch_mlp.py --threads "$2" --epochs 1 --steps 156 --warmup-steps 0
                 --omp-wait-policy "$policy")
            figure='s/.*seconds_per_epoch=\([0-9.]*\).*/\1/p' ;;
    esac
    local before after
    before=$(busy)
    TIMEFORMAT='%R %U %S'
    { time "${cmd[@]}" >"$tmp/out" 2>&1; } 2>"$tmp/time" || { cat "$tmp/out" >&2; exit 1; }
    after=$(busy)
    value=$(sed -n "$figure" "$tmp/out" | tail -1)
    [[ -n $value ]] || { echo "no figure in the output of ${cmd[*]}:" >&2; cat "$tmp/out" >&2; exit 1; }
    [[ $1 == mlp-pytorch ]] && value=$(awk -v v="$value" 'BEGIN { printf "%.3f", v / 3 }')
    others=$(awk -v b="$before" -v a="$after" -v hz="$hz" -v n="$(nproc)" \
        '{ o = ((a - b) / hz - $2 - $3) / ($1 * n); printf "%.0f", 100 * (o < 0 ? 0 : o) }' "$tmp/time")
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; steps=$steps OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-unset}" \
     "torch=$($python -c 'import torch; print(torch.__version__)'); $(date -u '+%F %H:%M UTC')"

if ((load == 0)); then
    printf '%-7s %-5s %12s %12s %12s %9s %9s %s\n' threads round scalify_fp32 scalify_fp8 pytorch_fp32 \
        fp32/pt fp8/pt "others% (fp32,fp8,pt)"
    for t in $threads_list; do
        for ((r = 1; r <= rounds; ++r)); do
            measure lm-fp32 "$t"; a=$value oa=$others
            measure lm-fp8 "$t"; b=$value ob=$others
            measure lm-pytorch "$t"; p=$value op=$others
            printf '%-7s %-5s %12s %12s %12s %9s %9s %s\n' "$t" "$r" "$a" "$b" "$p" "$(ratio "$a" "$p")" \
                "$(ratio "$b" "$p")" "$oa,$ob,$op"
        done
    done
    echo "(ms per training step; ratios scalify / PyTorch fp32 within the round)"
    exit 0
fi

# --load: each program quiet, then at once beside the spinner, so both see the same machine state.
printf '%-7s %-18s %10s %10s %9s %s\n' threads program quiet loaded slowdown "others% (quiet,loaded)"
for t in $threads_list; do
    for program in lm-fp32 lm-fp8 lm-pytorch mlp-fp32 mlp-fp8 mlp-pytorch; do
        measure "$program" "$t"; quiet=$value oq=$others
        bash -c 'while :; do :; done' &
        spinner=$!
        measure "$program" "$t"; loaded=$value
        kill "$spinner"; wait "$spinner" 2>/dev/null || true
        spinner=
        printf '%-7s %-18s %10s %10s %9s %s\n' "$t" "$program" "$quiet" "$loaded" "$(ratio "$loaded" "$quiet")" "$oq,$others"
    done
done
echo "(lm-*: ms per step, $steps steps; mlp-*: s per 156-step epoch; slowdown = loaded / quiet)"
