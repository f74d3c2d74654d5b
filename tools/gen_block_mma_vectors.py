#!/usr/bin/python3
"""Reference vectors for scalify's Blackwell block-scaled tensor-core models, computed by MMA-Sim.

MMA-Sim (Xie et al., "MMA-Sim: Bit-Accurate Reference Model of Tensor Cores and Matrix Cores",
arXiv 2511.10909; github.com/microsoft/MMA-Sim, MIT) states the arithmetic of tcgen05.mma in
mmasim/simulator/arithmetic.py (nv_fused_dot_add, nv_fused_dot_add_with_block_scale) and
mmasim/simulator/nv_ptx.py (class tcgen05mma: F = 25 for kind::f8f6f4; class
tcgen05mma_block_scale: F = 25 for kind::mxf8f6f4 (K = 32), F = 35 for kind::mxf4nvf4 (K = 64)).
This script imports MMA-Sim's arithmetic.py from a checkout (nothing of it is copied here) and
calls those functions with the arguments the tcgen05 classes pass for one output (i, j):

    f8f6f4   nv_fused_dot_add(a, b, c, 25, "f32")
    mxf8f6f4 nv_fused_dot_add(a, b, c, 25, "f32", scale_a, scale_b)
    mxf4nvf4 nv_fused_dot_add_with_block_scale(unpack_fp4_tensor(A), unpack_fp4_tensor(B), c,
                                               scale_a[0:K/block], scale_b[0:K/block], 35)

Adapters, because this machine's torch is Debian's 1.13 (no float8 dtypes; MMA-Sim wants the
float8 types of torch >= 2.7):
  * torch.float8_e4m3fn, float8_e5m2, float8_e8m0fnu, float8_e4m3fnuz, float8_e5m2fnuz are set to
    plain marker objects when torch lacks them (they are only dictionary keys in arithmetic.py);
  * operands and scales of those formats travel as `Typed`: their exact values in a float64
    tensor plus the marker as .dtype (what extract_significand_exponent reads for the subnormal
    exponent). torch functions on them (isnan, *) see the float64 values.
  * fp6 (e2m3, e3m2) and fp4 (e2m1) operands of kind::f8f6f4 / mxf8f6f4 are not simulated by
    MMA-Sim (its tcgen05 classes list e2m3/e3m2 as TODO, and e2m1 is a uint8 dtype there that
    extract_significand_exponent rejects). Lines with those operands use MMA-Sim's same function
    with its dtype_min_exponent table extended by their smallest normal exponents
    (e2m1: 0, e2m3: 0, e3m2: -2): MMA-Sim's rule extrapolated, marked "x" in the data.

Usage:
    git --git-dir=<mirror of microsoft/MMA-Sim> archive HEAD | tar -x -C /tmp/mmasim
    /usr/bin/python3 tools/gen_block_mma_vectors.py --mmasim /tmp/mmasim --commit <sha> \\
        --out tests/data/block_mma/block_mma_vectors.txt [--seed 20261126]

Output: one vector per line, fields separated by spaces (README in tests/data/block_mma/).
"""

import argparse
import datetime
import importlib.util
import os
import random
import struct
import sys

import torch


class Marker:
    """Stands for a torch dtype that this torch lacks; only compared and hashed."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return "torch." + self.name


for _name in ["float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "float8_e4m3fnuz", "float8_e5m2fnuz"]:
    if not hasattr(torch, _name):
        setattr(torch, _name, Marker(_name))
# arithmetic.py builds its canonical NaN as torch.tensor(0x7FFF_FFFF, dtype=torch.uint32).view(float32);
# torch 1.13 has no uint32, and int32 holds 0x7FFFFFFF with the same bits.
if not hasattr(torch, "uint32"):
    torch.uint32 = torch.int32
FP6_E2M3 = Marker("float6_e2m3fn")
FP6_E3M2 = Marker("float6_e3m2fn")
FP4_E2M1 = Marker("float4_e2m1fn")


class Typed(torch.Tensor):
    """Exact values of a narrow format (a float64 tensor) that reports MMA-Sim's dtype key as .dtype
    (extract_significand_exponent reads it for the subnormal exponent). Indexing and abs() keep
    the key; every other torch function sees plain float64 values."""

    @staticmethod
    def __new__(cls, values, dtype):
        t = torch.Tensor._make_subclass(cls, torch.as_tensor(values, dtype=torch.float64))
        t._mmasim_dtype = dtype
        return t

    @property
    def dtype(self):
        return self._mmasim_dtype

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda x: x.as_subclass(torch.Tensor) if isinstance(x, Typed) else x
        with torch._C.DisableTorchFunction():
            out = func(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in (kwargs or {}).items()})
        if func in (torch.Tensor.__getitem__, torch.Tensor.abs, torch.abs) and isinstance(args[0], Typed):
            return Typed(out, args[0]._mmasim_dtype)
        return out


# ------------------------------------------------------------------------------------------------
# Formats: (exponent bits, mantissa bits, bias, specials)

FORMATS = {
    "e4m3": (4, 3, 7, "fn"),     # NaN: S.1111.111; no inf
    "e5m2": (5, 2, 15, "ieee"),
    "e2m3": (2, 3, 1, "none"),
    "e3m2": (3, 2, 3, "none"),
    "e2m1": (2, 1, 1, "none"),
}
WIDTH = {"e4m3": 8, "e5m2": 8, "e2m3": 6, "e3m2": 6, "e2m1": 4}
DTYPE = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e2m3": FP6_E2M3, "e3m2": FP6_E3M2,
         "e2m1": FP4_E2M1}
EXTRAPOLATED = {"e2m3", "e3m2", "e2m1"}


def decode(fmt, code):
    e, m, bias, specials = FORMATS[fmt]
    sign = -1.0 if (code >> (e + m)) & 1 else 1.0
    mag = code & ((1 << (e + m)) - 1)
    field, mant = mag >> m, mag & ((1 << m) - 1)
    if specials == "ieee" and field == (1 << e) - 1:
        return sign * float("inf") if mant == 0 else float("nan")
    if specials == "fn" and mag == (1 << (e + m)) - 1:
        return float("nan")
    if field == 0:
        return sign * mant * 2.0 ** (1 - bias - m)
    return sign * (1 + mant * 2.0 ** -m) * 2.0 ** (field - bias)


def finite_codes(fmt):
    return [c for c in range(1 << WIDTH[fmt]) if decode(fmt, c) == decode(fmt, c) and abs(decode(fmt, c)) != float("inf")]


def decode_e8m0(code):
    return float("nan") if code == 0xFF else 2.0 ** (code - 127)


def decode_ue4m3(code):  # MMA-Sim reads UE4M3 as e4m3fn and takes abs(): the sign bit is ignored
    return decode("e4m3", code)


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def bits_f32(b):
    return struct.unpack("<f", struct.pack("<I", b))[0]


def result_bits(t):
    return int(t.view(torch.int32).item()) & 0xFFFFFFFF


# ------------------------------------------------------------------------------------------------


def load_mmasim(root):
    path = os.path.join(root, "mmasim", "simulator", "arithmetic.py")
    spec = importlib.util.spec_from_file_location("mmasim_arithmetic", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # Extrapolation for fp6/fp4 operands (see the module docstring).
    mod.dtype_min_exponent.update({FP6_E2M3: 0, FP6_E3M2: -2, FP4_E2M1: 0})
    return mod


class Gen:
    def __init__(self, ar, rng):
        self.ar, self.rng = ar, rng
        self.lines = []
        self.codes = {f: finite_codes(f) for f in FORMATS}

    # -- operands
    def rand_codes(self, fmt, k, cls):
        r = self.rng
        codes = self.codes[fmt]
        if cls == "uniform":
            return [r.choice(codes) for _ in range(k)]
        if cls == "narrow":  # |x| in [1/2, 4): the products share a few binades
            pool = [c for c in codes if 0.5 <= abs(decode(fmt, c)) < 4] or codes
            return [r.choice(pool) for _ in range(k)]
        if cls == "subnormal":  # half subnormal or zero codes
            e, m = FORMATS[fmt][:2]
            sub = [c for c in codes if ((c & ((1 << (e + m)) - 1)) >> m) == 0]
            return [r.choice(sub) if r.random() < 0.5 else r.choice(codes) for _ in range(k)]
        if cls == "cancel":  # second half repeats the first with the sign flipped on one side
            half = [r.choice(codes) for _ in range(k // 2)]
            return half + half
        raise ValueError(cls)

    def cancel_b(self, fmt, b, k):
        sign = 1 << (WIDTH[fmt] - 1)
        out = b[: k // 2] + [x ^ sign for x in b[: k // 2]]
        for _ in range(2):  # break the exact cancellation a little
            i = self.rng.randrange(k)
            out[i] = self.rng.choice(self.codes[fmt])
        return out

    def rand_c(self, near):
        r = self.rng.random()
        if r < 0.2:
            return 0.0
        if r < 0.25:  # a float32 subnormal
            return bits_f32(self.rng.randint(1, 0x7FFFFF) | (self.rng.getrandbits(1) << 31))
        e = near + self.rng.randint(-30, 6)
        e = max(-149, min(127, e))
        m = 1 + self.rng.random()
        x = struct.unpack("<f", struct.pack("<f", m * 2.0 ** e if e > -126 else 2.0 ** e))[0]
        return -x if self.rng.random() < 0.5 else x

    # -- MMA-Sim calls
    def f8f6f4(self, ta, tb, a, b, c, sa=None, sb=None):
        ar = self.ar
        A = Typed([decode(ta, x) for x in a], DTYPE[ta])
        B = Typed([decode(tb, x) for x in b], DTYPE[tb])
        C = torch.tensor(c, dtype=torch.float32)
        if sa is None:
            d = ar.nv_fused_dot_add(A, B, C, 25, "f32")
        else:
            SA = Typed(decode_e8m0(sa), torch.float8_e8m0fnu)
            SB = Typed(decode_e8m0(sb), torch.float8_e8m0fnu)
            d = ar.nv_fused_dot_add(A, B, C, 25, "f32", SA, SB)
        return result_bits(d)

    def mxf4nvf4(self, a, b, c, sa, sb, stype):
        ar = self.ar
        pack = lambda codes: torch.tensor([codes[2 * i] | codes[2 * i + 1] << 4 for i in range(len(codes) // 2)],
                                          dtype=torch.uint8)
        A = ar.unpack_fp4_tensor(pack(a))  # MMA-Sim's own fp4 decoding
        B = ar.unpack_fp4_tensor(pack(b))
        C = torch.tensor(c, dtype=torch.float32)
        if stype == "ue4m3":
            SA = Typed([decode_ue4m3(x) for x in sa], torch.float8_e4m3fn)
            SB = Typed([decode_ue4m3(x) for x in sb], torch.float8_e4m3fn)
        else:
            SA = Typed([decode_e8m0(x) for x in sa], torch.float8_e8m0fnu)
            SB = Typed([decode_e8m0(x) for x in sb], torch.float8_e8m0fnu)
        return result_bits(ar.nv_fused_dot_add_with_block_scale(A, B, C, SA, SB, 35))

    # -- lines
    def hexcodes(self, fmt, codes):
        digits = 1 if WIDTH[fmt] == 4 else 2
        return "".join(f"{x:0{digits}x}" for x in codes)

    def emit_f8(self, kind, cls, ta, tb, a, b, c, sa=0x7F, sb=0x7F):
        scaled = kind == "mxf8f6f4"
        d = self.f8f6f4(ta, tb, a, b, c, sa if scaled else None, sb if scaled else None)
        src = "x" if (ta in EXTRAPOLATED or tb in EXTRAPOLATED) else "m"
        self.lines.append(f"{kind} {src} {cls} {ta} {tb} {f32_bits(c):08x} {sa:02x} {sb:02x} "
                          f"{self.hexcodes(ta, a)} {self.hexcodes(tb, b)} {d:08x}")

    def emit_f4(self, kind, cls, a, b, c, sa, sb):
        stype, block = {"nvf4": ("ue4m3", 16), "mxf4": ("ue8m0", 32), "mxf4b16": ("ue8m0", 16)}[kind]
        d = self.mxf4nvf4(a, b, c, sa, sb, stype)
        self.lines.append(f"{kind} m {cls} e2m1 e2m1 {f32_bits(c):08x} {''.join(f'{x:02x}' for x in sa)} "
                          f"{''.join(f'{x:02x}' for x in sb)} {self.hexcodes('e2m1', a)} {self.hexcodes('e2m1', b)} {d:08x}")

    def product_exponent_hint(self, ta, tb, a, b):
        best = -200
        for x, y in zip(a, b):
            p = abs(decode(ta, x) * decode(tb, y))
            if p > 0:
                best = max(best, int(p).bit_length() - 1 if p >= 1 else -int(1 / p).bit_length())
        return best if best > -200 else 0

    def random_f8(self, kind, per_pair):
        classes = ["uniform", "narrow", "subnormal", "cancel"]
        for ta in FORMATS:
            for tb in FORMATS:
                for n in range(per_pair):
                    cls = classes[n % len(classes)]
                    a = self.rand_codes(ta, 32, cls)
                    b = self.rand_codes(tb, 32, "uniform" if cls == "cancel" else cls)
                    if cls == "cancel":
                        b = self.cancel_b(tb, b, 32)
                    sa = sb = 0x7F
                    shift = 0
                    if kind == "mxf8f6f4":
                        sa = self.rng.randint(127 - 24, 127 + 24)
                        sb = self.rng.randint(127 - 24, 127 + 24)
                        shift = sa + sb - 254
                    c = self.rand_c(self.product_exponent_hint(ta, tb, a, b) + shift)
                    self.emit_f8(kind, cls, ta, tb, a, b, c, sa, sb)

    def random_f4(self, kind, count):
        r = self.rng
        classes = ["uniform", "narrow", "cancel", "zeros", "spread"]
        nscale = {"nvf4": 4, "mxf4": 2, "mxf4b16": 4}[kind]
        block = {"nvf4": 16, "mxf4": 32, "mxf4b16": 16}[kind]
        for n in range(count):
            cls = classes[n % len(classes)]
            codes = list(range(16))
            if cls == "narrow":
                a = [r.choice([2, 3, 4, 10, 11, 12]) for _ in range(64)]
                b = [r.choice([2, 3, 4, 10, 11, 12]) for _ in range(64)]
            else:
                a = [r.choice(codes) for _ in range(64)]
                b = [r.choice(codes) for _ in range(64)]
            if cls == "cancel":
                b = [x ^ (8 if (i // 8) % 2 else 0) for i, x in enumerate(b)]
                a = [a[i - 8] if (i // 8) % 2 else a[i] for i in range(64)]
                b = [b[i - 8] ^ 8 if (i // 8) % 2 else b[i] for i in range(64)]
                b[r.randrange(64)] = r.choice(codes)
            if cls == "zeros":  # whole 16-blocks of zero products
                for blk in r.sample(range(4), 2):
                    for i in range(16 * blk, 16 * blk + 16):
                        a[i] = 0 if r.random() < 0.5 else 8
            if kind == "nvf4":
                # UE4M3: mostly normal scales near 1..448, sometimes subnormal; sign bit random
                sa = [r.randint(0x08, 0x7E) | (0x80 if r.random() < 0.1 else 0) for _ in range(nscale)]
                sb = [r.randint(0x08, 0x7E) | (0x80 if r.random() < 0.1 else 0) for _ in range(nscale)]
                hint = 6
            else:
                sa = [r.randint(127 - 20, 127 + 20) for _ in range(nscale)]
                sb = [r.randint(127 - 20, 127 + 20) for _ in range(nscale)]
                hint = max(x + y - 254 for x, y in zip(sa, sb)) + 4
            c = self.rand_c(hint)
            if cls == "spread":  # block 0 with large scales, the others small; C nearly cancels block 0
                if kind == "nvf4":
                    sa = [r.randint(0x68, 0x7E)] + [r.randint(0x01, 0x20) for _ in range(nscale - 1)]
                    sb = [r.randint(0x68, 0x7E)] + [r.randint(0x01, 0x20) for _ in range(nscale - 1)]
                    value = decode_ue4m3
                else:
                    sa = [127 + r.randint(8, 20)] + [127 - r.randint(4, 16) for _ in range(nscale - 1)]
                    sb = [127 + r.randint(8, 20)] + [127 - r.randint(4, 16) for _ in range(nscale - 1)]
                    value = decode_e8m0
                v0 = sum(decode("e2m1", a[i]) * decode("e2m1", b[i]) for i in range(block)) * value(sa[0]) * value(sb[0])
                c = struct.unpack("<f", struct.pack("<f", -v0 * (1 + (r.random() - 0.5) * 2.0 ** -r.randint(6, 20))))[0]
            self.emit_f4(kind, cls, a, b, c, sa, sb)

    def specials(self):
        z = [0] * 32
        one = {"e4m3": 0x38, "e5m2": 0x3C, "e2m3": 0x08, "e3m2": 0x0C, "e2m1": 0x2}
        big = {"e4m3": 0x7E, "e5m2": 0x7B, "e2m3": 0x1F, "e3m2": 0x1F, "e2m1": 0x7}
        sub = {"e4m3": 0x01, "e5m2": 0x01, "e2m3": 0x01, "e3m2": 0x01, "e2m1": 0x1}
        neg = {f: 1 << (WIDTH[f] - 1) for f in FORMATS}
        for kind in ["f8f6f4", "mxf8f6f4"]:
            e = lambda cls, ta, tb, a, b, c, sa=0x7F, sb=0x7F: self.emit_f8(kind, cls, ta, tb, a, b, c, sa, sb)
            # NaN operands, inf, inf x 0, inf - inf, NaN and inf accumulators
            e("nan_a", "e4m3", "e4m3", [0x7F] + [one["e4m3"]] * 31, [one["e4m3"]] * 32, 1.0)
            e("nan_a_times_0", "e4m3", "e5m2", [0xFF] + [one["e4m3"]] * 31, [0] * 32, 0.0)
            e("nan_b", "e5m2", "e5m2", [one["e5m2"]] * 32, [0x7E] + [one["e5m2"]] * 31, 2.0)
            e("inf", "e5m2", "e4m3", [0x7C] + [one["e5m2"]] * 31, [one["e4m3"]] * 32, 1.0)
            e("minus_inf", "e5m2", "e2m1", [0xFC] + [one["e5m2"]] * 31, [one["e2m1"]] * 32, 1.0)
            e("inf_times_0", "e5m2", "e4m3", [0x7C] + [one["e5m2"]] * 31, [0] + [one["e4m3"]] * 31, 1.0)
            e("inf_minus_inf", "e5m2", "e5m2", [0x7C, 0xFC] + [0] * 30, [one["e5m2"]] * 32, 0.0)
            e("c_nan", "e4m3", "e4m3", [one["e4m3"]] * 32, [one["e4m3"]] * 32, float("nan"))
            e("c_inf", "e4m3", "e2m3", [one["e4m3"]] * 32, [one["e2m3"]] * 32, float("inf"))
            e("c_minus_inf_plus_inf", "e5m2", "e4m3", [0x7C] + z[:31], [one["e4m3"]] * 32, float("-inf"))
            # subnormal operands only
            for ta in FORMATS:
                for tb in FORMATS:
                    e("all_subnormal", ta, tb, [sub[ta] | (neg[ta] if i % 3 == 0 else 0) for i in range(32)],
                      [sub[tb]] * 32, 0.0)
            # the largest products, all positive (no overflow without scales)
            e("largest", "e5m2", "e5m2", [big["e5m2"]] * 32, [big["e5m2"]] * 32, 3.0e38)
            e("largest_e4m3", "e4m3", "e4m3", [big["e4m3"]] * 32, [big["e4m3"]] * 32, -1.0)
            # zeros: all products zero; c = -0, c = 0, tiny c
            e("zero_minus0", "e4m3", "e4m3", z, [one["e4m3"]] * 32, -0.0)
            e("zero_c", "e4m3", "e4m3", z, [big["e4m3"]] * 32, 1.5)
            e("zero_tiny_c", "e5m2", "e5m2", z, [big["e5m2"]] * 32, bits_f32(0x00000003))
            e("zero_small_c", "e4m3", "e4m3", z, [big["e4m3"]] * 32, bits_f32(0x08000001))
            # exact cancellation to zero, and the accumulator dominating tiny products
            e("cancel_zero", "e4m3", "e4m3", [one["e4m3"]] * 32, [one["e4m3"] | (neg["e4m3"] if i % 2 else 0)
                                                                  for i in range(32)], 0.0)
            e("c_dominates", "e4m3", "e2m1", [sub["e4m3"]] * 32, [sub["e2m1"]] * 32, 1.0e6)
            e("ties", "e4m3", "e4m3", [one["e4m3"]] + [sub["e4m3"]] * 31, [one["e4m3"]] * 32, 16777216.0)
        m = "mxf8f6f4"
        e = lambda cls, ta, tb, a, b, c, sa, sb: self.emit_f8(m, cls, ta, tb, a, b, c, sa, sb)
        ones = lambda f: [one[f]] * 32
        e("scale_nan_a", "e4m3", "e4m3", ones("e4m3"), ones("e4m3"), 1.0, 0xFF, 0x7F)
        e("scale_nan_b_zero_data", "e4m3", "e5m2", z, z, 0.0, 0x7F, 0xFF)
        e("scale_max_overflow", "e5m2", "e5m2", [big["e5m2"]] * 32, [big["e5m2"]] * 32, 0.0, 0xFE, 0xFE)
        e("scale_overflow_neg", "e4m3", "e4m3", [big["e4m3"] | 0x80] * 32, [big["e4m3"]] * 32, 0.0, 0xC0, 0xC0)
        e("scale_just_below_2p128", "e4m3", "e4m3", [one["e4m3"]] + z[:31], [one["e4m3"]] + z[:31], 0.0, 0xFE, 0x81)
        e("scale_min", "e4m3", "e4m3", ones("e4m3"), ones("e4m3"), 0.0, 0x00, 0x00)
        e("scale_min_subnormal_result", "e5m2", "e5m2", ones("e5m2"), ones("e5m2"), 0.0, 0x00, 0x7F - 0x10)
        e("scale_subnormal_result_c", "e4m3", "e2m1", ones("e4m3"), ones("e2m1"), bits_f32(0x00000005), 0x20, 0x2A)
        e("scale_large_zero_data_c", "e4m3", "e4m3", z, ones("e4m3"), 1.0, 0xF0, 0xF0)
        e("scale_small_c_dominates", "e4m3", "e4m3", ones("e4m3"), ones("e4m3"), 1.0, 0x40, 0x40)
        e("scale_inf_data", "e5m2", "e4m3", [0x7C] + [one["e5m2"]] * 31, ones("e4m3"), 1.0, 0x00, 0x01)
        # block-scaled fp4 kinds
        z64 = [0] * 64
        one4, big4 = [2] * 64, [7] * 64
        for kind, s1, nan in [("nvf4", 0x38, 0x7F), ("mxf4", 0x7F, 0xFF), ("mxf4b16", 0x7F, 0xFF)]:
            ns = 4 if kind != "mxf4" else 2
            f = lambda cls, a, b, c, sa, sb: self.emit_f4(kind, cls, a, b, c, sa, sb)
            f("unit", one4, one4, 0.0, [s1] * ns, [s1] * ns)
            f("scale_nan_a", one4, one4, 1.0, [nan] + [s1] * (ns - 1), [s1] * ns)
            f("scale_nan_b_zero_data", z64, z64, 0.0, [s1] * ns, [s1] * (ns - 1) + [nan])
            f("c_nan", one4, one4, float("nan"), [s1] * ns, [s1] * ns)
            f("zero_minus0", z64, one4, -0.0, [s1] * ns, [s1] * ns)
            f("cancel_zero", one4, [2 if i % 2 else 10 for i in range(64)], 0.0, [s1] * ns, [s1] * ns)
            f("largest", big4, big4, 0.0, [0x7E if kind == "nvf4" else 0xFE] * ns, [0x7E if kind == "nvf4" else 0xFE] * ns)
            f("largest_c", big4, big4, 3.4e38, [0x7E if kind == "nvf4" else 0xF0] * ns, [0x7E if kind == "nvf4" else 0x90] * ns)
            f("smallest", [1] * 64, [1] * 64, 0.0, [0x01 if kind == "nvf4" else 0x00] * ns, [0x01 if kind == "nvf4" else 0x00] * ns)
            f("zero_block_large_scale", [0] * 16 + [2] * 48, one4, 0.0,
              ([0x7E] + [0x08] * (ns - 1)) if kind == "nvf4" else ([0xF0] + [0x70] * (ns - 1)), [s1] * ns)
            f("zero_data_c", z64, big4, 1.5, [0x7E if kind == "nvf4" else 0xF0] * ns, [0x7E if kind == "nvf4" else 0xF0] * ns)
            f("tiny_c_small_scales", one4, one4, bits_f32(0x00000007),
              [0x01 if kind == "nvf4" else 0x10] * ns, [0x01 if kind == "nvf4" else 0x10] * ns)
        # UE4M3 only: zero scales, sign bit set on scales
        f = lambda cls, a, b, c, sa, sb: self.emit_f4("nvf4", cls, a, b, c, sa, sb)
        f("scale_zero", one4, one4, 1.0, [0x00, 0x38, 0x38, 0x38], [0x38] * 4)
        f("scale_zero_all", one4, one4, -2.5, [0x00] * 4, [0x38] * 4)
        f("scale_sign_ignored", one4, one4, 0.0, [0xB8] * 4, [0x38, 0xB8, 0x38, 0xB8])
        f("scale_subnormal", one4, big4, 0.0, [0x01, 0x02, 0x03, 0x07], [0x05] * 4)
        f("scale_negative_zero", one4, one4, 0.5, [0x80] * 4, [0x38] * 4)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mmasim", required=True, help="a checkout of microsoft/MMA-Sim (the folder holding mmasim/)")
    ap.add_argument("--commit", required=True, help="the MMA-Sim commit of that checkout (recorded in the header)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=20261126)
    ap.add_argument("--per-pair", type=int, default=12, help="random vectors per operand pair and f8 kind")
    ap.add_argument("--f4", type=int, default=240, help="random vectors of kind nvf4 (mxf4: a quarter each)")
    args = ap.parse_args()

    ar = load_mmasim(args.mmasim)
    g = Gen(ar, random.Random(args.seed))
    g.random_f8("f8f6f4", args.per_pair)
    g.random_f8("mxf8f6f4", args.per_pair)
    g.random_f4("nvf4", args.f4)
    g.random_f4("mxf4", args.f4 // 4)
    g.random_f4("mxf4b16", args.f4 // 4)
    g.specials()

    cmd = "/usr/bin/python3 tools/gen_block_mma_vectors.py " + " ".join(
        a if not a.startswith("/") else "<" + os.path.basename(a) + ">" for a in sys.argv[1:])
    with open(args.out, "w") as out:
        out.write("# Blackwell block-scaled MMA reference vectors, computed by MMA-Sim's arithmetic.py\n")
        out.write("# source: github.com/microsoft/MMA-Sim (MIT), Xie et al., arXiv 2511.10909\n")
        out.write(f"# commit: {args.commit}\n")
        out.write(f"# command: {cmd}\n")
        out.write(f"# date: {datetime.datetime.utcnow().strftime('%Y-%m-%d %H:%M UTC')}; torch {torch.__version__} "
                  f"(float8 dtypes as markers, see the script)\n")
        out.write("# fields: kind src class ta tb c_bits scale_a scale_b a_codes b_codes d_bits\n")
        out.write("#   kind f8f6f4 (F=25, K=32, no scales: scale fields 7f) | mxf8f6f4 (F=25, K=32, E8M0 scales) |\n")
        out.write("#        nvf4 (K=64, F=35, UE4M3 scale per 16) | mxf4 (UE8M0 per 32) | mxf4b16 (UE8M0 per 16)\n")
        out.write("#   src m: MMA-Sim as published; x: fp6/fp4 operand in f8f6f4/mxf8f6f4, MMA-Sim's rule with its\n")
        out.write("#       dtype table extended (e2m1 0, e2m3 0, e3m2 -2), not simulated by MMA-Sim itself\n")
        out.write("#   codes: 2 hex digits per 8- or 6-bit code, 1 per fp4 code, element 0 first; scales: 2 hex\n")
        out.write("#   digits each, block 0 first\n")
        for line in g.lines:
            out.write(line + "\n")
    print(f"{len(g.lines)} vectors -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
