"""A 30-layer Mixtral-style checkpoint with SmolLM2-135M's trunk shape (hidden 576, 9 heads and
3 KV heads of 64, vocab 49152) and 4 experts of 1536 per layer, top-2: 5.3 MB per BF16 expert,
about 0.75 GB in all. Random weights (seed 0): for memory-plan and streaming benchmarks only.

    /work/venv/ref/bin/python tools/bench-models/mixtral_smol.py /work/bench-data/mixtral-smol
"""

import sys

import torch
from transformers import MixtralConfig, MixtralForCausalLM

out = sys.argv[1]
torch.manual_seed(0)
cfg = MixtralConfig(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    max_position_embeddings=8192,
    num_local_experts=4,
    num_experts_per_tok=2,
    rope_theta=100000.0,
    tie_word_embeddings=False,
)
model = MixtralForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(out, max_shard_size="1GB")
print(out)
