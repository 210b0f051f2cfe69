#!/usr/bin/env python3
"""Regenerate sluice's quantized-checkpoint fixtures (testdata/quant/).

    /work/venv/ref/bin/python tools/reference/make_quant_fixtures.py

(run from the repository root; the output always goes to <repo>/testdata/quant/, found from this
file's location). Deterministic like make_fixtures.py (fixed seeds, one thread, deterministic
algorithms, single-key safetensors metadata): two runs give byte-identical files, and the script
prints a sha256 over the tree.

Each fixture is a tiny random-init model written in the tensor names, dtypes and
quantization_config of a real release, with reference outputs computed by transformers on the
weights as the format's *reference code* decodes them:

| fixture | release it imitates | weights the reference runs on |
|---|---|---|
| deepseek_v3-fp8 | DeepSeek-V3 / Kimi K2: FP8 E4M3 + F32 `weight_scale_inv` per 128x128 block; hidden 192 so blocks are cut at the edges | DeepSeek's layout, w[i, j] = q[i, j] * s[i // 128, j // 128] (transformers' own FP8 dequant derives the block from rows / scale rows and is wrong at those edges; the script checks it agrees wherever a dimension is a multiple of 128 and records where it does not) |
| minimax_m2-fp8 | MiniMax-M2 (released in FP8 only): the same FP8 blocks on attention and `block_sparse_moe` experts, F32 router and bias | the same DeepSeek-layout dequantization |
| glm4_moe-fp8 | GLM-4.5-FP8: FP8 blocks on attention, dense MLP and experts | the same DeepSeek-layout dequantization |
| qwen3_5_moe-fp8 | Qwen3.5 FP8 releases: the multimodal layout, FP8 blocks on attention, DeltaNet projections and experts | the same DeepSeek-layout dequantization, on the text model |
| deepseek_v3-int4 | Kimi K2 Thinking / K2.5: compressed-tensors pack-quantized INT4 routed experts, group 32, K2's ignore list | compressed-tensors' own decompressor, run with the BF16 group scales widened to fp32 so the products are exact; transformers' native load (BF16) is checked to be the BF16 rounding of exactly these |
| qwen3_moe-mxfp4 | compressed-tensors mxfp4-pack-quantized experts (the Kimi K3 layout) | transformers' native compressed-tensors load (exact: power-of-two scales) |
| gpt_oss-bf16 | GPT-OSS as transformers saves it: fused x@W experts | transformers' load of the BF16 file |
| deepseek_v3-fp8-ue8m0-fp4 | DeepSeek-V4's formats on DeepSeek-V3's shape: FP8 E4M3 blocks with **UE8M0** `weight_scale_inv` (F8_E8M0 powers of two, `scale_fmt: ue8m0`) on attention, dense MLP and shared experts; routed experts **FP4** (`expert_dtype: fp4`: I8, two E2M1 per byte, low nibble first, one F8_E8M0 `weight_scale_inv` per 32 columns) | the same DeepSeek-layout dequantization for FP8 blocks; transformers' `Fp8Dequantize` for the FP4 experts (checked against an independent decode) |
| gpt_oss-mxfp4 | GPT-OSS as released: `*_blocks` / `*_scales` experts, quant_method mxfp4 | transformers' Mxfp4 dequantize path (convert_moe_packed_tensors) |

All reference arithmetic is fp32. The outputs use the layout of testdata/models (see
testdata/README.md): prompt logits for 1/7/33 tokens, routed experts and weights per MoE layer,
32 greedy ids with their step logits and margins.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as mf  # noqa: E402  (shared helpers; sets threads and determinism)

import compressed_tensors  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized.base import (  # noqa: E402
    PackedQuantizationCompressor,
)
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    CompressedTensorsConfig,
    DeepseekV3Config,
    GptOssConfig,
    Glm4MoeConfig,
    MiniMaxM2Config,
    Qwen3_5MoeTextConfig,
    Mxfp4Config,
    Qwen3MoeConfig,
)
from transformers.integrations.finegrained_fp8 import Fp8Dequantize  # noqa: E402
from transformers.integrations.mxfp4 import FP4_VALUES  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "testdata" / "quant"
VOCAB = mf.VOCAB
KW = dict(attn_implementation="eager", experts_implementation="eager")

FP8_BLOCK = 128
INT4_GROUP = 32
GPT_OSS_GATE_UP_GAIN = 4.0  # gate/up pre-activations ~N(0, 16): the clamp at 7 is exercised

# ----------------------------------------------------------------------------------------------
# configs


def ds_fp8_config():
    # hidden 192 = 128 + 64: every block grid is cut at an edge somewhere (rows of o_proj, down,
    # q_b; columns of everything reading the hidden state); kv_a has 80 rows (one partial block).
    return DeepseekV3Config(
        **{**mf.COMMON, "hidden_size": 192, "num_hidden_layers": 3, "max_position_embeddings": 64},
        intermediate_size=256,
        moe_intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=96,
        kv_lora_rank=64,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
        first_k_dense_replace=1,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=2,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        rope_interleave=True,
        num_mtp_layers=0,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 16,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    )


def minimax_fp8_config():
    # MiniMax-M2 is released in FP8 only. hidden 192 = 128 + 64 cuts block grids at the edges;
    # head_dim 64 with rotary_dim 32 (its legacy field), q/k norms over the whole projection.
    return MiniMaxM2Config(
        **{**mf.COMMON, "hidden_size": 192, "num_hidden_layers": 3},
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        num_local_experts=8,
        num_experts_per_tok=2,
        router_jitter_noise=0.0,
        rotary_dim=32,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )


def glm4_fp8_config():
    # GLM-4.5-FP8: hidden 192 cuts block grids at the edges; half of each head rotated.
    return Glm4MoeConfig(
        **{**mf.COMMON, "hidden_size": 192, "num_hidden_layers": 3},
        intermediate_size=256,
        moe_intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        attention_bias=True,
        use_qk_norm=False,
        first_k_dense_replace=1,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=2,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        num_mtp_layers=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    )


def qwen3_5_fp8_config():
    # hidden 192 cuts block grids at the edges; DeltaNet key/value widths 2x32 / 4x16.
    return Qwen3_5MoeTextConfig(
        **{**mf.COMMON, "hidden_size": 192, "num_hidden_layers": 2},
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=32,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "full_attention"],
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=128,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    )


def ds_int4_config():
    return DeepseekV3Config(
        **{**mf.COMMON, "max_position_embeddings": 64},
        intermediate_size=128,
        moe_intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        first_k_dense_replace=1,
        n_routed_experts=16,
        num_experts_per_tok=4,
        n_shared_experts=1,
        n_group=4,
        topk_group=2,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        rope_interleave=True,
        num_mtp_layers=0,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 16,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    )


def qwen3_config():
    return Qwen3MoeConfig(
        **mf.COMMON,
        intermediate_size=128,
        moe_intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        attention_bias=False,
        use_sliding_window=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )


def gpt_oss_config():
    return GptOssConfig(
        **mf.COMMON,
        intermediate_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=8,
        num_experts_per_tok=2,
        sliding_window=8,  # the 33-token prompt and the greedy run cross it
        layer_types=["sliding_attention", "full_attention"] * 2,
        attention_bias=True,
        swiglu_limit=7.0,
        # As GPT-OSS releases configure it (factor 32, original 4096), scaled down; max positions
        # = factor x original so transformers uses the factor as given.
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 4.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 64,
        },
    )


# quantization_config blocks exactly as the releases write them
FP8_QCFG = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
}

INT4_QCFG = {  # Kimi K2 Thinking / K2.5
    "config_groups": {
        "group_0": {
            "input_activations": None,
            "output_activations": None,
            "targets": ["Linear"],
            "weights": {
                "actorder": None,
                "block_structure": None,
                "dynamic": False,
                "group_size": INT4_GROUP,
                "num_bits": 4,
                "observer": "minmax",
                "observer_kwargs": {},
                "strategy": "group",
                "symmetric": True,
                "type": "int",
            },
        }
    },
    "format": "pack-quantized",
    "ignore": [
        "lm_head",
        "re:.*self_attn.*",
        "re:.*shared_experts.*",
        "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
    ],
    "kv_cache_scheme": None,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
}

MXFP4_CT_QCFG = {  # as the Kimi K3 release writes it, targets adapted to Qwen3 module names
    "quant_method": "compressed-tensors",
    "format": "mxfp4-pack-quantized",
    "quantization_status": "compressed",
    "global_compression_ratio": None,
    "kv_cache_scheme": None,
    "ignore": ["re:.*self_attn.*", "re:.*mlp\\.gate$", "lm_head"],
    "config_groups": {
        "group_0": {
            "format": "mxfp4-pack-quantized",
            "input_activations": None,
            "output_activations": None,
            "targets": ["re:.*mlp.experts.*"],
            "weights": {
                "actorder": None,
                "block_structure": None,
                "dynamic": False,
                "group_size": 32,
                "num_bits": 4,
                "observer": "minmax",
                "observer_kwargs": {},
                "scale_dtype": "torch.uint8",
                "strategy": "group",
                "symmetric": True,
                "type": "float",
                "zp_dtype": None,
            },
        }
    },
}

GPT_OSS_QCFG = {  # openai/gpt-oss-20b and -120b
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
    "quant_method": "mxfp4",
}

# ----------------------------------------------------------------------------------------------
# initialisation


def init_gpt_oss(model, seed: int) -> None:
    """Seeded init in the spirit of make_fixtures.init_weights, for GPT-OSS's parameters (fused
    x@W experts: fan-in is the middle dimension)."""
    g = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in sorted(params):
            p = params[name]
            z = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("norm.weight"):
                v = 1.0 + mf.NORM_JITTER * z
            elif name == "model.embed_tokens.weight":
                v = mf.EMBED_STD * z
            elif name == "lm_head.weight":
                v = z * (mf.LM_HEAD_GAIN / p.shape[-1] ** 0.5)
            elif name.endswith("mlp.router.weight"):
                v = z * (mf.ROUTER_GAIN_SOFTMAX / p.shape[-1] ** 0.5)
            elif name.endswith("self_attn.sinks"):
                v = z  # one logit per head, the size of an attention score
            elif name.endswith("bias"):  # q/k/v/o, router, expert biases
                v = mf.BIAS_STD * z
            elif name.endswith("experts.gate_up_proj"):  # [E, H, 2I], x @ W
                v = z * (GPT_OSS_GATE_UP_GAIN / p.shape[-2] ** 0.5)
            elif name.endswith("experts.down_proj"):  # [E, I, H]
                v = z / p.shape[-2] ** 0.5
            elif p.dim() == 2:
                v = z / p.shape[-1] ** 0.5
            else:
                raise RuntimeError(f"no init rule for {name} {tuple(p.shape)}")
            p.copy_(v.to(p.dtype))


# ----------------------------------------------------------------------------------------------
# quantizers (producing the released tensor layouts) and reference decoders


def fp8_quantize(w: torch.Tensor, block=(FP8_BLOCK, FP8_BLOCK)):
    """Block-wise FP8 E4M3 with an F32 `weight_scale_inv` per block (the multiplier that
    dequantizes). The grid is rounded up: edge blocks are partial."""
    br, bc = block
    r, c = w.shape
    rb, cb = math.ceil(r / br), math.ceil(c / bc)
    wp = F.pad(w.float(), (0, cb * bc - c, 0, rb * br - r))
    blocks = wp.reshape(rb, br, cb, bc)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12)
    scale = amax / 448.0
    q = (blocks / scale[:, None, :, None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    q = q.reshape(rb * br, cb * bc)[:r, :c].contiguous()
    return q, scale.to(torch.float32).contiguous()


def fp8_dequant_deepseek(q: torch.Tensor, s: torch.Tensor, block=(FP8_BLOCK, FP8_BLOCK)):
    """DeepSeek-V3's layout (inference/kernel.py weight_dequant): w = q * s[i // 128, j // 128]."""
    br, bc = block
    r, c = q.shape
    full = s.repeat_interleave(br, 0)[:r].repeat_interleave(bc, 1)[:, :c]
    return q.to(torch.float32) * full


def fp8_orientation_check() -> None:
    """On a full grid (every dimension a multiple of 128, 2 x 3 blocks so a transposed grid
    cannot pass) transformers' FP8 dequant and DeepSeek's layout must agree exactly: scale rows
    go with weight rows."""
    g = torch.Generator().manual_seed(128)
    w = torch.randn(256, 384, generator=g) * torch.tensor([1.0, 3.0, 0.1]).repeat_interleave(128)
    q, s = fp8_quantize(w)
    assert s.shape == (2, 3)
    tf = Fp8Dequantize(None)._dequantize_one(q, s, output_dtype=torch.float32)
    assert torch.equal(tf, fp8_dequant_deepseek(q, s)), "FP8 scale orientation"
    assert not torch.equal(tf, fp8_dequant_deepseek(q, s.T.contiguous().reshape(2, 3)))


INT4_ARGS = QuantizationArgs(
    num_bits=4, type="int", symmetric=True, strategy="group", group_size=INT4_GROUP
)
INT4_SCHEME = QuantizationScheme(targets=["Linear"], weights=INT4_ARGS)
MXFP4_ARGS = QuantizationArgs(
    num_bits=4, type="float", symmetric=True, strategy="group", group_size=32, scale_dtype=torch.uint8
)
MXFP4_SCHEME = QuantizationScheme(targets=["re:.*mlp.experts.*"], weights=MXFP4_ARGS)


def int4_compress(w: torch.Tensor) -> dict:
    """compressed-tensors pack-quantized: minmax symmetric group scales (BF16), packed by the
    package itself."""
    r, c = w.shape
    g = w.float().reshape(r, c // INT4_GROUP, INT4_GROUP)
    scale = (g.abs().amax(-1) / 7.5).clamp(min=1e-8).to(torch.bfloat16)
    return PackedQuantizationCompressor.compress({"weight": w.float(), "weight_scale": scale}, INT4_SCHEME)


def int4_decompress_exact(st: dict) -> torch.Tensor:
    """compressed-tensors' decompressor with the group scales widened to fp32: the products
    q * scale are then exact (in BF16 they round)."""
    st32 = dict(st)
    st32["weight_scale"] = st["weight_scale"].float()
    w = PackedQuantizationCompressor.decompress(st32, INT4_SCHEME)["weight"]
    assert w.dtype == torch.float32
    return w


def mx_scale_exponents(w: torch.Tensor) -> torch.Tensor:
    """Power-of-two scales per 32 values along the last dim with |w / scale| <= 6."""
    g = w.float().reshape(*w.shape[:-1], w.shape[-1] // 32, 32)
    amax = g.abs().amax(-1).clamp(min=2.0**-120)
    return torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)


def mxfp4_ct_compress(w: torch.Tensor) -> dict:
    scale = torch.exp2(mx_scale_exponents(w))
    return MXFP4PackedCompressor.compress({"weight": w.float(), "weight_scale": scale}, MXFP4_SCHEME)


LUT = torch.tensor(FP4_VALUES, dtype=torch.float32)


def gpt_oss_mxfp4(w_xw: torch.Tensor):
    """GPT-OSS `*_blocks` [E, out, in/32, 16] (two E2M1 codes per byte, low nibble = even
    column) and `*_scales` [E, out, in/32] (E8M0) from a fused x@W tensor [E, in, out]."""
    w = w_xw.float().transpose(1, 2).contiguous()  # [E, out, in]
    e, o, i = w.shape
    ex = mx_scale_exponents(w)  # [E, out, in/32]
    x = w.reshape(e, o, i // 32, 32) / torch.exp2(ex)[..., None]
    mag = (x.abs()[..., None] - LUT[:8]).abs().argmin(-1)  # nearest magnitude (ties: lower)
    code = (mag + 8 * (x < 0).long()).to(torch.uint8)
    blocks = (code[..., 0::2] | (code[..., 1::2] << 4)).contiguous()
    scales = (ex + 127).to(torch.uint8).contiguous()
    return blocks, scales


def gpt_oss_mxfp4_decode(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Independent decode of the blocks to the fused x@W layout, to check transformers'."""
    vals = torch.stack([LUT[(blocks & 15).long()], LUT[(blocks >> 4).long()]], -1)
    vals = vals.reshape(*blocks.shape[:2], -1)
    w = vals * torch.exp2(scales.float() - 127).repeat_interleave(32, -1)
    return w.transpose(1, 2).contiguous()


# ----------------------------------------------------------------------------------------------
# writing checkpoints


def save_st(tensors: dict, path: Path) -> None:
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, str(path), metadata={"format": "pt"})


def write_config(src_dir: Path, dst: Path, qcfg: dict | None, dtype: str = "bfloat16") -> None:
    cfg = json.loads((src_dir / "config.json").read_text())
    cfg["dtype"] = dtype
    if qcfg is not None:
        cfg["quantization_config"] = qcfg
    (dst / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    shutil.copyfile(src_dir / "generation_config.json", dst / "generation_config.json")


def write_by_layer(tensors: dict, dst: Path) -> None:
    """One shard per layer as DeepSeek releases do (embeddings with layer 0, final norm and
    lm_head with the last), written by safetensors (tensors sorted by dtype, then name)."""
    n_layers = 1 + max(mf.layer_of(k) for k in tensors if mf.layer_of(k) is not None)
    groups = [dict() for _ in range(n_layers)]
    for k, v in tensors.items():
        li = mf.layer_of(k)
        if li is None:
            li = 0 if k.startswith("model.embed_tokens") else n_layers - 1
        groups[li][k] = v
    weight_map, total = {}, 0
    for i, grp in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{n_layers:05d}.safetensors"
        save_st(grp, dst / fname)
        for k, v in grp.items():
            weight_map[k] = fname
            total += v.numel() * v.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def plain_fp32_dir(hf_dir: Path, state: dict, dst: Path) -> Path:
    """A plain fp32 checkpoint of reference weights (names as save_pretrained writes them)."""
    dst.mkdir()
    save_st({k: v.float() for k, v in state.items()}, dst / "model.safetensors")
    write_config(hf_dir, dst, None, dtype="float32")
    return dst


def is_fp8_target(name: str) -> bool:
    """What DeepSeek-V3 and MiniMax-M2 store in FP8: every projection inside the layers
    (attention, dense MLP, shared and routed experts); not the router (`mlp.gate`,
    `block_sparse_moe.gate`), norms, embeddings or lm_head."""
    return (
        name.startswith("model.layers.")
        and name.endswith(".weight")
        and not name.endswith("norm.weight")
        and not name.endswith(".mlp.gate.weight")
        and not name.endswith(".block_sparse_moe.gate.weight")
    )


# ----------------------------------------------------------------------------------------------
# fixture builders: each returns (fixture dir, reference model, router kind, facts)


def new_model(cfg, seed: int, init: str):
    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, **KW)
    if init == "gpt_oss":
        init_gpt_oss(m, seed)
    elif init == "qwen3_5":  # zero-centred norms
        mf.init_weights(m, seed, "softmax_renorm", True)
    else:
        mf.init_weights(m, seed, init)
    m.eval()
    return m


def finish_ref(m):
    m.eval()
    m.config.eos_token_id = None
    m.generation_config.eos_token_id = None
    m.generation_config.pad_token_id = None
    m.generation_config.bos_token_id = None
    return m


def build_ds_fp8(seed: int, work: Path):
    model = new_model(ds_fp8_config(), seed, "deepseek")
    hf = work / "hf"
    model.save_pretrained(hf, max_shard_size="1GB")
    src = load_file(str(hf / "model.safetensors"))
    out, ref = {}, {}
    fp8_orientation_check()
    tf_agree, tf_wrong = [], []
    for k, v in sorted(src.items()):
        if is_fp8_target(k):
            q, s = fp8_quantize(v)
            out[k] = q
            out[k + "_scale_inv"] = s
            w = fp8_dequant_deepseek(q, s)
            ref[k] = w
            # transformers' CPU dequant infers the block from rows // scale rows: right only
            # where that happens to be 128 (or the whole dimension).
            tf = Fp8Dequantize(None)._dequantize_one(q, s, output_dtype=torch.float32)
            if torch.equal(tf, w):
                tf_agree.append(k)
            else:
                assert v.shape[0] % FP8_BLOCK or v.shape[1] % FP8_BLOCK, k
                tf_wrong.append(k)
        elif k.endswith("e_score_correction_bias"):
            out[k] = v.float()  # F32 in the release
            ref[k] = v.float()
        else:
            out[k] = v.to(torch.bfloat16)  # BF16 in the release, router gate included
            ref[k] = out[k].float()
    assert tf_wrong, "expected transformers' FP8 dequant to misplace some edge blocks"
    d = work / "deepseek_v3-fp8"
    d.mkdir()
    write_by_layer(out, d)
    write_config(hf, d, FP8_QCFG)
    m = AutoModelForCausalLM.from_pretrained(plain_fp32_dir(hf, ref, work / "ref"), dtype=torch.float32, **KW)
    facts = {
        "fp8_tensors": sum(1 for k in out if k.endswith("_scale_inv")),
        "transformers_fp8_dequant_agrees": len(tf_agree),
        "transformers_fp8_dequant_agrees_example": tf_agree[0],
        "transformers_fp8_dequant_wrong_at_edges": len(tf_wrong),
        "transformers_fp8_dequant_wrong_example": tf_wrong[0],
        "orientation_checked_on": "[256, 384] (2 x 3 full blocks): transformers == DeepSeek layout",
    }
    return d, finish_ref(m), "deepseek", facts


def fp8_quantize_ue8m0(w: torch.Tensor, block=(FP8_BLOCK, FP8_BLOCK)):
    """`fp8_quantize` with each block's scale rounded up to a power of two, stored as E8M0
    (`scale_fmt: ue8m0`), the codes quantized with that exact scale."""
    br, bc = block
    r, c = w.shape
    rb, cb = math.ceil(r / br), math.ceil(c / bc)
    wp = F.pad(w.float(), (0, cb * bc - c, 0, rb * br - r))
    blocks = wp.reshape(rb, br, cb, bc)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 448.0)))
    q = (blocks / scale[:, None, :, None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    q = q.reshape(rb * br, cb * bc)[:r, :c].contiguous()
    return q, scale.to(torch.float8_e8m0fnu).contiguous()


def fp4_quantize(w: torch.Tensor):
    """DeepSeek-V4's FP4 experts: codes `[rows, cols / 2]` I8 (two E2M1 per byte, low nibble =
    even column) and `[rows, cols / 32]` E8M0 scales (powers of two with |w / scale| <= 6)."""
    r, c = w.shape
    ex = mx_scale_exponents(w)  # [r, c / 32]
    x = w.float().reshape(r, c // 32, 32) / torch.exp2(ex)[..., None]
    mag = (x.abs()[..., None] - LUT[:8]).abs().argmin(-1)  # nearest magnitude (ties: lower)
    code = (mag + 8 * (x < 0).long()).to(torch.uint8).reshape(r, c)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).contiguous().view(torch.int8)
    return packed, torch.exp2(ex).to(torch.float8_e8m0fnu).contiguous()


def fp4_decode(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Independent decode of `fp4_quantize`'s output, to check transformers'."""
    u = packed.view(torch.uint8)
    vals = torch.stack([LUT[(u & 15).long()], LUT[(u >> 4).long()]], -1).reshape(u.shape[0], -1)
    return vals * scale.float().repeat_interleave(32, -1)


def build_ds_fp8_ue8m0_fp4(seed: int, work: Path):
    model = new_model(ds_fp8_config(), seed, "deepseek")
    hf = work / "hf"
    model.save_pretrained(hf, max_shard_size="1GB")
    src = load_file(str(hf / "model.safetensors"))
    out, ref = {}, {}
    fp4 = fp8 = 0
    for k, v in sorted(src.items()):
        if is_fp8_target(k) and ".mlp.experts." in k:
            q, s = fp4_quantize(v)
            out[k], out[k + "_scale_inv"] = q, s
            w = Fp8Dequantize(None)._dequantize_one(q, s, output_dtype=torch.float32)
            assert torch.equal(w, fp4_decode(q, s)), k
            ref[k] = w
            fp4 += 1
        elif is_fp8_target(k):
            q, s = fp8_quantize_ue8m0(v)
            out[k], out[k + "_scale_inv"] = q, s
            ref[k] = fp8_dequant_deepseek(q, s.float())
            fp8 += 1
        elif k.endswith("e_score_correction_bias"):
            out[k] = v.float()
            ref[k] = v.float()
        else:
            out[k] = v.to(torch.bfloat16)
            ref[k] = out[k].float()
    d = work / "deepseek_v3-fp8-ue8m0-fp4"
    d.mkdir()
    write_by_layer(out, d)
    write_config(hf, d, {**FP8_QCFG, "scale_fmt": "ue8m0", "expert_dtype": "fp4"})
    m = AutoModelForCausalLM.from_pretrained(plain_fp32_dir(hf, ref, work / "ref"), dtype=torch.float32, **KW)
    facts = {"fp8_ue8m0_tensors": fp8, "fp4_expert_tensors": fp4}
    return d, finish_ref(m), "deepseek", facts


def fp8_release(model, work: Path, name: str, f32) -> tuple[Path, dict, dict]:
    """A release in 128x128-block FP8: every `is_fp8_target` weight quantized (its reference the
    DeepSeek-layout dequantization), the tensors `f32(name)` selects kept F32, the rest BF16.
    Returns the fixture directory, the reference weights and the facts."""
    hf = work / "hf"
    model.save_pretrained(hf, max_shard_size="1GB")
    src = load_file(str(hf / "model.safetensors"))
    out, ref = {}, {}
    for k, v in sorted(src.items()):
        if is_fp8_target(k):
            q, sc = fp8_quantize(v)
            out[k] = q
            out[k + "_scale_inv"] = sc
            ref[k] = fp8_dequant_deepseek(q, sc)
        elif f32(k):
            out[k] = v.float()
            ref[k] = v.float()
        else:
            out[k] = v.to(torch.bfloat16)
            ref[k] = out[k].float()
    d = work / name
    d.mkdir()
    save_st(out, d / "model.safetensors")
    write_config(hf, d, FP8_QCFG)
    return d, ref, {"fp8_tensors": sum(1 for k in out if k.endswith("_scale_inv"))}


def build_glm4_fp8(seed: int, work: Path):
    """GLM-4.5 as its FP8 release: FP8 blocks on the attention (q/k/v biases stay BF16), dense MLP,
    shared and routed experts; router BF16, `e_score_correction_bias` F32."""
    model = new_model(glm4_fp8_config(), seed, "deepseek")
    d, ref, facts = fp8_release(model, work, "glm4_moe-fp8", lambda k: k.endswith("e_score_correction_bias"))
    m = AutoModelForCausalLM.from_pretrained(plain_fp32_dir(work / "hf", ref, work / "ref"), dtype=torch.float32, **KW)
    return d, finish_ref(m), "deepseek", facts


def build_minimax_fp8(seed: int, work: Path):
    """MiniMax-M2 as released: FP8 projections with 128x128 `weight_scale_inv`, the router and
    `e_score_correction_bias` in F32, the rest BF16. The reference runs on the DeepSeek-layout
    dequantization of the codes."""
    model = new_model(minimax_fp8_config(), seed, "minimax")
    d, ref, facts = fp8_release(
        model, work, "minimax_m2-fp8", lambda k: k.endswith("e_score_correction_bias") or k.endswith(".gate.weight")
    )
    m = AutoModelForCausalLM.from_pretrained(plain_fp32_dir(work / "hf", ref, work / "ref"), dtype=torch.float32, **KW)
    return d, finish_ref(m), "minimax", facts


def build_qwen3_5_fp8(seed: int, work: Path):
    """Qwen3.5 as its FP8 releases are laid out: the multimodal checkpoint (`qwen3_5_moe` with
    `text_config`, the text model under `model.language_model.`, quantization_config at the top)
    with 128x128-block FP8 linear layers — attention, the DeltaNet's projections, experts and
    shared experts — and the router, the shared expert's gate, convolutions, norms, A_log,
    dt_bias, embeddings and lm_head kept BF16. The reference is the text model on the
    DeepSeek-layout dequantization."""
    model = new_model(qwen3_5_fp8_config(), seed, "qwen3_5")
    hf = work / "hf"
    model.save_pretrained(hf, max_shard_size="1GB")
    src = load_file(str(hf / "model.safetensors"))
    out, ref = {}, {}
    for k, v in sorted(src.items()):
        if is_fp8_target(k) and "shared_expert_gate" not in k and "conv1d" not in k:
            q, sc = fp8_quantize(v)
            out[k] = q
            out[k + "_scale_inv"] = sc
            ref[k] = fp8_dequant_deepseek(q, sc)
        else:
            out[k] = v.to(torch.bfloat16)
            ref[k] = out[k].float()
    mm = {
        (k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k): v
        for k, v in out.items()
    }
    d = work / "qwen3_5_moe-fp8"
    d.mkdir()
    save_st(mm, d / "model.safetensors")
    text = json.loads((hf / "config.json").read_text())
    cfg = {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": text,
        "vision_config": {"model_type": "qwen3_5_moe_vision", "depth": 1},
        "quantization_config": FP8_QCFG,
        "tie_word_embeddings": False,
    }
    (d / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    shutil.copyfile(hf / "generation_config.json", d / "generation_config.json")
    m = AutoModelForCausalLM.from_pretrained(plain_fp32_dir(hf, ref, work / "ref"), dtype=torch.float32, **KW)
    facts = {
        "fp8_tensors": sum(1 for k in out if k.endswith("_scale_inv")),
        "layout": "multimodal: text_config, model.language_model.*, per-expert tensors",
    }
    return d, finish_ref(m), "softmax_renorm", facts


def build_ds_int4(seed: int, work: Path):
    model = new_model(ds_int4_config(), seed, "deepseek")
    hf = work / "hf"
    model.save_pretrained(hf, max_shard_size="1GB")
    src = load_file(str(hf / "model.safetensors"))
    out, ref, packed = {}, {}, {}
    for k, v in sorted(src.items()):
        if ".mlp.experts." in k and k.endswith(".weight"):
            base = k[: -len(".weight")]
            st = int4_compress(v)
            assert set(st) == {"weight_packed", "weight_scale", "weight_shape"}, st.keys()
            for kk, vv in st.items():
                out[f"{base}.{kk}"] = vv
            packed[base] = st
            ref[k] = int4_decompress_exact(st)
        elif k.endswith("e_score_correction_bias"):
            out[k] = v.float()
            ref[k] = v.float()
        else:
            out[k] = v.to(torch.bfloat16)
            ref[k] = out[k].float()
    d = work / "deepseek_v3-int4"
    d.mkdir()
    save_st(out, d / "model.safetensors")
    write_config(hf, d, INT4_QCFG)
    # Cross-check: transformers' own load of the packed file (BF16) is the BF16 rounding of the
    # exact decode, and the nibble order is the documented one (low bits first, value - 8).
    nat = AutoModelForCausalLM.from_pretrained(
        d, dtype=torch.float32, quantization_config=CompressedTensorsConfig(run_compressed=False), **KW
    ).state_dict()
    inter = model.config.moe_intermediate_size
    for base, st in packed.items():
        layer, e, proj = base.split(".")[2], int(base.split(".")[5]), base.split(".")[6]
        fused = f"model.layers.{layer}.mlp.experts."
        if proj == "down_proj":
            got = nat[fused + "down_proj"][e]
        else:
            gu = nat[fused + "gate_up_proj"][e]
            got = gu[:inter] if proj == "gate_proj" else gu[inter:]
        exact = ref[base + ".weight"]
        assert torch.equal(got, exact.to(torch.bfloat16).to(got.dtype)), base
        p = st["weight_packed"]
        nib = torch.stack([(p >> (4 * j)) & 15 for j in range(8)], -1).reshape(p.shape[0], -1)
        manual = (nib.float() - 8) * st["weight_scale"].float().repeat_interleave(INT4_GROUP, 1)
        assert torch.equal(manual, exact), base
    m = AutoModelForCausalLM.from_pretrained(plain_fp32_dir(hf, ref, work / "ref"), dtype=torch.float32, **KW)
    facts = {"packed_linears": len(packed), "native_bf16_load_is_rounded_exact_decode": True}
    return d, finish_ref(m), "deepseek", facts


def build_qwen3_mxfp4(seed: int, work: Path):
    model = new_model(qwen3_config(), seed, "softmax")
    hf = work / "hf"
    model.save_pretrained(hf, max_shard_size="1GB")
    src = load_file(str(hf / "model.safetensors"))
    out, exact = {}, {}
    for k, v in sorted(src.items()):
        if ".mlp.experts." in k and k.endswith(".weight"):
            base = k[: -len(".weight")]
            st = mxfp4_ct_compress(v)
            assert set(st) == {"weight_packed", "weight_scale"}, st.keys()
            assert st["weight_packed"].dtype == torch.uint8 and st["weight_scale"].dtype == torch.uint8
            for kk, vv in st.items():
                out[f"{base}.{kk}"] = vv
            p, s = st["weight_packed"], st["weight_scale"]
            vals = torch.stack([LUT[(p & 15).long()], LUT[(p >> 4).long()]], -1).reshape(p.shape[0], -1)
            exact[k] = vals * torch.exp2(s.float() - 127).repeat_interleave(32, 1)
        else:
            out[k] = v.to(torch.bfloat16)
    d = work / "qwen3_moe-mxfp4"
    d.mkdir()
    save_st(out, d / "model.safetensors")
    write_config(hf, d, MXFP4_CT_QCFG)
    m = AutoModelForCausalLM.from_pretrained(
        d, dtype=torch.float32, quantization_config=CompressedTensorsConfig(run_compressed=False), **KW
    ).float()
    sd = m.state_dict()
    inter = m.config.moe_intermediate_size
    for k, w in exact.items():
        layer, e, proj = k.split(".")[2], int(k.split(".")[5]), k.split(".")[6]
        fused = f"model.layers.{layer}.mlp.experts."
        if proj == "down_proj":
            got = sd[fused + "down_proj"][e]
        else:
            gu = sd[fused + "gate_up_proj"][e]
            got = gu[:inter] if proj == "gate_proj" else gu[inter:]
        assert torch.equal(got, w), f"{k}: compressed-tensors' MXFP4 decode differs from E2M1 x 2^(s-127)"
    facts = {"packed_linears": len(exact), "native_load_equals_e2m1_times_pow2": True}
    return d, finish_ref(m), "softmax", facts


def build_gpt_oss(seed: int, work: Path, variant: str):
    model = new_model(gpt_oss_config(), seed, "gpt_oss")
    hf = work / "hf"
    if not hf.exists():
        model.save_pretrained(hf, max_shard_size="1GB")
    d = work / f"gpt_oss-{variant}"
    d.mkdir()
    if variant == "bf16":
        m16 = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.bfloat16, **KW)
        m16.save_pretrained(d, max_shard_size="1GB")
        del m16
        m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16, **KW).float()
        facts = {}
    else:
        src = load_file(str(hf / "model.safetensors"))
        out, decoded = {}, {}
        for k, v in sorted(src.items()):
            if k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj"):
                b, s = gpt_oss_mxfp4(v)
                out[k + "_blocks"], out[k + "_scales"] = b, s
                decoded[k] = gpt_oss_mxfp4_decode(b, s)
            else:
                out[k] = v.to(torch.bfloat16)
        save_st(out, d / "model.safetensors")
        write_config(hf, d, GPT_OSS_QCFG)
        m = AutoModelForCausalLM.from_pretrained(
            d, dtype=torch.float32, quantization_config=Mxfp4Config(dequantize=True), **KW
        )
        sd = m.state_dict()
        for k, w in decoded.items():
            assert torch.equal(sd[k].float(), w), f"{k}: transformers' MXFP4 decode differs"
        facts = {"native_dequant_equals_independent_decode": True}
    return d, finish_ref(m), "gptoss", facts


FIXTURES = [
    dict(name="deepseek_v3-fp8", base_seed=11000, variants=[("fp8", build_ds_fp8)]),
    dict(name="deepseek_v3-int4", base_seed=12000, variants=[("int4", build_ds_int4)]),
    dict(
        name="deepseek_v3-fp8-ue8m0-fp4",
        base_seed=18000,
        variants=[("fp8-ue8m0-fp4", build_ds_fp8_ue8m0_fp4)],
    ),
    dict(name="qwen3_moe-mxfp4", base_seed=13000, variants=[("mxfp4", build_qwen3_mxfp4)]),
    dict(name="minimax_m2-fp8", base_seed=15000, variants=[("fp8", build_minimax_fp8)]),
    dict(name="glm4_moe-fp8", base_seed=17000, variants=[("fp8", build_glm4_fp8)]),
    dict(name="qwen3_5_moe-fp8", base_seed=16000, variants=[("fp8", build_qwen3_5_fp8)]),
    dict(
        name="gpt_oss",
        base_seed=14000,
        variants=[
            ("bf16", lambda s, w: build_gpt_oss(s, w, "bf16")),
            ("mxfp4", lambda s, w: build_gpt_oss(s, w, "mxfp4")),
        ],
    ),
]

# ----------------------------------------------------------------------------------------------
# reference run


class Tap:
    """Forward hooks on every router (`mlp.gate` or GPT-OSS `mlp.router`)."""

    def __init__(self, model):
        self.calls, self.routers, self.blocks, self.handles = [], {}, {}, []
        for li, layer in enumerate(model.model.layers):
            r = getattr(layer.mlp, "gate", None) or getattr(layer.mlp, "router", None)
            if r is not None and type(r).__name__.endswith("Router"):
                self.routers[li] = r
                self.blocks[li] = layer.mlp
                self.handles.append(r.register_forward_hook(self._hook(li)))

    def _hook(self, li):
        def fn(module, args, out):
            self.calls.append((li, tuple(o.detach().clone() for o in out)))

        return fn

    def take(self):
        c, self.calls = self.calls, []
        return c


def recompute(kind, module, cfg, logits, block=None):
    if kind == "gptoss":  # top-k of the (biased) logits, softmax over the k chosen
        k = cfg.num_experts_per_tok
        srt = logits.float().sort(dim=-1, descending=True).values
        top = logits.float().topk(k, dim=-1)
        return top.indices, torch.softmax(top.values, dim=-1), srt[:, k - 1] - srt[:, k], None
    ids, w, egap, ggap, _ = mf.recompute_route(kind, module, cfg, logits, block)
    return ids, w, egap, ggap


def check_routes(kind, tap, cfg, calls, seq_len):
    per_layer, min_e, min_g = {}, float("inf"), float("inf")
    for li, out in calls:
        logits, weights, ids = out[0], out[1], out[2]
        assert ids.shape == (seq_len, cfg.num_experts_per_tok), (li, ids.shape)
        rid, rw, egap, ggap = recompute(kind, tap.routers[li], cfg, logits, tap.blocks[li])
        hs, horder = ids.sort(dim=-1)
        rs, rorder = rid.sort(dim=-1)
        assert torch.equal(hs, rs), f"layer {li}: expert sets differ from re-derivation"
        hw = weights.float().gather(1, horder)
        assert torch.allclose(hw, rw.gather(1, rorder), rtol=1e-6, atol=1e-7), f"layer {li}: weights"
        assert li not in per_layer, "router called twice in one forward"
        per_layer[li] = (hs.to(torch.int64), hw.to(torch.float32))
        min_e = min(min_e, float(egap.min()))
        if ggap is not None:
            min_g = min(min_g, float(ggap.min()))
    return per_layer, min_e, min_g


class ClampCounter:
    """Counts GPT-OSS gate/up values the SwiGLU clamp changes (to show the clamp is exercised)."""

    def __init__(self, model):
        self.clamped, self.total = 0, 0
        self.orig = {}
        for layer in model.model.layers:
            ex = layer.mlp.experts
            if hasattr(ex, "_apply_gate"):
                orig = ex._apply_gate
                self.orig[ex] = orig

                def wrapped(gate_up, _orig=orig, _ex=ex):
                    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
                    self.clamped += int((gate > _ex.limit).sum() + (up.abs() > _ex.limit).sum())
                    self.total += gate_up.numel()
                    return _orig(gate_up)

                ex._apply_gate = wrapped


@torch.no_grad()
def run_reference(model, kind, prompts):
    cfg = model.config
    tap = Tap(model)
    clamp = ClampCounter(model) if kind == "gptoss" else None
    tensors, stats = {}, dict(min_e=float("inf"), min_g=float("inf"))

    def absorb(calls, seq_len, prefix):
        per_layer, me, mg = check_routes(kind, tap, cfg, calls, seq_len)
        stats["min_e"] = min(stats["min_e"], me)
        stats["min_g"] = min(stats["min_g"], mg)
        if prefix is not None:
            for li, (ids, w) in sorted(per_layer.items()):
                tensors[f"{prefix}.layer{li}.experts"] = ids.contiguous()
                tensors[f"{prefix}.layer{li}.weights"] = w.contiguous()

    max_abs = 0.0
    for t, ids in prompts.items():
        tap.take()
        logits = model(input_ids=ids[None], use_cache=False).logits[0].float()
        assert logits.shape == (t, VOCAB)
        tensors[f"prompt{t}.ids"] = ids.clone()
        tensors[f"prompt{t}.logits"] = logits.contiguous()
        max_abs = max(max_abs, float(logits.abs().max()))
        absorb(tap.take(), t, f"prompt{t}")
    p = prompts[mf.GREEDY_PROMPT_LEN]
    tap.take()
    gen = model.generate(
        input_ids=p[None],
        attention_mask=torch.ones_like(p)[None],
        do_sample=False,
        max_new_tokens=mf.GREEDY_NEW,
        min_new_tokens=mf.GREEDY_NEW,
        output_logits=True,
        return_dict_in_generate=True,
        use_cache=True,
    )
    tap.take()
    seq = gen.sequences[0]
    new = seq[mf.GREEDY_PROMPT_LEN :]
    assert new.numel() == mf.GREEDY_NEW, f"generated {new.numel()} tokens"
    step = torch.stack([lg[0] for lg in gen.logits]).float()
    assert torch.equal(step.argmax(-1), new), "greedy token != argmax of its logits"
    top2 = step.topk(2, dim=-1).values
    gaps = top2[:, 0] - top2[:, 1]
    rel = gaps / step.abs().max(-1).values
    full = model(input_ids=seq[None], use_cache=False).logits[0].float()
    lo = mf.GREEDY_PROMPT_LEN - 1
    cached_vs_full = float((full[lo : lo + mf.GREEDY_NEW] - step).abs().max())
    absorb(tap.take(), seq.numel(), None)
    max_abs = max(max_abs, float(step.abs().max()))
    tensors["greedy.prompt_ids"] = p.clone()
    tensors["greedy.ids"] = new.to(torch.int64).clone()
    tensors["greedy.step_logits"] = step.contiguous()
    tensors["greedy.margins"] = gaps.contiguous()
    for h in tap.handles:
        h.remove()
    return dict(
        tensors=tensors,
        min_greedy_rel=float(rel.min()),
        min_greedy_abs=float(gaps.min()),
        min_expert_gap=stats["min_e"],
        min_group_gap=None if stats["min_g"] == float("inf") else stats["min_g"],
        max_abs_logit=max_abs,
        cached_vs_full=cached_vs_full,
        moe_layers=sorted(tap.routers),
        clamped_fraction=(clamp.clamped / max(clamp.total, 1)) if clamp else None,
    )


def passes(r) -> bool:
    ok = r["min_greedy_rel"] >= mf.MIN_GREEDY_REL and r["min_expert_gap"] >= mf.MIN_ROUTER_GAP
    if r["min_group_gap"] is not None:
        ok = ok and r["min_group_gap"] >= mf.MIN_ROUTER_GAP
    return ok


def tensor_facts(d: Path) -> dict:
    files = sorted(p for p in d.glob("*.safetensors") if p.name != "reference.safetensors")
    dtypes: dict[str, int] = {}
    for f in files:
        hdr = mf.safetensors_header(f)
        hdr.pop("__metadata__", None)
        for v in hdr.values():
            dtypes[v["dtype"]] = dtypes.get(v["dtype"], 0) + 1
    return {"shards": len(files), "tensor_dtypes": dict(sorted(dtypes.items()))}


def main() -> int:
    versions = {
        "python": mf.platform.python_version(),
        "torch": torch.__version__,
        "transformers": mf.transformers.__version__,
        "safetensors": mf.safetensors.__version__,
        "compressed_tensors": compressed_tensors.__version__,
    }
    print("versions:", " ".join(f"{k}={v}" for k, v in versions.items()))
    prompts = mf.make_prompts()
    if OUT.exists():  # everything under testdata/quant/ is generated by this script
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    summary = {
        "generator": "tools/reference/make_quant_fixtures.py",
        "command": "/work/venv/ref/bin/python tools/reference/make_quant_fixtures.py",
        "versions": versions,
        "thresholds": {"min_greedy_rel": mf.MIN_GREEDY_REL, "min_router_gap": mf.MIN_ROUTER_GAP},
        "prompt_seed": mf.PROMPT_SEED,
        "models": {},
    }
    rows = []
    with tempfile.TemporaryDirectory(prefix="sluice-quant-") as tmp:
        for fx in FIXTURES:
            rejected = []
            for seed in range(fx["base_seed"], fx["base_seed"] + mf.MAX_SEED_TRIES):
                work = Path(tmp) / f"{fx['name']}-{seed}"
                work.mkdir()
                results, ok = {}, True
                for variant, build in fx["variants"]:
                    d, model, kind, facts = build(seed, work)
                    r = run_reference(model, kind, prompts)
                    del model
                    r.update(dir=d, facts=facts)
                    results[d.name] = r
                    if not passes(r):
                        ok = False
                        break
                if ok:
                    break
                bad = {
                    n: {k: r[k] for k in ("min_greedy_rel", "min_expert_gap", "min_group_gap")}
                    for n, r in results.items()
                }
                print(f"  {fx['name']}: seed {seed} rejected {bad}")
                rejected.append(seed)
                shutil.rmtree(work)
            else:
                raise SystemExit(f"{fx['name']}: no seed passed in {mf.MAX_SEED_TRIES} tries")
            for name, r in results.items():
                final = OUT / name
                shutil.copytree(r["dir"], final)
                save_st(r["tensors"], final / "reference.safetensors")
                mf.chmod_tree(final)
                summary["models"][name] = {
                    "model_type": json.loads((final / "config.json").read_text())["model_type"],
                    "quantization": json.loads((final / "config.json").read_text()).get(
                        "quantization_config", {}
                    ).get("quant_method"),
                    "compute": "fp32",
                    "seed": seed,
                    "seeds_rejected": rejected,
                    "moe_layers": r["moe_layers"],
                    "min_greedy_margin_rel": r["min_greedy_rel"],
                    "min_greedy_margin_abs": r["min_greedy_abs"],
                    "min_router_expert_gap": r["min_expert_gap"],
                    "min_router_group_gap": r["min_group_gap"],
                    "max_abs_logit": r["max_abs_logit"],
                    "cached_vs_full_max_abs_diff": r["cached_vs_full"],
                    "swiglu_clamped_fraction": r["clamped_fraction"],
                    "checks": r["facts"],
                    "tensors": tensor_facts(final),
                    "files": {
                        p.name: {"bytes": p.stat().st_size, "sha256": mf.sha256_file(p)}
                        for p in sorted(final.iterdir())
                    },
                }
                rows.append((name, seed, r))
    mf.chmod_tree(OUT)
    (OUT / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    os.chmod(OUT / "summary.json", 0o644)

    hdr = (
        f"{'model':<20} {'seed':>6} {'greedy rel':>10} {'greedy abs':>10} {'expert gap':>10} "
        f"{'group gap':>10} {'max|logit|':>10} {'cache diff':>10} {'clamped':>8}"
    )
    print(hdr)
    print("-" * len(hdr))
    for name, seed, r in rows:
        gg = "-" if r["min_group_gap"] is None else f"{r['min_group_gap']:.3g}"
        cl = "-" if r["clamped_fraction"] is None else f"{r['clamped_fraction']:.3f}"
        print(
            f"{name:<20} {seed:>6} {r['min_greedy_rel']:>10.3g} {r['min_greedy_abs']:>10.3g} "
            f"{r['min_expert_gap']:>10.3g} {gg:>10} {r['max_abs_logit']:>10.3g} "
            f"{r['cached_vs_full']:>10.2g} {cl:>8}"
        )
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    tree = hashlib.sha256()
    for p in sorted(OUT.rglob("*")):
        if p.is_file():
            tree.update(f"{p.relative_to(OUT)} {mf.sha256_file(p)}\n".encode())
    print(f"total size {total / 1e6:.2f} MB; tree sha256 {tree.hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
