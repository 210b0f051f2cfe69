#!/usr/bin/env python3
"""Packed-weight decoding fixtures for sluice-kernels, produced by torch and the libraries that
define the formats.

Writes crates/sluice-kernels/tests/data/kernel_fixtures.safetensors (a few KB), read by
crates/sluice-kernels/tests/torch_fixtures.rs:

- FP8 E4M3: every one of the 256 codes cast by torch (float8_e4m3fn -> float32), and two
  block-scaled matrices (128 x 128 blocks, f32 inverse scales as DeepSeek-V3 stores them) that
  cross a row-block and a column-block edge, with torch's dequantized values of the rows at the
  edge and a product.
- INT4 pack-quantized: int4 values packed by compressed-tensors' own `pack_to_int32` (so the
  nibble order and the +8 offset are the library's), bf16 group scales, torch's dequantized
  values, and compressed-tensors' `unpack_from_int32` round trip.
- MXFP4: GPT-OSS blocks and E8M0 scales dequantized by transformers'
  `convert_moe_packed_tensors` (lut[nibble], low nibble = even element, ldexp(scale - 127)).

Regenerate (deterministic):
    /work/venv/ref/bin/python tools/reference/kernel_fixtures.py
"""

import pathlib

import torch
from compressed_tensors.compressors.pack_quantized.helpers import (
    pack_to_int32,
    unpack_from_int32,
)
from safetensors.torch import save_file
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "crates/sluice-kernels/tests/data/kernel_fixtures.safetensors"


def fp8(gen: torch.Generator, out: dict) -> None:
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    out["e4m3.codes"] = codes
    out["e4m3.values"] = codes.view(torch.float8_e4m3fn).to(torch.float32)

    # Block-scaled matrices: rows cross a 128-row block edge in the first, columns cross a
    # 128-column block edge in the second.
    for name, (rows, cols) in {"e4m3_rows": (130, 32), "e4m3_cols": (2, 144)}.items():
        w = (torch.randn(rows, cols, generator=gen) * 100).to(torch.float8_e4m3fn)
        srows, scols = -(-rows // 128), -(-cols // 128)
        s = torch.rand(srows, scols, generator=gen) * 0.01 + 0.001
        full = s.repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :cols]
        deq = w.to(torch.float32) * full
        x = torch.randn(cols, generator=gen)
        out[f"{name}.weight"] = w
        out[f"{name}.weight_scale_inv"] = s
        # Dequantized values of the rows around the block edge (the rest checked via `y`).
        first = max(0, rows - 6)
        out[f"{name}.dequant_first_row"] = torch.tensor([first], dtype=torch.int32)
        out[f"{name}.dequant"] = deq[first:].contiguous()
        out[f"{name}.x"] = x
        out[f"{name}.y"] = deq.double() @ x.double()


def int4(gen: torch.Generator, out: dict) -> None:
    rows, cols, group = 6, 96, 32
    q = torch.randint(-8, 8, (rows, cols), generator=gen, dtype=torch.int8)
    packed = pack_to_int32(q, num_bits=4)
    assert torch.equal(unpack_from_int32(packed, 4, q.shape), q)
    s = (torch.rand(rows, cols // group, generator=gen) * 0.1 + 0.01).to(torch.bfloat16)
    deq = q.to(torch.float32) * s.to(torch.float32).repeat_interleave(group, 1)
    x = torch.randn(cols, generator=gen)
    out["int4.weight_packed"] = packed
    out["int4.weight_scale"] = s
    out["int4.values"] = q
    out["int4.dequant"] = deq
    out["int4.x"] = x
    out["int4.y"] = deq.double() @ x.double()


def mxfp4(gen: torch.Generator, out: dict) -> None:
    rows, groups = 4, 2
    blocks = torch.randint(0, 256, (1, rows, groups, 16), generator=gen, dtype=torch.int32)
    blocks = blocks.to(torch.uint8)
    scales = torch.randint(120, 136, (1, rows, groups), generator=gen, dtype=torch.int32)
    scales = scales.to(torch.uint8)
    # transformers returns [experts, cols, rows] (transposed for its matmul); undo that.
    deq = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)[0].T.contiguous()
    x = torch.randn(groups * 32, generator=gen)
    out["mxfp4.blocks"] = blocks.reshape(rows, groups * 16).contiguous()
    out["mxfp4.scales"] = scales.reshape(rows, groups).contiguous()
    out["mxfp4.dequant"] = deq
    out["mxfp4.x"] = x
    out["mxfp4.y"] = deq.double() @ x.double()


def main() -> None:
    gen = torch.Generator().manual_seed(20261129)
    out: dict = {}
    fp8(gen, out)
    int4(gen, out)
    mxfp4(gen, out)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    save_file(
        out,
        str(OUT),
        metadata={
            "generator": "tools/reference/kernel_fixtures.py",
            "torch": torch.__version__,
        },
    )
    print(f"wrote {OUT.relative_to(ROOT)} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
