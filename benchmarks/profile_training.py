#!/usr/bin/env python3
"""Where a training step's time goes: reads `perf script` output of bench_training and attributes
every sample of the timed loop to the op it was in (the innermost frame naming one: bias add, relu,
the transposes matmul_vjp copies, casts, value() copies, the tape, ...) and to what it was doing
there (GEMM kernel, page faults, malloc/free, memcpy/memset, other loops). Used for the profile in
docs/benchmarks.md ("Training throughput"):

    perf record -F 1999 --call-graph dwarf,16384 -o fp32.data -- \\
        build/benchmarks/bench_training --modes fp32 --steps 468 --threads 1
    perf script -i fp32.data -F pid,tid,ip,sym --inline > fp32.txt
    python3 benchmarks/profile_training.py fp32.txt

Build bench_training with -g -fno-omit-frame-pointer (CMAKE_CXX_FLAGS_RELEASE) so inlined frames
keep their names. Samples outside the timed loop (loading the data) are left out; samples of other
threads (Eigen's OpenMP workers) are reported apart, by what they were doing.
"""

import argparse
import collections
import re
import sys

# (op, pattern on the frame's base name); the innermost frame that matches one decides the op.
OPS = [
    ("value() copy", r"^scalify::ScaledArray::value$"),
    ("transpose copy (matmul_vjp)", r"^scalify::transpose$"),
    ("decode operands to float panels", r"^scalify::detail::as_matrix$"),
    ("matmul (GEMM)", r"^scalify::detail::matmul_with$|^scalify::tensor_core::|^Eigen::internal::(gebp_kernel|gemm_pack_lhs|"
                      r"gemm_pack_rhs|general_matrix_matrix_product|parallelize_gemm)"),
    ("relu backward", r"^scalify::relu_vjp$"),
    ("relu forward", r"^scalify::relu$"),
    ("bias gradient (column sum)", r"^scalify::detail::unbroadcast$|^scalify::reduce_sum$"),
    ("add_vjp (cotangent passed on)", r"^scalify::add_vjp$"),
    ("bias add forward", r"^scalify::add$"),
    ("cast", r"^scalify::cast$|rescale_for_cast$|^scalify::convert|^scalify::ad::detail::recipe_(cast_array|grid)$"),
    ("loss: softmax cross-entropy", r"^scalify::softmax_cross_entropy$"),
    ("loss: dynamic_rescale_l2 of the logits' gradient", r"^scalify::dynamic_rescale_l2$"),
    ("scalar mul (loss path)", r"^scalify::mul$"),
    ("sgd update", r"^scalify::ad::sgd::"),
    ("batch assembly (rows_of, labels)", r"^fashion::rows_of$|batches::(images|labels)$"),
    ("gradient accumulation", r"value_node::accumulate$"),
    ("ScaledArray copy", r"^scalify::ScaledArray::ScaledArray$"),
    ("tape teardown (frees the graph)", r"tape_state::~tape_state$|^scalify::ad::tape::~tape$"),
    ("tape / graph bookkeeping", r"^scalify::ad::detail::record_op|^scalify::ad::tape::|^scalify::ad::detail::value_node|"
                                 r"^scalify::ad::var::|^scalify::ad::value_and_grad|tree_map$|tree_zip$|^scalify::ad::gradient::visit|"
                                 r"^std::_Function|^std::function|_Sp_counted|shared_ptr|^scalify::ad::detail::var_access"),
    ("hand-written trainer: other", r"^hand_written::"),  # split by HAND below
    ("train_step (rest)", r"^fashion::train_step$"),
]
OPS = [(name, re.compile(pattern)) for name, pattern in OPS]

# Context overrides: (op found, pattern of a frame further out, op reported); the nearest such
# frame decides. value_and_grad's lambdas count in source order: #1 watches a parameter, #2 reads
# its gradient.
CONTEXT = [
    ("bias add forward", r"value_node::accumulate$", "gradient accumulation"),
    ("cast", r"recipe_matmul::\{lambda", "cast: cotangent to the gradient type"),
    ("cast", r"^scalify::detail::matmul_with$", "matmul: product encoded into a narrow result type"),
    ("cast", r"^scalify::relu_vjp$", "relu backward"),
    ("cast", r"^scalify::detail::unbroadcast$|^scalify::reduce_sum$", "bias gradient (column sum)"),
    ("cast", r"recipe_matmul$", "cast: matmul operands to the forward type"),
    ("scalar mul (loss path)", r"^scalify::ad::softmax_cross_entropy", "loss: gradient times cotangent (mul)"),
    ("value() copy", r"^scalify::relu_vjp$", "value() copy (in relu_vjp)"),
    ("value() copy", r"^fashion::train_step$", "value() copy (loss read)"),
    ("ScaledArray copy", r"^scalify::ad::value_and_grad::\{lambda#1\}", "copy: parameters watched on the tape"),
    ("ScaledArray copy", r"^scalify::ad::value_and_grad::\{lambda#2\}", "copy: gradients read off the tape"),
    ("ScaledArray copy", r"^scalify::ad::detail::lift$", "copy: constant operand lifted into a var"),
    ("ScaledArray copy", r"_grad$", "copy: value through a gradient-path op's identity forward"),
    ("ScaledArray copy", r"rescale_for_cast$", "cast: rescale before the cast (copy)"),
]
CONTEXT = [(found, re.compile(outer), reported) for found, outer, reported in CONTEXT]

# The hand-written trainer's xtensor expressions are inlined into its functions: they are told
# apart by the functor in the raw symbol of an inner frame. (frame of the trainer, functor, op)
HAND = [
    (r"::backward$", "conditional_ternary", "relu backward"),
    (r"::backward$", "xreducer", "bias gradient (column sum)"),
    (r"::forward$", "maximum", "relu forward"),
    (r"::forward$", "plus", "bias add forward"),
    (r"^hand_written::step$", "minus", "sgd update"),
    (r"^hand_written::quantize$", "", "cast (quantize<float>: a float copy)"),
]
HAND = [(re.compile(frame), functor, op) for frame, functor, op in HAND]

KINDS = [
    ("page faults", re.compile(r"page_fault|clear_page|do_anonymous_page|handle_mm_fault")),
    ("mmap/munmap", re.compile(r"munmap|mmap|__x64_sys_brk|zap_pte|unmap_|tlb_finish|release_pages")),
    ("malloc/free", re.compile(r"^(_int_malloc|_int_free|malloc|free|cfree|__libc_malloc|__libc_free|sysmalloc|systrim|"
                               r"malloc_consolidate|unlink_chunk|operator new|operator delete|__GI___libc_malloc|"
                               r"__GI___libc_free|_int_memalign|__posix_memalign|aligned_alloc|tcache_)")),
    ("memcpy/memset", re.compile(r"__mem(cpy|set|move)|^memcpy|^memset|^memmove")),
    ("GEMM kernel", re.compile(r"^Eigen::internal::(gebp_kernel|gemm_pack_lhs|gemm_pack_rhs)|^scalify::tensor_core::detail::")),
    ("OpenMP runtime", re.compile(r"^(gomp_|GOMP_|do_spin|do_wait|futex)")),
]


def base_name(symbol):
    """The symbol without template arguments, parameter lists or a trailing `(inlined)`."""
    symbol = symbol.replace(" (inlined)", "")
    out, depth_angle, depth_paren = [], 0, 0
    i = 0
    while i < len(symbol):
        c = symbol[i]
        if symbol.startswith("operator()", i):
            out.append("operator()")
            i += len("operator()")
            continue
        if c == "(":
            depth_paren += 1
        elif c == ")":
            depth_paren -= 1
        elif c == "<" and depth_paren == 0:
            depth_angle += 1
        elif c == ">" and depth_paren == 0 and depth_angle > 0:
            depth_angle -= 1
        elif depth_angle == 0 and depth_paren == 0:
            out.append(c)
        i += 1
    return "".join(out).strip()


def samples(lines):
    """(pid, tid, frame base names, raw frames), innermost first, per sample of `perf script -F pid,tid,ip,sym`."""
    head, frames, raw = None, [], []
    for line in lines:
        if not line.strip():
            if head:
                yield head[0], head[1], frames, raw
            head, frames, raw = None, [], []
        elif not line.startswith("\t"):  # a header: "pid/tid", right-aligned
            fields = line.split()
            pid_tid = fields[0].split("/") if "/" in fields[0] else fields[:2]
            head = (int(pid_tid[0]), int(pid_tid[1]))
        else:
            parts = line.strip().split(None, 1)
            raw.append(parts[1] if len(parts) > 1 else "[unknown]")
            frames.append(base_name(raw[-1]))
    if head:
        yield head[0], head[1], frames, raw


def classify(frames, raw):
    op = "other"
    for depth, frame in enumerate(frames):
        hit = next((name for name, pattern in OPS if pattern.search(frame)), None)
        if hit:
            op = hit
            overrides = [(outer, reported) for found, outer, reported in CONTEXT if found == hit]
            for f in frames[depth + 1:]:
                reported = next((r for outer, r in overrides if outer.search(f)), None)
                if reported:
                    op = reported
                    break
            if hit == "hand-written trainer: other":
                for pattern, functor, reported in HAND:
                    if pattern.search(frame) and any(functor in r for r in raw[:depth]):
                        op = reported
                        break
            break
    kind = "other (loops)"
    for frame in frames:
        hit = next((name for name, pattern in KINDS if pattern.search(frame)), None)
        if hit:
            kind = hit
            break
        if frame.startswith("scalify::") or frame.startswith("xt::") or frame.startswith("hand_written::"):
            break  # the first library frame: what it runs itself is a loop
    return op, kind


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("script", help="perf script -F pid,tid,ip,sym --inline output")
    parser.add_argument("--timed", default=r"^(\(anonymous namespace\)::)?timed$",
                        help="regex of the frame that marks the timed loop (default: bench_training's timed)")
    parser.add_argument("--show", help="also print the commonest call paths of this op (for drilling down)")
    args = parser.parse_args()
    timed = re.compile(args.timed)
    ops, kinds, op_kinds, workers, paths = (collections.Counter() for _ in range(5))
    total = 0
    with open(args.script, encoding="utf-8", errors="replace") as f:
        for pid, tid, frames, raw in samples(f):
            if tid != pid:
                kind = next((name for frame in frames for name, pattern in KINDS if pattern.search(frame)), None)
                if kind is None:  # libgomp has no symbols: a worker outside any GEMM waits for the next one
                    known = [f for f in frames if f not in ("[unknown]", "start_thread", "clone3", "clone")]
                    kind = "OpenMP wait (libgomp)" if not known else "other"
                workers[kind] += 1
                continue
            if not any(timed.search(frame) for frame in frames):
                continue
            op, kind = classify(frames, raw)
            total += 1
            ops[op] += 1
            kinds[kind] += 1
            op_kinds[op, kind] += 1
            if args.show and op == args.show:
                paths[" <- ".join([f for f in frames if not f.startswith(("std::", "xt::", "["))][:10])] += 1
    if total == 0:
        sys.exit("profile_training: no sample of the timed loop (is the binary built with -g?)")
    print(f"{total} samples in the timed loop of the main thread\n")
    print(f"{'op':<50} {'share':>6}   what it was doing there")
    for op, n in ops.most_common():
        detail = ", ".join(f"{kind} {100 * c / total:.1f}" for (o, kind), c in op_kinds.most_common() if o == op)
        print(f"{op:<50} {100 * n / total:5.1f}%   {detail}")
    print(f"\n{'kind':<50} {'share':>6}")
    for kind, n in kinds.most_common():
        print(f"{kind:<50} {100 * n / total:5.1f}%")
    for path, n in paths.most_common(8):
        print(f"\n{100 * n / total:.1f}%: {path}")
    if workers:
        n = sum(workers.values())
        print(f"\nother threads: {n} samples ({100 * n / total:.0f}% of the main thread's): "
              + ", ".join(f"{k} {100 * c / n:.0f}%" for k, c in workers.most_common()))


if __name__ == "__main__":
    main()
