#!/usr/bin/env python3
"""GGUF fixtures from llama.cpp's gguf-py (PyPI `gguf`), the reference sluice matches.

    /work/venv/gguf/bin/python tools/reference/make_gguf_fixtures.py

Writes (deleting them first):

- testdata/gguf/blocks/manifest.txt and, per ggml type, <TYPE>.blocks (raw blocks, `rows` rows of
  `cols` elements) and <TYPE>.f32 (what `gguf.quants.dequantize` gives for them, little-endian
  f32). Rows are seeded random blocks with sane f16 scales (for the types gguf-py can quantize,
  the first two rows are `gguf.quants.quantize` of seeded normal data instead) and the last row
  is fully random bytes, scales included.
- testdata/gguf/files/*.gguf: tiny files written by `gguf.GGUFWriter` (every metadata type,
  nested arrays, several tensor types, a custom alignment, a two-part split, a big-endian file),
  and testdata/gguf/files/expect.json: what `gguf.GGUFReader` reads back from each.
- crates/sluice-kernels/src/gguf/grids.rs: the IQ grid tables, decoded by gguf-py itself.

Run twice, get byte-identical files (the script prints a sha256 over everything it wrote).
"""

import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "testdata" / "gguf"
GRIDS = ROOT / "crates" / "sluice-kernels" / "src" / "gguf" / "grids.rs"

# (type, rows, cols)
TYPES = [
    (T.F32, 4, 64), (T.F16, 4, 64), (T.BF16, 4, 64),
    (T.Q8_0, 6, 128), (T.Q4_0, 6, 128), (T.Q4_1, 6, 128), (T.Q5_0, 6, 128), (T.Q5_1, 6, 128),
    (T.Q2_K, 6, 512), (T.Q3_K, 6, 512), (T.Q4_K, 6, 512), (T.Q5_K, 6, 512), (T.Q6_K, 6, 512),
    (T.IQ4_NL, 6, 128), (T.IQ4_XS, 6, 512), (T.MXFP4, 6, 128),
    (T.IQ2_XXS, 6, 512), (T.IQ2_XS, 6, 512), (T.IQ2_S, 6, 512), (T.IQ3_XXS, 6, 512),
    (T.IQ3_S, 6, 512), (T.IQ1_S, 6, 512), (T.IQ1_M, 6, 512),
    (T.TQ1_0, 6, 512), (T.TQ2_0, 6, 512), (T.NVFP4, 6, 128),
]

# Byte offsets of the f16 scales inside one block, set to sane values in the "sane" rows.
F16_FIELDS = {
    T.Q8_0: [0], T.Q4_0: [0], T.Q5_0: [0], T.IQ4_NL: [0], T.Q4_1: [0, 2], T.Q5_1: [0, 2],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ4_XS: [0], T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ2_S: [0], T.IQ3_XXS: [0], T.IQ3_S: [0],
    T.IQ1_S: [0], T.TQ1_0: [52], T.TQ2_0: [64],
}
QUANTIZABLE = {T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.MXFP4, T.TQ1_0, T.TQ2_0}


def sane_f16(rng, n):
    """f16 scales: mostly normal magnitudes of either sign, some subnormals, zeros, the max."""
    mag = (2.0 ** rng.uniform(-14, 1, n)).astype(np.float16)
    sign = np.where(rng.random(n) < 0.5, -1, 1).astype(np.float16)
    v = mag * sign
    pick = rng.random(n)
    v = np.where(pick < 0.05, np.float16(0), v)
    v = np.where((pick >= 0.05) & (pick < 0.1), np.float16(6e-6), v)  # subnormal
    v = np.where((pick >= 0.1) & (pick < 0.12), np.float16(-65504), v)
    return v.astype(np.float16)


def make_blocks(qtype, rows, cols, rng):
    bs, ts = GGML_QUANT_SIZES[qtype]
    nb = rows * cols // bs
    raw = rng.integers(0, 256, size=(nb, ts), dtype=np.uint8)
    per_row = cols // bs
    sane = raw[: (rows - 1) * per_row]
    if qtype in F16_FIELDS:
        for off in F16_FIELDS[qtype]:
            sane[:, off:off + 2] = sane_f16(rng, sane.shape[0]).view(np.uint8).reshape(-1, 2)
    elif qtype == T.IQ1_M:
        # The f16 scale is spread over the top nibbles of the four u16 scales at byte 48.
        h = sane_f16(rng, sane.shape[0]).view(np.uint16)
        sc = sane[:, 48:56].copy().view(np.uint16)
        for k in range(4):
            sc[:, k] = (sc[:, k] & 0x0FFF) | (((h >> (4 * k)) & 0xF) << 12)
        sane[:, 48:56] = sc.view(np.uint8)
    elif qtype == T.MXFP4:
        sane[:, 0] = rng.integers(100, 150, size=sane.shape[0], dtype=np.uint8)
    elif qtype == T.F16:
        sane[:] = rng.standard_normal(sane.shape[0] * ts // 2).astype(np.float16).view(np.uint8).reshape(sane.shape)
    elif qtype in (T.F32,):
        sane[:] = rng.standard_normal(sane.shape[0] * ts // 4).astype(np.float32).view(np.uint8).reshape(sane.shape)
    if qtype in QUANTIZABLE:
        data = rng.standard_normal((2, cols)).astype(np.float32)
        data[1] *= 1e-3
        q = quants.quantize(data, qtype).reshape(-1, ts)
        raw[: 2 * per_row] = q
    return raw.reshape(rows, cols // bs * ts)


def dequantize(blocks, qtype):
    if qtype == T.BF16:
        # gguf.quants.dequantize has no F16/F32-style shortcut for BF16 (it goes through its class).
        pass
    return np.ascontiguousarray(quants.dequantize(blocks, qtype), dtype=np.float32)


def write_blocks(written):
    d = OUT / "blocks"
    d.mkdir(parents=True)
    lines = ["# type id rows cols: <type>.blocks (raw), <type>.f32 (gguf.quants.dequantize)"]
    for i, (qtype, rows, cols) in enumerate(TYPES):
        rng = np.random.default_rng(1000 + int(qtype))
        blocks = make_blocks(qtype, rows, cols, rng)
        f = dequantize(blocks, qtype)
        assert f.shape == (rows, cols), (qtype, f.shape)
        (d / f"{qtype.name}.blocks").write_bytes(blocks.tobytes())
        (d / f"{qtype.name}.f32").write_bytes(f.astype("<f4").tobytes())
        written += [d / f"{qtype.name}.blocks", d / f"{qtype.name}.f32"]
        lines.append(f"{qtype.name} {int(qtype)} {rows} {cols}")
    (d / "manifest.txt").write_text("\n".join(lines) + "\n")
    written.append(d / "manifest.txt")


def q_tensor(rng, qtype, shape):
    """Random raw blocks for a quantized tensor of `shape` (outermost first)."""
    bs, ts = GGML_QUANT_SIZES[qtype]
    n = int(np.prod(shape))
    raw = rng.integers(0, 256, size=(n // bs, ts), dtype=np.uint8)
    return raw.reshape(*shape[:-1], shape[-1] // bs * ts)


def write_files(written):
    d = OUT / "files"
    d.mkdir(parents=True)
    rng = np.random.default_rng(7)

    # 1. every metadata type, several tensor types, default alignment.
    w = gguf.GGUFWriter(d / "tiny.gguf", "llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_float32("t.f32", 0.1)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", -0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ✓")
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_array("t.arr_str", ["a", "", "ünï"])
    w.add_array("t.arr_f32", [0.5, -1.25])
    w.add_array("t.arr_bool", [True, False])
    w.add_key_value("t.nested", [[1, 2], [3]], gguf.GGUFValueType.ARRAY)
    w.add_block_count(2)
    w.add_tensor("f32.weight", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16.weight", rng.standard_normal((2, 4)).astype(np.float16))
    w.add_tensor("q8.weight", q_tensor(rng, T.Q8_0, (2, 64)), raw_dtype=T.Q8_0)
    w.add_tensor("q4k.weight", q_tensor(rng, T.Q4_K, (1, 256)), raw_dtype=T.Q4_K)
    w.add_tensor("vec", rng.standard_normal(7).astype(np.float32))
    w.add_tensor("experts", q_tensor(rng, T.IQ4_NL, (2, 3, 32)), raw_dtype=T.IQ4_NL)
    finish(w)

    # 2. a custom alignment.
    w = gguf.GGUFWriter(d / "align64.gguf", "llama")
    w.add_custom_alignment(64)
    w.add_tensor("a", rng.standard_normal(3).astype(np.float32))
    w.add_tensor("b", q_tensor(rng, T.Q6_K, (1, 256)), raw_dtype=T.Q6_K)
    finish(w)

    # 3. a two-part split (GGUFWriter names the parts split-0000N-of-00002.gguf).
    w = gguf.GGUFWriter(d / "split.gguf", "llama", split_max_tensors=2)
    for i in range(3):
        w.add_tensor(f"t{i}", rng.standard_normal((2, 2)).astype(np.float32))
    finish(w)

    # 4. big-endian (refused).
    w = gguf.GGUFWriter(d / "big-endian.gguf", "llama", endianess=gguf.GGUFEndian.BIG)
    w.add_tensor("a", rng.standard_normal(3).astype(np.float32))
    finish(w)

    expect = {}
    for p in sorted(d.glob("*.gguf")):
        if p.name == "big-endian.gguf":
            continue
        r = gguf.GGUFReader(p)
        expect[p.name] = {
            "alignment": int(r.alignment),
            "data_start": int(r.data_offset),
            "keys": [[f.name, int(f.types[0])] for f in r.fields.values() if not f.name.startswith("GGUF.")],
            "tensors": [
                {
                    "name": t.name,
                    "dims": [int(x) for x in t.shape],  # innermost first, as stored
                    "type": int(t.tensor_type),
                    "offset": int(t.data_offset),
                    "len": int(t.n_bytes),
                }
                for t in r.tensors
            ],
        }
    (d / "expect.json").write_text(json.dumps(expect, indent=1, sort_keys=True) + "\n")
    written += sorted(d.iterdir())


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_grids(written):
    out = [
        "//! The IQ grid tables as gguf-py decodes them (`gguf.quants.<TYPE>.grid`), one row of",
        "//! grid values per index. Generated by `tools/reference/make_gguf_fixtures.py`: do not edit.",
        "",
    ]
    for cls, name in [
        (quants.IQ2_XXS, "IQ2XXS_GRID"), (quants.IQ2_XS, "IQ2XS_GRID"), (quants.IQ2_S, "IQ2S_GRID"),
        (quants.IQ3_XXS, "IQ3XXS_GRID"), (quants.IQ3_S, "IQ3S_GRID"), (quants.IQ1_S, "IQ1S_GRID"),
    ]:
        cls.init_grid()
        g = np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape)
        iv = g.astype(np.int64)
        assert (iv.astype(np.float32) == g).all()
        n, w = g.shape
        out.append(f"/// `{cls.__name__}` grid: {n} entries of {w} values.")
        out.append(f"pub(crate) static {name}: [[i8; {w}]; {n}] = [")
        for row in iv:
            out.append("    [" + ", ".join(str(int(x)) for x in row) + "],")
        out.append("];")
        out.append("")
    ks = np.frombuffer(quants.IQ2_XXS.ksigns, dtype=np.uint8)
    out.append("/// `IQ2_XXS.ksigns`: 7 sign bits plus the parity bit.")
    out.append("pub(crate) static KSIGNS: [u8; 128] = [")
    for i in range(0, 128, 16):
        out.append("    " + ", ".join(f"0x{x:02x}" for x in ks[i:i + 16]) + ",")
    out.append("];")
    GRIDS.parent.mkdir(parents=True, exist_ok=True)
    GRIDS.write_text("\n".join(out) + "\n")
    written.append(GRIDS)


def main():
    if OUT.exists():
        shutil.rmtree(OUT)
    written = []
    write_blocks(written)
    write_files(written)
    write_grids(written)
    h = hashlib.sha256()
    total = 0
    for p in sorted(written):
        b = p.read_bytes()
        total += len(b)
        h.update(str(p.relative_to(ROOT)).encode() + b"\0" + b)
    print(f"gguf {gguf.__version__ if hasattr(gguf, '__version__') else '?'} numpy {np.__version__} "
          f"python {sys.version.split()[0]}")
    print(f"{len(written)} files, {total} bytes, sha256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
