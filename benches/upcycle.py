#!/usr/bin/env python3
"""A trained mixture-of-experts model for benchmarks, made offline from a trained dense one.

    /work/venv/ref/bin/python benches/upcycle.py /work/bench-data/smollm2 /work/bench-data/smollm2-moe

Sparse upcycling without training: every layer's MLP of a Llama checkpoint (SRC, e.g. the
SmolLM2-135M-Instruct that `tools/reference/smollm2.py` writes) becomes EXPERTS identical
experts of a Mixtral checkpoint (OUT), with a seeded random router choosing TOP_K of them per
token. Mixtral weighs the chosen experts by their renormalised softmax scores, which sum to one,
so each layer's output is the dense MLP's up to rounding: the model predicts what the dense model
predicts (a trained model's acceptance of drafts, its copying of earlier text), while its
experts are stored, read and cached as separate experts. The router is random, so consecutive
tokens share experts only by chance: the least a draft's rows can share, which is what a
benchmark of expert reads per token under speculation should not flatter.

Written in bf16 (`--dtype`), with the tokenizer files, chat template and generation config
copied. OUT must not exist. The script then checks the result with transformers: the upcycled
model's logits over a prompt against the dense model's with the same (rounded) weights, and
prints the largest difference and the share of positions whose most likely token agrees.
Deterministic: fixed seed, one thread.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

COPIED = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
# Shards of at most this many bytes, as released checkpoints come.
SHARD = 1 << 30


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--seed", type=int, default=20261205)
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    args = ap.parse_args()
    if args.out.exists():
        raise SystemExit(f"{args.out}: exists; this script writes only a new directory")
    if not 1 <= args.top_k <= args.experts:
        raise SystemExit(f"--top-k {args.top_k}: must be between 1 and --experts {args.experts}")
    torch.set_num_threads(1)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32

    cfg = json.loads((args.src / "config.json").read_text())
    if cfg.get("model_type") != "llama":
        raise SystemExit(f"{args.src / 'config.json'}: model_type {cfg.get('model_type')!r}, not llama")
    if cfg.get("mlp_bias") or cfg.get("attention_bias"):
        raise SystemExit(f"{args.src / 'config.json'}: biases are not carried over")
    h, n = cfg["hidden_size"], cfg["num_hidden_layers"]
    keep = (
        "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
        "head_dim", "num_hidden_layers", "rms_norm_eps", "rope_parameters",
        "max_position_embeddings", "vocab_size", "tie_word_embeddings", "bos_token_id",
        "eos_token_id", "pad_token_id", "hidden_act", "initializer_range",
    )
    out_cfg = {k: cfg[k] for k in keep if k in cfg}
    out_cfg.update(
        architectures=["MixtralForCausalLM"],
        model_type="mixtral",
        num_local_experts=args.experts,
        num_experts_per_tok=args.top_k,
        sliding_window=None,
        router_jitter_noise=0.0,
        output_router_logits=False,
        dtype="bfloat16" if dtype == torch.bfloat16 else "float32",
        transformers_version=cfg.get("transformers_version", "5.24.0"),
    )

    src = {}
    for f in sorted(args.src.glob("*.safetensors")):
        if f.name.startswith("reference"):
            continue
        with safe_open(str(f), "pt") as s:
            src.update({k: s.get_tensor(k) for k in s.keys()})
    g = torch.Generator().manual_seed(args.seed)
    tensors: dict[str, torch.Tensor] = {}
    for k, v in src.items():
        if ".mlp." in k:
            continue
        tensors[k] = v.to(dtype).contiguous()
    for layer in range(n):
        pre = f"model.layers.{layer}."
        moe = pre + "block_sparse_moe."
        tensors[moe + "gate.weight"] = (
            torch.randn(args.experts, h, generator=g) * h**-0.5
        ).to(dtype)
        w = {
            "w1": src[pre + "mlp.gate_proj.weight"],
            "w2": src[pre + "mlp.down_proj.weight"],
            "w3": src[pre + "mlp.up_proj.weight"],
        }
        for e in range(args.experts):
            for name, t in w.items():
                tensors[f"{moe}experts.{e}.{name}.weight"] = t.to(dtype).contiguous()

    args.out.mkdir(parents=True)
    names = list(tensors)
    shards, cur, size = [], [], 0
    for k in names:
        b = tensors[k].numel() * tensors[k].element_size()
        if cur and size + b > SHARD:
            shards.append(cur)
            cur, size = [], 0
        cur.append(k)
        size += b
    shards.append(cur)
    weight_map, total = {}, 0
    for i, ks in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: tensors[k] for k in ks}, str(args.out / fname), metadata={"format": "pt"})
        for k in ks:
            weight_map[k] = fname
            total += tensors[k].numel() * tensors[k].element_size()
    (args.out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n"
    )
    (args.out / "config.json").write_text(json.dumps(out_cfg, indent=2) + "\n")
    for f in COPIED:
        if (args.src / f).exists():
            shutil.copyfile(args.src / f, args.out / f)
    print(f"wrote {args.out}: {len(shards)} shards, {total / 2**30:.2f} GiB, "
          f"{n} layers x {args.experts} experts, top-{args.top_k}")
    check(args, src, dtype)


def check(args, src: dict, dtype) -> None:
    """The upcycled model against the dense one with the same rounded weights."""
    from transformers import LlamaConfig, LlamaForCausalLM, MixtralForCausalLM

    ids = torch.tensor([[1, 2, 3] + [(i * 7919) % 40000 + 100 for i in range(29)]])
    dense = LlamaForCausalLM(LlamaConfig.from_pretrained(args.src)).eval()
    dense.load_state_dict(
        {k: v.to(dtype).float() for k, v in src.items()}, strict=False
    )
    dense.tie_weights()
    moe = MixtralForCausalLM.from_pretrained(args.out, dtype=torch.float32).eval()
    with torch.no_grad():
        a = dense(ids).logits[0]
        b = moe(ids).logits[0]
    diff = (a - b).abs().max().item()
    agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    print(f"check: largest logit difference {diff:.2e} (logits up to {a.abs().max().item():.1f}); "
          f"most likely token agrees at {agree:.0%} of {ids.shape[1]} positions")
    if agree < 0.9:
        raise SystemExit("the upcycled model does not predict what the dense one does")


if __name__ == "__main__":
    main()
