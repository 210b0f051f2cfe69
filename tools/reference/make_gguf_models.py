#!/usr/bin/env python3
"""GGUF model fixtures made by llama.cpp's own converter and quantizer, with transformers references.

    /work/venv/ref/bin/python tools/reference/make_gguf_models.py

(run from the repository root; the output always goes to <repo>/testdata/gguf/models/, found from
this file's location, and that directory alone is deleted and written again). For each fixture:

1. a tiny random-init model is built from a config (seeded; weights re-initialised with
   make_fixtures.py's `init_weights`) and saved with `save_pretrained`, beside the byte-level
   tokenizer of testdata/byte-tokenizer/ and a minimal tokenizer_config.json;
2. llama.cpp's `convert_hf_to_gguf.py --outtype f32` converts it, run by this script as a module
   in a subprocess (`--convert`, below) with one method monkeypatched: `TextModel.
   get_vocab_base_pre`, which identifies a BPE pre-tokenizer by hashing the tokens of a test
   string and does not know the byte tokenizer, returns "gpt-2". Nothing else about the
   conversion is changed;
3. `llama-quantize` (one thread) quantizes that f32 GGUF to the fixture's type: `model.gguf`;
4. transformers loads `model.gguf` (`from_pretrained(dir, gguf_file="model.gguf",
   dtype=torch.float32)`; it dequantizes with gguf-py and undoes llama.cpp's Q/K row permutation
   for the llama architecture). For qwen3 / qwen3moe / qwen2moe the GGUF config mapping of
   transformers 5.24 lacks a key (head_dim, moe_intermediate_size,
   shared_expert_intermediate_size) and would build a model of the wrong shape, so the config
   transformers reads from the GGUF is completed with those fields, read from the same GGUF's
   own keys, and passed as `config=`; the weights still come from transformers' GGUF loader;
5. the loaded weights are saved with `save_pretrained` in fp32 (`dequant/`), reloaded from disk,
   and the reference outputs are computed from the reloaded model exactly as make_fixtures.py's
   `run_reference` does (prompt logits, routed experts and weights, a 32-token greedy
   continuation; the same acceptance margins, so a seed is accepted only if the dequantized model
   passes them, else the next seed is tried).

Checks, all recorded in summary.json: the GGUF-loaded model and the reloaded dequant/ model give
bit-identical prompt logits and weights; every tensor of model.gguf, dequantized with
`gguf.quants.dequantize` (Q/K un-permuted here, independently of transformers, for llama), equals
its tensor in dequant/model.safetensors bit for bit, and every dequant/ tensor is covered; the f32
GGUF's un-permuted Q/K equal the source checkpoint's bit for bit.

Families transformers cannot load from a GGUF get no fixture: the script still builds, converts
and quantizes them and records how transformers fails (mixtral: llama.cpp writes it as arch
`llama`, which transformers loads as a dense LlamaForCausalLM without its experts; olmoe: not in
transformers' GGUF architectures).

Needs, beside /work/venv/ref (tools/reference/requirements.txt): llama.cpp's sources with a built
llama-quantize ($LLAMA_CPP, default /work/llama/src: convert_hf_to_gguf.py, its conversion/ and
gguf-py/, build/bin/llama-quantize), and two packages /work/venv/ref lacks, installed beside it
($SLUICE_GGUF_EXTRAS, default /work/venv/ref-gguf-extras):

    /work/venv/ref/bin/pip install --target /work/venv/ref-gguf-extras --no-deps \
        accelerate==1.15.0 sentencepiece==0.2.3

(transformers refuses GGUF files without accelerate; the converter's Llama vocab path imports
sentencepiece before it looks for a tokenizer.model). The directory goes on sys.path before
transformers is imported. llama.cpp's bundled gguf-py is put first on
sys.path, in the converter and here, so both use the same gguf-py.

Deterministic: fixed seeds, one torch thread, deterministic algorithms, one quantizer thread,
single-key safetensors metadata. The script prints a sha256 over the whole tree.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "testdata" / "gguf" / "models"
LLAMA_CPP = Path(os.environ.get("LLAMA_CPP", "/work/llama/src")).resolve()
GGUF_PY = LLAMA_CPP / "gguf-py"
QUANTIZE = LLAMA_CPP / "build" / "bin" / "llama-quantize"
EXTRAS = Path(os.environ.get("SLUICE_GGUF_EXTRAS", "/work/venv/ref-gguf-extras"))
BYTE_TOKENIZER = REPO / "testdata" / "byte-tokenizer" / "tokenizer.json"

# llama.cpp's gguf-py first, then the extra packages, before anything imports gguf.
sys.path.insert(0, str(EXTRAS))
sys.path.insert(0, str(GGUF_PY))


def convert_main(args: list[str]) -> None:
    """`--convert ARGS...`: run llama.cpp's convert_hf_to_gguf.py with ARGS, as a module, with the
    BPE pre-tokenizer detection answering "gpt-2" (the byte tokenizer's hash is not in its list)."""
    sys.path.insert(0, str(LLAMA_CPP))
    import convert_hf_to_gguf  # noqa: E402
    from conversion.base import TextModel  # noqa: E402

    def get_vocab_base_pre(self, tokenizer) -> str:
        return "gpt-2"

    TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = ["convert_hf_to_gguf.py", *args]
    convert_hf_to_gguf.main()


if __name__ == "__main__" and sys.argv[1:2] == ["--convert"]:
    convert_main(sys.argv[2:])
    sys.exit(0)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as mf  # noqa: E402  (sets one thread, deterministic algorithms, offline env)

import numpy  # noqa: E402
import safetensors  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
import gguf  # noqa: E402
from gguf import GGUFReader  # noqa: E402
from gguf.quants import dequantize  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import (  # noqa: E402
    AutoConfig,
    AutoModelForCausalLM,
    LlamaConfig,
    MixtralConfig,
    OlmoeConfig,
    Qwen2MoeConfig,
    Qwen3Config,
    Qwen3MoeConfig,
)

# The byte tokenizer has 256 tokens, so the vocabulary is 256 and the prompts are make_fixtures'
# make_prompts() drawn over 256 ids (same seed and lengths, other ids than testdata/models/).
mf.VOCAB = 256
VOCAB = 256
HIDDEN = 256
N_LAYERS = 1  # 256-aligned rows make every layer ~0.4-1.3 M parameters; see the README for sizes
SEARCH_TRIES = 32
# With tied embeddings, make_fixtures' unit-variance embedding dominates the residual stream, so
# the tied head scores each position's own token far above the rest (max|logit| ~250 here) and
# greedy decoding repeats the last prompt token. Tied models scale the embedding by this instead
# (logits then spread a few units and greedy decoding wanders).
TIED_EMBED_SCALE = 0.1

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    num_hidden_layers=N_LAYERS,
    rms_norm_eps=1e-6,
    max_position_embeddings=256,
    hidden_act="silu",
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)
# every matrix row (input dimension) is 256 long: hidden, intermediate, moe/shared intermediate,
# heads x head_dim; 4 query heads of 64, 2 key/value heads
ATTN = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=64)

LLAMA = lambda: LlamaConfig(  # noqa: E731
    **COMMON, **ATTN, tie_word_embeddings=True, intermediate_size=256, attention_bias=False, mlp_bias=False
)

FIXTURES = [
    dict(name="llama-q4_k_m", family="llama", quant="Q4_K_M", base_seed=31000, router="none", config=LLAMA),
    # the same model (same config and seed) as llama-q4_k_m, quantized to Q8_0
    dict(name="llama-q8_0", family="llama", quant="Q8_0", same_model_as="llama-q4_k_m", router="none", config=LLAMA),
    dict(
        name="qwen3_moe-q5_k_m",
        family="qwen3_moe",
        quant="Q5_K_M",
        base_seed=33000,
        router="softmax",
        # transformers' qwen3moe mapping has no expert_feed_forward_length (default 768)
        overrides={"moe_intermediate_size": "expert_feed_forward_length"},
        config=lambda: Qwen3MoeConfig(
            **COMMON,
            **ATTN,
            tie_word_embeddings=False,
            intermediate_size=256,
            moe_intermediate_size=256,
            num_experts=4,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            attention_bias=False,
            use_sliding_window=False,
        ),
    ),
    dict(
        name="qwen2_moe-q6_k",
        family="qwen2_moe",
        quant="Q6_K",
        base_seed=34000,
        router="softmax",
        # nor has its qwen2moe mapping the expert sizes (defaults 1408 and 5632)
        overrides={
            "moe_intermediate_size": "expert_feed_forward_length",
            "shared_expert_intermediate_size": "expert_shared_feed_forward_length",
        },
        config=lambda: Qwen2MoeConfig(
            **COMMON,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=False,
            intermediate_size=256,
            moe_intermediate_size=256,
            shared_expert_intermediate_size=256,
            num_experts=4,
            num_experts_per_tok=2,
            norm_topk_prob=False,
            qkv_bias=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            use_sliding_window=False,
        ),
    ),
    dict(
        name="qwen3-iq4_xs",
        family="qwen3",
        quant="IQ4_XS",
        base_seed=35000,
        router="none",
        # its qwen3 mapping drops rope.dimension_count and has no key_length (head_dim default 128)
        overrides={"head_dim": "attention.key_length"},
        config=lambda: Qwen3Config(
            **COMMON,
            **ATTN,
            tie_word_embeddings=True,
            intermediate_size=256,
            attention_bias=False,
            use_sliding_window=False,
        ),
    ),
]

# Built, converted and quantized, then offered to transformers, which cannot load them.
UNSUPPORTED = [
    dict(
        name="mixtral-q4_k_m",
        family="mixtral",
        quant="Q4_K_M",
        seed=32000,
        config=lambda: MixtralConfig(
            **COMMON,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=False,
            intermediate_size=256,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=None,
            router_jitter_noise=0.0,
        ),
        with_config=lambda cfg: cfg,  # also try with the source config passed as config=
    ),
    dict(
        name="olmoe-q4_0",
        family="olmoe",
        quant="Q4_0",
        seed=36000,
        config=lambda: OlmoeConfig(
            **COMMON,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=False,
            intermediate_size=256,
            num_experts=4,
            num_experts_per_tok=2,
            norm_topk_prob=False,
            clip_qkv=None,
            attention_bias=False,
        ),
    ),
]

LOAD_KW = dict(attn_implementation="eager", experts_implementation="eager")


# ----------------------------------------------------------------------------------------------
# build, convert, quantize


def run(cmd: list[str], log: Path, **kw) -> None:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    with open(log, "w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, **kw)
    if p.returncode != 0:
        sys.stderr.write(log.read_text()[-4000:])
        raise SystemExit(f"failed ({p.returncode}): {' '.join(map(str, cmd))}")


def build_source(config_fn, seed: int, router: str, hf: Path) -> dict:
    """The seeded source checkpoint in `hf/` with the byte tokenizer; returns its state dict."""
    torch.manual_seed(seed)
    cfg = config_fn()
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, **LOAD_KW)
    mf.init_weights(model, seed, router)
    if cfg.tie_word_embeddings:
        with torch.no_grad():
            model.get_input_embeddings().weight.mul_(TIED_EMBED_SCALE)
    model.eval()
    model.save_pretrained(hf, max_shard_size="1GB")
    shutil.copyfile(BYTE_TOKENIZER, hf / "tokenizer.json")
    (hf / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 256}, indent=2) + "\n"
    )
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def convert_and_quantize(hf: Path, work: Path, quant: str) -> Path:
    f32 = work / "model-f32.gguf"
    run(
        [sys.executable, str(Path(__file__).resolve()), "--convert", str(hf), "--outtype", "f32",
         "--outfile", str(f32)],
        work / "convert.log",
    )
    gdir = work / "gguf"
    gdir.mkdir()
    run([str(QUANTIZE), str(f32), str(gdir / "model.gguf"), quant, "1"], work / "quantize.log")
    return f32


# ----------------------------------------------------------------------------------------------
# transformers' GGUF loading


def gguf_fields(path: Path) -> dict:
    r = GGUFReader(str(path))
    out = {}
    for k, f in r.fields.items():
        if k.startswith("tokenizer.ggml.") and k != "tokenizer.ggml.model" and k != "tokenizer.ggml.pre":
            continue
        v = f.contents()
        out[k] = v
    return out


def load_from_gguf(gdir: Path, overrides: dict | None):
    """transformers' model from gdir/model.gguf; with `overrides` (config field -> GGUF key suffix)
    the config transformers reads from the GGUF gets those fields from the GGUF's own keys."""
    record = {}
    cfg = None
    if overrides:
        cfg = AutoConfig.from_pretrained(gdir, gguf_file="model.gguf")
        fields = gguf_fields(gdir / "model.gguf")
        arch = fields["general.architecture"]
        for attr, key in overrides.items():
            value = fields[f"{arch}.{key}"]
            record[attr] = {"gguf_key": f"{arch}.{key}", "value": value, "transformers_default": getattr(cfg, attr)}
            setattr(cfg, attr, value)
    model, info = AutoModelForCausalLM.from_pretrained(
        gdir, gguf_file="model.gguf", dtype=torch.float32, config=cfg, output_loading_info=True, **LOAD_KW
    )
    model.eval()
    return model, info, record


def loading_problems(info: dict) -> dict:
    return {k: sorted(map(str, v)) for k, v in info.items() if v}


def save_dequant(model, dst: Path) -> None:
    """save_pretrained refuses a model loaded through the GGUF quantizer, so the same config (less
    its quantization_config) and the same weights go into a plain model, which is saved."""
    cfg = copy.deepcopy(model.config)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    torch.manual_seed(0)  # from_config initialises weights that load_state_dict then replaces
    plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, **LOAD_KW)
    plain.load_state_dict(model.state_dict(), strict=True)
    plain.save_pretrained(dst, max_shard_size="1GB")
    assert (dst / "model.safetensors").exists()
    assert "quantization_config" not in json.loads((dst / "config.json").read_text())
    mf.chmod_tree(dst)


# ----------------------------------------------------------------------------------------------
# independent checks of the GGUF tensors


def unpermute(w: numpy.ndarray, n_head: int) -> numpy.ndarray:
    """Inverse of llama.cpp's LlamaModel.permute (rows of each head from interleaved pairs to
    halves): w.reshape(n_head, 2, d/2, ...).swapaxes(1, 2) is the permute."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute(w: numpy.ndarray, n_head: int) -> numpy.ndarray:
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


BLK = re.compile(r"^blk\.(\d+)\.(.+)$")
PLAIN = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
}
EXPS = {"ffn_gate_exps.weight": "gate_proj", "ffn_up_exps.weight": "up_proj", "ffn_down_exps.weight": "down_proj"}


def hf_targets(name: str, values: numpy.ndarray, cfg: dict) -> list[tuple[str, numpy.ndarray]]:
    """What dequant/model.safetensors must hold for the GGUF tensor `name` (dequantized values),
    by this script's own reading of llama.cpp's names (not transformers' mapping)."""
    if name == "token_embd.weight":
        return [("model.embed_tokens.weight", values)]
    if name == "output.weight":
        return [("lm_head.weight", values)]
    if name == "output_norm.weight":
        return [("model.norm.weight", values)]
    m = BLK.match(name)
    assert m, name
    layer, rest = int(m.group(1)), m.group(2)
    stem = f"model.layers.{layer}."
    if rest in EXPS:  # stacked [experts, rows, cols]
        return [(f"{stem}mlp.experts.{e}.{EXPS[rest]}.weight", values[e]) for e in range(values.shape[0])]
    if rest == "ffn_gate_inp_shexp.weight":  # [hidden] in the GGUF, [1, hidden] in transformers
        return [(f"{stem}mlp.shared_expert_gate.weight", values.reshape(1, -1))]
    if cfg["model_type"] == "llama" and rest in ("attn_q.weight", "attn_k.weight"):
        heads = cfg["num_attention_heads"] if rest == "attn_q.weight" else cfg["num_key_value_heads"]
        values = unpermute(values, heads)
    return [(stem + PLAIN[rest], values)]


def check_gguf_tensors(gguf_path: Path, dq: Path, source: dict) -> dict:
    """Every GGUF tensor, dequantized by gguf.quants.dequantize, against dequant/ (bit-equal), and
    its quantization error against the source weights."""
    cfg = json.loads((dq / "config.json").read_text())
    saved = load_file(str(dq / "model.safetensors"))
    reader = GGUFReader(str(gguf_path))
    covered = set()
    tensors = {}
    for t in reader.tensors:
        values = dequantize(t.data, t.tensor_type)
        equal = True
        rel_err = []
        for key, want in hf_targets(t.name, values, cfg):
            got = saved[key].numpy()
            covered.add(key)
            equal &= got.shape == want.shape and bool(numpy.array_equal(got, want))
            src = source[key].numpy() if key in source else None
            if src is not None:
                rel_err.append(float(numpy.linalg.norm(want - src) / max(numpy.linalg.norm(src), 1e-30)))
        assert equal, f"{gguf_path}: {t.name} differs from dequant/"
        tensors[t.name] = {
            "type": t.tensor_type.name,
            "shape_ggml": [int(x) for x in t.shape],
            "bytes": int(t.n_bytes),
            "dequant_equal": equal,
            "rel_rms_error_vs_source": max(rel_err) if rel_err else None,
        }
    tied_head = bool(cfg.get("tie_word_embeddings")) and "lm_head.weight" not in saved
    missing = sorted(set(saved) - covered)
    assert not missing, f"dequant/ tensors with no GGUF tensor: {missing}"
    return {"tensors": tensors, "all_dequant_tensors_covered": True, "tied_lm_head_not_saved": tied_head}


def check_f32_permutation(f32_path: Path, source: dict, cfg: dict) -> dict | None:
    """The converter's f32 file: attn_q/attn_k un-permuted here equal the source rows bit for bit,
    and are not the source rows as stored (so the permutation is real)."""
    if cfg["model_type"] != "llama":
        return None
    reader = GGUFReader(str(f32_path))
    checked = []
    for t in reader.tensors:
        m = BLK.match(t.name)
        if not m or m.group(2) not in ("attn_q.weight", "attn_k.weight"):
            continue
        key = f"model.layers.{m.group(1)}." + PLAIN[m.group(2)]
        heads = cfg["num_attention_heads"] if m.group(2) == "attn_q.weight" else cfg["num_key_value_heads"]
        stored = numpy.asarray(t.data, dtype=numpy.float32).reshape(source[key].shape)
        src = source[key].numpy()
        assert numpy.array_equal(unpermute(stored, heads), src), t.name
        assert numpy.array_equal(stored, permute(src, heads)), t.name
        assert not numpy.array_equal(stored, src), f"{t.name}: not permuted"
        checked.append(t.name)
    return {"tensors": checked, "unpermuted_equal_source": True, "stored_differs_from_source": True}


def config_diff(got: dict, want: dict) -> dict:
    skip = {"architectures", "transformers_version", "_name_or_path", "dtype", "torch_dtype"}
    out = {}
    for k in sorted(set(got) | set(want)):
        if k in skip or got.get(k) == want.get(k):
            continue
        out[k] = {"dequant": got.get(k, "<absent>"), "source": want.get(k, "<absent>")}
    return out


# ----------------------------------------------------------------------------------------------


def kinds(tensors: dict) -> dict:
    """ggml types per tensor kind (the name without blk.N.)."""
    out: dict[str, list[str]] = {}
    for name, t in tensors.items():
        m = BLK.match(name)
        kind = m.group(2) if m else name
        out.setdefault(kind, [])
        if t["type"] not in out[kind]:
            out[kind].append(t["type"])
    return dict(sorted(out.items()))


@torch.no_grad()
def attempt(fx: dict, seed: int, prompts, tmp: Path):
    work = tmp / f"{fx['name']}-{seed}"
    hf = work / fx["family"]  # the converter names the model after this directory
    hf.mkdir(parents=True)
    source = build_source(fx["config"], seed, fx["router"], hf)
    f32 = convert_and_quantize(hf, work, fx["quant"])
    gdir = work / "gguf"
    gmodel, info, overrides = load_from_gguf(gdir, fx.get("overrides"))
    problems = loading_problems(info)
    assert not problems, f"{fx['name']}: transformers' loading report: {problems}"
    assert type(gmodel).__name__ == json.loads((hf / "config.json").read_text())["architectures"][0]
    dq = gdir / "dequant"
    save_dequant(gmodel, dq)
    expected = {k: v.detach().clone() for k, v in gmodel.state_dict().items() if "rotary_emb" not in k}
    r = mf.run_reference(dq, "fp32", fx["router"], prompts, expected)  # asserts the reload is bit-equal
    # the GGUF-loaded model gives the reloaded model's logits bit for bit
    worst = 0.0
    identical = True
    for t, ids in prompts.items():
        got = gmodel(input_ids=ids[None], use_cache=False).logits[0].float()
        want = r["tensors"][f"prompt{t}.logits"]
        identical &= bool(torch.equal(got, want))
        worst = max(worst, float((got - want).abs().max()))
    return dict(
        work=work, hf=hf, gdir=gdir, dq=dq, f32=f32, source=source, r=r, overrides=overrides,
        gguf_vs_dequant_identical=identical, gguf_vs_dequant_max_abs=worst,
    )


def sha256_file(p: Path) -> str:
    return mf.sha256_file(p)


def versions() -> dict:
    import accelerate
    import sentencepiece

    commit = subprocess.run(
        ["git", "-C", str(LLAMA_CPP), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(LLAMA_CPP), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    ).stdout.strip()
    gguf_version = re.search(r'^version = "([^"]+)"', (GGUF_PY / "pyproject.toml").read_text(), re.M).group(1)
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": numpy.__version__,
        "accelerate": accelerate.__version__,
        "sentencepiece": sentencepiece.__version__,
        "gguf_py": f"{gguf_version} (llama.cpp's bundled gguf-py, {Path(gguf.__file__).parent})",
        "llama_cpp_commit": commit + (" (modified)" if dirty else ""),
        "llama_cpp_source": str(LLAMA_CPP),
    }


def quantize_build(log: Path) -> str:
    for line in log.read_text().splitlines():
        if line.startswith("version:"):
            return line.split(":", 1)[1].strip()
    return "?"


@torch.no_grad()
def try_unsupported(fx: dict, tmp: Path) -> dict:
    work = tmp / fx["name"]
    hf = work / fx["family"]
    hf.mkdir(parents=True)
    source = build_source(fx["config"], fx["seed"], "softmax", hf)
    convert_and_quantize(hf, work, fx["quant"])
    gdir = work / "gguf"
    fields = gguf_fields(gdir / "model.gguf")
    reader = GGUFReader(str(gdir / "model.gguf"))
    out = {
        "family": fx["family"],
        "gguf_architecture": fields["general.architecture"],
        "quant": fx["quant"],
        "gguf_tensor_types": kinds({t.name: {"type": t.tensor_type.name} for t in reader.tensors}),
        "attempts": [],
    }
    src_cfg = AutoConfig.from_pretrained(hf)
    tries = [("from_pretrained(dir, gguf_file)", None)]
    if "with_config" in fx:
        tries.append(("from_pretrained(dir, gguf_file, config=<source config>)", src_cfg))
    for label, cfg in tries:
        entry = {"call": label}
        try:
            m, info = AutoModelForCausalLM.from_pretrained(
                gdir, gguf_file="model.gguf", dtype=torch.float32, config=cfg, output_loading_info=True, **LOAD_KW
            )
            entry["loaded_class"] = type(m).__name__
            entry["loading_report"] = loading_problems(info)
            entry["source_tensors_absent"] = sorted(set(source) - set(m.state_dict()))
        except Exception as e:  # noqa: BLE001  (recorded, not hidden)
            entry["error"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        out["attempts"].append(entry)
    return out


def main() -> int:
    assert QUANTIZE.exists(), f"{QUANTIZE} missing: cmake --build {LLAMA_CPP}/build --target llama-quantize -j2"
    for pkg in ("accelerate", "sentencepiece"):  # transformers' GGUF loading; the converter
        try:
            __import__(pkg)
        except ImportError:
            raise SystemExit(f"{pkg} missing: /work/venv/ref/bin/pip install --target {EXTRAS} --no-deps "
                             "accelerate==1.15.0 sentencepiece==0.2.3")
    assert transformers.utils.is_accelerate_available()
    vers = versions()
    print("versions:", json.dumps(vers))
    prompts = mf.make_prompts()
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    summary = {
        "generator": "tools/reference/make_gguf_models.py",
        "command": "/work/venv/ref/bin/python tools/reference/make_gguf_models.py",
        "versions": vers,
        "converter": "convert_hf_to_gguf.py --outtype f32, with TextModel.get_vocab_base_pre returning 'gpt-2'",
        "thresholds": {"min_greedy_rel": mf.MIN_GREEDY_REL, "min_router_gap": mf.MIN_ROUTER_GAP},
        "prompt_seed": mf.PROMPT_SEED,
        "prompt_vocab": VOCAB,
        "fixtures": {},
        "not_made": {},
    }
    rows = []
    with tempfile.TemporaryDirectory(prefix="sluice-gguf-") as tmpd:
        tmp = Path(tmpd)
        for fx in FIXTURES:
            rejected = []
            twin = fx.get("same_model_as")
            base = summary["fixtures"][twin]["seed"] if twin else fx["base_seed"]
            for seed in range(base, base + SEARCH_TRIES):
                a = attempt(fx, seed, prompts, tmp)
                if mf.passes(a["r"]):
                    break
                r = a["r"]
                print(f"  {fx['name']}: seed {seed} rejected (greedy rel {r['min_greedy_rel']:.3g}, "
                      f"expert gap {r['min_expert_gap']:.3g})")
                rejected.append(seed)
                shutil.rmtree(a["work"])
            else:
                raise SystemExit(f"{fx['name']}: no seed passed in {SEARCH_TRIES} tries")
            r = a["r"]
            if twin:
                assert seed == summary["fixtures"][twin]["seed"], f"{fx['name']}: the seed of {twin} failed here"
            final = OUT / fx["name"]
            final.mkdir()
            shutil.copyfile(a["gdir"] / "model.gguf", final / "model.gguf")
            shutil.copytree(a["dq"], final / "dequant")
            save_file(dict(sorted(r["tensors"].items())), str(final / "reference.safetensors"), metadata={"format": "pt"})
            mf.chmod_tree(final)
            os.chmod(final, 0o755)

            source = load_file(str(a["hf"] / "model.safetensors"))  # names as saved
            tensor_check = check_gguf_tensors(final / "model.gguf", final / "dequant", source)
            dq_cfg = json.loads((final / "dequant" / "config.json").read_text())
            src_cfg = json.loads((a["hf"] / "config.json").read_text())
            perm = check_f32_permutation(a["f32"], source, dq_cfg)
            fields = gguf_fields(final / "model.gguf")
            files = {
                str(p.relative_to(final)): {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
                for p in sorted(final.rglob("*"))
                if p.is_file()
            }
            summary["fixtures"][fx["name"]] = {
                "family": fx["family"],
                "hf_architecture": src_cfg["architectures"][0],
                "model_type": dq_cfg["model_type"],
                "gguf_architecture": fields["general.architecture"],
                "quant_requested": fx["quant"],
                "gguf_file_type": int(fields["general.file_type"]),
                "seed": seed,
                "seeds_rejected": rejected,
                "source_config": src_cfg,
                "config_overrides_from_gguf_keys": a["overrides"],
                "dequant_config_vs_source": config_diff(dq_cfg, src_cfg),
                "tensor_types_by_kind": kinds(tensor_check["tensors"]),
                "tensors": tensor_check["tensors"],
                "checks": {
                    "every_gguf_tensor_dequantized_by_gguf_py_equals_dequant": True,
                    "every_dequant_tensor_covered_by_a_gguf_tensor": tensor_check["all_dequant_tensors_covered"],
                    "tied_lm_head_not_saved": tensor_check["tied_lm_head_not_saved"],
                    "f32_gguf_qk_permutation": perm,
                    "reloaded_dequant_weights_bit_equal_gguf_loaded": True,
                    "gguf_loaded_vs_reloaded_prompt_logits_identical": a["gguf_vs_dequant_identical"],
                    "gguf_loaded_vs_reloaded_prompt_logits_max_abs_diff": a["gguf_vs_dequant_max_abs"],
                },
                "moe_layers": r["moe_layers"],
                "top_k": r["top_k"],
                "min_greedy_margin_rel": r["min_greedy_rel"],
                "min_greedy_margin_abs": r["min_greedy_abs"],
                "min_router_expert_gap": None if r["min_expert_gap"] == float("inf") else r["min_expert_gap"],
                "routing_decisions_checked": r["decisions"],
                "max_abs_logit": r["max_abs_logit"],
                "cached_vs_full_max_abs_diff": r["cached_vs_full"],
                "intermediate_sha256": {
                    "source model.safetensors": sha256_file(a["hf"] / "model.safetensors"),
                    "model-f32.gguf": sha256_file(a["f32"]),
                },
                "llama_quantize": quantize_build(a["work"] / "quantize.log"),
                "versions": vers,
                "files": files,
                "bytes_total": sum(f["bytes"] for f in files.values()),
            }
            assert a["gguf_vs_dequant_identical"], f"{fx['name']}: GGUF-loaded and reloaded logits differ"
            rows.append((fx["name"], seed, r, summary["fixtures"][fx["name"]]))
        for fx in UNSUPPORTED:
            summary["not_made"][fx["name"]] = try_unsupported(fx, tmp)
    (OUT / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    os.chmod(OUT / "summary.json", 0o644)

    for name, seed, r, s in rows:
        eg = "-" if r["min_expert_gap"] == float("inf") else f"{r['min_expert_gap']:.3g}"
        print(f"{name:<18} seed {seed} greedy rel {r['min_greedy_rel']:.3g} expert gap {eg} "
              f"max|logit| {r['max_abs_logit']:.3g} {s['bytes_total'] / 1e6:.2f} MB {s['tensor_types_by_kind']}")
    for name, s in summary["not_made"].items():
        print(f"{name}: not made: {s['attempts']}")
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    tree = hashlib.sha256()
    for p in sorted(OUT.rglob("*")):
        if p.is_file():
            tree.update(f"{p.relative_to(OUT)} {sha256_file(p)}\n".encode())
    print(f"total size {total / 1e6:.2f} MB; tree sha256 {tree.hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
