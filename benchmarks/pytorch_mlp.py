#!/usr/bin/env python3
"""PyTorch peer of benchmarks/bench_training.cpp: the same Fashion-MNIST MLP
(784-512-512-10 ReLU), data (Debian's dataset-fashion-mnist, gzip IDX, inputs / 255 as float32),
initialisation (PyTorch's default nn.Linear), recipe (SGD lr 0.1, no momentum, batch 128, mean
cross-entropy) and steps (468 per epoch), in float32 on the CPU with a fixed thread count.

Install PyTorch on Debian 12 (root), with OpenBLAS as the BLAS its GEMMs call:

    apt-get install python3-torch libopenblas0-pthread

and run it with the system interpreter (a pyenv or venv python does not see Debian's packages):

    /usr/bin/python3 benchmarks/pytorch_mlp.py --threads 1,2 --output build/pytorch_mlp.txt

Without PyTorch it prints "skipped: PyTorch not installed ..." and exits 0; nothing in the demo or
the tests runs it. It prints, per thread count, one line bench_training --pytorch-file reads:

    pytorch_mlp threads=2 seconds_per_epoch=1.85 gflops=130.0 peak_rss_mib=700 ...

seconds_per_epoch is steady state: --warmup-steps untimed steps first, then --epochs timed epochs
of --steps steps each (fewer steps are scaled to 468), the fastest reported. Each thread count runs
in its own process: OpenBLAS reads OPENBLAS_NUM_THREADS when it is loaded, so the variables are set
before torch is imported; torch.set_num_threads sets PyTorch's own pool. OMP_WAIT_POLICY is passive
by default: with OpenBLAS's pthreads next to PyTorch's OpenMP pool, OpenMP workers spinning after
each element-wise op take the core OpenBLAS's second thread needs, and on the project's 2-core VM
2 threads ran at 3x the time of 1 (active 9.7 s, passive 3.1 s per epoch); --omp-wait-policy
active or unset measures that configuration. peak_rss_mib is the
process's peak resident set as /usr/bin/time -v reports it; with --reset-peak-rss the kernel's
mark restarts after loading and run_rss_mib is the training run's peak (the float32 training set,
180 MiB, included, as in bench_training's "run MiB"; peak_rss_mib then misses the loader's peak);
others_cpu is the share of the machine's CPU time other processes took during the fastest epoch.
"""

import argparse
import gzip
import importlib.util
import os
import resource
import struct
import subprocess
import sys
import time

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"
BATCH = 128
EPOCH_STEPS = 60000 // BATCH  # 468, as the C++ loop runs
SIZES = (784, 512, 512, 10)
# 3 x the forward products per step: the usual forward + backward count, as bench_training uses.
EPOCH_FLOPS = 3 * sum(2 * BATCH * SIZES[i] * SIZES[i + 1] for i in range(3)) * EPOCH_STEPS
INSTALL = "apt-get install python3-torch libopenblas0-pthread, then run with /usr/bin/python3"


def read_idx(path, magic):
    with gzip.open(path, "rb") as f:
        data = f.read()
    if struct.unpack(">I", data[:4])[0] != magic:
        raise SystemExit(f"pytorch_mlp: {path} is not an IDX file of the expected kind")
    return data


def load(directory, torch):
    images = read_idx(os.path.join(directory, "train-images-idx3-ubyte.gz"), 0x803)
    labels = read_idx(os.path.join(directory, "train-labels-idx1-ubyte.gz"), 0x801)
    count, rows, cols = struct.unpack(">III", images[4:16])
    if rows * cols != 784 or len(images) != 16 + count * 784 or len(labels) != 8 + count:
        raise SystemExit("pytorch_mlp: IDX sizes do not match")
    x = torch.frombuffer(bytearray(images[16:]), dtype=torch.uint8).reshape(count, 784).to(torch.float32)
    x.div_(255.0)  # in place: no second float copy of the training set
    y = torch.frombuffer(bytearray(labels[8:]), dtype=torch.uint8).to(torch.int64)
    return x, y


def cpu_sample():
    """CPU seconds of the whole machine (/proc/stat, steal included) and of this process."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = (float(v) for v in fields[1:9])
        machine = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        machine = None
    return machine, usage.ru_utime + usage.ru_stime


def others_share(before, after, seconds):
    """Share of the machine's CPU time other processes used between two samples (None: unknown)."""
    if before[0] is None or after[0] is None or seconds <= 0:
        return None
    return min(1.0, max(0.0, ((after[0] - before[0]) - (after[1] - before[1])) / (seconds * os.cpu_count())))


def reset_peak_rss():
    """Restarts the kernel's peak-RSS mark (Linux); False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mib():
    """VmHWM of this process in MiB, or None."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def run_one(args, threads):
    # Before torch (and OpenBLAS, OpenMP) load: their pools are sized from these.
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)
    if args.omp_wait_policy != "unset":
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy
    try:
        import torch
    except ImportError:
        print(f"skipped: PyTorch not installed for {sys.executable} ({INSTALL})")
        return 0
    torch.set_num_threads(threads)
    torch.manual_seed(args.seed)
    x, y = load(args.data, torch)
    # With --reset-peak-rss the kernel's peak-RSS mark (VmHWM) restarts here: it then measures the
    # training run, the loaded data included, as bench_training's "run MiB" does.
    peak_reset = args.reset_peak_rss and reset_peak_rss()
    model = torch.nn.Sequential(
        torch.nn.Linear(SIZES[0], SIZES[1]), torch.nn.ReLU(),
        torch.nn.Linear(SIZES[1], SIZES[2]), torch.nn.ReLU(),
        torch.nn.Linear(SIZES[2], SIZES[3]))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(args.seed + 1)
    order = torch.randperm(x.shape[0], generator=generator)
    batches = x.shape[0] // BATCH

    def step(i):
        index = order[(i % batches) * BATCH:(i % batches + 1) * BATCH]
        xb, yb = x[index], y[index]
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    for i in range(args.warmup_steps):
        step(i)
    times, others, loss_sum = [], [], 0.0
    for e in range(args.epochs):
        before, start = cpu_sample(), time.perf_counter()
        for i in range(args.steps):
            loss_sum += step(args.warmup_steps + e * args.steps + i)
        seconds = time.perf_counter() - start
        times.append(seconds * EPOCH_STEPS / args.steps)
        others.append(others_share(before, cpu_sample(), seconds))
    best = min(times)
    busy = others[times.index(best)]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    run_peak = peak_rss_mib() if peak_reset else None
    line = (f"pytorch_mlp threads={threads} seconds_per_epoch={best:.3f} gflops={EPOCH_FLOPS / best * 1e-9:.1f} "
            f"peak_rss_mib={peak:.0f} run_rss_mib={'?' if run_peak is None else f'{run_peak:.0f}'} epochs={','.join(f'{t:.3f}' for t in times)} "
            f"others_cpu={'?' if busy is None else f'{100 * busy:.0f}%'} "
            f"mean_loss={loss_sum / (args.epochs * args.steps):.4f} torch={torch.__version__} "
            f"torch_threads={torch.get_num_threads()} omp_wait_policy={args.omp_wait_policy}")
    print(line, flush=True)
    if args.output:
        with open(args.output, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated (default 1,2)")
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs per thread count (default 2)")
    parser.add_argument("--steps", type=int, default=EPOCH_STEPS, help="steps per timed epoch (default 468)")
    parser.add_argument("--warmup-steps", type=int, default=20, help="untimed steps first (default 20)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default=DEFAULT_DATA)
    parser.add_argument("--output", help="append the result lines to this file")
    parser.add_argument("--omp-wait-policy", choices=("passive", "active", "unset"), default="passive",
                        help="OMP_WAIT_POLICY for PyTorch's OpenMP pool (default passive; see the module comment)")
    parser.add_argument("--reset-peak-rss", action="store_true", help="measure the peak RSS of the training run alone")
    args = parser.parse_args()
    if args.epochs < 1 or args.steps < 1 or args.warmup_steps < 0:
        parser.error("--epochs and --steps must be positive, --warmup-steps not negative")
    threads = [int(t) for t in args.threads.split(",") if t]
    if importlib.util.find_spec("torch") is None:
        print(f"skipped: PyTorch not installed for {sys.executable} ({INSTALL})")
        return 0
    if len(threads) == 1:
        return run_one(args, threads[0])
    # One process per thread count (see the module comment).
    status = 0
    for t in threads:
        command = [sys.executable, os.path.abspath(__file__), "--threads", str(t), "--epochs", str(args.epochs),
                   "--steps", str(args.steps), "--warmup-steps", str(args.warmup_steps), "--seed", str(args.seed),
                   "--data", args.data, "--omp-wait-policy", args.omp_wait_policy] \
            + (["--output", args.output] if args.output else []) \
            + (["--reset-peak-rss"] if args.reset_peak_rss else [])
        status = status or subprocess.call(command)
    return status


if __name__ == "__main__":
    sys.exit(main())
