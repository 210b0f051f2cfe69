#!/usr/bin/env python3
"""Regenerate sluice's GGUF tokenizer fixtures (testdata/gguf/vocab/).

    /work/venv/ref/bin/python tools/reference/make_gguf_tokenizer_fixtures.py [LLAMA_CPP_MODELS]

LLAMA_CPP_MODELS is llama.cpp's `models/` directory (default: the one vendored by
llama-cpp-python 0.3.36 under /work/llama). No network: transformers loads every file with
`AutoTokenizer.from_pretrained(dir, gguf_file=name)`, and llama.cpp is llama-cpp-python 0.3.36
from its source tree (/work/llama/llama_cpp_python-0.3.36) on the libllama built in its
`vendor/llama.cpp/build/bin`. Running it twice gives byte-identical files; it prints a sha256
over what it wrote. It takes about 80 s.

What it writes (see testdata/gguf/vocab/README.md):

1. llama.cpp's vocab test files for the vocabularies in `VOCABS`: `ggml-vocab-NAME.gguf.gz`
   (gzip -9, no name or time in the header), `.gguf.inp` and `.gguf.out` copied as they are. For
   `SAME_VOCAB` entries only `.inp` and `.out` are copied, after checking that the file's metadata
   equals its twin's but for `tokenizer.ggml.pre` (the test rebuilds it from the twin).

2. `transformers.json`: for the vocabularies in `TRANSFORMERS`, the ids transformers 5.24's
   tokenizer gives for a set of texts (add_special_tokens False and True), its backend's decode
   of those ids, its vocabulary size, its `special_tokens_map`, and `apply_chat_template` renders
   of a few conversations when the file has a `tokenizer.chat_template`; for `TEMPLATE_ONLY`
   (whose architecture transformers refuses), renders of the default template by transformers'
   renderer with the special tokens its GGUF reader gives.

   Where transformers' GGUF loader does not build the model's own tokenizer, the reference is
   transformers' tokenizer with that one thing changed, named in the file's `patches`, and the
   ids transformers gives unpatched are kept beside (`transformers_ids`, ...) wherever they
   differ. The patches, each what llama.cpp and the model's `tokenizer.json` do (and what the
   `.gguf.out` files, made by each model's own tokenizer, confirm):

   - `prepend_normalizer` (SentencePiece): the normalizer `Prepend("▁")` + `Replace(" ", "▁")`
     and no pre-tokenizer, which transformers itself uses for Phi-3 files, in place of its
     `Metaspace(prepend_scheme="first")`, which does not add `▁` to text that starts with a space;
   - `ignore_merges` (Llama 3's BPE): `ignore_merges = True`, as Llama 3's `tokenizer.json` has it;
   - `drop_appended` (byte-level): the added tokens transformers appends past the file's token
     list (`<|endoftext|>`, GPT2Tokenizer's default, which Llama 3's vocabulary lacks) removed.

3. `llama_cpp.json`: llama.cpp's ids (`tokenize(text, add_bos=False, special=True)`) for every
   committed vocabulary, its `SAME_VOCAB` twins and `VARIANTS` (a vocabulary with one key
   changed, which the test makes the same way), on the same texts, and what `add_bos=True` adds
   around them (checked to be the same for every text).
"""

from __future__ import annotations

import gzip
import importlib.metadata
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import gguf  # noqa: E402
import tokenizers  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.set_verbosity_error()

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "testdata" / "gguf" / "vocab"
DEFAULT_MODELS = Path("/work/llama/llama_cpp_python-0.3.36/vendor/llama.cpp/models")

# Vocabularies committed (gzipped) with their llama.cpp test files.
VOCABS = [
    "llama-spm",
    "phi-3",
    "gpt-2",
    "mpt",
    "starcoder",
    "refact",
    "falcon",
    "deepseek-coder",
    "deepseek-llm",
    "qwen2",
    "llama-bpe",
    "command-r",
]
# name -> the committed vocabulary it equals but for `tokenizer.ggml.pre`.
SAME_VOCAB = {"qwen35": "qwen2"}
# Vocabularies with a transformers reference, and the patches each needs (see the docstring).
TRANSFORMERS = {
    "gpt-2": [],
    "qwen2": [],
    "phi-3": [],
    "llama-spm": ["prepend_normalizer"],
    "llama-bpe": ["ignore_merges", "drop_appended"],
}
# Special tokens written into the texts of each vocabulary.
SPECIAL_TEXTS = {
    "gpt-2": ["<|endoftext|>Hello<|endoftext|>", "a<|endoftext|> b"],
    "qwen2": [
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "<|endoftext|>x [PAD151933] y",
    ],
    "phi-3": ["<|user|>\nHi<|end|>\n<|assistant|>", "<s>a</s> b<|endoftext|>"],
    "llama-spm": ["<s>Hello</s> world", "x<s> y", " <s>"],
    "llama-bpe": [
        "<|begin_of_text|>Hello<|end_of_text|>",
        "a<|reserved_special_token_5|> b",
        "x<|endoftext|>y",
    ],
    "deepseek-coder": ["<｜begin▁of▁sentence｜>def f():<｜end▁of▁sentence｜>", "a<|EOT|>b"],
    "deepseek-llm": ["<｜begin▁of▁sentence｜>Hi<｜end▁of▁sentence｜>", "x ø y"],
    "falcon": [">>TITLE<<x<|endoftext|>", "a>>QUESTION<< b"],
    "starcoder": ["<fim_prefix>def<fim_suffix>x<fim_middle>", "<|endoftext|>a"],
    "refact": ["<fim_prefix>a<fim_suffix>b<fim_middle>", "<|endoftext|> x"],
    "mpt": ["<|endoftext|>a", "x<|padding|> y"],
    "command-r": [
        "<BOS_TOKEN><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi<|END_OF_TURN_TOKEN|>",
        "x<PAD> y",
    ],
}
SPECIAL_TEXTS["qwen35"] = SPECIAL_TEXTS["qwen2"]
SPECIAL_TEXTS["phi-3"] = SPECIAL_TEXTS["phi-3"]
# Texts every vocabulary encodes beside testdata/tokenizers/texts.json (whose 30,000-character
# ones are left out here).
EXTRA_TEXTS = [
    ("leading_space", " Hello world"),
    ("leading_spaces", "   three"),
    ("leading_tab", "\tx"),
    ("leading_newline", "\nx"),
    ("space", " "),
    ("trailing_space", "end "),
    ("rare_words", "Cửa Việt antidisestablishmentarianism"),
    ("fraction", "ied 4 ½ months"),
]
CONVERSATIONS = ["user_only", "system_user", "multi_turn"]
# Vocabularies transformers cannot load (it refuses their architecture) whose default chat
# template is rendered with transformers' own renderer and the special tokens transformers' GGUF
# reader gives (`get_gguf_tokenizer`).
TEMPLATE_ONLY = ["command-r"]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# Variants of committed vocabularies with one metadata key changed, encoded by llama.cpp; the Rust
# test rebuilds each from its base with the same change.
VARIANTS = {"llama-spm+no_space_prefix": ("llama-spm", "tokenizer.ggml.add_space_prefix", False)}

LLAMA_CPP_PYTHON = Path("/work/llama/llama_cpp_python-0.3.36")
LLAMA_CPP_LIB = LLAMA_CPP_PYTHON / "vendor/llama.cpp/build/bin"


def llama_cpp_module():
    """llama-cpp-python 0.3.36 from its source tree, on the libllama built there. Its
    `diskcache` import (a prompt cache this script does not use) is stubbed."""
    import types

    os.environ.setdefault("LLAMA_CPP_LIB_PATH", str(LLAMA_CPP_LIB))
    sys.path.insert(0, str(LLAMA_CPP_PYTHON))
    stub = types.ModuleType("diskcache")
    stub.Cache = object
    sys.modules.setdefault("diskcache", stub)
    import llama_cpp

    return llama_cpp


def write_variant(src: Path, dst: Path, key: str, value) -> None:
    """A copy of a vocab-only GGUF file with one key set (a bool)."""
    r = gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch=arch)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k in ("general.architecture", key):
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(k, f.contents(), f.types[0], sub_type=f.types[1])
        else:
            w.add_key_value(k, f.contents(), f.types[0])
    w.add_bool(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


def llama_cpp_fixture(models: Path) -> dict:
    """llama.cpp's ids for every committed vocabulary (and variant) and text: special tokens
    parsed, add_special False and True."""
    import tempfile

    llama_cpp = llama_cpp_module()
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = {name: models / f"ggml-vocab-{name}.gguf" for name in VOCABS + list(SAME_VOCAB)}
        for name, (base, key, value) in VARIANTS.items():
            files[name] = Path(tmp) / f"{name}.gguf"
            write_variant(models / f"ggml-vocab-{base}.gguf", files[name], key, value)
        for name, path in files.items():
            m = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
            ids = {}
            pairs = []
            for tname, text in texts_for(name.split("+")[0]):
                b = text.encode("utf-8")
                plain = m.tokenize(b, add_bos=False, special=True)
                pairs.append((plain, m.tokenize(b, add_bos=True, special=True)))
                ids[tname] = plain
            # What add_special adds: the same around every text (checked).
            plain, full = next((p, f) for p, f in pairs if p)
            cut = next(i for i in range(len(full)) if full[i : i + len(plain)] == plain)
            prefix, suffix = full[:cut], full[cut + len(plain) :]
            assert all(f == prefix + p + suffix for p, f in pairs), name
            out[name] = {"add_special": {"prefix": prefix, "suffix": suffix}, "ids": ids}
            del m
            print(f"llama.cpp {name}: {len(ids)} texts", file=sys.stderr)
    return out


def tokenizer_fields(path: Path) -> dict:
    """The metadata of a GGUF file, as Python values, `general.*` left out."""
    r = gguf.GGUFReader(str(path))
    return {
        k: f.contents()
        for k, f in r.fields.items()
        if not k.startswith("general.") and not k.startswith("GGUF.")
    }


def copy_vocabs(models: Path) -> dict:
    sources = {}
    for name in VOCABS:
        src = models / f"ggml-vocab-{name}.gguf"
        dst = OUT / f"ggml-vocab-{name}.gguf.gz"
        data = src.read_bytes()
        with open(dst, "wb") as f:
            with gzip.GzipFile(filename="", mode="wb", fileobj=f, compresslevel=9, mtime=0) as g:
                g.write(data)
        sources[src.name] = sha256(src)
    for name, twin in SAME_VOCAB.items():
        a = tokenizer_fields(models / f"ggml-vocab-{name}.gguf")
        b = tokenizer_fields(models / f"ggml-vocab-{twin}.gguf")
        a.pop("tokenizer.ggml.pre")
        b.pop("tokenizer.ggml.pre")
        assert a == b, f"{name} is not {twin} but for tokenizer.ggml.pre"
        sources[f"ggml-vocab-{name}.gguf"] = sha256(models / f"ggml-vocab-{name}.gguf")
    for name in VOCABS + list(SAME_VOCAB):
        for ext in (".gguf.inp", ".gguf.out"):
            src = models / f"ggml-vocab-{name}{ext}"
            shutil.copyfile(src, OUT / src.name)
    return sources


def patched(tok, patches: list[str], n_tokens: int) -> Tokenizer:
    """transformers' backend tokenizer with the named patches applied."""
    j = json.loads(tok.backend_tokenizer.to_str())
    for p in patches:
        if p == "prepend_normalizer":
            # What `normalizers.Sequence([Prepend("▁"), Replace(" ", "▁")])` serialises to.
            j["normalizer"] = {
                "type": "Sequence",
                "normalizers": [
                    {"type": "Prepend", "prepend": "\u2581"},
                    {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
                ],
            }
            j["pre_tokenizer"] = None
        elif p == "ignore_merges":
            j["model"]["ignore_merges"] = True
        elif p == "drop_appended":
            gone = {a["content"] for a in j["added_tokens"] if a["id"] >= n_tokens}
            j["added_tokens"] = [a for a in j["added_tokens"] if a["id"] < n_tokens]
            # The post-processor never names them: transformers adds no BOS/EOS from them here.
            assert not any(t in gone for t in json.dumps(j["post_processor"])), gone
        else:
            raise ValueError(p)
    return Tokenizer.from_str(json.dumps(j))


def texts_for(name: str) -> list[tuple[str, str]]:
    base = json.loads((REPO / "testdata/tokenizers/texts.json").read_text(encoding="utf-8"))
    out = [(t["name"], t["text"]) for t in base if len(t["text"]) <= 10_000]
    out += EXTRA_TEXTS
    out += [(f"special_{name}_{i}", s) for i, s in enumerate(SPECIAL_TEXTS.get(name, []))]
    return out


def renders(render, conversations: dict) -> list[dict]:
    out = []
    for cname in CONVERSATIONS:
        for gen in (False, True):
            r = {"conversation": cname, "add_generation_prompt": gen}
            try:
                r["text"] = render(conversations[cname], gen)
            except Exception as e:  # noqa: BLE001
                r["error"] = str(e)
            out.append(r)
    return out


def template_only(models: Path, conversations: dict) -> dict:
    from transformers.integrations.gguf import get_gguf_tokenizer
    from transformers.utils.chat_template_utils import render_jinja_template

    out = {}
    for name in TEMPLATE_ONLY:
        fname = f"ggml-vocab-{name}.gguf"
        _, _, config = get_gguf_tokenizer(str(models / fname))
        template = config["chat_template"]
        special = {k: config[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token") if config.get(k)}

        def render(messages, gen, template=template, special=special):
            text, _ = render_jinja_template(
                conversations=[messages], chat_template=template, add_generation_prompt=gen, **special
            )
            return text[0]

        out[name] = {
            "file": fname + ".gz",
            "special_tokens_map": special,
            "renders": renders(render, conversations),
        }
    return out


def transformers_fixture(models: Path) -> dict:
    conversations = {
        c["name"]: c["messages"]
        for c in json.loads(
            (REPO / "testdata/tokenizers/chat/conversations.json").read_text(encoding="utf-8")
        )
    }
    files = {}
    for name, patches in TRANSFORMERS.items():
        fname = f"ggml-vocab-{name}.gguf"
        n_tokens = len(gguf.GGUFReader(str(models / fname)).fields["tokenizer.ggml.tokens"].data)
        tok = AutoTokenizer.from_pretrained(str(models), gguf_file=fname)
        ref = patched(tok, patches, n_tokens)
        encodings = []
        differ = 0
        for tname, text in texts_for(name):
            e = {"name": tname, "text": text}
            for key, add in (("ids", False), ("ids_add_special", True)):
                ids = ref.encode(text, add_special_tokens=add).ids
                e[key] = ids
                raw = tok.encode(text, add_special_tokens=add)
                if raw != ids:
                    e["transformers_" + key] = raw
                    differ += 1
            e["decoded"] = ref.decode(e["ids"], skip_special_tokens=False)
            encodings.append(e)
        entry = {
            "file": fname + ".gz",
            "patches": patches,
            "vocab_size": ref.get_vocab_size(with_added_tokens=True),
            "transformers_vocab_size": len(tok),
            "special_tokens_map": {k: str(v) for k, v in tok.special_tokens_map.items()},
            "differ_unpatched": differ,
            "encodings": encodings,
        }
        if tok.chat_template:
            entry["renders"] = renders(
                lambda m, gen, tok=tok: tok.apply_chat_template(
                    m, tokenize=False, add_generation_prompt=gen
                ),
                conversations,
            )
        files[name] = entry
        print(f"{name}: {len(encodings)} texts, {differ} encodings differ unpatched", file=sys.stderr)
    return {
        "conversations": {c: conversations[c] for c in CONVERSATIONS},
        "files": files,
        "template_only": template_only(models, conversations),
    }


def dump(v, indent: int = 0) -> str:
    """JSON with one space of indent per level, lists of numbers on one line."""
    pad = " " * (indent + 1)
    if isinstance(v, dict) and v:
        items = [f"{pad}{json.dumps(k, ensure_ascii=False)}: {dump(x, indent + 1)}" for k, x in v.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if isinstance(v, list) and v and not all(isinstance(x, int) for x in v):
        items = [pad + dump(x, indent + 1) for x in v]
        return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
    return json.dumps(v, ensure_ascii=False, separators=(",", ": ") if isinstance(v, dict) else (",", ":"))


def main() -> None:
    models = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_MODELS
    if OUT.exists():
        for p in OUT.iterdir():
            if p.name != "README.md":
                p.unlink()
    OUT.mkdir(parents=True, exist_ok=True)
    sources = copy_vocabs(models)
    fixture = {
        "generator": "tools/reference/make_gguf_tokenizer_fixtures.py",
        "versions": {
            "python": sys.version.split()[0],
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "gguf": importlib.metadata.version("gguf"),
        },
        "sources_sha256": sources,
    }
    fixture.update(transformers_fixture(models))
    (OUT / "transformers.json").write_text(dump(fixture) + "\n", encoding="utf-8")
    texts = {}
    for name in VOCABS + list(SAME_VOCAB):
        texts.update(texts_for(name))
    lcpp = {
        "generator": fixture["generator"],
        "llama_cpp_python": "0.3.36 (its vendored llama.cpp, built in place)",
        "variants": {k: {"base": b, "key": key, "value": v} for k, (b, key, v) in VARIANTS.items()},
        "texts": texts,
        "files": llama_cpp_fixture(models),
    }
    (OUT / "llama_cpp.json").write_text(dump(lcpp) + "\n", encoding="utf-8")
    h = hashlib.sha256()
    for p in sorted(OUT.iterdir()):
        if p.name != "README.md":
            h.update(p.name.encode() + b"\0" + p.read_bytes())
    print(f"sha256 over {OUT.relative_to(REPO)}: {h.hexdigest()}")


if __name__ == "__main__":
    main()
