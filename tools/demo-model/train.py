"""Train sluice's demo model: a small DeepSeek-V3-architecture MoE, on CPU, in under an hour.

Usage (from the repository root; see README.md in this folder for the whole pipeline):
    nice -n 10 /work/venv/ref/bin/python tools/demo-model/train.py DATA_DIR WORK_DIR

DATA_DIR is what prepare_data.py wrote (token streams + tokenizer.json). WORK_DIR receives the
fp32 checkpoint (`final-fp32/`), resumable state (`state.pt`), `loss.csv`, `expert_load.json` and
`train_summary.json`. The bf16 checkpoint under models/demo is written by export.py.

Determinism: fixed seeds, torch.use_deterministic_algorithms(True), 2 threads; the batch of every
step is drawn from a generator seeded by (SEED, step), so a resumed run sees the same data.
"""

import os

# On a shared CPU, OpenMP worker threads that spin while waiting make each step several times
# slower (measured: 19.6 s/step spinning vs 4.6 s/step passive, same machine, same load).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

SEED = 20250611


def model_config(vocab_size: int) -> DeepseekV3Config:
    return DeepseekV3Config(
        vocab_size=vocab_size,
        hidden_size=256,
        num_hidden_layers=6,
        first_k_dense_replace=1,
        intermediate_size=768,  # dense MLP of layer 0
        moe_intermediate_size=96,
        n_routed_experts=16,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        num_attention_heads=8,
        num_key_value_heads=8,
        q_lora_rank=128,
        kv_lora_rank=64,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
        hidden_act="silu",
        max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        initializer_range=0.02,
        attention_bias=False,
        attention_dropout=0.0,
        num_mtp_layers=0,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=None,
        use_cache=True,
    )


def param_counts(model, cfg) -> dict:
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
    n_moe = cfg.num_hidden_layers - cfg.first_k_dense_replace
    one_expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
    embed = model.model.embed_tokens.weight.numel()
    active = total - experts + n_moe * cfg.num_experts_per_tok * one_expert
    return dict(total=total, routed_experts=experts, embedding=embed, active_per_token=active,
                active_per_token_excl_embedding=active - embed)


class Batches:
    """Windows of SEQ tokens: <bos> + the stream from a random paragraph start."""

    def __init__(self, ids: np.ndarray, starts: np.ndarray, seq: int):
        self.ids = torch.from_numpy(ids.astype(np.int64))
        self.seq = seq
        self.starts = torch.from_numpy(starts[starts + seq <= len(ids)])

    def window(self, s: int) -> torch.Tensor:
        return torch.cat([torch.zeros(1, dtype=torch.int64), self.ids[s:s + self.seq - 1]])

    def batch(self, step: int, size: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(SEED * 1000 + step)
        pick = torch.randint(len(self.starts), (size,), generator=g)
        return torch.stack([self.window(int(self.starts[i])) for i in pick])


class LoadTap:
    """Counts how often each routed expert is chosen, per MoE layer."""

    def __init__(self, model, cfg):
        self.layers = list(range(cfg.first_k_dense_replace, cfg.num_hidden_layers))
        self.counts = {li: torch.zeros(cfg.n_routed_experts) for li in self.layers}
        self.gates = {li: model.model.layers[li].mlp.gate for li in self.layers}
        for li, g in self.gates.items():
            g.register_forward_hook(self._hook(li))
        self.n = cfg.n_routed_experts

    def _hook(self, li):
        def fn(module, args, out):
            idx = out[2].detach().reshape(-1)
            self.counts[li] += torch.bincount(idx, minlength=self.n).float()
        return fn

    def reset(self):
        for c in self.counts.values():
            c.zero_()


def evaluate(model, data: Batches, n_windows: int) -> float:
    """Mean next-token loss over fixed held-out windows (the <bos> position predicts nothing)."""
    model.eval()
    total, count = 0.0, 0
    g = torch.Generator().manual_seed(SEED + 7)
    pick = torch.randperm(len(data.starts), generator=g)[:n_windows]
    with torch.no_grad():
        for chunk in pick.split(16):
            x = torch.stack([data.window(int(data.starts[i])) for i in chunk])
            logits = model(input_ids=x).logits.float()
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                   reduction="sum")
            total += float(loss)
            count += x[:, 1:].numel()
    model.train()
    return total / count


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("--steps", type=int, default=900)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--decay", type=int, default=400)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--bias-step", type=float, default=1e-3, help="aux-loss-free balancing speed (gamma)")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--eval-windows", type=int, default=64)
    ap.add_argument("--final-eval-windows", type=int, default=512)
    ap.add_argument("--train-eval-windows", type=int, default=128)
    ap.add_argument("--save-every", type=int, default=50)
    ap.add_argument("--bench", type=int, default=0, help="time this many steps and exit")
    ap.add_argument("--experts-impl", default="eager")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    torch.use_deterministic_algorithms(True)
    args.work.mkdir(parents=True, exist_ok=True)

    train = Batches(np.load(args.data / "train_ids.npy"), np.load(args.data / "train_starts.npy"), args.seq)
    held = Batches(np.load(args.data / "heldout_ids.npy"), np.load(args.data / "heldout_starts.npy"), args.seq)
    from tokenizers import Tokenizer
    vocab = Tokenizer.from_file(str(args.data / "tokenizer.json")).get_vocab_size()

    cfg = model_config(vocab)
    model = DeepseekV3ForCausalLM._from_config(cfg, attn_implementation="sdpa",
                                               experts_implementation=args.experts_impl)
    model.train()
    counts = param_counts(model, cfg)
    print("params", counts, flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed_tokens" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed_tokens" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    # Warmup-stable-decay: linear warmup, constant, then a linear decay to min_lr_frac over the
    # last `decay` steps. (Until the decay starts the schedule does not depend on --steps.)
    def lr_at(step):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        decay_start = args.steps - args.decay
        if step < decay_start:
            return args.lr
        t = (step - decay_start + 1) / args.decay
        return args.lr * (1 - (1 - args.min_lr_frac) * t)

    tap = LoadTap(model, cfg)
    state_path = args.work / "state.pt"
    start, elapsed_before, rows = 0, 0.0, []
    if state_path.exists() and not args.bench:
        st = torch.load(state_path, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        start, elapsed_before, rows = st["step"], st["elapsed"], st["rows"]
        print(f"resumed at step {start}", flush=True)

    tokens_per_step = args.batch * (args.seq - 1)
    t0 = time.time()
    window_loss, window_n = 0.0, 0
    steps = args.bench if args.bench else args.steps
    for step in range(start, steps):
        for gr in opt.param_groups:
            gr["lr"] = lr_at(step)
        x = train.batch(step, args.batch)
        tap.reset()
        out = model(input_ids=x, labels=x)
        loss = out.loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        # DeepSeek-V3 auxiliary-loss-free balancing: nudge each expert's selection bias toward
        # the mean load by a fixed step (sign of the load error), after every optimizer step.
        with torch.no_grad():
            for li, c in tap.counts.items():
                tap.gates[li].e_score_correction_bias += args.bias_step * torch.sign(c.mean() - c)
        window_loss += float(loss.detach())
        window_n += 1
        if args.bench:
            print(f"step {step} loss {float(loss):.3f} {time.time() - t0:.1f}s", flush=True)
            continue
        done = step + 1
        if done % args.log_every == 0 or done == steps:
            elapsed = elapsed_before + time.time() - t0
            row = dict(step=done, tokens=done * tokens_per_step, lr=f"{lr_at(step):.6g}",
                       train_loss=f"{window_loss / window_n:.4f}", grad_norm=f"{float(gnorm):.3f}",
                       heldout_loss="", elapsed_s=f"{elapsed:.0f}")
            if done % args.eval_every == 0 and done != steps:
                row["heldout_loss"] = f"{evaluate(model, held, args.eval_windows):.4f}"
            loads = {li: (c / c.sum()) for li, c in tap.counts.items()}
            spread = " ".join(f"{float(l.min()):.3f}-{float(l.max()):.3f}" for l in loads.values())
            print(f"step {done} loss {row['train_loss']} held {row['heldout_loss'] or '-'} lr {row['lr']} "
                  f"gn {row['grad_norm']} {elapsed:.0f}s load[min-max] {spread}", flush=True)
            rows.append(row)
            window_loss, window_n = 0.0, 0
        if done % args.save_every == 0 and done != steps:
            torch.save(dict(model=model.state_dict(), opt=opt.state_dict(), step=done,
                            elapsed=elapsed_before + time.time() - t0, rows=rows), state_path)
    train_elapsed = elapsed_before + time.time() - t0
    if args.bench:
        print(f"bench: {(time.time() - t0) / steps:.2f} s/step, {tokens_per_step * steps / (time.time() - t0):.0f} tok/s")
        return 0

    with open(args.work / "loss.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)

    # Final: held-out loss, and expert load measured over held-out windows (no bias update there).
    tap.reset()
    held_loss = evaluate(model, held, args.final_eval_windows)
    held_counts = {li: c.clone() for li, c in tap.counts.items()}
    train_loss_eval = evaluate(model, train, args.train_eval_windows)
    load = {}
    for li, c in held_counts.items():
        frac = c / c.sum()
        bias = tap.gates[li].e_score_correction_bias
        load[f"layer{li}"] = dict(fraction=[round(float(v), 4) for v in frac],
                                  min=float(frac.min()), max=float(frac.max()),
                                  bias=[round(float(v), 4) for v in bias])
        print(f"layer {li} load% " + " ".join(f"{100 * float(v):.1f}" for v in frac))
        print(f"layer {li} bias  " + " ".join(f"{float(v):+.3f}" for v in bias))
    (args.work / "expert_load.json").write_text(json.dumps(load, indent=1))
    summary = dict(steps=steps, batch=args.batch, seq=args.seq, tokens_per_step=tokens_per_step,
                   tokens_trained=steps * tokens_per_step, train_wall_s=round(train_elapsed),
                   final_train_loss_logged=float(rows[-1]["train_loss"]),
                   train_loss_eval=train_loss_eval, heldout_loss=held_loss,
                   heldout_ppl=math.exp(held_loss), train_ppl_eval=math.exp(train_loss_eval),
                   params=counts, args={k: str(v) for k, v in vars(args).items()},
                   torch=torch.__version__, seed=SEED)
    print(json.dumps(summary, indent=1))
    (args.work / "train_summary.json").write_text(json.dumps(summary, indent=1))
    model.save_pretrained(args.work / "final-fp32")
    return 0


if __name__ == "__main__":
    sys.exit(main())
