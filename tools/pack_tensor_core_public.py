#!/usr/bin/env python3
"""Packs the public tensor-core captures (Khattak and Mikaitis, north-numerical-computing/
MATLAB-tensor-core, model_validation/, commit b12b5a7) into the compact files the unit tests read.

    python3 tools/pack_tensor_core_public.py SOURCE_DIR tests/data/tensor_core_public

SOURCE_DIR holds <GPU>/<format>/{a,b}_<GPU>_<format>.txt (operands as float32 bit patterns in hex),
c_<GPU>_fp32.txt, d_<GPU>_fp32.txt and, where captured, d_<GPU>_fp16.txt (float32 binary strings;
a float16 result is written as the float32 of its value). Every set is packed, line for line and bit
for bit, once per result: fp16, bf16, E4M3, E5M2 and tf32 operands with a float32 accumulator
(<GPU>/<format>/<GPU>_<format>_fp32.bin) and with a float16 one (..._fp16.bin). An fp16, bf16 or
fp8 operand is stored as its code in its own format, after checking that the code decodes to
exactly the float32 value of the source line; a tf32 operand as the float32 word of the source
line, unchanged (the unit reads its leading 19 bits). Output: a 256-byte ASCII header of key=value
words, then one record per source line: K codes of a, K codes of b (uint8 for fp8, little-endian
uint16 for fp16/bf16, uint32 for tf32), C and D as little-endian float32 bit patterns (a float16 D
after checking that it is exactly a float16 value). A NaN operand is stored as the format's
canonical NaN code, an infinite one as its infinity. The LICENCE file is copied beside them.
"""
import os
import shutil
import struct
import sys

FORMATS = {  # exponent bits, mantissa bits, bias, bytes per code
    'fp16': (5, 10, 15, 2),
    'bf16': (8, 7, 127, 2),
    'E4M3': (4, 3, 7, 1),
    'E5M2': (5, 2, 15, 1),
    'tf32': (8, 10, 127, 4),  # stored as the float32 word
}


def f32(bits):
    return struct.unpack('<f', struct.pack('<I', bits))[0]


def decode(code, fmt):
    """The value of a finite code of fmt (exact, as a Python float)."""
    e, m, bias, nbytes = FORMATS[fmt]
    sign = -1.0 if code >> (e + m) else 1.0
    field = (code >> m) & ((1 << e) - 1)
    mant = code & ((1 << m) - 1)
    if field == 0:
        return sign * mant * 2.0 ** (1 - bias - m)
    return sign * (mant + (1 << m)) * 2.0 ** (field - bias - m)


# The positive finite codes of each fp8 format by value (E4M3: 0x7f is NaN; E5M2: field 31 is inf/NaN).
FP8_CODES = {fmt: {decode(c, fmt): c for c in range(1, 0x80)
                   if not (fmt == 'E4M3' and c == 0x7f) and not (fmt == 'E5M2' and c >> 2 == 31)}
             for fmt in ('E4M3', 'E5M2')}


# Non-finite operands: the format's infinity (none in E4M3) and its canonical NaN (a float32 NaN
# operand carries no payload the tensor core reads).
INF_CODES = {'fp16': 0x7c00, 'bf16': 0x7f80, 'E5M2': 0x7c}
NAN_CODES = {'fp16': 0x7e00, 'bf16': 0x7fc0, 'E4M3': 0x7f, 'E5M2': 0x7e}


def is_float16(bits):
    """Whether the float32 with these bits is exactly a float16 value (NaN and inf included)."""
    x = f32(bits)
    if x != x:
        return True
    try:
        return struct.unpack('<e', struct.pack('<e', x))[0] == x
    except OverflowError:
        return False


def encode(bits, fmt):
    """The code of fmt whose value is the float32 with these bits; raises unless exact."""
    if fmt == 'tf32':
        return bits
    e, m, bias, nbytes = FORMATS[fmt]
    x = f32(bits)
    sign = bits >> 31
    if x != x:
        return NAN_CODES[fmt]
    if x in (float('inf'), float('-inf')):
        if fmt not in INF_CODES:
            raise ValueError(f'{bits:08x}: {fmt} has no infinity')
        return INF_CODES[fmt] | sign << (e + m)
    if x == 0.0:
        return sign << (e + m)
    if fmt == 'bf16':
        code = bits >> 16
    elif fmt == 'fp16':
        code = struct.unpack('<H', struct.pack('<e', x))[0]
    else:
        code = FP8_CODES[fmt].get(abs(x))
        if code is None:
            raise ValueError(f'{bits:08x} is not a finite {fmt} value')
        code |= sign << (e + m)
    if decode(code, fmt) != x or (x == 0.0) != (code & ((1 << (e + m)) - 1) == 0):
        raise ValueError(f'{bits:08x} is not exactly a {fmt} code')
    return code


def pack_set(src, dst, gpu, fmt, result='fp32'):
    d = os.path.join(src, gpu, fmt)
    names = [f'a_{gpu}_{fmt}.txt', f'b_{gpu}_{fmt}.txt', f'c_{gpu}_fp32.txt', f'd_{gpu}_{result}.txt']
    a, b, c, out = [open(os.path.join(d, n)).read().split('\n') for n in names]
    a, b, c, out = [[line.strip() for line in f if line.strip()] for f in (a, b, c, out)]
    if not (len(a) == len(b) == len(c) == len(out)):
        raise ValueError(f'{gpu}/{fmt}: files of different lengths')
    k = len(a[0].split())
    nbytes = FORMATS[fmt][3]
    records = bytearray()
    for la, lb, lc, ld in zip(a, b, c, out):
        wa, wb = la.split(), lb.split()
        if len(wa) != k or len(wb) != k or len(lc) != 32 or len(ld) != 32:
            raise ValueError(f'{gpu}/{fmt}: a malformed line')
        for w in wa + wb:
            records += encode(int(w, 16), fmt).to_bytes(nbytes, 'little')
        if result == 'fp16' and not is_float16(int(ld, 2)):
            raise ValueError(f'{gpu}/{fmt}: a float16 result that is not a float16 value')
        records += int(lc, 2).to_bytes(4, 'little') + int(ld, 2).to_bytes(4, 'little')
    source = (f'{{a,b}}_{gpu}_{fmt}.txt,{{c,d}}_{gpu}_fp32.txt' if result == 'fp32' else
              f'{{a,b}}_{gpu}_{fmt}.txt,c_{gpu}_fp32.txt,d_{gpu}_fp16.txt')
    header = (f'kind=tensor_core_public gpu={gpu} format={fmt} result={result} K={k} elem_bytes={nbytes} '
              f'lines={len(a)} record_bytes={2 * k * nbytes + 8} '
              f'source=north-numerical-computing/MATLAB-tensor-core@b12b5a7:model_validation/{gpu}/{fmt}/'
              f'{source}\n').encode()
    if len(header) > 256:
        raise ValueError('header too long')
    os.makedirs(os.path.join(dst, gpu, fmt), exist_ok=True)
    path = os.path.join(dst, gpu, fmt, f'{gpu}_{fmt}_{result}.bin')
    tmp = path + '.tmp'
    with open(tmp, 'wb') as f:
        f.write(header.ljust(256, b' ') + records)
    os.replace(tmp, path)
    return len(a), k


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    for gpu in sorted(os.listdir(src)):
        if not os.path.isdir(os.path.join(src, gpu)):
            continue
        for fmt in sorted(os.listdir(os.path.join(src, gpu))):
            for result in ('fp32', 'fp16'):
                if fmt in FORMATS and os.path.exists(os.path.join(src, gpu, fmt, f'd_{gpu}_{result}.txt')):
                    n, k = pack_set(src, dst, gpu, fmt, result)
                    print(f'{gpu}/{fmt} ({result} result): {n} lines, K = {k}')
    shutil.copyfile(os.path.join(src, 'LICENCE'), os.path.join(dst, 'LICENCE'))


if __name__ == '__main__':
    main()
