#!/usr/bin/env python3
"""Regenerate sluice's sampling fixtures from Hugging Face transformers' own logits processors.

    /work/venv/ref/bin/python tools/reference/make_sampling_fixtures.py

(run from the repository root; the output goes to <repo>/testdata/sampling/, found from this
file's location). Deterministic: fixed seeds, one thread; running it twice gives byte-identical
files (the script prints their sha256).

For every case (a logit vector, a token history, sampling options) the processors are the ones
`generate` itself builds: a tiny model's `_prepare_generation_config` + `_get_logits_processor`
for `do_sample=True` and the case's options, exactly as `generate` calls them. They run on the
f32 logits widened to f64, the processed scores are soft-maxed as `generate` does before
`multinomial`, and the fixture records the surviving ids (finite processed score) with their
probabilities. The script also runs the same pipeline on f32 scores and checks that it keeps
the same ids, so no case depends on the precision.

Cases whose top-p or min-p threshold lands exactly on a cumulative mass / probability ratio are
kept only where that equality is exact by construction (ties, powers of two, -inf); they are
marked `top_p_boundary` / `min_p_boundary`. Any other case within 1e-6 (relative) of a threshold
is drawn again. Where ties straddle the top-p cut, transformers' choice among the tied tokens
depends on `torch.sort`'s order, which it leaves undefined; such cases carry `tie_at_cut` (the
tied group, the survivors outside it, how many survive) and sluice's rule (lower ids first) is
checked instead of transformers' id list. See testdata/README.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.generation import LogitsProcessorList  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.set_verbosity_error()
warnings.filterwarnings("ignore")
torch.set_num_threads(1)
torch.manual_seed(0)

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "testdata" / "sampling"
SEED = 20270027

# The processor classes `generate` must build, in this order, for the options that are on.
EXPECTED_ORDER = [
    ("repetition_penalty", "RepetitionPenaltyLogitsProcessor"),
    ("temperature", "TemperatureLogitsWarper"),
    ("top_k", "TopKLogitsWarper"),
    ("top_p", "TopPLogitsWarper"),
    ("min_p", "MinPLogitsWarper"),
]
OPTIONS = [name for name, _ in EXPECTED_ORDER]
KINDS = ["random", "peaked", "flat", "ties", "threshold", "neg_inf"]


def f32(x: float) -> float:
    return float(np.float32(x))


def tiny_model():
    cfg = LlamaConfig(
        vocab_size=16,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    return LlamaForCausalLM(cfg).eval()


MODEL = None


def processors(opts: dict, prompt_len: int) -> LogitsProcessorList:
    """The list `generate` builds for these options (same calls, same arguments)."""
    kw = {"do_sample": True}
    kw["temperature"] = opts["temperature"]
    kw["top_k"] = opts["top_k"]
    kw["top_p"] = opts["top_p"]
    kw["min_p"] = opts["min_p"] if opts["min_p"] > 0 else None
    kw["repetition_penalty"] = opts["repetition_penalty"]
    gc, model_kwargs = MODEL._prepare_generation_config(None, **kw)
    procs = MODEL._get_logits_processor(
        generation_config=gc,
        input_ids_seq_length=prompt_len,
        encoder_input_ids=torch.zeros((1, max(prompt_len, 1)), dtype=torch.long),
        prefix_allowed_tokens_fn=None,
        logits_processor=LogitsProcessorList(),
        device="cpu",
        model_kwargs=model_kwargs,
    )
    names = [type(p).__name__ for p in procs]
    want = [cls for name, cls in EXPECTED_ORDER if is_on(opts, name)]
    assert names == want, (names, want, opts)
    return procs


def is_on(opts: dict, name: str) -> bool:
    off = {"repetition_penalty": 1.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    return opts[name] != off[name]


def run(logits: np.ndarray, history: list[int], opts: dict, dtype, scores_too=False):
    """Surviving ids and the probabilities `generate` samples from (and the processed scores)."""
    scores = torch.tensor(logits, dtype=torch.float32).to(dtype)[None, :]
    # generate's input_ids: the prompt and the tokens generated so far (the history).
    ids = torch.tensor([history if history else [0]], dtype=torch.long)
    if not history:
        ids = ids[:, :0]
    for p in processors(opts, ids.shape[1]):
        scores = p(ids, scores)
    scores = scores[0]
    probs = torch.softmax(scores, dim=-1)
    keep = {i for i in range(len(logits)) if torch.isfinite(scores[i])}
    if scores_too:
        return keep, probs.double().numpy(), scores.double().numpy()
    return keep, probs.double().numpy()


def nudged(opts: dict, name: str, factor: float) -> dict:
    o = dict(opts)
    o[name] = opts[name] * factor
    return o


def draw_logits(rng: np.random.Generator, kind: str, opts: dict) -> tuple[np.ndarray, list[int]]:
    n = int(rng.choice([8, 16, 32, 64, 257]))
    hist_len = int(rng.integers(0, 24))
    if kind == "random":
        x = rng.normal(0.0, 2.0, n)
    elif kind == "peaked":
        x = rng.normal(0.0, 1.0, n)
        x[rng.integers(n)] += rng.uniform(6.0, 12.0)
    elif kind == "flat":
        if rng.random() < 0.5:
            n = int(rng.choice([4, 8, 16, 32]))
            x = np.full(n, rng.normal(0.0, 3.0))
        else:
            x = rng.normal(0.0, 0.02, n)
    elif kind == "ties":
        x = rng.integers(-4, 5, n) * 0.5
    elif kind == "neg_inf":
        x = rng.normal(0.0, 2.0, n)
        x[rng.random(n) < 0.4] = -np.inf
        x[rng.integers(n)] = rng.normal(0.0, 2.0)  # at least one finite
    elif kind == "threshold":
        # m tied maxima (a power of two) and either -inf or lower values that top-k cuts away:
        # the probabilities are exactly 1/m, so a top_p of j/m lands exactly on a cumulative mass.
        m = int(rng.choice([2, 4, 8, 16]))
        n = max(n, m + 4)
        c = rng.normal(0.0, 2.0)
        x = np.full(n, -np.inf)
        if opts["top_k"] != 0:
            x = c - 1.0 - np.abs(rng.normal(0.0, 2.0, n))
        tied = rng.choice(n, m, replace=False)
        x[tied] = c
        others = [i for i in range(n) if i not in set(tied.tolist())]
        history = [int(rng.choice(others)) for _ in range(hist_len)]
        return x.astype(np.float32), history
    else:
        raise ValueError(kind)
    # Histories with repeats: drawn from a few ids.
    pool = rng.choice(n, max(1, min(n, int(rng.integers(1, 6)))), replace=False)
    history = [int(rng.choice(pool)) for _ in range(hist_len)]
    return x.astype(np.float32), history


def draw_options(rng: np.random.Generator, on: set, kind: str) -> dict:
    o = {"repetition_penalty": 1.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    if "repetition_penalty" in on:
        choices = [1.1, 1.3, 2.0, 0.7] if kind != "threshold" else [1.1, 1.3, 2.0]
        o["repetition_penalty"] = f32(rng.choice(choices))
    if "temperature" in on:
        o["temperature"] = f32(rng.choice([0.1, 0.25, 0.5, 0.7, 1.3, 2.0]))
    if "top_k" in on:
        o["top_k"] = int(rng.choice([1, 2, 3, 5, 10, 40, 300]))
    if "top_p" in on:
        o["top_p"] = f32(rng.choice([0.1, 0.3, 0.5, 0.75, 0.9, 0.95]))
    if "min_p" in on:
        o["min_p"] = f32(rng.choice([0.01, 0.05, 0.1, 0.3, 0.6, 1.0]))
    return o


def fit_threshold(rng, x: np.ndarray, opts: dict) -> None:
    """For the threshold kind: top_k = the tied count, top_p = j/m exactly."""
    c = x.max()
    m = int((x == c).sum())
    if opts["top_k"] != 0:
        opts["top_k"] = m
    if opts["top_p"] != 1.0:
        opts["top_p"] = float(rng.integers(1, m)) / m


def enc(v: float):
    if v == -np.inf:
        return "-inf"
    assert np.isfinite(v)
    return float(v)


def make_case(rng, kind: str, on: set, idx: int):
    for attempt in range(200):
        opts = draw_options(rng, on, kind)
        x, history = draw_logits(rng, kind, opts)
        if kind == "threshold":
            fit_threshold(rng, x, opts)
        keep64, p64 = run(x, history, opts, torch.float64)
        keep32, _ = run(x, history, opts, torch.float32)
        # Boundaries: does a nudge of 1e-6 (relative) to a threshold change the set?
        boundary = {}
        for name in ("top_p", "min_p"):
            boundary[name] = False
            if not is_on(opts, name):
                continue
            for f in (1 - 1e-6, 1 + 1e-6):
                o = nudged(opts, name, f)
                if name == "top_p" and o[name] > 1.0:
                    continue
                if name == "min_p" and o[name] > 1.0:
                    # min_p 1 keeps exactly the ids whose probability equals the top one's: on the
                    # threshold whenever more than one survives.
                    boundary[name] |= len(keep64) > 1
                    continue
                if run(x, history, o, torch.float64)[0] != keep64:
                    boundary[name] = True
        structured = kind in ("flat", "ties", "threshold")
        if any(boundary.values()) and not structured:
            continue  # too close to a threshold to be decided the same way in every arithmetic
        if keep32 != keep64:
            continue
        # Ties at the top-p cut: a processed score before top-p shared by a survivor and by a token
        # that top-p removed (top-k keeps ties whole and min-p cannot split them).
        pre = dict(opts, top_p=1.0, min_p=0.0)
        keep_pre, _, s_pre = run(x, history, pre, torch.float64, scores_too=True)
        tie = None
        for v in sorted({s_pre[i] for i in keep64}):
            group = sorted(i for i in keep_pre if s_pre[i] == v)
            if any(i not in keep64 for i in group):
                assert tie is None and is_on(opts, "top_p")
                kept_probs = {p64[i] for i in group if i in keep64}
                assert max(kept_probs) - min(kept_probs) <= 1e-12 * max(kept_probs)
                tie = {
                    "sure": sorted(keep64 - set(group)),
                    "tied": group,
                    "tied_prob": float(min(kept_probs)),
                    "n_keep": len(keep64),
                }
        kept = sorted(keep64, key=lambda i: (-p64[i], i))
        return {
            "name": f"{kind}-{'+'.join(sorted(on)) or 'none'}-{idx}",
            "kind": kind,
            "options": opts,
            "logits": [enc(v) for v in x.tolist()],
            "history": history,
            "keep": [[int(i), float(p64[i])] for i in kept],
            "top_p_boundary": boundary["top_p"],
            "min_p_boundary": boundary["min_p"],
            "tie_at_cut": tie,
        }, attempt
    raise RuntimeError(f"no acceptable case for {kind} {on}")


def main() -> int:
    global MODEL
    MODEL = tiny_model()
    rng = np.random.default_rng(SEED)
    cases = []
    redrawn = 0
    for mask in range(1 << len(OPTIONS)):
        on = {OPTIONS[b] for b in range(len(OPTIONS)) if mask >> b & 1}
        for kind in KINDS:
            for rep in range(2):
                case, attempts = make_case(rng, kind, on, rep)
                redrawn += attempts
                cases.append(case)
    counts = {
        "cases": len(cases),
        "redrawn_near_a_threshold": redrawn,
        "top_p_boundary": sum(c["top_p_boundary"] for c in cases),
        "min_p_boundary": sum(c["min_p_boundary"] for c in cases),
        "tie_at_cut": sum(c["tie_at_cut"] is not None for c in cases),
        "with_neg_inf": sum("-inf" in c["logits"] for c in cases),
        "with_repeats_in_history": sum(len(set(c["history"])) < len(c["history"]) for c in cases),
    }
    doc = {
        "about": "transformers' logits processors, in generate's order, on f32 logits widened to f64: "
        "surviving ids (finite processed score) and their probabilities, most likely first, ties to "
        "the lower id. See testdata/README.md.",
        "generator": "tools/reference/make_sampling_fixtures.py",
        "seed": SEED,
        "order": [cls for _, cls in EXPECTED_ORDER],
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "numpy": np.__version__,
        },
        "counts": counts,
        "cases": cases,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "transformers.json"
    text = json.dumps(doc, indent=None, separators=(",", ":"), allow_nan=False)
    # One case per line: readable diffs.
    text = text.replace(',{"name"', ',\n{"name"')
    path.write_text(text + "\n")
    os.chmod(path, 0o644)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    print(json.dumps(counts))
    print(f"{path.relative_to(ROOT)}: {path.stat().st_size} bytes, sha256 {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
