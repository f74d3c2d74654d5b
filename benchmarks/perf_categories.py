#!/usr/bin/env python3
"""Share of a `perf record` profile by what its symbols do (the rows of docs/benchmarks.md's
"Where a step goes" table): perf report's flat symbol list, each symbol counted in the first
group whose pattern it matches.

    OMP_NUM_THREADS=1 perf record -F 999 -g -o step.data build/examples/char_lm --mode fp32 --steps 60 \\
        --eval-every 60 --eval-batches 1 --sample-chars 0
    benchmarks/perf_categories.py step.data
"""
import re
import subprocess
import sys

GROUPS = [
    ("GEMM: kernels and packing", r"sgemm|gebp|gemm_pack|gemm_slab|gemm_small"),
    ("GELU and its backward (erf, exp)", r"gelu|math::erf\b"),
    ("softmax, causal mask and their backward", r"softmax|causal_mask|expf|Sleef_finz_exp|exp_fma"),
    ("layer norm and its backward", r"layer_norm|lane_statistics|normalise_last_axis|affine_normalise"),
    ("fp8 casts of the recipe", r"fake_quantize"),
    ("element-wise add and mul", r"binary_by_rule|plus_fn|multiply_by_rule"),
    ("copies: transposes, reshapes, broadcasts, joins", r"memmove|memcpy|permuted_copy|xarray_container|transpose|concatenate"),
    ("zero fills", r"memset"),
    ("AdamW", r"adam"),
    ("allocator and kernel", r"malloc|_int_free|\[kernel|free|page"),
]


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: perf_categories.py PERF_DATA")
    report = subprocess.run(["perf", "report", "-i", sys.argv[1], "--no-children", "--sort", "dso,symbol",
                             "-g", "none", "--percent-limit", "0"], capture_output=True, text=True, check=True).stdout
    shares = {name: 0.0 for name, _ in GROUPS}
    other = 0.0
    for line in report.splitlines():
        m = re.match(r"\s+([0-9.]+)%\s+(\S+)\s+\[(.)\]\s+(.*)", line)
        if not m:
            continue
        share, symbol = float(m.group(1)), m.group(2) + " " + m.group(4)
        if m.group(3) == "k":
            symbol = "[kernel " + symbol
        for name, pattern in GROUPS:
            if re.search(pattern, symbol):
                shares[name] += share
                break
        else:
            other += share
    for name, _ in GROUPS:
        print(f"| {name} | {shares[name]:.1f} % |")
    print(f"| other | {other:.1f} % |")


if __name__ == "__main__":
    main()
