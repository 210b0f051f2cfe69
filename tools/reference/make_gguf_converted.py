#!/usr/bin/env python3
"""Transformers fixtures as llama.cpp's converter writes them: testdata/gguf_converted/*.gguf.

    /work/venv/ref/bin/python tools/reference/make_gguf_converted.py [LLAMA_CPP_DIR]

(LLAMA_CPP_DIR defaults to /work/llama/src; run from anywhere; the extras of
testdata/README.md's GGUF section on PYTHONPATH.) For each fixture below it copies
testdata/models/<fixture>, adds the byte tokenizer of testdata/byte-tokenizer (the converter
needs one; benches/gguf_convert.py names its pre-tokenizer `gpt-2`, changing nothing about the
tensors) and converts it with `--outtype f32`:

- `deepseek_v3-f32.gguf` from `deepseek_v3-fp32`: architecture `deepseek2`, MLA's `kv_b_proj`
  split into `attn_k_b` (transposed per head) and `attn_v_b`, the experts stacked, YaRN in
  `rope.scaling.*`. The released config's `scoring_func: sigmoid` is added first: transformers 5
  does not write it back, and without it the converter writes no `expert_gating_func` (llama.cpp
  then reads the file as DeepSeek-V2's softmax routing).
- `mixtral-f32.gguf` from `mixtral-fp32`: architecture `llama` with `expert_count`, the query
  and key rows permuted for llama.cpp's rotary layout, the experts stacked.
- `llama-f32.gguf` from `llama-fp32`: Llama 3's rope scaling as the `rope_freqs.weight`
  factors, attention biases (the query and key ones permuted like their rows).
- `gpt_oss-mxfp4.gguf` from `testdata/quant/gpt_oss-mxfp4`: architecture `gpt-oss`, the
  experts' MXFP4 blocks repacked into GGUF's MXFP4 type (the rest widened to F32), the fused
  `gate_up_proj` split into stacked gate (even rows) and up (odd rows) experts, the biases
  stacked beside them, the sinks as `attn_sinks.weight`.
- `gpt_oss-bf16-f32.gguf` from `testdata/quant/gpt_oss-bf16`: the same in F32, the experts'
  `x @ W` matrices transposed by the converter.
- `demo-q4_k_m.gguf` from the bundled demo model (`models/demo`, trained, with its own
  byte-level BPE tokenizer, whose pre-tokenizer is GPT-2's): converted to BF16, then
  `llama-quantize ... Q4_K_M 1` (the 96-wide expert rows are not whole 256-blocks, so
  llama-quantize falls back to Q5_0/Q8_0/... for 28 tensors). A trained model in a GGUF with a
  real vocabulary and `general.sampling.*` defaults, for the commands that take text (`run`,
  `serve`, `batch`) and for comparing with llama.cpp; there is no transformers reference for it.

Their weights are the fixtures' own, so each fixture's transformers reference
(<fixture>/reference.safetensors) is theirs; `crates/sluice-model/tests/
gguf_models.rs` reads it from there. The converter is deterministic: the same sources give the
same bytes (the script prints each sha256).
"""

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

repo = Path(__file__).resolve().parents[2]
llama = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/work/llama/src")
out_dir = repo / "testdata/gguf_converted"

SIGMOID = {"scoring_func": "sigmoid"}
# (fixture directory in the repository, GGUF name, config keys added before converting,
#  llama-quantize type or None for the converter's f32)
FIXTURES = [
    ("testdata/models/deepseek_v3-fp32", "deepseek_v3-f32.gguf", SIGMOID, None),
    ("testdata/models/mixtral-fp32", "mixtral-f32.gguf", {}, None),
    ("testdata/models/llama-fp32", "llama-f32.gguf", {}, None),
    ("testdata/quant/gpt_oss-mxfp4", "gpt_oss-mxfp4.gguf", {}, None),
    ("testdata/quant/gpt_oss-bf16", "gpt_oss-bf16-f32.gguf", {}, None),
    ("models/demo", "demo-q4_k_m.gguf", SIGMOID, "Q4_K_M"),
]

out_dir.mkdir(parents=True, exist_ok=True)
for fixture, name, extra, quant in FIXTURES:
    with tempfile.TemporaryDirectory() as t:
        src = Path(t) / "src"
        shutil.copytree(repo / fixture, src)
        (src / "reference.safetensors").unlink(missing_ok=True)
        cfg = json.loads((src / "config.json").read_text())
        cfg.update(extra)
        (src / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        if not (src / "tokenizer.json").exists():
            shutil.copy(repo / "testdata/byte-tokenizer/tokenizer.json", src / "tokenizer.json")
            (src / "tokenizer_config.json").write_text(
                '{"tokenizer_class": "PreTrainedTokenizerFast"}\n'
            )
        out = Path(t) / name
        subprocess.run(
            [sys.executable, str(repo / "benches/gguf_convert.py"), str(llama), str(src),
             str(out), "--outtype", "f32" if quant is None else "bf16"],
            check=True,
        )
        if quant is not None:
            wide = out.with_suffix(".wide.gguf")
            out.rename(wide)
            subprocess.run(
                [str(llama / "build/bin/llama-quantize"), str(wide), str(out), quant, "1"],
                check=True,
            )
        shutil.copy(out, out_dir / name)
    dst = out_dir / name
    print(dst, hashlib.sha256(dst.read_bytes()).hexdigest())
