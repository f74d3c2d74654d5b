#!/usr/bin/python3 -O
"""Reference vectors for AMD's CDNA matrix cores (MI100, MI250, MI300 MFMA), computed by running the
published bit-accurate model MMA-Sim (Xie et al., "MMA-Sim: Bit-Accurate Reference Model of Tensor
Cores and Matrix Cores", arXiv 2511.10909; github.com/microsoft/MMA-Sim, MIT licence) on inputs of
eight classes. Nothing is fetched: MMA_SIM_DIR is a checkout (or `git archive`) of that repository.

    git -C MMA-Sim checkout c78513835c8b2ae61b35062afce4c4255bc6901c
    /usr/bin/python3 -O tools/gen_cdna_vectors.py MMA_SIM_DIR OUT_DIR [--count N] [--seed S]

The vendored set (tests/data/cdna/) is `--count 150 --seed 20261126`. One file per instruction,
OUT_DIR/<arch>_<qualifier>.txt, with '#' header lines (source, commit, command, date) and one line
per output:

    class c a b d          c, d: float32 bit patterns; a, b: the K operand codes of one row of A and
                           one column of B, each code in hex (fp8 2, f16/bf16 4, xf32 8 digits),
                           concatenated without spaces

How MMA-Sim is run, and why (all outside its arithmetic):

- Python's -O. The CDNA1/CDNA2 fp16/bf16 path hands fp16/bf16 slices to pairwise_dot(), whose first
  line asserts float32 operands; with the assertion on, those instructions cannot run at all. The
  function reads each operand through .item() into a C float, which is exact for fp16 and bf16, so
  skipping the assertion gives what converting the operands to float32 first would.
- One output per call: each instruction object gets m = n = 1 (its K is unchanged), and A (1 x K),
  B (K x 1), C (1 x 1) hold one output's operands. Every output of an MFMA is computed alone by the
  model, so this only saves the other m*n - 1 outputs' time.
- torch 1.13 (Debian's python3-torch) has no float8 dtypes; MMA-Sim names them in module-level
  tables. Missing dtypes are stood in for by marker objects before MMA-Sim is imported, and the fp8
  operands are tensors of a torch.Tensor subclass holding the exact float32 values of the fnuz codes
  whose .dtype is the marker, so MMA-Sim's extract_significand_exponent() finds the fnuz format's
  smallest exponent (-7 for e4m3fnuz, -15 for e5m2fnuz) as it would on a torch with real fp8 dtypes.
  Every value MMA-Sim reads from them (.item(), .double()) is the fnuz value exactly.
"""
import argparse
import datetime
import os
import struct
import subprocess
import sys

import numpy as np
import torch

MMA_SIM_COMMIT = "c78513835c8b2ae61b35062afce4c4255bc6901c"


class _MissingDtype:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return "torch." + self.name


for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"):
    if not hasattr(torch, _name):
        setattr(torch, _name, _MissingDtype(_name))


def _fnuz_tensor_class(dtype, base=torch.Tensor):
    class Fnuz(base):
        @property
        def dtype(self):
            return dtype

    return Fnuz


# ---------------------------------------------------------------------------------------------
# Formats: codes <-> exact values (Python floats)


def f32_of_bits(bits):
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def bits_of_f32(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def fnuz_value(code, e_bits, m_bits):
    """Value of an fnuz fp8 code (bias 2^(E-1)); 0x80 is NaN; no inf, no -0."""
    if code == 0x80:
        return float("nan")
    bias = 1 << (e_bits - 1)
    sign = -1.0 if code & 0x80 else 1.0
    field = (code >> m_bits) & ((1 << e_bits) - 1)
    mant = code & ((1 << m_bits) - 1)
    if field == 0:
        return sign * mant * 2.0 ** (1 - bias - m_bits)
    return sign * (1 + mant / (1 << m_bits)) * 2.0 ** (field - bias)


FORMATS = {
    # name: (digits, encode float -> code (round to nearest even), decode code -> float)
    "f16": 4,
    "bf16": 4,
    "xf32": 8,
    "fp8": 2,  # e4m3fnuz
    "bf8": 2,  # e5m2fnuz
}

_E4M3FNUZ = [fnuz_value(c, 4, 3) for c in range(256)]
_E5M2FNUZ = [fnuz_value(c, 5, 2) for c in range(256)]


def decode(fmt, code):
    if fmt == "f16":
        return float(np.array([code], dtype=np.uint16).view(np.float16)[0])
    if fmt == "bf16":
        return f32_of_bits(code << 16)
    if fmt == "xf32":
        return f32_of_bits(code)
    if fmt == "fp8":
        return _E4M3FNUZ[code]
    return _E5M2FNUZ[code]


def _nearest_code(table, x):
    """Nearest finite fnuz code to x, ties to the even code (saturating: these formats lack inf)."""
    best, best_err = 0, None
    for c, v in enumerate(table):
        if v != v:
            continue
        err = abs(v - x)
        if best_err is None or err < best_err or (err == best_err and c % 2 == 0):
            best, best_err = c, err
    return best


def encode(fmt, x):
    if fmt == "f16":
        return int(np.array([x], dtype=np.float16).view(np.uint16)[0])
    if fmt == "bf16":
        return int(torch.tensor([x], dtype=torch.float32).to(torch.bfloat16).view(torch.int16)[0]) & 0xFFFF
    if fmt == "xf32":
        return bits_of_f32(x)
    return _nearest_code(_E4M3FNUZ if fmt == "fp8" else _E5M2FNUZ, x)


FMT_BITS = {  # exponent bits, mantissa bits, bias, code width in bits
    "f16": (5, 10, 15, 16),
    "bf16": (8, 7, 127, 16),
    "xf32": (8, 23, 127, 32),
    "fp8": (4, 3, 8, 8),
    "bf8": (5, 2, 16, 8),
}


def code_from_parts(fmt, negative, field, mant):
    e, m, _, w = FMT_BITS[fmt]
    return (int(negative) << (w - 1)) | (field << m) | mant


def is_nan_code(fmt, code):
    if fmt in ("fp8", "bf8"):
        return code == 0x80
    e, m, _, w = FMT_BITS[fmt]
    field = (code >> m) & ((1 << e) - 1)
    return field == (1 << e) - 1 and code & ((1 << m) - 1) != 0


# ---------------------------------------------------------------------------------------------
# Input classes

CLASSES = ("normal", "codes", "cancel", "subnormal", "tiny", "overflow", "ctail", "special")


class Gen:
    def __init__(self, rng, fa, fb, k):
        self.rng, self.fa, self.fb, self.k = rng, fa, fb, k

    def rand_code(self, fmt, finite=True):
        e, m, _, w = FMT_BITS[fmt]
        while True:
            c = int(self.rng.integers(0, 1 << w))
            if fmt in ("fp8", "bf8"):
                if c != 0x80:
                    return c
                continue
            field = (c >> m) & ((1 << e) - 1)
            if not finite or field != (1 << e) - 1:
                return c

    def normal_code(self, fmt, scale=1.0):
        return encode(fmt, float(self.rng.normal()) * scale)

    def subnormal_code(self, fmt):
        e, m, _, w = FMT_BITS[fmt]
        return code_from_parts(fmt, self.rng.integers(0, 2) == 1, 0,
                               int(self.rng.integers(1, 1 << m)))

    def exp_code(self, fmt, lo, hi):
        """A random normal value 2^[lo, hi) * [1, 2) of fmt (clamped to its normal range)."""
        e, m, bias, w = FMT_BITS[fmt]
        field = int(self.rng.integers(lo, hi)) + bias
        field = max(1, min(field, (1 << e) - (1 if fmt in ("fp8", "bf8") else 2)))
        return code_from_parts(fmt, self.rng.integers(0, 2) == 1, field, int(self.rng.integers(0, 1 << m)))

    def c_float(self, value):
        return bits_of_f32(float(np.float32(value)))

    def vector(self, cls):
        k, fa, fb, rng = self.k, self.fa, self.fb, self.rng
        a = [self.normal_code(fa) for _ in range(k)]
        b = [self.normal_code(fb) for _ in range(k)]
        c = self.c_float(rng.normal() * 4) if rng.random() < 0.8 else 0
        if cls == "normal":
            pass
        elif cls == "codes":  # any finite code: the whole exponent range, subnormals included
            a = [self.rand_code(fa) for _ in range(k)]
            b = [self.rand_code(fb) for _ in range(k)]
            prod = [decode(fa, x) * decode(fb, y) for x, y in zip(a, b)]
            big = max(abs(p) for p in prod) or 1.0
            c = self.c_float(rng.normal() * big * 2.0 ** int(rng.integers(-30, 4))) if rng.random() < 0.8 else 0
            if not np.isfinite(np.float32(decode("xf32", c))):
                c = 0
        elif cls == "cancel":  # products in opposite pairs, then C near minus their sum
            h = k // 2
            for i in range(h):
                a[h + i] = a[i] ^ (1 << (FMT_BITS[fa][3] - 1))
                b[h + i] = b[i]
                if fa in ("fp8", "bf8") and a[h + i] == 0x80:
                    a[h + i] = 0
            for _ in range(int(rng.integers(1, 3))):  # nudge a few codes by one unit
                i = int(rng.integers(0, k))
                a[i] = a[i] ^ 1
                if fa in ("fp8", "bf8") and a[i] == 0x80:
                    a[i] = 0
            s = sum(decode(fa, x) * decode(fb, y) for x, y in zip(a, b))
            c = self.c_float(-s * (1 + rng.normal() * 2.0 ** -int(rng.integers(8, 26)))) if rng.random() < 0.5 else \
                self.c_float(rng.normal() * 2.0 ** -int(rng.integers(0, 30)))
        elif cls == "subnormal":  # operands subnormal in their format, C a float32 subnormal or 0
            for i in range(k):
                if rng.random() < 0.6:
                    a[i] = self.subnormal_code(fa)
                if rng.random() < 0.4:
                    b[i] = self.subnormal_code(fb)
            r = rng.random()
            c = code_from_parts("xf32", rng.integers(0, 2) == 1, 0, int(rng.integers(1, 1 << 23))) if r < 0.4 else \
                (0x80000000 if r < 0.5 else c)
        elif cls == "tiny":  # results near the bottom of float32's range (bf16, xf32 products)
            e, m, bias, _ = FMT_BITS[fa]
            lo = -(bias - 1)
            a = [self.exp_code(fa, lo, lo + 8) for _ in range(k)]
            b = [self.exp_code(fb, -30, 0) if fb in ("bf16", "xf32") else self.exp_code(fb, -FMT_BITS[fb][2], 0)
                 for _ in range(k)]
            r = rng.random()
            c = code_from_parts("xf32", rng.integers(0, 2) == 1, int(rng.integers(0, 3)),
                                int(rng.integers(0, 1 << 23))) if r < 0.6 else (0 if r < 0.8 else 0x80000000)
        elif cls == "overflow":  # the largest operands; C near float32's largest
            e, m, bias, _ = FMT_BITS[fa]
            a = [self.exp_code(fa, bias - 3, bias + 2) for _ in range(k)]
            b = [self.exp_code(fb, FMT_BITS[fb][2] - 3, FMT_BITS[fb][2] + 2) for _ in range(k)]
            if rng.random() < 0.5:  # same signs, so the sum grows
                a = [x & ~(1 << (FMT_BITS[fa][3] - 1)) for x in a]
                b = [x & ~(1 << (FMT_BITS[fb][3] - 1)) for x in b]
            r = rng.random()
            c = code_from_parts("xf32", rng.integers(0, 2) == 1, 254, int(rng.integers(0, 1 << 23))) if r < 0.5 else \
                (code_from_parts("xf32", False, 254, (1 << 23) - 1) if r < 0.7 else c)
        elif cls == "ctail":  # C far below or far above the products (the round-down cuts)
            if rng.random() < 0.5:
                big = max(abs(decode(fa, x) * decode(fb, y)) for x, y in zip(a, b)) or 1.0
                c = self.c_float(rng.normal() * big * 2.0 ** -int(rng.integers(18, 34)))
            else:
                c = self.c_float(rng.normal() * 2.0 ** int(rng.integers(20, 40)))
            if rng.random() < 0.3:  # all products of one sign, opposite to C
                a = [x & ~(1 << (FMT_BITS[fa][3] - 1)) for x in a]
                b = [x & ~(1 << (FMT_BITS[fb][3] - 1)) for x in b]
                c |= 0x80000000
        elif cls == "special":
            a, b, c = self.special(a, b, c)
        return a, b, c

    def special(self, a, b, c):
        k, fa, fb, rng = self.k, self.fa, self.fb, self.rng
        has_inf_a = fa not in ("fp8", "bf8")
        kind = int(rng.integers(0, 10))

        def nan(fmt):
            return 0x80 if fmt in ("fp8", "bf8") else (0x7FC00000 if fmt == "xf32" else
                                                        (0x7E00 if fmt == "f16" else 0x7FC0))

        def inf(fmt, neg):
            return {"f16": 0x7C00, "bf16": 0x7F80, "xf32": 0x7F800000}[fmt] | (int(neg) << (FMT_BITS[fmt][3] - 1))

        i, j = int(rng.integers(0, k)), int(rng.integers(0, k))
        if kind == 0:
            a[i] = nan(fa)
        elif kind == 1:
            c = 0x7FC00000 if rng.random() < 0.5 else 0xFFC00000
        elif kind == 2 and has_inf_a:  # inf x finite
            a[i] = inf(fa, rng.random() < 0.5)
        elif kind == 3 and has_inf_a:  # inf x 0
            a[i] = inf(fa, rng.random() < 0.5)
            b[i] = 0
        elif kind == 4 and has_inf_a:  # +inf and -inf products
            a[i] = inf(fa, False)
            a[(i + 1) % k] = inf(fa, True)
            b[i] = b[(i + 1) % k] = encode(fb, 1.0)
        elif kind == 5:  # infinite C, with or without an opposite infinite product
            c = 0xFF800000 if rng.random() < 0.5 else 0x7F800000
            if has_inf_a and rng.random() < 0.5:
                a[i] = inf(fa, c == 0x7F800000)
                b[i] = encode(fb, 1.0)
        elif kind == 6:  # zeros: every product zero, C = -0, +0 or a value
            a = [0 if (fa in ("fp8", "bf8") or rng.random() < 0.5) else 1 << (FMT_BITS[fa][3] - 1) for _ in range(k)]
            c = [0x80000000, 0, c][int(rng.integers(0, 3))]
        elif kind == 7:  # one product, C = 0 or -0 (sign of a lone product, of an exact zero sum)
            a = [0] * k
            a[i] = self.normal_code(fa)
            c = [0x80000000, 0][int(rng.integers(0, 2))]
            if rng.random() < 0.5:  # and its negation: x + (-x)
                a[j if j != i else (i + 1) % k] = a[i] ^ (1 << (FMT_BITS[fa][3] - 1)) if fa not in ("fp8", "bf8") or \
                    a[i] != 0 else 0
                b[j if j != i else (i + 1) % k] = b[i]
        elif kind == 8:  # zero operands next to the largest ones (the alignment of zero products)
            e, m, bias, _ = FMT_BITS[fb]
            for t in range(k):
                if rng.random() < 0.3:
                    a[t] = 0
                    b[t] = self.exp_code(fb, bias - 2, bias + 1)
        else:  # NaN b with zero a
            b[i] = nan(fb)
            a[i] = 0
        return a, b, c


# ---------------------------------------------------------------------------------------------
# Running MMA-Sim


def make_tensor(fmt, codes, shape):
    if fmt == "f16":
        return torch.from_numpy(np.array(codes, dtype=np.uint16).view(np.float16).reshape(shape).copy())
    if fmt == "bf16":
        return torch.tensor(np.array(codes, dtype=np.uint16).view(np.int16).reshape(shape)).view(torch.bfloat16)
    if fmt == "xf32":
        return torch.from_numpy(np.array(codes, dtype=np.uint32).view(np.float32).reshape(shape).copy())
    cls = FNUZ_CLASSES[fmt]
    values = torch.tensor([decode(fmt, x) for x in codes], dtype=torch.float32).reshape(shape)
    return values.as_subclass(cls)


FNUZ_CLASSES = {}

# (arch, qualifier, a format, b format)
INSTRUCTIONS = [
    ("CDNA1", "f32_16x16x16f16", "f16", "f16"),
    ("CDNA1", "f32_16x16x8bf16", "bf16", "bf16"),
    ("CDNA2", "f32_16x16x16f16", "f16", "f16"),
    ("CDNA2", "f32_16x16x8bf16", "bf16", "bf16"),
    ("CDNA2", "f32_16x16x16bf16_1k", "bf16", "bf16"),
    ("CDNA3", "f32_16x16x16_f16", "f16", "f16"),
    ("CDNA3", "f32_16x16x16_bf16", "bf16", "bf16"),
    ("CDNA3", "f32_16x16x8_xf32", "xf32", "xf32"),
    ("CDNA3", "f32_16x16x32_fp8_fp8", "fp8", "fp8"),
    ("CDNA3", "f32_16x16x32_bf8_bf8", "bf8", "bf8"),
    ("CDNA3", "f32_16x16x32_fp8_bf8", "fp8", "bf8"),
    ("CDNA3", "f32_16x16x32_bf8_fp8", "bf8", "fp8"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mma_sim_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--count", type=int, default=150, help="vectors per instruction (spread over the classes)")
    ap.add_argument("--seed", type=int, default=20261126)
    ap.add_argument("--only", default="", help="comma-separated qualifiers to run (default: all)")
    args = ap.parse_args()
    if sys.flags.optimize < 1:
        sys.exit("run with python3 -O (see the docstring: MMA-Sim's CDNA1/2 pairwise path asserts float32 operands)")
    sys.path.insert(0, os.path.abspath(args.mma_sim_dir))
    from mmasim.simulator import amd as amd_sim  # noqa: E402

    FNUZ_CLASSES["fp8"] = _fnuz_tensor_class(torch.float8_e4m3fnuz)
    # Derived from the e4m3fnuz class so that torch multiplies an e5m2fnuz tensor by an e4m3fnuz one
    # (it refuses unrelated subclasses); MMA-Sim reads .dtype of operand elements only, never of a
    # product.
    FNUZ_CLASSES["bf8"] = _fnuz_tensor_class(torch.float8_e5m2fnuz, FNUZ_CLASSES["fp8"])
    try:
        commit = subprocess.run(["git", "-C", args.mma_sim_dir, "rev-parse", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown (not a git checkout; expected " + MMA_SIM_COMMIT + ")"
    os.makedirs(args.out_dir, exist_ok=True)
    only = set(filter(None, args.only.split(",")))
    for n, (arch, qualifier, fa, fb) in enumerate(INSTRUCTIONS):
        if only and qualifier not in only:
            continue
        inst = amd_sim.mfma(arch, qualifier)
        k = inst.k
        inst.m = inst.n = 1  # one output per call (see the docstring)
        rng = np.random.default_rng([args.seed, n])
        gen = Gen(rng, fa, fb, k)
        name = f"{arch.lower()}_{qualifier}.txt"
        lines = []
        for v in range(args.count):
            cls = CLASSES[v % len(CLASSES)]
            a, b, c = gen.vector(cls)
            A = make_tensor(fa, a, (1, k))
            B = make_tensor(fb, b, (k, 1))
            C = torch.from_numpy(np.array([[c]], dtype=np.uint32).view(np.float32).copy())
            D = inst(A, B, C)
            d = int(D.reshape(-1).view(torch.int32)[0]) & 0xFFFFFFFF
            da, db = FORMATS[fa], FORMATS[fb]
            lines.append(f"{cls} {c:08x} {''.join(f'{x:0{da}x}' for x in a)} {''.join(f'{x:0{db}x}' for x in b)} {d:08x}")
        with open(os.path.join(args.out_dir, name), "w") as f:
            f.write(f"# AMD {arch} v_mfma_{qualifier}: outputs of MMA-Sim's model (mmasim.simulator.amd.mfma)\n")
            f.write("# source: github.com/microsoft/MMA-Sim (MIT), Xie et al., arXiv 2511.10909\n")
            f.write(f"# commit: {commit}\n")
            f.write(f"# command: /usr/bin/python3 -O tools/gen_cdna_vectors.py MMA_SIM_DIR OUT_DIR --count {args.count} "
                    f"--seed {args.seed}\n")
            f.write(f"# date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')}\n")
            f.write(f"# python {sys.version.split()[0]}, torch {torch.__version__}, numpy {np.__version__}\n")
            f.write(f"# K = {k}; a: {fa}, b: {fb}; format: class c a b d (hex; c, d float32 bits; a, b the K codes "
                    f"concatenated)\n")
            f.write("\n".join(lines) + "\n")
        print(f"{name}: {len(lines)} vectors", file=sys.stderr)


if __name__ == "__main__":
    main()
