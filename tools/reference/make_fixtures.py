#!/usr/bin/env python3
"""Regenerate sluice's reference fixtures from Hugging Face transformers.

    /work/venv/ref/bin/python tools/reference/make_fixtures.py

(run from the repository root; the output always goes to <repo>/testdata/models/, found from this
file's location). Everything is deterministic: fixed seeds, one thread, deterministic algorithms.
Running it twice gives byte-identical files (the script prints a sha256 digest of the whole tree).

For each architecture it builds a tiny random-init model from a config, re-initialises every
weight with a seeded generator (scaled so routing is decisive and logits spread a few units),
writes an fp32 and a bf16 checkpoint in the shard layout chosen for that fixture, loads each
checkpoint back from disk, and records fp32 reference outputs (logits, routed experts and their
weights, a 32-token greedy continuation). A seed is accepted only if every greedy step and every
routing decision (prompts and the greedy sequence, fp32 and bf16) has a comfortable margin;
otherwise the next seed is tried. See testdata/README.md for the file layout.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import struct
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import numpy  # noqa: E402  (imported for its version only; torch needs it)
import safetensors  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    DeepseekV32Config,
    DeepseekV3Config,
    DeepseekV4Config,
    Ernie4_5_MoeConfig,
    Glm4MoeConfig,
    Glm5NextConfig,
    GlmMoeDsaConfig,
    HYV4Config,
    Llama4TextConfig,
    LongcatFlashConfig,
    LlamaConfig,
    MiMoV2FlashConfig,
    MiniMaxM2Config,
    MistralConfig,
    MistralLarge4Config,
    MixtralConfig,
    OlmoeConfig,
    Qwen2Config,
    Qwen2MoeConfig,
    Qwen3Config,
    Qwen3MoeConfig,
    Qwen3NextConfig,
    Qwen3_5MoeTextConfig,
    Step3p7Config,
)
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.set_verbosity_error()
hf_logging.disable_progress_bar()
warnings.filterwarnings("ignore")

torch.set_num_threads(1)
torch.set_num_interop_threads(1)
torch.use_deterministic_algorithms(True)

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "testdata" / "models"

VOCAB = 512
HIDDEN = 64
N_LAYERS = 4
PROMPT_LENS = (1, 7, 33)
PROMPT_SEED = 20240607  # prompts are shared by every model (same vocab)
GREEDY_PROMPT_LEN = 7
GREEDY_NEW = 32
MAX_SEED_TRIES = 64

# Acceptance thresholds (see README): greedy gap relative to max|logit| of that step, and the
# absolute gap between the k-th and (k+1)-th selection score (softmax prob / biased sigmoid score /
# DeepSeek group score) for every routing decision.
MIN_GREEDY_REL = 1e-3
MIN_ROUTER_GAP = 1e-4

# Initialisation scales (std = gain / sqrt(fan_in) for matrices).
EMBED_STD = 1.0
LM_HEAD_GAIN = 3.0  # logits spread a few units
ROUTER_GAIN_SOFTMAX = 2.0  # router logits ~N(0, 2^2): top-k choices decisive
ROUTER_GAIN_SIGMOID = 1.5  # sigmoid saturates if larger, which shrinks score gaps
E_BIAS_STD = 0.15  # DeepSeek e_score_correction_bias (a zero buffer by default)
NORM_JITTER = 0.1  # RMSNorm weights = 1 + 0.1 * N(0, 1), so a forgotten norm weight shows
BIAS_STD = 0.1  # linear biases (qwen2_moe qkv)
SOFTMAX_E_BIAS_STD = 0.05  # ERNIE's selection bias, added to softmax probabilities

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    num_hidden_layers=N_LAYERS,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    max_position_embeddings=256,
    hidden_act="silu",
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)

ARCHS = [
    dict(
        name="deepseek_v3",
        base_seed=1000,
        router="deepseek",
        layouts={"fp32": ("by_layer", None), "bf16": ("hf_sharded", "200KB")},
        config=lambda: DeepseekV3Config(
            **{**COMMON, "max_position_embeddings": 64},  # = factor x original (see README)
            intermediate_size=128,
            moe_intermediate_size=32,
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
        ),
    ),
    dict(
        name="deepseek_v3_noqlora",
        base_seed=2000,
        router="deepseek",
        layouts={"fp32": ("single", None), "bf16": ("single", None)},
        config=lambda: DeepseekV3Config(
            **COMMON,
            intermediate_size=128,
            moe_intermediate_size=32,
            num_attention_heads=4,
            num_key_value_heads=4,
            q_lora_rank=None,
            kv_lora_rank=32,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=16,
            first_k_dense_replace=2,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_shared_experts=1,
            n_group=1,
            topk_group=1,
            norm_topk_prob=True,
            routed_scaling_factor=2.827,
            rope_interleave=True,
            num_mtp_layers=0,
            # mscale != mscale_all_dim: cos/sin are scaled by
            # (0.1*0.707*ln4+1)/(0.1*1.0*ln4+1); theta 1000 and original 64 make the YaRN ramp
            # fractional ([1, 0.5, 0, 0] extrapolation weights), unlike the main deepseek fixture.
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 1000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 64,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale": 0.707,
                "mscale_all_dim": 1.0,
            },
        ),
    ),
    dict(
        name="qwen3_moe",
        base_seed=3000,
        router="softmax",
        layouts={"fp32": ("single", None), "bf16": ("hf_sharded", "64KB")},
        config=lambda: Qwen3MoeConfig(
            **COMMON,
            intermediate_size=128,
            moe_intermediate_size=32,
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
        ),
    ),
    dict(
        name="qwen2_moe",
        base_seed=4000,
        router="softmax",
        layouts={"fp32": ("single", None), "bf16": ("single", None)},
        config=lambda: Qwen2MoeConfig(
            **COMMON,
            intermediate_size=128,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=False,
            qkv_bias=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            use_sliding_window=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    dict(
        name="mixtral",
        base_seed=5000,
        router="softmax_renorm",
        layouts={"fp32": ("by_layer", None), "bf16": ("single", None)},
        config=lambda: MixtralConfig(
            **COMMON,
            intermediate_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_local_experts=8,
            num_experts_per_tok=2,
            sliding_window=None,
            router_jitter_noise=0.0,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    dict(
        name="olmoe",
        base_seed=6000,
        router="softmax",
        layouts={"fp32": ("single", None), "bf16": ("single", None)},
        config=lambda: OlmoeConfig(
            **COMMON,
            intermediate_size=32,
            num_attention_heads=4,
            num_key_value_heads=4,
            num_experts=16,
            num_experts_per_tok=4,
            norm_topk_prob=False,
            clip_qkv=None,
            attention_bias=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    dict(
        name="glm4_moe",
        base_seed=11000,
        router="deepseek",
        layouts={"fp32": ("single", None), "bf16": ("hf_sharded", "100KB")},
        config=lambda: Glm4MoeConfig(
            **COMMON,
            intermediate_size=128,
            moe_intermediate_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            attention_bias=True,  # q/k/v biases; o_proj has none
            use_qk_norm=True,
            first_k_dense_replace=1,
            n_routed_experts=16,
            num_experts_per_tok=4,
            n_shared_experts=1,
            n_group=4,
            topk_group=2,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            num_mtp_layers=0,
            # half of each head rotated (8 of 16 dimensions)
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        ),
    ),
    dict(
        name="minimax_m2",
        base_seed=12000,
        router="minimax",
        layouts={"fp32": ("by_layer", None), "bf16": ("single", None)},
        config=lambda: MiniMaxM2Config(
            **COMMON,
            intermediate_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_local_experts=8,
            num_experts_per_tok=2,
            router_jitter_noise=0.0,
            rotary_dim=8,  # released configs' legacy field: half of each head rotated
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    dict(
        name="ernie4_5_moe",
        base_seed=13000,
        router="ernie",
        layouts={"fp32": ("single", None), "bf16": ("hf_sharded", "100KB")},
        config=lambda: Ernie4_5_MoeConfig(
            **{**COMMON, "tie_word_embeddings": True},  # the family's default
            intermediate_size=128,
            moe_intermediate_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            use_bias=False,
            moe_num_experts=16,
            moe_k=4,
            moe_num_shared_experts=2,
            # MoE in layers 1 and 2 only: dense before the start and after the end
            moe_layer_start_index=1,
            moe_layer_end_index=2,
            moe_layer_interval=1,
            moe_norm_min=1e-12,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    dict(
        name="qwen3_next",
        base_seed=14000,
        router="softmax",
        zero_centred_norms=True,
        layouts={"fp32": ("single", None), "bf16": ("hf_sharded", "100KB")},
        config=lambda: Qwen3NextConfig(
            **COMMON,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            attention_bias=False,
            # Gated DeltaNet: 2 key heads serving 4 value heads, key dim 16, value dim 8
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=8,
            linear_conv_kernel_dim=4,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[2],  # one dense layer, a linear-attention one
            # a quarter of each head rotated (4 of 16 dimensions)
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        ),
    ),
    dict(
        name="qwen3_5_moe",
        base_seed=15000,
        router="softmax_renorm",
        zero_centred_norms=True,
        layouts={"fp32": ("single", None), "bf16": ("single", None)},
        config=lambda: Qwen3_5MoeTextConfig(
            **COMMON,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            attention_bias=False,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=8,
            linear_conv_kernel_dim=4,
            layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            # multimodal rotary sections: text-only positions make them the plain rotation
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.25,
                "mrope_section": [1, 1, 0],
            },
        ),
    ),
    dict(
        name="mimo_v2_flash",
        base_seed=16000,
        router="deepseek",
        layouts={"fp32": ("single", None), "bf16": ("single", None)},
        config=lambda: MiMoV2FlashConfig(
            **COMMON,
            intermediate_size=128,
            moe_intermediate_size=32,
            num_attention_heads=4,
            num_key_value_heads=1,  # 2 in the sliding layers
            head_dim=16,
            v_head_dim=8,
            attention_value_scale=0.707,
            sliding_window=8,
            layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
            mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            norm_topk_prob=True,
            routed_scaling_factor=None,  # as the hub config stores it: 1
            # each layer type its own theta; half of each head rotated
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
            },
        ),
    ),
    dict(
        name="llama4",
        base_seed=17000,
        router="llama4",
        xw_experts=True,
        layouts={"fp32": ("single", None), "bf16": ("single", None)},
        config=lambda: Llama4TextConfig(
            **COMMON,
            intermediate_size=32,  # experts and the shared expert
            intermediate_size_mlp=96,  # dense layers
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_local_experts=8,
            num_experts_per_tok=1,
            interleave_moe_layer_step=2,  # MoE layers 1 and 3, dense 0 and 2
            no_rope_layer_interval=2,  # layers 1 and 3 NoPE, 0 and 2 rotated
            attention_chunk_size=8,  # rotated layers attend within chunks of 8
            use_qk_norm=True,
            attn_temperature_tuning=True,
            floor_scale=4,  # the temperature changes every 4 positions
            attn_scale=0.1,
            router_jitter_noise=0.0,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    # LongCat-Flash: two sublayers per layer (sluice's layers 0-3), MLA with LoRA scaling, the
    # shortcut MoE over 8 routed and 4 zero-compute experts (top 4 of 12, so tokens choose
    # zero experts often), a selection-only bias on the softmax probabilities.
    dict(
        name="longcat_flash",
        base_seed=18000,
        router="longcat",
        layouts={"fp32": ("single", None), "bf16": ("hf_sharded", "100KB")},
        config=lambda: LongcatFlashConfig(
            **{k: v for k, v in COMMON.items() if k != "num_hidden_layers"},
            num_layers=N_LAYERS // 2,
            num_attention_heads=4,
            ffn_hidden_size=96,
            q_lora_rank=32,
            kv_lora_rank=32,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            head_dim=8,  # the rotary table's width: must be qk_rope_head_dim
            v_head_dim=16,
            n_routed_experts=8,
            zero_expert_num=4,
            moe_topk=4,
            expert_ffn_hidden_size=32,
            routed_scaling_factor=2.0,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    # DeepSeek-V3.2: DeepSeek-V3's blocks with sparse attention in every layer; the indexer keeps
    # 8 positions (16 heads of 16 dimensions, 8 rotated), so the 33-token prompt and the greedy
    # sequence attend sparsely past position 7.
    dict(
        name="deepseek_v32",
        base_seed=20000,
        router="deepseek",
        layouts={"fp32": ("single", None), "bf16": ("hf_sharded", "200KB")},
        config=lambda: DeepseekV32Config(
            **COMMON,
            intermediate_size=128,
            moe_intermediate_size=32,
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
            index_topk=8,
            index_head_dim=16,
            index_n_heads=16,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    # GLM-5: DeepSeek-V3.2's sparse attention with the indexer's pairs interleaved, and layers 1
    # and 3 sharing the top-k of the full layer before them (no indexer of their own).
    dict(
        name="glm_moe_dsa",
        base_seed=21000,
        router="deepseek",
        layouts={"fp32": ("single", None), "bf16": ("hf_sharded", "200KB")},
        config=lambda: GlmMoeDsaConfig(
            **COMMON,
            intermediate_size=128,
            moe_intermediate_size=32,
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
            index_topk=8,
            index_head_dim=16,
            index_n_heads=16,
            indexer_types=["full", "shared", "full", "shared"],
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    # Mistral Large 4 as released (the multimodal checkpoint; transformers writes Mistral's own
    # tensor names): no query LoRA; layers 2 and 3 NoPE; layer 1 reads layer 0's latent cache and
    # layer 3 layer 2's (kv_source_layers); the indexer (queries from a LayerNorm of the input,
    # 8 of 16 dimensions rotated) shared by layers 1 and 4; per-head log-position query factors
    # on attention and indexer; learned rotary frequency factors over YaRN; softmax routing of
    # 8 experts in 2 groups, the top group's best 2; logits soft-capped at 8; rms_norm_eps 1e-5 (which the latent
    # norm uses too).
    dict(
        name="mistral_large4",
        base_seed=22000,
        router="mistral",
        layouts={"fp32": ("single", None), "bf16": ("hf_sharded", "70KB")},
        config=lambda: MistralLarge4Config(
            text_config=dict(
                **{**COMMON, "num_hidden_layers": 5, "rms_norm_eps": 1e-5},
                intermediate_size=128,
                moe_intermediate_size=32,
                num_attention_heads=4,
                num_key_value_heads=4,
                kv_lora_rank=32,
                qk_nope_head_dim=16,
                qk_rope_head_dim=8,
                v_head_dim=16,
                first_k_dense_replace=1,
                n_routed_experts=8,
                num_experts_per_tok=2,
                n_shared_experts=1,
                n_group=2,
                topk_group=1,
                routed_scaling_factor=2.5,
                index_topk=8,
                index_head_dim=16,
                index_n_heads=16,
                indexer_types=["full", "shared", "full", "full", "shared"],
                no_rope_layers=[1, 1, 0, 0, 1],
                kv_source_layers=[0, 0, 2, 2, 4],
                final_logit_softcapping=8.0,
                rope_parameters={
                    "rope_type": "yarn",
                    "rope_theta": 10000.0,
                    "factor": 4.0,
                    "original_max_position_embeddings": 64,
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                    "attention_factor": 1.0,
                },
            ),
            vision_config=dict(
                hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                head_dim=16, image_size=56, patch_size=14,
            ),
        ),
    ),
    # Hy4 (Tencent): GLM-5's sparse attention (indexer top 8, layers 2 and 3 sharing layer 1's
    # top-k) with per-head sinks and a per-head sigmoid gate on the attention output, the
    # indexer's rotated part last; 3 hyper-connection streams (iHC: sigmoid pre/post weights, no
    # mixing matrix) and the hyper head; SwiGLU inputs clamped at 0.8 in the routed experts;
    # sigmoid routing with a selection bias; tensors under Tencent's names as transformers
    # writes them (`hc_pre.hc_attn_layer.hc_fn`, `learnable_sink_param`, `linear_gate`).
    dict(
        name="hy_v4",
        base_seed=23000,
        router="deepseek",
        layouts={"fp32": ("single", None), "bf16": ("hf_sharded", "100KB")},
        config=lambda: HYV4Config(
            **{**COMMON, "rms_norm_eps": 1e-5},
            intermediate_size=128,
            moe_intermediate_size=32,
            num_attention_heads=4,
            q_lora_rank=32,
            kv_lora_rank=32,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=16,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_shared_experts=1,
            n_group=1,
            topk_group=1,
            routed_scaling_factor=2.5,
            index_topk=8,
            index_head_dim=16,
            index_n_heads=8,
            indexer_types=["full", "full", "shared", "shared"],
            hc_mult=3,
            hc_magnitude=2.0,
            swiglu_limit=0.8,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    # GLM-5.3-Flash as released (the multimodal checkpoint): Kimi Delta Attention layers 0 and
    # 3 (4 heads of 16, the lower-bounded forget gate) beside NoPE MLA with sparse attention
    # (layers 1, 2, 4); the indexer scores pools of 4 keys (a learned gated average) and keeps
    # the best 2 pools plus the tail; layer 2 reuses layer 1's top-k; 3 hyper-connection
    # streams with the Sinkhorn-normalised mixing matrix (mHC), the streams' mean before the
    # final norm; SwiGLU inputs clamped at 0.8 in the routed experts.
    dict(
        name="glm5_next",
        base_seed=24000,
        router="deepseek",
        layouts={"fp32": ("single", None), "bf16": ("hf_sharded", "100KB")},
        config=lambda: Glm5NextConfig(
            text_config=dict(
                **{**COMMON, "num_hidden_layers": 5, "rms_norm_eps": 1e-5},
                intermediate_size=128,
                moe_intermediate_size=32,
                num_attention_heads=4,
                num_key_value_heads=4,
                q_lora_rank=32,
                kv_lora_rank=32,
                qk_nope_head_dim=24,
                qk_rope_head_dim=0,
                v_head_dim=16,
                n_routed_experts=8,
                num_experts_per_tok=2,
                n_shared_experts=1,
                n_group=1,
                topk_group=1,
                routed_scaling_factor=2.5,
                mlp_layer_types=["dense", "sparse", "sparse", "sparse", "sparse"],
                layer_types=[
                    "linear_attention", "indexed_attention", "indexed_attention",
                    "linear_attention", "indexed_attention",
                ],
                indexer_types=["full", "full", "shared", "full", "full"],
                index_topk=8,
                index_head_dim=16,
                index_n_heads=8,
                index_kpool=4,
                linear_head_dim=16,
                linear_num_heads=4,
                linear_conv_kernel_dim=4,
                hc_mult=3,
                swiglu_limit=0.8,
            ),
            vision_config=dict(
                depth=1, hidden_size=32, num_heads=2, out_hidden_size=64, intermediate_size=64,
                projection_intermediate_size=64,
            ),
        ),
    ),
    # DeepSeek-V4: shared-KV MQA over a window of 8 with sinks (4 heads of 32, the last 8
    # dimensions rotated, adjacent pairs), a query LoRA of 32, the grouped output projection (2
    # groups of 16); layers 0 and 4 heavily compressed (windows of 8), 1 and 3 compressed-sparse
    # (overlapping windows of 4, an indexer of 8 heads of 16 keeping the best 3 entries), layer
    # 2 sliding only; the compress table YaRN over θ 160000, the main one θ 10⁴; mHC with 3
    # streams and the gated head; √softplus routing of 8 experts top-2 with a selection bias,
    # layers 0 and 1 hash-routed (tid2eid); SwiGLU inputs clamped at 0.8 in routed and shared
    # experts. transformers writes DeepSeek's names (`attn.wq_a`, `ffn.experts.{e}.w1`).
    dict(
        name="deepseek_v4",
        base_seed=25000,
        router="deepseek_v4",
        mtp=lambda dst, seed: add_deepseek_v4_mtp(dst, seed),
        layouts={"fp32": ("single", None), "bf16": ("hf_sharded", "100KB")},
        config=lambda: DeepseekV4Config(
            **{**COMMON, "num_hidden_layers": 5},
            moe_intermediate_size=32,
            num_attention_heads=4,
            head_dim=32,
            q_lora_rank=32,
            partial_rotary_factor=0.25,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_shared_experts=1,
            routed_scaling_factor=1.5,
            layer_types=[
                "heavily_compressed_attention", "compressed_sparse_attention", "sliding_attention",
                "compressed_sparse_attention", "heavily_compressed_attention",
            ],
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
            mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe"],
            hc_mult=3,
            sliding_window=8,
            o_groups=2,
            o_lora_rank=16,
            index_n_heads=8,
            index_head_dim=16,
            index_topk=3,
            swiglu_limit=0.8,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 64,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
            },
        ),
    ),
    # Step-3.7-Flash as released (the multimodal checkpoint; transformers has no causal-LM class
    # of its text model): sliding layers 1 and 3 with window 8, 2 heads (full layers 4) and their
    # own rotary table (θ 500, whole head; full layers θ 10⁴, half of each head); Gemma norms; a
    # per-head g_proj gate; query_pre_attn_scalar 20; layer 0 dense, 1-3 MoE (8 experts top-2,
    # sigmoid + bias, scaling 2.5) with a shared expert; SwiGLU bounds small enough to bite.
    dict(
        name="step3p7",
        base_seed=19000,
        router="step3p7",
        zero_centred_norms=True,
        layouts={"fp32": ("single", None), "bf16": ("hf_sharded", "100KB")},
        config=lambda: Step3p7Config(
            text_config=dict(
                **{**COMMON, "pad_token_id": 0},  # transformers' config wants an int here
                intermediate_size=96,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=16,
                layer_types=["full_attention", "sliding_attention", "full_attention", "sliding_attention"],
                sliding_window=8,
                num_sliding_attention_heads=2,
                mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
                n_routed_experts=8,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                share_expert_dim=48,
                moe_router_scaling_factor=2.5,
                swiglu_limits=[0, 0.5, None, 0.8],
                swiglu_limits_shared=[0.6, 0, 0.7, None],
                query_pre_attn_scalar=20,
                rope_theta=[10000.0, 500.0, 10000.0, 500.0],
                partial_rotary_factors=[0.5, 1.0, 0.5, 1.0],
            ),
            vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=56, patch_size=14),
        ),
    ),
    # Dense models: no router; every feature of the family on (biases, Llama 3's rope scaling
    # with all three frequency bands populated, windows shorter than the 33-token prompt and
    # the 39-token greedy sequence, per-head q/k norms, tied embeddings).
    dict(
        name="llama",
        base_seed=7000,
        router="none",
        layouts={"fp32": ("by_layer", None), "bf16": ("single", None)},
        config=lambda: LlamaConfig(
            **COMMON,
            intermediate_size=96,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            attention_bias=True,
            mlp_bias=False,
            # wavelengths 2π·10000^(i/8): i ≤ 2 under 64 (kept), i = 3 between (smoothed),
            # i ≥ 4 over 256 (divided by 8).
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256,
            },
        ),
    ),
    dict(
        name="mistral",
        base_seed=8000,
        router="none",
        layouts={"fp32": ("single", None), "bf16": ("single", None)},
        config=lambda: MistralConfig(
            **COMMON,
            intermediate_size=96,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=16,
            sliding_window=8,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    dict(
        name="qwen2",
        base_seed=9000,
        router="none",
        layouts={"fp32": ("single", None), "bf16": ("single", None)},
        config=lambda: Qwen2Config(
            **COMMON,
            intermediate_size=96,
            num_attention_heads=4,
            num_key_value_heads=2,
            use_sliding_window=True,
            sliding_window=8,
            max_window_layers=2,  # layers 2 and 3 slide, 0 and 1 see everything
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        ),
    ),
    dict(
        name="qwen3",
        base_seed=10000,
        router="none",
        layouts={"fp32": ("single", None), "bf16": ("single", None)},
        config=lambda: Qwen3Config(
            **{**COMMON, "tie_word_embeddings": True},
            intermediate_size=96,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            attention_bias=False,
            use_sliding_window=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
]


# ----------------------------------------------------------------------------------------------
# helpers


# The digest of every other file under OUT, one line.
TREE_FILE = "TREE.sha256"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def safetensors_header(path: Path) -> dict:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def make_prompts() -> dict[int, torch.Tensor]:
    g = torch.Generator().manual_seed(PROMPT_SEED)
    return {t: torch.randint(0, VOCAB, (t,), generator=g, dtype=torch.int64) for t in PROMPT_LENS}


def init_weights(
    model: torch.nn.Module, seed: int, router_kind: str, zero_centred: bool = False, xw: bool = False
) -> None:
    """Deterministically overwrite every parameter (and the DeepSeek score bias buffer)."""
    g = torch.Generator().manual_seed(seed)
    router_gain = ROUTER_GAIN_SIGMOID if router_kind in ("deepseek", "minimax", "step3p7") else ROUTER_GAIN_SOFTMAX
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in sorted(params):
            p = params[name]
            z = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if zero_centred and name.endswith("norm.weight") and "linear_attn" not in name:
                v = NORM_JITTER * z  # Qwen3-Next's zero-centred norms scale by 1 + w
            elif name.endswith("norm.weight") or re.search(r"norm\.\d+\.weight$", name):
                # every RMSNorm incl. q/k norms, MLA latent norms and LongCat's per-sublayer norms
                v = 1.0 + NORM_JITTER * z
            elif name.endswith("rotary_emb.alpha"):  # Mistral Large 4's learned frequency factors
                v = 0.3 * z
            elif name.endswith("softmax_scaling.scale"):  # query factor scale·ln(pos + 1) + bias
                v = 0.15 * z
            elif name.endswith("softmax_scaling.bias"):
                v = 1.0 + 0.1 * z
            elif re.search(r"(attn_hc|ffn_hc|hc_head)\.(hc_)?scale$", name):  # hyper-connection gains
                v = 1.0 + 0.1 * z
            elif re.search(r"(attn_hc|ffn_hc|hc_head)\.(hc_)?base$", name):
                v = 0.5 * z
            elif name.endswith("A_log") or name.endswith("dt_bias"):  # Gated DeltaNet's decay
                v = 0.5 * z
            elif name.endswith(".sinks"):  # per-head attention sink logits
                v = z
            elif any(m in name for m in ("vision_model", "vision_tower", "multi_modal_projector", "model.visual.")):
                # not read by sluice
                v = 0.02 * z
            elif name in ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight"):
                v = EMBED_STD * z
            elif name == "lm_head.weight":
                v = z * (LM_HEAD_GAIN / p.shape[-1] ** 0.5)
            elif (
                name.endswith("mlp.gate.weight")
                or name.endswith("feed_forward.router.weight")
                or name.endswith("router.classifier.weight")
            ):  # the router
                v = z * (router_gain / p.shape[-1] ** 0.5)
            elif xw and p.dim() == 3:  # fused experts in the x @ W layout: [E, in, out]
                v = z / p.shape[-2] ** 0.5
            elif name.endswith("e_score_correction_bias"):  # ERNIE keeps it as a parameter
                v = SOFTMAX_E_BIAS_STD * z
            elif name.endswith(".bias"):
                v = BIAS_STD * z
            elif p.dim() >= 2:  # linear / fused expert weights, [.., out, in]
                v = z / p.shape[-1] ** 0.5
            else:
                raise RuntimeError(f"no init rule for {name} {tuple(p.shape)}")
            p.copy_(v.to(p.dtype))
        buffers = dict(model.named_buffers())
        for name in sorted(buffers):
            if name.endswith("tid2eid"):  # DeepSeek-V4's hash routing: distinct experts per token
                b = buffers[name]
                e = model.config.n_routed_experts
                rows = [torch.randperm(e, generator=g)[: b.shape[1]] for _ in range(b.shape[0])]
                b.copy_(torch.stack(rows).to(b.dtype))
            elif name.endswith("e_score_correction_bias"):
                b = buffers[name]
                # LongCat adds it to softmax probabilities, as ERNIE does
                std = SOFTMAX_E_BIAS_STD if router_kind == "longcat" else E_BIAS_STD
                b.copy_(std * torch.randn(b.shape, generator=g, dtype=torch.float32))


def chmod_tree(d: Path) -> None:
    for p in sorted(d.rglob("*")):
        os.chmod(p, 0o755 if p.is_dir() else 0o644)


# ----------------------------------------------------------------------------------------------
# checkpoint layouts


LAYER_PREFIX = "model.layers."
# Mistral's own names, which transformers writes for Mistral Large 4: `layers.{l}.…` at the root.
LAYER_RE = re.compile(r"^(?:model\.(?:language_model\.)?)?layers\.(\d+)\.")


def layer_of(name: str) -> int | None:
    m = LAYER_RE.match(name)
    return int(m.group(1)) if m else None


def write_by_layer(src_dir: Path, dst: Path) -> None:
    """Shard like real releases: embeddings + layer 0 in shard 1, one layer per shard, final norm
    + lm_head with the last layer. Tensor names are exactly what save_pretrained wrote."""
    tensors = {}
    for f in sorted(src_dir.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    n_layers = 1 + max(layer_of(k) for k in tensors if layer_of(k) is not None)
    groups: list[dict[str, torch.Tensor]] = [dict() for _ in range(n_layers)]
    for k, v in tensors.items():
        li = layer_of(k)
        if li is None:
            li = 0 if k.startswith("model.embed_tokens") else n_layers - 1
        groups[li][k] = v.contiguous()
    weight_map = {}
    total = 0
    for i, grp in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{n_layers:05d}.safetensors"
        save_file(grp, str(dst / fname), metadata={"format": "pt"})
        for k, v in grp.items():
            weight_map[k] = fname
            total += v.numel() * v.element_size()
    index = {
        "metadata": {"total_size": total},
        "weight_map": dict(sorted(weight_map.items())),
    }
    (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    for extra in ("config.json", "generation_config.json"):
        if (src_dir / extra).exists():
            shutil.copyfile(src_dir / extra, dst / extra)


MTP_SOURCE_LAYER = 2  # deepseek_v4's sliding, learned-routed layer


def add_deepseek_v4_mtp(dst: Path, seed: int) -> None:
    """DeepSeek-V4 checkpoints carry a multi-token-prediction layer that transformers does not
    instantiate (`_keys_to_ignore_on_load_unexpected = mtp.*`), so the reference is unchanged.
    Write one under the released V4-Flash names (`mtp.0.*`: a block like the model's, its
    attention sliding and its routing learned, plus `e_proj`, `h_proj`, `enorm`, `hnorm`, `norm`
    and the hyper head `hc_head_{fn,base,scale}`): layer 2's block, perturbed, and a seeded
    head. A single-file checkpoint gets them in its file; a sharded one in a shard of their
    own, as the release has them."""
    cfg = json.loads((dst / "config.json").read_text())
    h, hc = cfg["hidden_size"], cfg["hc_mult"]
    index = dst / "model.safetensors.index.json"
    if index.exists():
        idx = json.loads(index.read_text())
        files = sorted(set(idx["weight_map"].values()))
    else:
        idx, files = None, ["model.safetensors"]
    src = {}
    for f in files:
        src.update(load_file(str(dst / f)))
    # the projections in the checkpoint's dtype, the norms in its norms' (f32 in the bf16 one)
    dtype = src["model.layers.0.attn.wq_a.weight"].dtype
    norm_dtype = src["model.norm.weight"].dtype
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=0.02, offset=0.0):
        return (offset + scale * torch.randn(shape, generator=g)).to(dtype)

    stem = f"model.layers.{MTP_SOURCE_LAYER}."
    mtp = {}
    for k in sorted(src):
        if k.startswith(stem):
            v = src[k]
            if v.is_floating_point():
                v = (v.float() * (1.0 + 0.1 * torch.randn(v.shape, generator=g))).to(v.dtype)
            mtp["mtp.0." + k[len(stem):]] = v.contiguous()
    assert any(".ffn.gate.bias" in k for k in mtp) and not any("tid2eid" in k for k in mtp)
    assert not any("compressor" in k for k in mtp), "the MTP layer attends over the window only"
    mtp["mtp.0.e_proj.weight"] = rnd(h, h)
    mtp["mtp.0.h_proj.weight"] = rnd(h, h)
    for n in ("enorm", "hnorm", "norm"):
        mtp[f"mtp.0.{n}.weight"] = rnd(h, scale=0.1, offset=1.0).to(norm_dtype)
    # the hyper head keeps f32, as the release's `hc_*` do
    mtp["mtp.0.hc_head_fn"] = rnd(hc, hc * h).float()
    mtp["mtp.0.hc_head_base"] = rnd(hc, scale=0.5).float()
    mtp["mtp.0.hc_head_scale"] = rnd(1, scale=0.1, offset=1.0).float()
    if idx is None:
        src.update(mtp)
        save_file(src, str(dst / "model.safetensors"), metadata={"format": "pt"})
    else:
        save_file(mtp, str(dst / "mtp.safetensors"), metadata={"format": "pt"})
        for k, v in mtp.items():
            idx["weight_map"][k] = "mtp.safetensors"
            idx["metadata"]["total_size"] += v.numel() * v.element_size()
        idx["weight_map"] = dict(sorted(idx["weight_map"].items()))
        index.write_text(json.dumps(idx, indent=2) + "\n")


def save_layout(model, dst: Path, layout: str, shard: str | None, hf_fp32_dir: Path) -> None:
    dst.mkdir(parents=True)
    if layout == "single":
        model.save_pretrained(dst, max_shard_size="1GB")
        assert (dst / "model.safetensors").exists()
    elif layout == "hf_sharded":
        model.save_pretrained(dst, max_shard_size=shard)
        assert (dst / "model.safetensors.index.json").exists()
        facts = layout_facts(dst)
        # (experts stacked per projection have no per-expert tensors to scatter)
        assert facts["experts_total"] == 0 or facts["experts_split_across_shards"] > 0, "no expert was scattered"
    elif layout == "by_layer":
        assert model is None or model.dtype == torch.float32
        write_by_layer(hf_fp32_dir, dst)
        facts = layout_facts(dst)
        assert facts["experts_split_across_shards"] == 0 and facts["experts_not_adjacent_within_a_shard"] == 0
    else:
        raise ValueError(layout)
    chmod_tree(dst)


EXPERT_KEY = ".experts."


def expert_of(name: str):
    """(layer, expert) for a per-expert tensor name, else None."""
    if EXPERT_KEY not in name or layer_of(name) is None:
        return None
    rest = name.split(EXPERT_KEY, 1)[1].split(".", 1)[0]
    if not rest.isdigit():  # experts fused per layer (`experts.gate_up_proj`)
        return None
    return layer_of(name), int(rest)


def layout_facts(d: Path) -> dict:
    """Which shard holds what; whether each expert's tensors are adjacent in one file."""
    files = sorted(p for p in d.glob("*.safetensors") if p.name != "reference.safetensors")
    where: dict[tuple, set] = {}
    dtypes: dict[str, int] = {}
    f32_in_bf16 = []
    non_adjacent = []
    for f in files:
        hdr = safetensors_header(f)
        hdr.pop("__metadata__", None)
        order = sorted(hdr, key=lambda k: hdr[k]["data_offsets"][0])
        for k in order:
            dtypes[hdr[k]["dtype"]] = dtypes.get(hdr[k]["dtype"], 0) + 1
            if hdr[k]["dtype"] == "F32" and "bf16" in d.name:
                f32_in_bf16.append(k)
            e = expert_of(k)
            if e is not None:
                where.setdefault(e, set()).add(f.name)
        # adjacency: positions of each expert's tensors within this file must be consecutive
        pos: dict[tuple, list[int]] = {}
        for i, k in enumerate(order):
            e = expert_of(k)
            if e is not None:
                pos.setdefault(e, []).append(i)
        for e, ps in pos.items():
            if ps != list(range(ps[0], ps[0] + len(ps))):
                non_adjacent.append(f"{f.name}:layer{e[0]}.expert{e[1]}")
    scattered = sorted(f"layer{l}.expert{e}" for (l, e), s in where.items() if len(s) > 1)
    scattered_detail = {
        f"layer{l}.expert{e}": sorted(s) for (l, e), s in sorted(where.items()) if len(s) > 1
    }
    return {
        "shards": len(files),
        "tensor_dtypes": dict(sorted(dtypes.items())),
        "f32_tensors_in_bf16_checkpoint": sorted(f32_in_bf16),
        "experts_split_across_shards": len(scattered),
        "experts_total": len(where),
        "max_shards_per_expert": max((len(s) for s in where.values()), default=0),
        "example_split_expert": (
            {scattered[0]: scattered_detail[scattered[0]]} if scattered else None
        ),
        "experts_not_adjacent_within_a_shard": len(non_adjacent),
    }


# ----------------------------------------------------------------------------------------------
# routing: capture with hooks, recompute independently, measure margins


class RouterTap:
    """Forward hooks on every router module; records (layer, input, outputs) per call."""

    def __init__(self, model):
        self.calls: list[tuple[int, torch.Tensor, tuple]] = []
        self.routers = {}
        self.blocks = {}
        self.handles = []
        inner = model.model
        layers = inner.layers if hasattr(inner, "layers") else inner.language_model.layers
        for li, layer in enumerate(layers):
            block = getattr(layer, "mlp", None) or getattr(layer, "feed_forward", None)
            gate = getattr(block, "gate", None) or getattr(block, "router", None)
            if gate is not None and type(gate).__name__.endswith("Router"):
                # LongCat's layers are two sublayers each, and sluice numbers the sublayers:
                # the MoE runs in the first.
                key = 2 * li if type(layer).__name__ == "LongcatFlashDecoderLayer" else li
                self.routers[key] = gate
                self.blocks[key] = block
                # Step-3.7 scales the routed sum after it; sluice scales each weight (the same
                # product), so the recorded weights carry the factor.
                scale = getattr(block, "routed_scaling_factor", 1.0) if "Step3p7" in type(gate).__name__ else 1.0
                self.handles.append(gate.register_forward_hook(self._hook(key, scale)))

    def _hook(self, li, scale=1.0):
        def fn(module, args, out):
            out = tuple(o.detach().clone() for o in out)
            if scale != 1.0:
                out = (out[0], out[1] * scale, out[2])
            if type(module).__name__ == "Llama4Router":
                # (scores, logits): the top-k ids of the logits and their sigmoid scores
                scores, logits = out
                ids = logits.float().topk(module.top_k, dim=-1).indices
                out = (logits, scores.gather(1, ids), ids)
            # DeepSeek-V4's hash router also takes the token ids.
            module._sluice_ids = args[1].detach().clone() if len(args) > 1 else None
            self.calls.append((li, args[0].detach().clone(), out))

        return fn

    def take(self):
        c, self.calls = self.calls, []
        return c


class IndexerTap:
    """The gap between the k-th and the (k+1)-th score of every top-k a sparse-attention
    indexer takes over more than k visible positions (DeepSeek-V3.2): the scores its
    `Tensor.topk` call sees, recorded while an indexer runs."""

    def __init__(self, model):
        self.min_gap = float("inf")
        self.selections = 0
        self.handles = []
        self.active = False
        for m in model.modules():
            if type(m).__name__.endswith("Indexer"):
                self.handles.append(m.register_forward_pre_hook(self._enter))
                self.handles.append(m.register_forward_hook(self._leave))
        self.orig = torch.Tensor.topk
        if self.handles:
            tap = self

            def topk(t, k, *a, **kw):
                if tap.active:
                    tap._record(t, k)
                return tap.orig(t, k, *a, **kw)

            torch.Tensor.topk = topk

    def _enter(self, *_):
        self.active = True

    def _leave(self, *_):
        self.active = False

    def _record(self, scores, k):
        if scores.numel() == 0:  # GLM-5.3's pooled indexer before its first complete pool
            return
        s = scores.float().reshape(-1, scores.shape[-1])
        visible = (s > -1e30).sum(-1)
        srt = s.sort(dim=-1, descending=True).values
        for row, n in zip(srt, visible.tolist()):
            if n > k:
                self.min_gap = min(self.min_gap, float(row[k - 1] - row[k]))
                self.selections += 1

    def remove(self):
        for h in self.handles:
            h.remove()
        torch.Tensor.topk = self.orig


def group_select(choice, g: int, tg: int, k: int):
    """DeepSeek's group-limited top-k of `choice` [T, E]: groups ranked by the sum of their two
    best, the best `tg` groups kept, the top `k` of their experts; (ids, expert gap, group gap)."""
    t, e = choice.shape
    gs = choice.view(t, g, e // g).topk(2, dim=-1).values.sum(-1)
    gs_sorted = gs.sort(dim=-1, descending=True).values
    ggap = gs_sorted[:, tg - 1] - gs_sorted[:, tg] if tg < g else None
    gidx = gs.topk(tg, dim=-1).indices
    gmask = torch.zeros_like(gs).scatter_(1, gidx, 1.0).bool()
    emask = gmask.unsqueeze(-1).expand(t, g, e // g).reshape(t, e)
    masked = choice.masked_fill(~emask, float("-inf"))
    ms = masked.sort(dim=-1, descending=True).values
    egap = ms[:, k - 1] - ms[:, k]
    return masked.topk(k, dim=-1).indices, egap, ggap


def recompute_route(kind: str, module, cfg, logits: torch.Tensor, block=None):
    """Independent re-derivation of each router from the modeling code; returns
    (ids [T,k] unsorted, weights [T,k], expert_gap [T], group_gap [T] or None, ids_without_bias)."""
    k = cfg.num_experts_per_tok
    logits = logits.float()
    if kind == "minimax":
        # sigmoid scores, a selection-only bias on the MoE block, renormalised top-k
        s = torch.sigmoid(logits)
        choice = s + block.e_score_correction_bias.float()
        cs = choice.sort(dim=-1, descending=True).values
        egap = cs[:, k - 1] - cs[:, k]
        ids = choice.topk(k, dim=-1).indices
        ids_nobias = s.topk(k, dim=-1).indices
        w = s.gather(1, ids)
        w = w / w.sum(-1, keepdim=True)
        return ids, w, egap, None, ids_nobias
    if kind == "step3p7":
        # sigmoid scores, a selection-only bias on the router, renormalised, then the scaling
        s = torch.sigmoid(logits)
        choice = s + module.e_score_correction_bias.float()
        cs = choice.sort(dim=-1, descending=True).values
        egap = cs[:, k - 1] - cs[:, k]
        ids = choice.topk(k, dim=-1).indices
        ids_nobias = s.topk(k, dim=-1).indices
        w = s.gather(1, ids)
        w = w / w.sum(-1, keepdim=True) * cfg.moe_router_scaling_factor
        return ids, w, egap, None, ids_nobias
    if kind == "llama4":
        # top-k of the logits, each weighted by its sigmoid (it scales the expert's input)
        srt = logits.sort(dim=-1, descending=True).values
        egap = srt[:, k - 1] - srt[:, k]
        top = logits.topk(k, dim=-1)
        return top.indices, torch.sigmoid(top.values), egap, None, top.indices
    if kind == "ernie":
        # softmax probabilities, a selection-only bias, renormalised with a clamped divisor
        probs = torch.softmax(logits, dim=-1)
        choice = probs + module.moe_statics.e_score_correction_bias.float().squeeze()
        cs = choice.sort(dim=-1, descending=True).values
        egap = cs[:, k - 1] - cs[:, k]
        ids = choice.topk(k, dim=-1).indices
        ids_nobias = probs.topk(k, dim=-1).indices
        w = probs.gather(1, ids)
        w = w / torch.clamp(w.sum(-1, keepdim=True), min=cfg.moe_norm_min)
        return ids, w, egap, None, ids_nobias
    if kind == "longcat":
        # softmax over routed + zero experts, a selection-only bias, weights scaled, no renorm
        probs = torch.softmax(logits, dim=-1)
        choice = probs + module.e_score_correction_bias.float()
        cs = choice.sort(dim=-1, descending=True).values
        egap = cs[:, k - 1] - cs[:, k]
        ids = choice.topk(k, dim=-1).indices
        ids_nobias = probs.topk(k, dim=-1).indices
        w = probs.gather(1, ids) * cfg.routed_scaling_factor
        return ids, w, egap, None, ids_nobias
    if kind == "deepseek_v4":
        # sqrt(softplus) scores; hash-routed layers take the token's row of tid2eid, the others
        # the top-k of scores plus the selection bias; renormalised, then scaled
        s = torch.nn.functional.softplus(logits).sqrt()
        if hasattr(module, "tid2eid"):
            ids = module.tid2eid[module._sluice_ids.reshape(-1)].long()
            egap = torch.full((ids.shape[0],), float("inf"))
            ids_nobias = ids
        else:
            choice = s + module.e_score_correction_bias.float()
            cs = choice.sort(dim=-1, descending=True).values
            egap = cs[:, k - 1] - cs[:, k]
            ids = choice.topk(k, dim=-1).indices
            ids_nobias = s.topk(k, dim=-1).indices
        w = s.gather(1, ids)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * cfg.routed_scaling_factor
        return ids, w, egap, None, ids_nobias
    if kind == "mistral":
        # softmax probabilities, DeepSeek's group-limited top-k without a bias, always
        # renormalised, then scaled
        p = torch.softmax(logits, dim=-1)
        ids, egap, ggap = group_select(p, cfg.n_group, cfg.topk_group, k)
        w = p.gather(1, ids)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * cfg.routed_scaling_factor
        return ids, w, egap, ggap, ids
    if kind == "deepseek":
        s = torch.sigmoid(logits)
        bias = module.e_score_correction_bias.float()

        ids, egap, ggap = group_select(s + bias, cfg.n_group, cfg.topk_group, k)
        ids_nobias, _, _ = group_select(s, cfg.n_group, cfg.topk_group, k)
        w = s.gather(1, ids)
        if cfg.norm_topk_prob:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        w = w * cfg.routed_scaling_factor
        return ids, w, egap, ggap, ids_nobias
    probs = torch.softmax(logits, dim=-1)
    ps = probs.sort(dim=-1, descending=True).values
    egap = ps[:, k - 1] - ps[:, k]
    ids = probs.topk(k, dim=-1).indices
    w = probs.gather(1, ids)
    if kind == "softmax_renorm" or (kind == "softmax" and cfg.norm_topk_prob):
        w = w / w.sum(-1, keepdim=True)
    return ids, w, egap, None, ids


def check_routes(kind, tap, cfg, calls, seq_len):
    """Verify hook outputs against the re-derivation; return per-layer sorted ids/weights and
    the smallest gaps."""
    per_layer = {}
    min_e, min_g = float("inf"), float("inf")
    changed_by_bias = 0
    decisions = 0
    for li, _inp, out in calls:
        logits, weights, ids = out[0], out[1], out[2]
        assert ids.shape == (seq_len, cfg.num_experts_per_tok), (li, ids.shape)
        rid, rw, egap, ggap, ids_nb = recompute_route(kind, tap.routers[li], cfg, logits, tap.blocks[li])
        hs, horder = ids.sort(dim=-1)
        rs, rorder = rid.sort(dim=-1)
        assert torch.equal(hs, rs), f"layer {li}: expert sets differ from re-derivation"
        hw = weights.float().gather(1, horder)
        rw_sorted = rw.gather(1, rorder)
        assert torch.allclose(hw, rw_sorted, rtol=1e-6, atol=1e-7), f"layer {li}: weights differ"
        changed_by_bias += int((ids_nb.sort(-1).values != rs).any(-1).sum())
        decisions += seq_len
        assert li not in per_layer, "router called twice in one forward"
        per_layer[li] = (hs.to(torch.int64), hw.to(torch.float32))
        min_e = min(min_e, float(egap.min()))
        if ggap is not None:
            min_g = min(min_g, float(ggap.min()))
    return per_layer, min_e, min_g, changed_by_bias, decisions


# ----------------------------------------------------------------------------------------------
# reference run


# Families transformers runs only as their multimodal model (no causal-LM class of the text
# model): the fixture is that checkpoint, and the reference its text-only forward.
MULTIMODAL_ONLY = {"step3p7", "mistral_large4", "glm5_next"}


def auto_class(model_type: str):
    return AutoModelForImageTextToText if model_type in MULTIMODAL_ONLY else AutoModelForCausalLM


def load_for_reference(d: Path, variant: str):
    kw = dict(attn_implementation="eager", experts_implementation="eager")
    auto = auto_class(json.loads((d / "config.json").read_text())["model_type"])
    if variant == "fp32":
        m = auto.from_pretrained(d, dtype=torch.float32, **kw)
    else:  # bf16 weights, fp32 arithmetic
        m = auto.from_pretrained(d, dtype=torch.bfloat16, **kw).float()
    m.eval()
    m.config.eos_token_id = None
    m.generation_config.eos_token_id = None
    m.generation_config.pad_token_id = None
    m.generation_config.bos_token_id = None
    return m


@torch.no_grad()
def run_reference(d: Path, variant: str, kind: str, prompts, expected_state: dict):
    model = load_for_reference(d, variant)
    cfg = model.config.get_text_config()  # a multimodal model's text config
    # The weights read back from disk must be the ones we initialised (rounded for bf16).
    sd = model.state_dict()
    for k, v in expected_state.items():
        got = sd[k]
        want = v if variant == "fp32" else v.to(torch.bfloat16).float()
        if not torch.equal(got, want) and not (variant == "bf16" and torch.equal(got, v)):
            raise AssertionError(f"{d.name}: {k} differs after reload")
    tap = RouterTap(model)
    itap = IndexerTap(model)
    tensors: dict[str, torch.Tensor] = {}
    stats = dict(min_expert_gap=float("inf"), min_group_gap=float("inf"), bias_changed=0, decisions=0)

    def absorb(calls, seq_len, prefix):
        per_layer, me, mg, bc, nd = check_routes(kind, tap, cfg, calls, seq_len)
        stats["min_expert_gap"] = min(stats["min_expert_gap"], me)
        stats["min_group_gap"] = min(stats["min_group_gap"], mg)
        stats["bias_changed"] += bc
        stats["decisions"] += nd
        if prefix is not None:
            for li, (ids, w) in sorted(per_layer.items()):
                tensors[f"{prefix}.layer{li}.experts"] = ids.contiguous()
                tensors[f"{prefix}.layer{li}.weights"] = w.contiguous()
        return per_layer

    max_abs_logit = 0.0
    for t, ids in prompts.items():
        tap.take()
        out = model(input_ids=ids[None], use_cache=False)
        logits = out.logits[0].float()
        assert logits.shape == (t, VOCAB)
        tensors[f"prompt{t}.ids"] = ids.clone()
        tensors[f"prompt{t}.logits"] = logits.contiguous()
        max_abs_logit = max(max_abs_logit, float(logits.abs().max()))
        absorb(tap.take(), t, f"prompt{t}")

    # greedy generation with the KV cache
    p = prompts[GREEDY_PROMPT_LEN]
    tap.take()
    gen = model.generate(
        input_ids=p[None],
        attention_mask=torch.ones_like(p)[None],
        do_sample=False,
        max_new_tokens=GREEDY_NEW,
        min_new_tokens=GREEDY_NEW,
        output_logits=True,
        return_dict_in_generate=True,
        use_cache=True,
    )
    tap.take()
    seq = gen.sequences[0]
    new = seq[GREEDY_PROMPT_LEN:]
    assert new.numel() == GREEDY_NEW, f"generated {new.numel()} tokens"
    step_logits = torch.stack([l[0] for l in gen.logits]).float()
    assert step_logits.shape == (GREEDY_NEW, VOCAB)
    assert torch.equal(step_logits.argmax(-1), new), "greedy token != argmax of its logits"
    top2 = step_logits.topk(2, dim=-1).values
    gaps = top2[:, 0] - top2[:, 1]
    rel = gaps / step_logits.abs().max(-1).values
    # full no-cache forward over prompt + generated tokens must agree with the cached logits
    full = model(input_ids=seq[None], use_cache=False).logits[0].float()
    cached_vs_full = float(
        (full[GREEDY_PROMPT_LEN - 1 : GREEDY_PROMPT_LEN - 1 + GREEDY_NEW] - step_logits).abs().max()
    )
    absorb(tap.take(), seq.numel(), None)  # routing margins along the greedy sequence
    max_abs_logit = max(max_abs_logit, float(step_logits.abs().max()))

    tensors["greedy.prompt_ids"] = p.clone()
    tensors["greedy.ids"] = new.to(torch.int64).clone()
    tensors["greedy.step_logits"] = step_logits.contiguous()
    tensors["greedy.margins"] = gaps.contiguous()

    for h in tap.handles:
        h.remove()
    itap.remove()
    res = dict(
        tensors=tensors,
        min_greedy_rel=float(rel.min()),
        min_greedy_abs=float(gaps.min()),
        min_expert_gap=stats["min_expert_gap"],
        min_group_gap=(None if stats["min_group_gap"] == float("inf") else stats["min_group_gap"]),
        bias_changed=stats["bias_changed"],
        decisions=stats["decisions"],
        max_abs_logit=max_abs_logit,
        cached_vs_full=cached_vs_full,
        moe_layers=sorted(tap.routers),
        top_k=getattr(cfg, "num_experts_per_tok", None),
        min_index_gap=None if itap.min_gap == float("inf") else itap.min_gap,
        index_selections=itap.selections,
    )
    return res


def passes(r) -> bool:
    ok = r["min_greedy_rel"] >= MIN_GREEDY_REL and r["min_expert_gap"] >= MIN_ROUTER_GAP
    if r["min_group_gap"] is not None:
        ok = ok and r["min_group_gap"] >= MIN_ROUTER_GAP
    if r.get("min_index_gap") is not None:
        ok = ok and r["min_index_gap"] >= MIN_ROUTER_GAP
    return ok


# ----------------------------------------------------------------------------------------------


def build_arch(arch, seed: int, prompts, work: Path):
    """Build, save both variants under work/, compute references. Returns (ok, per-variant)."""
    torch.manual_seed(seed)
    cfg = arch["config"]()
    model = auto_class(cfg.model_type).from_config(
        cfg, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    )
    init_weights(model, seed, arch["router"], arch.get("zero_centred_norms", False), arch.get("xw_experts", False))
    model.eval()
    expected = {k: v.detach().clone() for k, v in model.state_dict().items()}
    expected = {k: v for k, v in expected.items() if "rotary_emb" not in k or k.endswith(".alpha")}

    hf_fp32 = work / "hf_fp32"
    model.save_pretrained(hf_fp32, max_shard_size="1GB")
    results = {}
    for variant in ("fp32", "bf16"):
        layout, shard = arch["layouts"][variant]
        dst = work / f"{arch['name']}-{variant}"
        if variant == "fp32":
            save_layout(model if layout != "by_layer" else None, dst, layout, shard, hf_fp32)
        else:
            m16 = auto_class(cfg.model_type).from_pretrained(
                hf_fp32, dtype=torch.bfloat16, attn_implementation="eager", experts_implementation="eager"
            )
            save_layout(m16, dst, layout, shard, hf_fp32)
            del m16
        if arch.get("mtp"):
            arch["mtp"](dst, seed)
            chmod_tree(dst)
        r = run_reference(dst, variant, arch["router"], prompts, expected)
        r["layout"] = layout if shard is None else f"{layout} (max_shard_size={shard})"
        r["dir"] = dst
        results[variant] = r
        if not passes(r):
            return False, results
    return True, results


def check_multimodal(src: Path, dst: Path, run, prompts, model_type: str) -> dict:
    """Copies `src`'s reference to the multimodal checkpoint `dst`, checks that `run(ids)` (the
    multimodal model loaded from `dst`) gives its prompt logits, and returns `dst`'s summary."""
    shutil.copyfile(src / "reference.safetensors", dst / "reference.safetensors")
    ref = load_file(str(dst / "reference.safetensors"))
    worst = 0.0
    for t in PROMPT_LENS:
        got = run(prompts[t][None]).logits[0].float()
        worst = max(worst, float((got - ref[f"prompt{t}.logits"]).abs().max()))
    assert worst < 1e-4, f"{dst.name}: the multimodal checkpoint's logits differ by {worst}"
    chmod_tree(dst)
    return {
        "architecture": f"{model_type} (multimodal checkpoint of {src.name})",
        "model_type": model_type,
        "weights": "bf16",
        "reference": f"{src.name}'s reference.safetensors",
        "multimodal_vs_text_max_abs_logit_diff": worst,
        "layout_facts": layout_facts(dst),
        "files": {
            p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in sorted(dst.iterdir())
        },
    }


@torch.no_grad()
def write_qwen3_5_multimodal(prompts) -> dict:
    """Qwen3.5 as released: the multimodal checkpoint (`qwen3_5_moe`, `text_config`, tensors under
    `model.language_model.`, experts fused as transformers keeps them, a vision tower), holding
    the weights of the `qwen3_5_moe-bf16` text fixture. Its reference is that fixture's: the
    script checks that transformers' multimodal model gives the same prompt logits."""
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    src = OUT / "qwen3_5_moe-bf16"
    dst = OUT / "qwen3_5_moe_multimodal-bf16"
    text = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16, experts_implementation="eager")
    tc = json.loads((src / "config.json").read_text())
    torch.manual_seed(0)
    cfg = Qwen3_5MoeConfig(
        text_config=tc,
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=HIDDEN),
    )
    mm = Qwen3_5MoeForConditionalGeneration(cfg).to(torch.bfloat16)
    mm.model.language_model.load_state_dict(text.model.state_dict())
    mm.lm_head.load_state_dict(text.lm_head.state_dict())
    mm.save_pretrained(dst, max_shard_size="1GB")
    # transformers writes one tensor per expert; also loads (and holds) them fused per layer,
    # `experts.gate_up_proj` [E, 2I, H] and `experts.down_proj` [E, H, I]: store that form, the
    # other one sluice reads.
    tensors = load_file(str(dst / "model.safetensors"))
    fused: dict[str, torch.Tensor] = {}
    layers = 1 + max(
        int(k.split(".")[3]) for k in tensors if k.startswith("model.language_model.layers.")
    )
    for l in range(layers):
        stem = f"model.language_model.layers.{l}.mlp.experts"
        n = sum(1 for k in tensors if k.startswith(f"{stem}.") and k.endswith(".gate_proj.weight"))
        if n == 0:
            continue
        gate_up = [torch.cat([tensors.pop(f"{stem}.{e}.gate_proj.weight"), tensors.pop(f"{stem}.{e}.up_proj.weight")]) for e in range(n)]
        down = [tensors.pop(f"{stem}.{e}.down_proj.weight") for e in range(n)]
        fused[f"{stem}.gate_up_proj"] = torch.stack(gate_up).contiguous()
        fused[f"{stem}.down_proj"] = torch.stack(down).contiguous()
    tensors.update(fused)
    save_file(dict(sorted(tensors.items())), str(dst / "model.safetensors"), metadata={"format": "pt"})
    back = Qwen3_5MoeForConditionalGeneration.from_pretrained(
        dst, dtype=torch.bfloat16, attn_implementation="eager", experts_implementation="eager"
    ).float()
    back.eval()
    return check_multimodal(src, dst, lambda ids: back(input_ids=ids, use_cache=False), prompts, "qwen3_5_moe")


@torch.no_grad()
def write_llama4_multimodal(prompts) -> dict:
    """Llama 4 as released: the multimodal checkpoint (`llama4`, `text_config`, the text model
    under `language_model.`, a vision tower and projector), holding the `llama4-bf16` weights; its
    reference is that fixture's, checked against transformers' multimodal model."""
    from transformers import Llama4Config, Llama4ForConditionalGeneration

    src = OUT / "llama4-bf16"
    dst = OUT / "llama4_multimodal-bf16"
    text = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16, experts_implementation="eager")
    tc = json.loads((src / "config.json").read_text())
    torch.manual_seed(0)
    cfg = Llama4Config(
        text_config=tc,
        vision_config=dict(
            hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            image_size=28, patch_size=14, vision_output_dim=32, projector_input_dim=32,
            projector_output_dim=HIDDEN,
        ),
    )
    mm = Llama4ForConditionalGeneration(cfg).to(torch.bfloat16)
    mm.language_model.load_state_dict(text.state_dict())
    mm.save_pretrained(dst, max_shard_size="1GB")
    back = Llama4ForConditionalGeneration.from_pretrained(
        dst, dtype=torch.bfloat16, attn_implementation="eager", experts_implementation="eager"
    ).float()
    back.eval()
    # transformers 5.24's Llama4ForConditionalGeneration.forward fails on text-only input (it
    # reads `image_outputs` from its language model's output), so the check runs the language
    # model it loaded from the multimodal file.
    return check_multimodal(
        src, dst, lambda ids: back.language_model(input_ids=ids, use_cache=False), prompts, "llama4"
    )


def main() -> int:
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": numpy.__version__,
    }
    print("versions:", " ".join(f"{k}={v}" for k, v in versions.items()))
    prompts = make_prompts()
    # `--only NAME`: regenerate one architecture's fixtures and its summary entries, leaving
    # the others as they are (a full run must give them back byte for byte anyway).
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    archs = [a for a in ARCHS if only is None or a["name"] == only]
    if only is not None and not archs:
        raise SystemExit(f"--only {only}: no such architecture")
    old_models = {}
    if only is not None:
        old_models = json.loads((OUT / "summary.json").read_text())["models"]
        old_models = {k: v for k, v in old_models.items() if v.get("architecture") != only}
    elif OUT.exists():  # everything under testdata/models/ is generated by this script
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True, exist_ok=True)
    summary = {
        "generator": "tools/reference/make_fixtures.py",
        "command": "/work/venv/ref/bin/python tools/reference/make_fixtures.py",
        "versions": versions,
        "thresholds": {"min_greedy_rel": MIN_GREEDY_REL, "min_router_gap": MIN_ROUTER_GAP},
        "prompt_seed": PROMPT_SEED,
        "models": {},
    }
    rows = []
    with tempfile.TemporaryDirectory(prefix="sluice-ref-") as tmp:
        for arch in archs:
            rejected = []
            for seed in range(arch["base_seed"], arch["base_seed"] + MAX_SEED_TRIES):
                work = Path(tmp) / f"{arch['name']}-{seed}"
                work.mkdir()
                ok, results = build_arch(arch, seed, prompts, work)
                if ok:
                    break
                bad = {
                    v: {k: r.get(k) for k in ("min_greedy_rel", "min_expert_gap", "min_group_gap", "min_index_gap")}
                    for v, r in results.items()
                }
                print(f"  {arch['name']}: seed {seed} rejected {bad}")
                rejected.append(seed)
                shutil.rmtree(work)
            else:
                raise SystemExit(f"{arch['name']}: no seed passed in {MAX_SEED_TRIES} tries")
            for variant, r in results.items():
                name = f"{arch['name']}-{variant}"
                final = OUT / name
                if final.exists():
                    shutil.rmtree(final)
                shutil.copytree(r["dir"], final)
                ref_path = final / "reference.safetensors"
                save_file(
                    dict(sorted(r["tensors"].items())),
                    str(ref_path),
                    # one key only: safetensors writes __metadata__ from a hash map, so several
                    # keys come out in a random order and the file is not byte-reproducible.
                    # Provenance lives in summary.json instead.
                    metadata={"format": "pt"},
                )
                chmod_tree(final)
                facts = layout_facts(final)
                files = {
                    p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
                    for p in sorted(final.iterdir())
                }
                summary["models"][name] = {
                    "architecture": arch["name"],
                    "model_type": json.loads((final / "config.json").read_text())["model_type"],
                    "weights": variant,
                    "compute": "fp32",
                    "seed": seed,
                    "seeds_rejected": rejected,
                    "layout": r["layout"],
                    "layout_facts": facts,
                    "moe_layers": r["moe_layers"],
                    "top_k": r["top_k"],
                    "min_greedy_margin_rel": r["min_greedy_rel"],
                    "min_greedy_margin_abs": r["min_greedy_abs"],
                    "min_router_expert_gap": (
                        None if r["min_expert_gap"] == float("inf") else r["min_expert_gap"]
                    ),
                    "min_router_group_gap": r["min_group_gap"],
                    **(
                        {"min_index_gap": r["min_index_gap"], "index_selections": r["index_selections"]}
                        if r["min_index_gap"] is not None
                        else {}
                    ),
                    "routing_decisions_checked": r["decisions"],
                    "decisions_changed_by_score_bias": (
                        r["bias_changed"]
                        if arch["router"] in ("deepseek", "minimax", "ernie", "longcat", "step3p7")
                        else None
                    ),
                    "max_abs_logit": r["max_abs_logit"],
                    "cached_vs_full_max_abs_diff": r["cached_vs_full"],
                    "versions": versions,
                    "files": files,
                }
                rows.append((name, seed, r, facts))
    if only is None:
        summary["models"]["qwen3_5_moe_multimodal-bf16"] = write_qwen3_5_multimodal(prompts)
        summary["models"]["llama4_multimodal-bf16"] = write_llama4_multimodal(prompts)
    else:
        # the regenerated entries go last (a full run orders them as ARCHS does)
        summary["models"] = {**old_models, **summary["models"]}
    chmod_tree(OUT)
    (OUT / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n")
    os.chmod(OUT / "summary.json", 0o644)

    hdr = (
        f"{'model':<26} {'seed':>5} {'greedy rel':>10} {'greedy abs':>10} {'expert gap':>10} "
        f"{'group gap':>10} {'max|logit|':>10} {'cache diff':>10} {'shards':>6} {'split':>5}"
    )
    print(hdr)
    print("-" * len(hdr))
    for name, seed, r, facts in rows:
        gg = "-" if r["min_group_gap"] is None else f"{r['min_group_gap']:.3g}"
        eg = "-" if r["min_expert_gap"] == float("inf") else f"{r['min_expert_gap']:.3g}"
        print(
            f"{name:<26} {seed:>5} {r['min_greedy_rel']:>10.3g} {r['min_greedy_abs']:>10.3g} "
            f"{eg:>10} {gg:>10} {r['max_abs_logit']:>10.3g} "
            f"{r['cached_vs_full']:>10.2g} {facts['shards']:>6} {facts['experts_split_across_shards']:>5}"
        )
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    tree = hashlib.sha256()
    for p in sorted(OUT.rglob("*")):
        if p.is_file() and p != OUT / TREE_FILE:
            tree.update(f"{p.relative_to(OUT)} {sha256_file(p)}\n".encode())
    # Kept beside the files (and left out of the digest) so that a new fixture changes nothing
    # outside testdata/.
    (OUT / TREE_FILE).write_text(tree.hexdigest() + "\n")
    print(f"total size {total / 1e6:.2f} MB; tree sha256 {tree.hexdigest()} (in {OUT / TREE_FILE})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
