"""Train a multi-token-prediction (MTP) layer for the demo model, the model itself frozen.

Usage (from the repository root, after fetch_data.sh; see README.md in this folder):
    nice -n 10 /work/venv/ref/bin/python tools/demo-model/train_mtp.py DATA_DIR WORK_DIR models/demo

The layer is DeepSeek-V3's (the paper's section 2.2, as vLLM's `DeepSeekMultiTokenPredictor`
runs it): at position i, the model's final-normed hidden state h_i and the embedding of token
i + 1 (zero at position 0, as vLLM does) are RMS-normed (`hnorm`, `enorm`), concatenated
(embedding first), projected by `eh_proj`, run through one decoder layer of the model's own
kind (MLA attention over the MTP positions, the MoE), normed by `shared_head.norm` and projected
by the model's lm_head: logits for token i + 2. The embedding and the head are the model's,
frozen; DeepSeek's checkpoints ship copies of them in the layer (`embed_tokens`,
`shared_head.head`), which are left out here (sluice uses the model's own either way). The
block starts from a copy of the model's last layer. The loss is distilled: cross-entropy
against the model's own distribution of token i + 2 (a greedy draft is kept when it is the
model's choice), not the text's token.

Writes into MODEL_DIR (after training; the model's own tensors are not touched):
`mtp.safetensors` (the layer as `model.layers.{N}.*`, N = num_hidden_layers, BF16 like the
model), `model.safetensors.index.json` (both shards), and `num_nextn_predict_layers: 1` in
`config.json`; and `mtp_summary.json` into WORK_DIR. Deterministic: fixed seeds, 2 threads.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import DeepseekV3ForCausalLM
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RMSNorm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train import Batches  # noqa: E402

SEED = 20261205


class Windows(Batches):
    """`train.py`'s windows, picked from one generator across the run."""

    def batch(self, g, size):
        pick = torch.randint(len(self.starts), (size,), generator=g)
        return torch.stack([self.window(int(self.starts[i])) for i in pick])


class Mtp(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        cfg = model.config
        h = cfg.hidden_size
        self.enorm = DeepseekV3RMSNorm(h, eps=cfg.rms_norm_eps)
        self.hnorm = DeepseekV3RMSNorm(h, eps=cfg.rms_norm_eps)
        self.eh_proj = torch.nn.Linear(2 * h, h, bias=False)
        with torch.no_grad():
            # Start as "the hidden state passes through": [0 | I] plus a little of the embedding.
            w = torch.zeros(h, 2 * h)
            w[:, h:] = torch.eye(h)
            w[:, :h] = torch.randn(h, h) * 0.02
            self.eh_proj.weight.copy_(w)
        self.block = copy.deepcopy(model.model.layers[-1])
        self.norm = copy.deepcopy(model.model.norm)
        self.model = [model]  # not a submodule: frozen, not saved

    def forward(self, x, hidden):
        m = self.model[0]
        emb = m.model.embed_tokens(x[:, 1:])
        emb[:, 0] = 0  # MTP position 0 (vLLM zeroes its embedding)
        inp = self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(hidden[:, :-1])], dim=-1))
        t = inp.shape[1]
        pos = torch.arange(t)[None].expand(inp.shape[0], -1)
        rope = m.model.rotary_emb(inp, pos)
        mask = torch.full((t, t), torch.finfo(inp.dtype).min).triu(1)[None, None]
        out = self.block(inp, attention_mask=mask, position_ids=pos, position_embeddings=rope)
        out = out[0] if isinstance(out, tuple) else out
        return m.lm_head(self.norm(out))


def losses(mtp, model, x):
    with torch.no_grad():
        hidden = model.model(input_ids=x).last_hidden_state
        teacher = model.lm_head(hidden[:, 1:-1])  # the model's own prediction of token i + 2
        main_pred = teacher.argmax(-1)
    logits = mtp(x, hidden)  # [b, t-1, v]: row i predicts token i + 2
    target = x[:, 2:]
    # Distilled: the draft is accepted when it is what the model itself would pick, so the
    # layer learns the model's distribution there (soft targets), not the text's token.
    v = logits.shape[-1]
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, v),
                           F.softmax(teacher, dim=-1).reshape(-1, v))
    # How often the MTP's guess equals the model's own greedy choice there (what a greedy
    # draft needs), and the text's next token.
    guess = logits[:, :-1].argmax(-1)
    return loss, float((guess == main_pred).float().mean()), float((guess == target).float().mean())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("model", type=Path)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    args.work.mkdir(parents=True, exist_ok=True)

    model = DeepseekV3ForCausalLM.from_pretrained(args.model, dtype=torch.float32,
                                                  attn_implementation="sdpa").eval()
    for p in model.parameters():
        p.requires_grad_(False)
    mtp = Mtp(model)
    mtp.train()
    params = [p for p in mtp.parameters()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    train = Windows(np.load(args.data / "train_ids.npy"), np.load(args.data / "train_starts.npy"), args.seq)
    held = Windows(np.load(args.data / "heldout_ids.npy"), np.load(args.data / "heldout_starts.npy"), args.seq)
    g = torch.Generator().manual_seed(SEED)
    t0 = time.time()
    log = []
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / 20) * (1 - 0.9 * step / args.steps)
        for grp in opt.param_groups:
            grp["lr"] = lr
        x = train.batch(g, args.batch)
        loss, agree, right = losses(mtp, model, x)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        log.append((step, float(loss), agree, right))
        if step % 10 == 0:
            print(f"step {step} loss {float(loss):.3f} agree {agree:.3f} right {right:.3f} "
                  f"{time.time() - t0:.0f}s", flush=True)
    mtp.eval()
    hg = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        ev = [losses(mtp, model, held.batch(hg, 16)) for _ in range(8)]
    summary = dict(
        steps=args.steps, batch=args.batch, seq=args.seq, lr=args.lr, seconds=time.time() - t0,
        heldout_loss=sum(float(e[0]) for e in ev) / len(ev),
        heldout_agree_with_model_greedy=sum(e[1] for e in ev) / len(ev),
        heldout_next_next_token=sum(e[2] for e in ev) / len(ev),
    )
    print(summary, flush=True)
    (args.work / "mtp_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (args.work / "mtp_loss.json").write_text(json.dumps(log) + "\n")

    # Export under DeepSeek-V3's names: the block through save_pretrained (transformers' own
    # naming of experts), the rest by hand, BF16 like the model.
    n = model.config.num_hidden_layers
    with tempfile.TemporaryDirectory() as tmp:
        other = copy.deepcopy(model)
        other.model.layers[n - 1] = mtp.block
        other.to(torch.bfloat16).save_pretrained(tmp)
        files = sorted(Path(tmp).glob("*.safetensors"))
        block = {}
        for f in files:
            with safe_open(str(f), "pt") as s:
                for k in s.keys():
                    pre = f"model.layers.{n - 1}."
                    if k.startswith(pre):
                        block[f"model.layers.{n}." + k[len(pre):]] = s.get_tensor(k)
    with safe_open(str(args.model / "model.safetensors"), "pt") as s:
        gate_dtype = s.get_tensor(f"model.layers.{n - 1}.mlp.gate.weight").dtype
        bias_dtype = s.get_tensor(f"model.layers.{n - 1}.mlp.gate.e_score_correction_bias").dtype
    # The router stays as the model stores it (f32).
    block[f"model.layers.{n}.mlp.gate.weight"] = mtp.block.mlp.gate.weight.detach().to(gate_dtype)
    block[f"model.layers.{n}.mlp.gate.e_score_correction_bias"] = (
        mtp.block.mlp.gate.e_score_correction_bias.detach().to(bias_dtype))
    bf = lambda t: t.detach().to(torch.bfloat16).contiguous()  # noqa: E731
    pre = f"model.layers.{n}."
    out = {k: v.contiguous() for k, v in block.items()}
    out[pre + "eh_proj.weight"] = bf(mtp.eh_proj.weight)
    out[pre + "enorm.weight"] = bf(mtp.enorm.weight)
    out[pre + "hnorm.weight"] = bf(mtp.hnorm.weight)
    out[pre + "shared_head.norm.weight"] = bf(mtp.norm.weight)
    save_file(out, str(args.model / "mtp.safetensors"), metadata={"format": "pt"})
    with safe_open(str(args.model / "model.safetensors"), "pt") as s:
        main_keys = list(s.keys())
    index = {"metadata": {}, "weight_map": {k: "model.safetensors" for k in sorted(main_keys)}}
    index["weight_map"].update({k: "mtp.safetensors" for k in sorted(out)})
    index["weight_map"] = dict(sorted(index["weight_map"].items()))
    (args.model / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    cfg = json.loads((args.model / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 1
    (args.model / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for f in ("mtp.safetensors", "model.safetensors.index.json", "config.json"):
        os.chmod(args.model / f, 0o644)
    print(f"wrote {args.model}: {len(out)} MTP tensors", flush=True)


if __name__ == "__main__":
    main()
