#!/usr/bin/env python3
"""The integer mode's reference: an independent NumPy implementation of its specification.

    /work/venv/ref/bin/python tools/reference/make_int8_fixtures.py

The specification is docs/ARCHITECTURE.md's "The integer mode" (and the module documentation of
crates/sluice-kernels/src/int8/mod.rs). This script implements it from that text and from
llama.cpp's reference quantizers (`quantize_row_q8_K_ref`, `quantize_row_q8_0_ref`,
`quantize_row_q8_1_ref` in ggml-quants.c), reading the weight blocks by ggml's layouts — none of
sluice's code — with NumPy float32 arithmetic, one rounding per operation in the order the
specification writes.

The weights are the blocks of testdata/gguf/blocks/ (gguf-py's quantizer on seeded data, seeded
random blocks with sane scales, and one row of fully random bytes). For each format with an
integer product it writes, under testdata/int8/:

- <TYPE>.acts: activation rows (f32 little-endian, `acts` rows of `cols`): seeded normal values,
  a row with a block of zeros and values whose scaled codes fall on ties, and a row of extremes;
- <TYPE>.out: the products, `acts` rows of `rows` values (f32 little-endian);
- manifest.txt: `type rows cols acts` per format.

crates/sluice-kernels/tests/int8_reference.rs checks every ISA against them bit for bit (NaN
against NaN, whose payload the contract does not fix). Run twice, get byte-identical files.
"""

import hashlib
import shutil
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = ROOT / "testdata" / "gguf" / "blocks"
OUT = ROOT / "testdata" / "int8"

f32 = np.float32
QK_K = 256

# ggml block sizes: (elements, bytes)
LAYOUT = {
    "Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24),
    "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210),
    "IQ4_NL": (32, 18), "MXFP4": (32, 17), "IQ4_XS": (256, 136),
}
# The activation type of each (llama.cpp's vec_dot_type).
ACT = {
    "Q8_0": "Q8_0", "Q4_0": "Q8_0", "Q5_0": "Q8_0", "Q4_1": "Q8_1", "Q5_1": "Q8_1",
    "Q4_K": "Q8_K", "Q5_K": "Q8_K", "Q6_K": "Q8_K",
    "IQ4_NL": "Q8_0", "MXFP4": "Q8_0", "IQ4_XS": "Q8_K",
}
# ggml's kvalues_iq4nl and kvalues_mxfp4 (E2M1 doubled).
KV_IQ4 = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int64)
KV_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int64)


def f16_value(raw, at):
    """The f16 at byte `at` of a block (`raw`: its bytes), as float32."""
    return f32(np.frombuffer(raw[at:at + 2].tobytes(), dtype="<f2")[0])


def f16_round(x):
    """The float32 value of the float16 nearest `x` (ties to even)."""
    return f32(np.float16(f32(x)))


def round_away(v):
    """C's roundf on float32 values: the nearest integer, halves away from zero."""
    t = np.trunc(v)
    frac = np.abs(v - t)  # exact in float32
    return np.where(frac >= f32(0.5), t + np.sign(v), t)


# ---- activations -------------------------------------------------------------------------------

def quantize_q8_k(x):
    """quantize_row_q8_K_ref on one row: (codes int8, d per block float32, bsums int16)."""
    nb = len(x) // QK_K
    qs = np.zeros(len(x), dtype=np.int8)
    d = np.zeros(nb, dtype=f32)
    bsums = np.zeros(len(x) // 16, dtype=np.int16)
    for i in range(nb):
        xb = x[i * QK_K:(i + 1) * QK_K]
        amax, mx = f32(0), f32(0)
        for v in xb:  # the first value of largest magnitude
            if abs(v) > amax:
                amax, mx = abs(v), v
        if amax == 0:
            continue
        iscale = f32(-127.0) / mx
        q = np.rint((iscale * xb).astype(f32))  # rint: ties to even, as nearest_int
        q = np.minimum(q, 127).astype(np.int8)
        qs[i * QK_K:(i + 1) * QK_K] = q
        bsums[i * 16:(i + 1) * 16] = q.astype(np.int32).reshape(16, 16).sum(axis=1)
        d[i] = f32(1.0) / iscale
    return qs, d, bsums


def quantize_q8_0(x, with_sum):
    """quantize_row_q8_0_ref / q8_1_ref on one row: (codes, d as f16 values, s as f16 values)."""
    nb = len(x) // 32
    qs = np.zeros(len(x), dtype=np.int8)
    d = np.zeros(nb, dtype=f32)
    s = np.zeros(nb, dtype=f32)
    for i in range(nb):
        xb = x[i * 32:(i + 1) * 32]
        amax = np.max(np.abs(xb)).astype(f32)
        di = amax / f32(127.0)
        idi = f32(1.0) / di if di != 0 else f32(0.0)
        q = round_away((xb * idi).astype(f32)).astype(np.int8)
        qs[i * 32:(i + 1) * 32] = q
        d[i] = f16_round(di)
        if with_sum:
            s[i] = f16_round(f32(int(q.astype(np.int32).sum())) * di)
    return qs, d, s


# ---- weights: integer codes and scales per block, by ggml's layouts ------------------------------

def k4_scales(s):
    """Q4_K/Q5_K: the 8 six-bit scales and mins from 12 bytes."""
    sc, mn = [], []
    for j in range(8):
        if j < 4:
            sc.append(s[j] & 63)
            mn.append(s[j + 4] & 63)
        else:
            sc.append((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4))
            mn.append((s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    return sc, mn


def weight_block(t, b):
    """(codes int64[block], sub-block scales, mins or None, dict of f16 factors)."""
    raw = np.frombuffer(bytes(b), dtype=np.uint8)
    b = raw.astype(np.int64)
    if t == "Q8_0":
        return raw[2:34].view(np.int8).astype(np.int64), [1], None, {"d": f16_value(raw, 0)}
    if t in ("Q4_0", "Q4_1"):
        off = 2 if t == "Q4_0" else 4
        qs = b[off:off + 16]
        q = np.concatenate([qs & 0xF, qs >> 4])
        if t == "Q4_0":
            return q - 8, [1], None, {"d": f16_value(raw, 0)}
        return q, [1], None, {"d": f16_value(raw, 0), "m": f16_value(raw, 2)}
    if t in ("Q5_0", "Q5_1"):
        hoff, off = (2, 6) if t == "Q5_0" else (4, 8)
        qh = int.from_bytes(raw[hoff:hoff + 4].tobytes(), "little")
        qs = b[off:off + 16]
        lo = np.concatenate([qs & 0xF, qs >> 4])
        hi = np.array([(qh >> j) & 1 for j in range(32)], dtype=np.int64) << 4
        q = lo | hi
        if t == "Q5_0":
            return q - 16, [1], None, {"d": f16_value(raw, 0)}
        return q, [1], None, {"d": f16_value(raw, 0), "m": f16_value(raw, 2)}
    if t in ("Q4_K", "Q5_K"):
        sc, mn = k4_scales(b[4:16])
        qs = b[16:144] if t == "Q4_K" else b[48:176]
        q = np.zeros(256, dtype=np.int64)
        for j in range(4):  # 64 elements per 32 bytes: low nibbles, then high
            q[64 * j:64 * j + 32] = qs[32 * j:32 * j + 32] & 0xF
            q[64 * j + 32:64 * j + 64] = qs[32 * j:32 * j + 32] >> 4
        if t == "Q5_K":
            qh = b[16:48]
            for e in range(256):
                q[e] |= ((qh[e % 32] >> (e // 32)) & 1) << 4
        return q, sc, mn, {"d": f16_value(raw, 0), "dmin": f16_value(raw, 2)}
    if t == "Q6_K":
        ql, qh, sc = b[0:128], b[128:192], raw[192:208].view(np.int8).astype(np.int64)
        q = np.zeros(256, dtype=np.int64)
        for n in range(2):  # halves of 128
            for l in range(32):
                lq0, lq1 = ql[64 * n + l], ql[64 * n + l + 32]
                h = qh[32 * n + l]
                q[128 * n + l] = (lq0 & 0xF) | (((h >> 0) & 3) << 4)
                q[128 * n + l + 32] = (lq1 & 0xF) | (((h >> 2) & 3) << 4)
                q[128 * n + l + 64] = (lq0 >> 4) | (((h >> 4) & 3) << 4)
                q[128 * n + l + 96] = (lq1 >> 4) | (((h >> 6) & 3) << 4)
        return q - 32, list(sc), None, {"d": f16_value(raw, 208)}
    if t in ("IQ4_NL", "MXFP4"):
        off = 2 if t == "IQ4_NL" else 1
        qs = b[off:off + 16]
        q = np.concatenate([qs & 0xF, qs >> 4])
        if t == "IQ4_NL":
            return KV_IQ4[q], [1], None, {"d": f16_value(raw, 0)}
        # GGML_E8M0_TO_FP32_HALF: 2^(e − 128).
        return KV_MXFP4[q], [1], None, {"d": f32(np.ldexp(f32(1.0), int(b[0]) - 128))}
    if t == "IQ4_XS":
        sh = int(b[2]) | (int(b[3]) << 8)
        sl, qs = b[4:8], b[8:136]
        q = np.zeros(256, dtype=np.int64)
        sc = []
        for ib in range(8):
            ls = int((sl[ib // 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4)
            sc.append(ls - 32)
            part = qs[16 * ib:16 * ib + 16]
            q[32 * ib:32 * ib + 16] = KV_IQ4[part & 0xF]
            q[32 * ib + 16:32 * ib + 32] = KV_IQ4[part >> 4]
        return q, sc, None, {"d": f16_value(raw, 0)}
    raise ValueError(t)


def dot(t, row, acts):
    """One output value of a format without mins per sub-block (see `dot_q45k` for Q4_K and
    Q5_K): the specification's integer sums and float32 epilogue."""
    n, nbytes = LAYOUT[t]
    kind = ACT[t]
    qa, da, extra = acts
    acc = f32(0.0)
    for bi in range(len(row) // nbytes):
        codes, sc, mn, fac = weight_block(t, row[bi * nbytes:(bi + 1) * nbytes])
        a = qa[bi * n:(bi + 1) * n].astype(np.int64)
        g = n // len(sc)
        isum = int(sum(int(s) * int(np.dot(codes[k * g:(k + 1) * g], a[k * g:(k + 1) * g]))
                       for k, s in enumerate(sc)))
        d_a = da[bi]
        if t in ("Q4_1", "Q5_1"):
            s_a = extra[bi]
            acc = f32(acc + f32(f32(f32(fac["d"] * d_a) * f32(isum)) + f32(fac["m"] * s_a)))
        else:
            acc = f32(acc + f32(f32(fac["d"] * d_a) * f32(isum)))
    return acc


def dot_k4(acc, dw, dmin, d_a, isum, msum):
    """acc + ((dw·da)·isum − (dmin·da)·msum), each operation rounded to float32."""
    left = f32(f32(dw * d_a) * f32(isum))
    right = f32(f32(dmin * d_a) * f32(msum))
    return f32(acc + f32(left - right))


def quantize(kind, x):
    if kind == "Q8_K":
        qs, d, bsums = quantize_q8_k(x)
        return qs, d, bsums
    qs, d, s = quantize_q8_0(x, kind == "Q8_1")
    return qs, d, s


def activations(rng, cols):
    rows = [rng.standard_normal(cols).astype(f32) * f32(0.7),
            rng.standard_normal(cols).astype(f32) * f32(40.0),
            (rng.standard_normal(cols) ** 3).astype(f32)]
    # A block of zeros, then values whose codes fall on ties: 2^k multiples of a block's max.
    r = rng.standard_normal(cols).astype(f32)
    r[:64] = f32(0)
    r[64] = f32(-2.0)
    r[65:69] = [f32(1.0), f32(0.5), f32(-1.0), f32(1.5)]
    rows.append(r)
    # Extremes: the largest value repeated with both signs, tiny values beside large ones.
    e = np.where(np.arange(cols) % 2 == 0, f32(3e4), f32(-3e4)).astype(f32)
    e[1::7] = f32(1e-30)
    rows.append(e)
    return np.stack(rows)


def main():
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    manifest = {}
    for line in (BLOCKS / "manifest.txt").read_text().splitlines():
        if line.startswith("#"):
            continue
        name, _, rows, cols = line.split()
        manifest[name] = (int(rows), int(cols))
    rng = np.random.default_rng(61)
    lines = ["# type rows cols acts: <type>.acts (f32 rows of cols), <type>.out (f32 rows of rows)"]
    digest = hashlib.sha256()
    for t in LAYOUT:
        rows, cols = manifest[t]
        n, nbytes = LAYOUT[t]
        data = np.frombuffer((BLOCKS / f"{t}.blocks").read_bytes(), dtype=np.uint8)
        row_bytes = cols // n * nbytes
        assert len(data) == rows * row_bytes, t
        x = activations(rng, cols)
        out = np.zeros((len(x), rows), dtype=f32)
        with np.errstate(all="ignore"):
            for i, xr in enumerate(x):
                acts = quantize(ACT[t], xr)
                for r in range(rows):
                    row = data[r * row_bytes:(r + 1) * row_bytes]
                    if t in ("Q4_K", "Q5_K"):
                        out[i, r] = dot_q45k(t, row, acts)
                    else:
                        out[i, r] = dot(t, row, acts)
        for suffix, arr in (("acts", x), ("out", out)):
            b = arr.astype("<f4").tobytes()
            (OUT / f"{t}.{suffix}").write_bytes(b)
            digest.update(b)
        lines.append(f"{t} {rows} {cols} {len(x)}")
    (OUT / "manifest.txt").write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}; sha256 {digest.hexdigest()}")


def dot_q45k(t, row, acts):
    """Q4_K / Q5_K: the epilogue of `dot_k4` per super-block."""
    n, nbytes = LAYOUT[t]
    qa, da, bsums = acts
    acc = f32(0.0)
    for bi in range(len(row) // nbytes):
        codes, sc, mn, fac = weight_block(t, row[bi * nbytes:(bi + 1) * nbytes])
        a = qa[bi * n:(bi + 1) * n].astype(np.int64)
        isum = int(sum(int(s) * int(np.dot(codes[k * 32:(k + 1) * 32], a[k * 32:(k + 1) * 32]))
                       for k, s in enumerate(sc)))
        bs = bsums[bi * 16:(bi + 1) * 16].astype(np.int64)
        msum = int(sum(int(m) * int(bs[2 * k] + bs[2 * k + 1]) for k, m in enumerate(mn)))
        acc = dot_k4(acc, fac["d"], fac["dmin"], da[bi], isum, msum)
    return acc


if __name__ == "__main__":
    main()
