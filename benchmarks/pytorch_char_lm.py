#!/usr/bin/env python3
"""PyTorch peer of examples/char_lm.cpp: the same decoder-only transformer, corpus and recipe in
float32 on the CPU with a fixed thread count.

What matches char_lm's default configuration:
- corpus: Debian's `fortunes` (char_lm_data.hpp's load_corpus: the extension-less regular files
  in name order, fortunes split at lines holding `%`, every tenth one for validation, each
  followed by a blank line), the sorted byte vocabulary;
- batches: the very same windows, from a std::mt19937_64 seeded with seed + 1 (reimplemented
  below) taking `rng() % (len - context)` per row; validation: the same 16 fixed windows per eval;
- model: token + position embeddings, `layers` pre-norm blocks (LayerNorm eps 1e-5 with gain and
  bias; causal multi-head attention with a fused qkv projection split as (3, heads, head_size),
  scores times 1/sqrt(head_size); a 4 x d_model GELU MLP, erf form), a final LayerNorm and an
  untied bias-free output matrix; mean cross-entropy of the next character;
- initialisation: GPT-2's, as char_lm's: N(0, 0.02) weights and token embeddings, N(0, 0.01)
  positions, N(0, 0.02 / sqrt(2 layers)) residual projections, zero biases, unit gains (the same
  distributions drawn by torch's generator, not char_lm's numbers);
- training: AdamW (lr 3e-3, betas 0.9 / 0.99, eps 1e-8, weight decay 0.01 on every parameter, as
  ad::adam applies it), linear warm-up over 5 % of the steps then cosine decay to a tenth, no
  gradient clipping; the step time covers batch, forward, backward and update, as char_lm's.

Install PyTorch on Debian 12 and run it with the system interpreter (a pyenv or venv python does
not see Debian's packages):

    apt-get install python3-torch libopenblas0-pthread
    /usr/bin/python3 benchmarks/pytorch_char_lm.py --threads 1 --steps 2000 --eval-every 250

Prints `step 0 val_bpc=...`, then every --eval-every steps (and at the last)
`step N train_bpc=... val_bpc=... ms_per_step=M interval_ms_per_step=I interval_cpu_ms_per_step=C`
(M the mean since step 1, char_lm's figure; I the mean since the previous line; C the process's CPU
time per step over the same steps, all threads: on a shared machine it shows the step's own cost
when other processes stretch the wall-clock figures), and at the end
`summary framework=pytorch mode=fp32 steps=N ms_per_step=M val_bpc=X threads=T ...`.
OMP_WAIT_POLICY is passive by default, as in pytorch_mlp.py (its module comment says why).

`--profile` runs the training loop under torch.profiler and prints, after the summary, each ATen
op's self CPU time in ms per training step and its calls per step, the largest first: the peer's
side of docs/benchmarks.md's "Where a step goes". Pass --eval-every equal to --steps and
--eval-batches 1, so that one evaluation batch is all that rides along; the profiler's own cost
lengthens the step by about a sixth.
"""

import argparse
import importlib.util
import math
import os
import sys
import time

DEFAULT_DATA = "/usr/share/games/fortunes"
INSTALL = "apt-get install python3-torch libopenblas0-pthread, then run with /usr/bin/python3"
MASK64 = (1 << 64) - 1


class MT19937_64:
    """std::mt19937_64, so the training windows are char_lm's own (its sample_batch draws rng())."""

    def __init__(self, seed):
        self.state = [seed & MASK64]
        for i in range(1, 312):
            previous = self.state[-1]
            self.state.append((6364136223846793005 * (previous ^ (previous >> 62)) + i) & MASK64)
        self.index = 312

    def __call__(self):
        if self.index == 312:
            s = self.state
            for i in range(312):
                y = (s[i] & 0xFFFFFFFF80000000) | (s[(i + 1) % 312] & 0x7FFFFFFF)
                s[i] = s[(i + 156) % 312] ^ (y >> 1) ^ (0xB5026F5AA96619E9 if y & 1 else 0)
            self.index = 0
        y = self.state[self.index]
        self.index += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        return (y ^ (y >> 43)) & MASK64


def load_corpus(directory):
    """char_lm::load_corpus: (train bytes, validation bytes, sorted symbols)."""
    names = sorted(n for n in os.listdir(os.fsencode(directory))
                   if not os.path.islink(os.path.join(os.fsencode(directory), n))
                   and os.path.isfile(os.path.join(os.fsencode(directory), n))
                   and not os.path.splitext(n)[1])  # std::filesystem's has_extension()
    if not names:
        raise SystemExit(f"pytorch_char_lm: cannot read {directory}: apt-get install fortunes, or pass --data DIR")
    splits, index = ([], []), 0
    for name in names:
        with open(os.path.join(os.fsencode(directory), name), "rb") as f:
            lines = f.read().split(b"\n")
        if lines[-1] == b"":
            lines.pop()  # the C++ loop stops at the end of the text: no empty line after the last newline
        fortune = b""
        for line in lines + [b"%"]:  # the final "%" adds the last fortune of a file that lacks one
            if line != b"%":
                fortune += line + b"\n"
                continue
            fortune = fortune.rstrip(b"\n")
            if fortune:
                splits[1 if index % 10 == 9 else 0].append(fortune + b"\n\n")
                index += 1
            fortune = b""
    train, validation = b"".join(splits[0]), b"".join(splits[1])
    return train, validation, sorted(set(train) | set(validation))


def learning_rate_at(args, step):
    """char_lm's learning_rate_at: linear warm-up over 5 % of the steps, cosine decay to a tenth."""
    warmup = max(1.0, 0.05 * args.steps)
    if step < warmup:
        return args.learning_rate * (step + 1.0) / warmup
    progress = (step - warmup) / max(1.0, args.steps - warmup)
    return args.learning_rate * (0.1 + 0.45 * (1.0 + math.cos(math.pi * progress)))


def build_model(torch, args, vocabulary):
    nn, F = torch.nn, torch.nn.functional
    d, heads, head_size = args.d_model, args.heads, args.d_model // args.heads

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.attention_out = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x, mask):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, heads, head_size).permute(2, 0, 3, 1, 4)
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head_size))
            mixed = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v  # (B, H, T, dh)
            x = x + self.attention_out(mixed.transpose(1, 2).reshape(b, t, d))
            return x + self.proj(F.gelu(self.fc(self.norm2(x))))  # F.gelu: the erf form

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = nn.Embedding(vocabulary, d)
            self.positions = nn.Parameter(torch.empty(args.context, d))
            self.blocks = nn.ModuleList(Block() for _ in range(args.layers))
            self.norm = nn.LayerNorm(d)
            self.logits = nn.Linear(d, vocabulary, bias=False)
            mask = torch.triu(torch.ones(args.context, args.context, dtype=torch.bool), diagonal=1)
            self.register_buffer("mask", mask)  # True above the diagonal: the future, masked

        def forward(self, inputs):
            b, t = inputs.shape
            x = self.tokens(inputs) + self.positions[:t]
            for block in self.blocks:
                x = block(x, self.mask[:t, :t])
            return self.logits(self.norm(x)).reshape(b * t, -1)

    model = Model()
    with torch.no_grad():  # GPT-2's initialisation, as char_lm's initial_model
        for name, p in model.named_parameters():
            if name == "positions":
                p.normal_(0.0, 0.01)
            elif name.endswith(("attention_out.weight", "proj.weight")):
                p.normal_(0.0, 0.02 / math.sqrt(2.0 * args.layers))
            elif name.endswith("weight") and p.dim() == 2:  # linear weights and the token table
                p.normal_(0.0, 0.02)
            elif ".norm" in name or name.startswith("norm"):
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            else:
                p.zero_()  # biases
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads and the BLAS/OpenMP pools")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--eval-batches", type=int, default=16)
    parser.add_argument("--data", default=DEFAULT_DATA)
    parser.add_argument("--omp-wait-policy", choices=("passive", "active", "unset"), default="passive")
    parser.add_argument("--profile", action="store_true", help="print each op's self CPU ms per step (torch.profiler)")
    args = parser.parse_args()
    if min(args.steps, args.threads, args.layers, args.d_model, args.heads, args.context, args.batch,
           args.eval_every, args.eval_batches) < 1 or args.d_model % args.heads:
        parser.error("sizes must be positive and --d-model a multiple of --heads")

    # Before torch (and OpenBLAS, OpenMP) load: their pools are sized from these.
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(args.threads)
    if args.omp_wait_policy != "unset":
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy
    if importlib.util.find_spec("torch") is None:
        print(f"skipped: PyTorch not installed for {sys.executable} ({INSTALL})")
        return 0
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train_text, validation_text, symbols = load_corpus(args.data)
    token_of = torch.zeros(256, dtype=torch.int64)
    token_of[symbols] = torch.arange(len(symbols))
    train, validation = (token_of[torch.frombuffer(bytearray(text), dtype=torch.uint8).long()]
                         for text in (train_text, validation_text))
    b, t = args.batch, args.context
    offsets = torch.arange(t + 1)

    def windows(tokens, starts):
        rows = tokens[torch.tensor(starts).unsqueeze(1) + offsets]  # (B, T + 1)
        return rows[:, :-1], rows[:, 1:].reshape(-1)

    # char_lm::validation_batches: starts spread evenly, no randomness.
    count = args.eval_batches * b
    last_start = len(validation) - t - 1
    starts = [0 if count == 1 else w * last_start // (count - 1) for w in range(count)]
    validation_batches = [windows(validation, starts[k * b:(k + 1) * b]) for k in range(args.eval_batches)]

    model = build_model(torch, args, len(symbols))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, betas=(0.9, 0.99), eps=1e-8,
                                  weight_decay=0.01)
    rng = MT19937_64(args.seed + 1)
    train_starts = len(train) - t

    def validation_bpc():
        with torch.no_grad():
            total = sum(F.cross_entropy(model(x), y).item() for x, y in validation_batches)
        return total / len(validation_batches) / math.log(2.0)

    print(f"corpus: {len(train)} train and {len(validation)} validation characters, {len(symbols)} symbols; "
          f"model: {args.layers} layers, d_model {args.d_model}, {args.heads} heads, context {t}, batch {b}; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, OMP_WAIT_POLICY={args.omp_wait_policy}")
    val_bpc = validation_bpc()
    print(f"step {0:5}  val_bpc={val_bpc:.4f}", flush=True)
    train_sum, seconds, interval_seconds, interval_cpu, since_eval = 0.0, 0.0, 0.0, 0.0, 0
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if args.profile else None
    if profiler is not None:
        profiler.start()
    for step in range(args.steps):
        start, cpu_start = time.perf_counter(), time.process_time()
        x, y = windows(train, [rng() % train_starts for _ in range(b)])
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate_at(args, step)
        optimizer.step()
        loss_value = loss.item()
        elapsed = time.perf_counter() - start
        interval_cpu += time.process_time() - cpu_start
        seconds += elapsed
        interval_seconds += elapsed
        train_sum += loss_value / math.log(2.0)
        since_eval += 1
        if not math.isfinite(loss_value):
            print(f"step {step + 1:5}  the loss is not finite: training diverged")
            val_bpc = float("nan")
            break
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            val_bpc = validation_bpc()
            print(f"step {step + 1:5}  train_bpc={train_sum / since_eval:.4f}  val_bpc={val_bpc:.4f}  "
                  f"ms_per_step={1000 * seconds / (step + 1):.1f}  "
                  f"interval_ms_per_step={1000 * interval_seconds / since_eval:.1f}  "
                  f"interval_cpu_ms_per_step={1000 * interval_cpu / since_eval:.1f}", flush=True)
            train_sum, interval_seconds, interval_cpu, since_eval = 0.0, 0.0, 0.0, 0
    if profiler is not None:
        profiler.stop()
    print(f"summary framework=pytorch mode=fp32 steps={args.steps} ms_per_step={1000 * seconds / args.steps:.1f} "
          f"val_bpc={val_bpc:.4f} threads={args.threads} seed={args.seed} torch={torch.__version__}")
    if profiler is not None:
        events = sorted(profiler.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total = sum(e.self_cpu_time_total for e in events)
        print(f"profile: self CPU ms per step by op ({total / 1000 / args.steps:.1f} ms per step in all)")
        for e in events:
            if e.self_cpu_time_total < 0.002 * total:
                break
            print(f"  {e.key:<40} {e.self_cpu_time_total / 1000 / args.steps:7.2f} ms  "
                  f"{100 * e.self_cpu_time_total / total:5.1f} %  {e.count / args.steps:7.1f} calls")
    return 0


if __name__ == "__main__":
    sys.exit(main())
