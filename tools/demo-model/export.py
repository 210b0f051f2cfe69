"""Export the trained demo model to models/demo and write its reference outputs.

    /work/venv/ref/bin/python tools/demo-model/export.py DATA_DIR WORK_DIR models/demo

1. Loads WORK_DIR/final-fp32 with dtype=bfloat16 and save_pretrained()s it (transformers keeps the
   DeepSeek router `mlp.gate.weight` and `e_score_correction_bias` in F32; everything else BF16).
2. Writes generation_config.json, tokenizer.json and tokenizer_config.json (bos/eos from the
   tokenizer), checks config.json, chmods everything 0644.
3. Reloads the committed files fresh, computes `reference.safetensors` (bf16 weights upcast with
   .float(), eager attention and experts, fp32 arithmetic) for the prompt PROMPT, and writes
   samples (greedy and sampled continuations) to WORK_DIR/samples.json.
"""

import hashlib
import json
import os
import struct
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import (AutoModelForCausalLM, AutoTokenizer, GenerationConfig,
                          PreTrainedTokenizerFast)

PROMPT = "It is a truth universally acknowledged"
GREEDY_NEW = 32
SAMPLE_PROMPTS = [
    "It is a truth universally acknowledged",
    "Elizabeth looked at him",
    "The President said",
    "She was not",
    "In the morning",
]
SAMPLE_SEED = 1234


def sha256_file(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def header(p: Path) -> dict:
    with open(p, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def export(data: Path, work: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for p in out.iterdir():
        if p.name != "README.md":
            p.unlink()
    model = AutoModelForCausalLM.from_pretrained(work / "final-fp32", dtype=torch.bfloat16)
    model.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=1)
    model.save_pretrained(out)

    tok = PreTrainedTokenizerFast(tokenizer_file=str(data / "tokenizer.json"),
                                  bos_token="<|bos|>", eos_token="<|eos|>",
                                  model_max_length=model.config.max_position_embeddings,
                                  clean_up_tokenization_spaces=False)
    tok.save_pretrained(out)
    # transformers 5 writes its own class name; the classic name loads in transformers 4 and 5.
    tc_path = out / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    tc_path.write_text(json.dumps(tc, indent=2) + "\n")
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in cfg
    assert cfg["bos_token_id"] == tok.bos_token_id == 0 and cfg["eos_token_id"] == tok.eos_token_id == 1
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["bos_token_id"] == 0 and gen["eos_token_id"] == 1
    for p in out.iterdir():
        os.chmod(p, 0o644)


def route_gaps(model, ids: torch.Tensor) -> float:
    """Smallest gap between the k-th and (k+1)-th selection score (sigmoid + bias), any MoE layer."""
    gaps = []

    def hook(module, args, outp):
        logits = outp[0]
        choice = logits.sigmoid() + module.e_score_correction_bias
        top = choice.topk(module.top_k + 1, dim=-1).values
        gaps.append(float((top[:, -2] - top[:, -1]).min()))

    hs = [l.mlp.gate.register_forward_hook(hook) for l in model.model.layers if hasattr(l.mlp, "gate")]
    model(input_ids=ids[None], use_cache=False)
    for h in hs:
        h.remove()
    return min(gaps)


@torch.no_grad()
def reference(out: Path, work: Path) -> dict:
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16, attn_implementation="eager",
                                                 experts_implementation="eager").float().eval()
    prompt = torch.tensor(tok(PROMPT)["input_ids"], dtype=torch.int64)
    assert int(prompt[0]) == tok.bos_token_id, "the tokenizer should prepend <|bos|>"
    model.config.eos_token_id = None
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = None
    g = model.generate(input_ids=prompt[None], attention_mask=torch.ones_like(prompt)[None],
                       do_sample=False, max_new_tokens=GREEDY_NEW, min_new_tokens=GREEDY_NEW,
                       output_logits=True, return_dict_in_generate=True, use_cache=True)
    seq = g.sequences[0]
    new = seq[prompt.numel():]
    assert new.numel() == GREEDY_NEW
    step_logits = torch.stack([l[0] for l in g.logits]).float()
    assert torch.equal(step_logits.argmax(-1), new)
    top2 = step_logits.topk(2, dim=-1).values
    gaps = top2[:, 0] - top2[:, 1]
    rel = gaps / step_logits.abs().max(-1).values
    full = model(input_ids=seq[None], use_cache=False).logits[0].float()
    n = prompt.numel()
    cached_vs_full = float((full[n - 1:n - 1 + GREEDY_NEW] - step_logits).abs().max())
    tensors = {
        "greedy.prompt_ids": prompt.clone(),
        "greedy.ids": new.to(torch.int64).clone(),
        "greedy.step_logits": step_logits.contiguous(),
        "greedy.margins": gaps.contiguous(),
    }
    ref = out / "reference.safetensors"
    save_file(tensors, str(ref), metadata={"prompt": PROMPT})
    os.chmod(ref, 0o644)
    facts = dict(prompt=PROMPT, prompt_ids=prompt.tolist(), greedy_ids=new.tolist(),
                 greedy_text=tok.decode(new), min_greedy_margin_abs=float(gaps.min()),
                 min_greedy_margin_rel=float(rel.min()), max_abs_logit=float(step_logits.abs().max()),
                 cached_vs_full=cached_vs_full, min_router_gap=route_gaps(model, seq))
    print(json.dumps(facts, indent=1))
    return facts


@torch.no_grad()
def samples(out: Path) -> list:
    """Fresh load as a user would (bf16 as stored, default implementations), greedy and sampled."""
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    print("loaded dtype:", next(model.parameters()).dtype)
    res = []
    for i, text in enumerate(SAMPLE_PROMPTS):
        ids = tok(text, return_tensors="pt")
        greedy = model.generate(**ids, do_sample=False, max_new_tokens=60)
        torch.manual_seed(SAMPLE_SEED + i)
        sampled = model.generate(**ids, do_sample=True, temperature=0.8, top_p=0.95, max_new_tokens=60)
        r = dict(prompt=text,
                 greedy=tok.decode(greedy[0, ids["input_ids"].shape[1]:], skip_special_tokens=True),
                 sampled=tok.decode(sampled[0, ids["input_ids"].shape[1]:], skip_special_tokens=True))
        print(f"--- {text!r}\n  greedy : {r['greedy']}\n  sampled: {r['sampled']}", flush=True)
        res.append(r)
    return res


def main() -> int:
    data, work, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    torch.set_num_threads(2)
    torch.manual_seed(0)
    export(data, work, out)
    facts = reference(out, work)
    smp = samples(out)
    files = {p.name: dict(bytes=p.stat().st_size, sha256=sha256_file(p)) for p in sorted(out.iterdir())
             if p.name != "README.md"}  # the model card is written by hand, after the export
    dtypes = {}
    for k, v in header(out / "model.safetensors").items():
        if k != "__metadata__":
            dtypes.setdefault(v["dtype"], []).append(k)
    facts.update(files=files, total_bytes=sum(f["bytes"] for f in files.values()),
                 dtypes={k: len(v) for k, v in dtypes.items()},
                 f32_tensors=sorted(dtypes.get("F32", [])), samples=smp)
    (work / "export_summary.json").write_text(json.dumps(facts, indent=1))
    print("total bytes", facts["total_bytes"], "dtypes", facts["dtypes"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
