#!/usr/bin/env python3
"""Regenerate sluice's Kimi fixtures (testdata/kimi/).

    /work/venv/ref/bin/python tools/reference/make_kimi_fixtures.py [--k3 /work/shared/fixtures/kimi-k3]

(run from the repository root; the output always goes to <repo>/testdata/kimi/, found from this
file's location). Two things happen:

1. `kimi_linear-fp32/` and `kimi_linear-bf16/`: tiny random-init Kimi Linear models (the
   predecessor of Kimi K3: KDA linear attention mixed with MLA without rotary, sigmoid routing
   with a selection-only bias, shared experts) built with transformers' `kimi_linear`, with
   reference outputs in exactly the layout of testdata/models (see testdata/README.md). The
   helpers (seed acceptance, router re-derivation, reference run, shard layouts) are those of
   make_fixtures.py. transformers' KDA needs `fla` kernels on GPU; on CPU it falls back to its
   own PyTorch code: the chunked form (`chunk_kimi_delta_attention`) for prompts and prefill, the
   token-by-token recurrence (`recurrent_kimi_delta_attention`) for single-token decode steps.
   The reference logits are those fallbacks' output. The script checks the chunked form against
   the recurrence on every prompt (the recurrence patched in for the chunked form) and records the
   difference (`chunked_vs_recurrent_max_abs_diff`).
2. `k3/`: `k3-tiny-bf16/`, `k3-tiny-mxfp4/`, `ref_bf16.safetensors`, `ref_mxfp4.safetensors`,
   `summary.json`, `README.md`, copied unchanged from the Kimi K3 reference fixtures (outputs of
   Moonshot's own K3 modeling code, see their README), each file checked against the sha256 the
   fixtures' summary.json records. The fp32 checkpoint is not copied: it holds the same values
   as the bf16 one (all bf16-representable), and the Rust tests write it from the bf16 file.

Everything is deterministic: running it twice gives byte-identical files (the script prints a
sha256 digest of the whole tree).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import make_fixtures as mf  # noqa: E402  (sets the offline environment, threads, determinism)
import torch  # noqa: E402
import transformers  # noqa: E402
import transformers.models.kimi_linear.modeling_kimi_linear as mk  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import AutoModelForCausalLM, KimiLinearConfig  # noqa: E402

OUT = mf.REPO / "testdata" / "kimi"
K3_DEFAULT = Path("/work/shared/fixtures/kimi-k3")
K3_FILES = [
    "README.md",
    "summary.json",
    "k3-tiny-bf16/config.json",
    "k3-tiny-bf16/model.safetensors",
    "k3-tiny-mxfp4/config.json",
    "k3-tiny-mxfp4/model.safetensors",
    "ref_bf16.safetensors",
    "ref_mxfp4.safetensors",
]
# summary.json of the K3 fixtures names the reference files under `reference/`.
K3_SUMMARY_NAME = {"ref_bf16.safetensors": "reference/ref_bf16.safetensors",
                   "ref_mxfp4.safetensors": "reference/ref_mxfp4.safetensors"}

N_LAYERS = 6
KDA_HEADS = 4
KDA_HEAD_DIM = 16
CONV = 4
FGATE_GAIN = 0.5  # f_b_proj: the decay input stays near dt_bias, so both long and short memory show


def kimi_linear_config() -> KimiLinearConfig:
    return KimiLinearConfig(
        vocab_size=mf.VOCAB,
        hidden_size=mf.HIDDEN,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=None,  # as Kimi-Linear-48B-A3B: a plain q_proj
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        num_local_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        routed_scaling_factor=2.446,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        rms_norm_eps=1e-5,
        max_position_embeddings=256,
        hidden_act="silu",
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        first_k_dense_replace=1,
        # 1-based, as checkpoints write it: MLA at layers 3 and 6, KDA elsewhere.
        linear_attn_config={
            "full_attn_layers": [3, 6],
            "kda_layers": [1, 2, 4, 5],
            "head_dim": KDA_HEAD_DIM,
            "num_heads": KDA_HEADS,
            "short_conv_kernel_size": CONV,
        },
    )


def init_kimi_linear(model: torch.nn.Module, seed: int) -> None:
    """Seeded init, make_fixtures' rules plus the KDA parameters (FLA's init for A_log and
    dt_bias, so decays range from long to short memory)."""
    g = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in sorted(params):
            p = params[name]
            z = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("forget_gate.A_log"):
                u = torch.rand(p.shape, generator=g, dtype=torch.float32)
                v = torch.log(1.0 + 15.0 * u)
            elif name.endswith("forget_gate.dt_bias"):
                u = torch.rand(p.shape, generator=g, dtype=torch.float32)
                dt = torch.exp(math.log(1e-3) + u * (math.log(1e-1) - math.log(1e-3)))
                v = dt + torch.log(-torch.expm1(-dt))  # inverse softplus
            elif name.endswith("conv1d.weight"):  # [channels, 1, kernel]
                v = z / p.shape[-1] ** 0.5
            elif name.endswith("forget_gate.f_b_proj.weight"):
                v = z * (FGATE_GAIN / p.shape[-1] ** 0.5)
            elif name.endswith("norm.weight"):
                v = 1.0 + mf.NORM_JITTER * z
            elif name == "model.embed_tokens.weight":
                v = mf.EMBED_STD * z
            elif name == "lm_head.weight":
                v = z * (mf.LM_HEAD_GAIN / p.shape[-1] ** 0.5)
            elif name.endswith("mlp.gate.weight"):  # the router (sigmoid)
                v = z * (mf.ROUTER_GAIN_SIGMOID / p.shape[-1] ** 0.5)
            elif p.dim() >= 2:
                v = z / p.shape[-1] ** 0.5
            else:
                raise RuntimeError(f"no init rule for {name} {tuple(p.shape)}")
            p.copy_(v.to(p.dtype))
        buffers = dict(model.named_buffers())
        for name in sorted(buffers):
            if name.endswith("e_score_correction_bias"):
                b = buffers[name]
                b.copy_(mf.E_BIAS_STD * torch.randn(b.shape, generator=g, dtype=torch.float32))


LAYOUTS = {"fp32": ("by_layer", None), "bf16": ("single", None)}


@torch.no_grad()
def chunked_vs_recurrent(d: Path, variant: str, prompts) -> float:
    """Max |Δlogit| between transformers' chunked KDA (its prefill path) and the token-by-token
    recurrence patched in its place, over the prompts."""
    model = mf.load_for_reference(d, variant)
    chunked = {t: model(input_ids=ids[None], use_cache=False).logits[0] for t, ids in prompts.items()}
    original = mk.chunk_kimi_delta_attention

    def recurrent(query, key, value, g, beta, chunk_size=64, initial_state=None,
                  output_final_state=False, use_qk_l2norm_in_kernel=False, **kw):
        return mk.recurrent_kimi_delta_attention(
            query, key, value, g, beta, initial_state, output_final_state,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)

    mk.chunk_kimi_delta_attention = recurrent
    try:
        worst = 0.0
        for t, ids in prompts.items():
            r = model(input_ids=ids[None], use_cache=False).logits[0]
            worst = max(worst, float((r - chunked[t]).abs().max()))
    finally:
        mk.chunk_kimi_delta_attention = original
    # The patch must have taken effect somewhere (the two forms round differently).
    assert worst > 0.0, "the recurrence patch did not reach the model"
    return worst


def build(seed: int, prompts, work: Path):
    torch.manual_seed(seed)
    cfg = kimi_linear_config()
    model = AutoModelForCausalLM.from_config(
        cfg, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    )
    init_kimi_linear(model, seed)
    model.eval()
    expected = {k: v.detach().clone() for k, v in model.state_dict().items()}
    hf_fp32 = work / "hf_fp32"
    model.save_pretrained(hf_fp32, max_shard_size="1GB")
    results = {}
    for variant in ("fp32", "bf16"):
        layout, shard = LAYOUTS[variant]
        dst = work / f"kimi_linear-{variant}"
        if variant == "fp32":
            mf.save_layout(None, dst, layout, shard, hf_fp32)
        else:
            m16 = AutoModelForCausalLM.from_pretrained(
                hf_fp32, dtype=torch.bfloat16, attn_implementation="eager", experts_implementation="eager"
            )
            mf.save_layout(m16, dst, layout, shard, hf_fp32)
            del m16
        r = mf.run_reference(dst, variant, "deepseek", prompts, expected)
        r["layout"] = layout if shard is None else f"{layout} (max_shard_size={shard})"
        r["dir"] = dst
        results[variant] = r
        if not mf.passes(r):
            return False, results
        r["chunked_vs_recurrent"] = chunked_vs_recurrent(dst, variant, prompts)
    return True, results


def copy_k3(src: Path) -> dict:
    summary = json.loads((src / "summary.json").read_text())
    want = summary["files"]
    out = {}
    for rel in K3_FILES:
        s = src / rel
        d = OUT / "k3" / rel
        d.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(s, d)
        sha = mf.sha256_file(d)
        key = K3_SUMMARY_NAME.get(rel, rel)
        if key in want:
            assert want[key]["sha256"] == sha, f"{rel}: sha256 differs from the fixtures' summary"
        out[rel] = {"bytes": d.stat().st_size, "sha256": sha, "checked_against_summary": key in want}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k3", type=Path, default=K3_DEFAULT, help="the Kimi K3 reference fixtures")
    args = ap.parse_args()
    versions = {
        "python": mf.platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": mf.safetensors.__version__,
        "numpy": mf.numpy.__version__,
    }
    print("versions:", " ".join(f"{k}={v}" for k, v in versions.items()))
    prompts = mf.make_prompts()
    if OUT.exists():  # everything under testdata/kimi/ is generated by this script
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    summary = {
        "generator": "tools/reference/make_kimi_fixtures.py",
        "command": "/work/venv/ref/bin/python tools/reference/make_kimi_fixtures.py",
        "versions": versions,
        "thresholds": {"min_greedy_rel": mf.MIN_GREEDY_REL, "min_router_gap": mf.MIN_ROUTER_GAP},
        "prompt_seed": mf.PROMPT_SEED,
        "kda_reference": "transformers' PyTorch fallbacks: chunk_kimi_delta_attention (prompts, "
        "prefill), recurrent_kimi_delta_attention (decode steps)",
        "models": {},
    }
    base_seed = 7000
    with tempfile.TemporaryDirectory(prefix="sluice-kimi-") as tmp:
        rejected = []
        for seed in range(base_seed, base_seed + mf.MAX_SEED_TRIES):
            work = Path(tmp) / f"kimi_linear-{seed}"
            work.mkdir()
            ok, results = build(seed, prompts, work)
            if ok:
                break
            bad = {v: {k: r[k] for k in ("min_greedy_rel", "min_expert_gap")} for v, r in results.items()}
            print(f"  kimi_linear: seed {seed} rejected {bad}")
            rejected.append(seed)
            shutil.rmtree(work)
        else:
            raise SystemExit(f"kimi_linear: no seed passed in {mf.MAX_SEED_TRIES} tries")
        for variant, r in results.items():
            name = f"kimi_linear-{variant}"
            final = OUT / name
            shutil.copytree(r["dir"], final)
            save_file(dict(sorted(r["tensors"].items())), str(final / "reference.safetensors"),
                      metadata={"format": "pt"})
            mf.chmod_tree(final)
            files = {p.name: {"bytes": p.stat().st_size, "sha256": mf.sha256_file(p)}
                     for p in sorted(final.iterdir())}
            summary["models"][name] = {
                "architecture": "kimi_linear",
                "weights": variant,
                "compute": "fp32",
                "seed": seed,
                "seeds_rejected": rejected,
                "layout": r["layout"],
                "layout_facts": mf.layout_facts(final),
                "moe_layers": r["moe_layers"],
                "top_k": r["top_k"],
                "min_greedy_margin_rel": r["min_greedy_rel"],
                "min_greedy_margin_abs": r["min_greedy_abs"],
                "min_router_expert_gap": r["min_expert_gap"],
                "routing_decisions_checked": r["decisions"],
                "decisions_changed_by_score_bias": r["bias_changed"],
                "max_abs_logit": r["max_abs_logit"],
                "cached_vs_full_max_abs_diff": r["cached_vs_full"],
                "chunked_vs_recurrent_max_abs_diff": r["chunked_vs_recurrent"],
                "files": files,
            }
            print(
                f"{name}: seed {seed} greedy rel {r['min_greedy_rel']:.3g} abs {r['min_greedy_abs']:.3g} "
                f"expert gap {r['min_expert_gap']:.3g} max|logit| {r['max_abs_logit']:.3g} "
                f"cached-vs-full {r['cached_vs_full']:.2g} chunked-vs-recurrent {r['chunked_vs_recurrent']:.2g}"
            )
    summary["k3_copied"] = copy_k3(args.k3)
    mf.chmod_tree(OUT)
    (OUT / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    os.chmod(OUT / "summary.json", 0o644)
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    tree = hashlib.sha256()
    for p in sorted(OUT.rglob("*")):
        if p.is_file():
            tree.update(f"{p.relative_to(OUT)} {mf.sha256_file(p)}\n".encode())
    print(f"total size {total / 1e6:.2f} MB; tree sha256 {tree.hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
