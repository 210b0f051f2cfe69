#!/usr/bin/env python3
"""The DeepSeek-V3 fixture as llama.cpp's converter writes it: testdata/gguf_converted/deepseek_v3-f32.gguf.

    /work/venv/ref/bin/python tools/reference/make_gguf_deepseek2.py [LLAMA_CPP_DIR]

(LLAMA_CPP_DIR defaults to /work/llama/src; run from anywhere.) It copies
testdata/models/deepseek_v3-fp32, adds the byte tokenizer of testdata/byte-tokenizer (the
converter needs one; benches/gguf_convert.py names its pre-tokenizer `gpt-2`, changing nothing
about the tensors) and converts it with `--outtype f32` into `deepseek_v3-f32.gguf` (with the released config's
`scoring_func: sigmoid`, which transformers 5 drops): GGUF architecture
`deepseek2`, MLA's `kv_b_proj` split into `attn_k_b` (transposed per head) and `attn_v_b`, the
experts stacked, YaRN in `rope.scaling.*`. Its weights are the fixture's own, so the fixture's
transformers reference (testdata/models/deepseek_v3-fp32/reference.safetensors) is its
reference; `crates/sluice-model/tests/gguf_models.rs` reads it from there. The converter is
deterministic: the same sources give the same bytes (the script prints the sha256).
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

with tempfile.TemporaryDirectory() as t:
    src = Path(t) / "src"
    shutil.copytree(repo / "testdata/models/deepseek_v3-fp32", src)
    (src / "reference.safetensors").unlink()
    # DeepSeek's released config names its routing; transformers 5 does not write it back, and
    # the converter writes `expert_gating_func` only from it (llama.cpp reads a file without
    # it as DeepSeek-V2's softmax routing).
    cfg = json.loads((src / "config.json").read_text())
    cfg["scoring_func"] = "sigmoid"
    (src / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    shutil.copy(repo / "testdata/byte-tokenizer/tokenizer.json", src / "tokenizer.json")
    (src / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}\n')
    out = Path(t) / "model.gguf"
    subprocess.run(
        [sys.executable, str(repo / "benches/gguf_convert.py"), str(llama), str(src), str(out),
         "--outtype", "f32"],
        check=True,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(out, out_dir / "deepseek_v3-f32.gguf")
dst = out_dir / "deepseek_v3-f32.gguf"
print(dst, hashlib.sha256(dst.read_bytes()).hexdigest())
