"""Cuts the vendored subset in this folder out of the shared capture (reference/mma/ of the
project's shared material). usage: python3 make_subset.py SHARED_MMA_DIR OUT_DIR
Tile files keep their first TILES[...] tiles (whole groups of 4 for wgmma, every input class);
the 256-byte header is kept with tiles= rewritten and the subset appended. cuBLASLt records keep
the top-left ROWS x COLS block of every record (each output depends only on its row of A and its
row of BT), the header line extended with subset=."""
import os, sys

src, out = sys.argv[1], sys.argv[2]
TILES = {"wgmma_e4m3_e4m3.bin": 80, "wgmma_e4m3_e5m2.bin": 80, "wgmma_e5m2_e4m3.bin": 80,
         "wgmma_e5m2_e5m2.bin": 80, "mma_f16.bin": 100, "mma_bf16.bin": 100}
BLOCK = {"gemm_k32.bin": 16, "gemm_long.bin": 8}

for name, count in TILES.items():
    data = open(os.path.join(src, name), "rb").read()
    header = data[:256].decode("ascii").rstrip()
    keys = dict(w.split("=", 1) for w in header.split() if "=" in w)
    tile_bytes, total = int(keys["tile_bytes"]), int(keys["tiles"])
    header = header.replace(f"tiles={total}", f"tiles={count}") + f" subset=first_{count}_of_{total}"
    assert len(header) < 255
    with open(os.path.join(out, name), "wb") as f:
        f.write(header.ljust(255).encode("ascii") + b"\n")
        f.write(data[256:256 + count * tile_bytes])

for name, block in BLOCK.items():
    data = open(os.path.join(src, name), "rb").read()
    p = 0
    with open(os.path.join(out, name), "wb") as f:
        while p < len(data):
            eol = data.index(b"\n", p)
            header = data[p:eol].decode("ascii")
            keys = dict(w.split("=", 1) for w in header.split()[1:])
            M, K, N = int(keys["M"]), int(keys["K"]), int(keys["N"])
            p = eol + 1
            A = data[p:p + M * K]; p += M * K
            BT = data[p:p + N * K]; p += N * K
            D0 = data[p:p + 4 * M * N]; p += 4 * M * N
            D1 = data[p:p + 4 * M * N]; p += 4 * M * N
            header = header.replace(f"M={M}", f"M={block}").replace(f"N={N}", f"N={block}")
            f.write(f"{header} subset=rows_0-{block - 1}_cols_0-{block - 1}_of_{M}x{N}\n".encode("ascii"))
            f.write(A[:block * K] + BT[:block * K])
            for D in (D0, D1):
                f.write(b"".join(D[4 * (i * N):4 * (i * N + block)] for i in range(block)))
