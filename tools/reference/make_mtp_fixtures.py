#!/usr/bin/env python3
"""Checkpoints with a multi-token-prediction layer, and what that layer computes.

    /work/venv/ref/bin/python tools/reference/make_mtp_fixtures.py

(run from the repository root). Writes two fixtures, each the committed model fixture's config
and weights plus a seeded MTP layer under the hub's names, and `mtp_reference.safetensors`:

- `testdata/mtp/qwen3_next-fp32/` from `testdata/models/qwen3_next-fp32`: `mtp.fc`,
  `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`, `mtp.norm`, `mtp.layers.0.*` (a
  full-attention MoE decoder layer).
- `testdata/mtp/deepseek_v3-fp32/` from `testdata/models/deepseek_v3-fp32`, with
  `num_nextn_predict_layers: 1`: `model.layers.4.{eh_proj,enorm,hnorm,shared_head.norm}`, the
  copies `model.layers.4.embed_tokens` and `model.layers.4.shared_head.head` of the model's
  embedding and lm_head (as DeepSeek-V3's checkpoints ship them), and an MLA MoE decoder layer.
- `testdata/mtp/glm4_moe-fp32/` from `testdata/models/glm4_moe-fp32`: the same for GLM-4.5
  (whose MTP layer is DeepSeek-V3's kind), over a grouped-query MoE decoder layer.
- `testdata/mtp/deepseek_v4-fp32/mtp_reference.safetensors` only, for the model fixture
  `testdata/models/deepseek_v4-fp32`, which already carries its MTP layer under the released
  V4-Flash names (`mtp.0.*`, written by `make_fixtures.py`).

transformers does not instantiate MTP layers (their tensors are dropped on load), so each
reference is assembled from transformers' own pieces the way vLLM runs the layer
(`Qwen3NextMultiTokenPredictor`, `DeepSeekMultiTokenPredictor`, `Glm4MoeMultiTokenPredictor`): per position `i`, the embedding
of token `i + 1` (DeepSeek: zero at position 0) and the model's final-normed hidden state at `i`
(`last_hidden_state`), each normed by the family's RMSNorm, concatenated (embedding first),
projected by `fc` / `eh_proj`; then the MTP layer, which is transformers' decoder layer loaded
with the MTP weights through `from_pretrained` (so the hub's per-expert names go through
transformers' own conversion), causal over the MTP positions with the model's rotary table at
positions `i`; then the final norm (`norm` / `shared_head.norm`) and the model's `lm_head`.

DeepSeek-V4's layer (DeepSeek's `MTPBlock` in the release's `inference/model.py`) works on the
hyper-connection streams: per position `i`, the model's streams after its last layer at `i`
(the hyper head's input, `[hc_mult, hidden]`), each normed by `hnorm` and projected by `h_proj`,
plus `e_proj` of the `enorm`-normed embedding of token `i + 1` (zero at position 0, as for
DeepSeek-V3) added to every stream; then the block (transformers' decoder layer with the MTP
weights, its own hyper-connections), the layer's own hyper head (`hc_head_*`, transformers'
`DeepseekV4HyperHead`), `norm` and the model's head. Its `hidden` and `out` are streams,
`[T, hc_mult · hidden]`.

Outputs: `ids` (the prompt), `hidden` (`last_hidden_state`, `[T, hidden]`), `logits`
(`[T - 1, vocab]`: row `i` predicts token `i + 2`); DeepSeek's and GLM's also `out`, the layer's rows
before the final norm (where its next draft step starts). Deterministic: fixed seeds, one
thread.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import (  # noqa: E402
    DeepseekV3ForCausalLM,
    DeepseekV4ForCausalLM,
    Glm4MoeForCausalLM,
    Qwen3NextForCausalLM,
)
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RMSNorm  # noqa: E402
from transformers.models.deepseek_v4.modeling_deepseek_v4 import (  # noqa: E402
    DeepseekV4HyperHead,
    DeepseekV4RMSNorm,
)
from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeRMSNorm  # noqa: E402
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNorm  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "testdata/models/qwen3_next-fp32"
DST = ROOT / "testdata/mtp/qwen3_next-fp32"
SOURCE_LAYER = 3  # a full-attention MoE layer of the fixture: the MTP layer's shape
SEED = 7301
PROMPT = 24


def fresh_layer(base: dict, stem: str, rnd, norm_centre: float) -> dict:
    """The MTP layer: the tensors of the model's layer under `stem`, by their names after it,
    with fresh values of each tensor's spread (norm weights `norm_centre` + N(0, 0.1))."""
    layer = {}
    for k, v in base.items():
        if k.startswith(stem):
            rest = k[len(stem):]
            if "norm" in rest:
                layer[rest] = norm_centre + rnd(*v.shape, scale=0.1)
            else:
                layer[rest] = rnd(*v.shape, scale=float(v.std()))
    return layer


def as_decoder_layer(cls, src: Path, base: dict, stem: str, layer: dict, index: int):
    """The MTP layer as transformers' decoder layer: the model again with layer `index`'s
    weights (under `stem`) replaced by the MTP layer's, loaded through `from_pretrained`."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        shutil.copy(src / "config.json", tmp / "config.json")
        swapped = dict(base)
        for k, v in layer.items():
            swapped[stem + k] = v.contiguous()
        save_file(swapped, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        other = cls.from_pretrained(tmp, attn_implementation="eager").eval()
    return other.model.layers[index]


def run_causal(model, mtp_layer, x):
    """`mtp_layer` over the rows of `x` (`[1, t, hidden]`), causal, at rotary positions 0..t."""
    t = x.shape[1]
    pos = torch.arange(t)[None]
    rope = model.model.rotary_emb(x, pos)
    mask = torch.full((t, t), torch.finfo(torch.float32).min).triu(1)[None, None]
    out = mtp_layer(x, position_embeddings=rope, attention_mask=mask, position_ids=pos)
    return (out[0] if isinstance(out, tuple) else out)[0]


def qwen3_next() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    g = torch.Generator().manual_seed(SEED)

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    with safe_open(str(SRC / "model.safetensors"), "pt") as f:
        base = {k: f.get_tensor(k) for k in sorted(f.keys())}
    cfg = json.loads((SRC / "config.json").read_text())
    h = cfg["hidden_size"]

    # The MTP layer: the source layer's shapes, fresh values of each tensor's spread (norm
    # weights, zero-centred, near zero).
    stem = f"model.layers.{SOURCE_LAYER}."
    layer = fresh_layer(base, stem, rnd, 0.0)
    mtp = {f"mtp.layers.0.{k}": v.contiguous() for k, v in layer.items()}
    mtp["mtp.fc.weight"] = rnd(h, 2 * h, scale=(2 * h) ** -0.5)
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        mtp[f"mtp.{n}.weight"] = rnd(h, scale=0.1)

    DST.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "generation_config.json"):
        shutil.copy(SRC / name, DST / name)
    save_file({**base, **mtp}, str(DST / "model.safetensors"), metadata={"format": "pt"})

    model = Qwen3NextForCausalLM.from_pretrained(DST, attn_implementation="eager").eval()
    mtp_layer = as_decoder_layer(Qwen3NextForCausalLM, SRC, base, stem, layer, SOURCE_LAYER)

    def norm(name):
        n = Qwen3NextRMSNorm(h, eps=cfg["rms_norm_eps"])
        n.weight.data.copy_(mtp[f"mtp.{name}.weight"])
        return n

    ids = torch.randint(0, cfg["vocab_size"], (1, PROMPT), generator=g)
    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state[0]
        emb = model.model.embed_tokens(ids)[0]
        cat = torch.cat(
            [norm("pre_fc_norm_embedding")(emb[1:]), norm("pre_fc_norm_hidden")(hidden[:-1])],
            dim=-1,
        )
        out = run_causal(model, mtp_layer, (cat @ mtp["mtp.fc.weight"].T)[None])
        y = norm("norm")(out)
        logits = model.lm_head(y)
    save_file(
        {
            "ids": ids[0].to(torch.int64).contiguous(),
            "hidden": hidden.contiguous(),
            "logits": logits.contiguous(),
        },
        str(DST / "mtp_reference.safetensors"),
        metadata={"format": "pt"},
    )
    print(f"wrote {DST}: {len(mtp)} MTP tensors, logits {tuple(logits.shape)}")


DS_SOURCE_LAYER = 3  # an MoE layer of each fixture: the MTP layer's shape


def load_all(src: Path) -> dict:
    out = {}
    for f in sorted(src.glob("model*.safetensors")):
        with safe_open(str(f), "pt") as s:
            out.update({k: s.get_tensor(k) for k in s.keys()})
    return dict(sorted(out.items()))


def trailing(name: str, cls, norm_cls, seed: int) -> None:
    """DeepSeek-V3's kind of MTP layer (GLM-4.5's is the same) on the `name` fixture."""
    DS_SRC = ROOT / "testdata/models" / name
    DS_DST = ROOT / "testdata/mtp" / name
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    base = load_all(DS_SRC)
    cfg = json.loads((DS_SRC / "config.json").read_text())
    h, n = cfg["hidden_size"], cfg["num_hidden_layers"]

    # The MTP layer: the source layer's shapes, fresh values of each tensor's spread (norm
    # weights near one).
    stem = f"model.layers.{DS_SOURCE_LAYER}."
    layer = fresh_layer(base, stem, rnd, 1.0)
    pre = f"model.layers.{n}."
    mtp = {pre + k: v.contiguous() for k, v in layer.items()}
    mtp[pre + "eh_proj.weight"] = rnd(h, 2 * h, scale=(2 * h) ** -0.5)
    for name in ("enorm", "hnorm", "shared_head.norm"):
        mtp[pre + f"{name}.weight"] = 1 + rnd(h, scale=0.1)
    mtp[pre + "embed_tokens.weight"] = base["model.embed_tokens.weight"].clone()
    mtp[pre + "shared_head.head.weight"] = base["lm_head.weight"].clone()

    DS_DST.mkdir(parents=True, exist_ok=True)
    cfg["num_nextn_predict_layers"] = 1
    (DS_DST / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    shutil.copy(DS_SRC / "generation_config.json", DS_DST / "generation_config.json")
    save_file({**base, **mtp}, str(DS_DST / "model.safetensors"), metadata={"format": "pt"})

    model = cls.from_pretrained(DS_SRC, attn_implementation="eager").eval()
    mtp_layer = as_decoder_layer(cls, DS_SRC, base, stem, layer, DS_SOURCE_LAYER)

    def norm(name):
        m = norm_cls(h, eps=cfg["rms_norm_eps"])
        m.weight.data.copy_(mtp[pre + f"{name}.weight"])
        return m

    ids = torch.randint(0, cfg["vocab_size"], (1, PROMPT), generator=g)
    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state[0]
        emb = model.model.embed_tokens(ids)[0][1:].clone()
        emb[0] = 0  # MTP position 0: vLLM masks the embedding
        cat = torch.cat([norm("enorm")(emb), norm("hnorm")(hidden[:-1])], dim=-1)
        out = run_causal(model, mtp_layer, (cat @ mtp[pre + "eh_proj.weight"].T)[None])
        logits = model.lm_head(norm("shared_head.norm")(out))
    save_file(
        {
            "ids": ids[0].to(torch.int64).contiguous(),
            "hidden": hidden.contiguous(),
            "logits": logits.contiguous(),
            "out": out.contiguous(),
        },
        str(DS_DST / "mtp_reference.safetensors"),
        metadata={"format": "pt"},
    )
    print(f"wrote {DS_DST}: {len(mtp)} MTP tensors, logits {tuple(logits.shape)}")


V4_SOURCE_LAYER = 2  # the layer make_fixtures.py made the fixture's MTP layer from


def deepseek_v4() -> None:
    """DeepSeek-V4's MTP layer (`mtp.0.*`, already in the model fixture) over the streams."""
    src = ROOT / "testdata/models/deepseek_v4-fp32"
    dst = ROOT / "testdata/mtp/deepseek_v4-fp32"
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    g = torch.Generator().manual_seed(7304)
    base = load_all(src)
    cfg = json.loads((src / "config.json").read_text())
    h, hc, eps = cfg["hidden_size"], cfg["hc_mult"], cfg["rms_norm_eps"]
    mtp = {k[len("mtp.0."):]: v for k, v in base.items() if k.startswith("mtp.0.")}
    stem = f"model.layers.{V4_SOURCE_LAYER}."
    layer = {k[len(stem):]: v for k, v in base.items() if k.startswith(stem)}
    assert set(layer) <= set(mtp), "the MTP block has the source layer's tensors"
    model = DeepseekV4ForCausalLM.from_pretrained(src, attn_implementation="eager").eval()
    trunk = {k: v for k, v in base.items() if not k.startswith("mtp.")}
    block = as_decoder_layer(
        DeepseekV4ForCausalLM, src, trunk, stem, {k: mtp[k] for k in layer}, V4_SOURCE_LAYER
    )

    def norm(name):
        m = DeepseekV4RMSNorm(h, eps=eps)
        m.weight.data.copy_(mtp[f"{name}.weight"])
        return m

    head = DeepseekV4HyperHead(model.config)
    head.hc_fn.data.copy_(mtp["hc_head_fn"])
    head.hc_base.data.copy_(mtp["hc_head_base"])
    head.hc_scale.data.copy_(mtp["hc_head_scale"])

    ids = torch.randint(0, cfg["vocab_size"], (1, PROMPT), generator=g)
    seen = {}
    hook = model.model.hc_head.register_forward_pre_hook(
        lambda _m, args: seen.__setitem__("streams", args[0].detach().clone())
    )
    # What the model hands its layer over the MTP rows (rotary tables at 0..T-2, the sliding
    # window's causal mask): taken from a pass of the model over that many tokens.
    layer_kwargs = {}
    kw_hook = model.model.layers[V4_SOURCE_LAYER].register_forward_pre_hook(
        lambda _m, _a, kw: layer_kwargs.update(kw), with_kwargs=True
    )
    with torch.no_grad():
        model.model(input_ids=ids, use_cache=False)
        streams = seen["streams"][0]  # [T, hc, hidden]
        layer_kwargs.clear()
        model.model(input_ids=ids[:, :-1], use_cache=False)
        hook.remove()
        kw_hook.remove()
        emb = model.model.embed_tokens(ids)[0][1:].clone()
        emb[0] = 0  # MTP position 0: no embedding, as for DeepSeek-V3
        e = norm("enorm")(emb) @ mtp["e_proj.weight"].T
        x = norm("hnorm")(streams[:-1]) @ mtp["h_proj.weight"].T + e[:, None, :]
        kwargs = dict(layer_kwargs)
        kwargs["input_ids"] = ids[:, 1:]
        out = block(x[None], **kwargs)
        out = (out[0] if isinstance(out, tuple) else out)[0]  # [T-1, hc, hidden]
        logits = model.lm_head(norm("norm")(head(out[None])[0]))
    dst.mkdir(parents=True, exist_ok=True)
    save_file(
        {
            "ids": ids[0].to(torch.int64).contiguous(),
            "hidden": streams.reshape(PROMPT, hc * h).contiguous(),
            "logits": logits.contiguous(),
            "out": out.reshape(PROMPT - 1, hc * h).contiguous(),
        },
        str(dst / "mtp_reference.safetensors"),
        metadata={"format": "pt"},
    )
    print(f"wrote {dst}: {len(mtp)} MTP tensors, logits {tuple(logits.shape)}")


if __name__ == "__main__":
    qwen3_next()
    trailing("deepseek_v3-fp32", DeepseekV3ForCausalLM, DeepseekV3RMSNorm, 7302)
    trailing("glm4_moe-fp32", Glm4MoeForCausalLM, Glm4MoeRMSNorm, 7303)
    deepseek_v4()
