#!/usr/bin/env bash
# Seeds every fuzz target's corpus (fuzz/corpus/<target>/, gitignored) from the committed
# fixtures in testdata/. Idempotent; needs python3.
set -euo pipefail
cd "$(dirname "$0")"

# safetensors_header: the headers of the fixture checkpoints.
mkdir -p corpus/safetensors_header
for f in ../testdata/models/*/*.safetensors ../testdata/quant/*/*.safetensors; do
  n=$(python3 -c "import struct,sys; print(struct.unpack('<Q', open(sys.argv[1],'rb').read(8))[0])" "$f")
  name=$(echo "${f#../}" | tr '/' '_')
  # A leading 0 byte: the parser is told the true length of these bytes.
  { printf '\x00'; head -c $((8 + n)) "$f"; } > "corpus/safetensors_header/$name"
done

# gguf: the GGUFWriter fixtures, whole (a leading 0 byte: the parser is told their true length).
mkdir -p corpus/gguf
for f in ../testdata/gguf/files/*.gguf; do
  { printf '\x00'; cat "$f"; } > "corpus/gguf/$(basename "$f")"
done

python3 - <<'PY'
import base64, glob, gzip, json, os, struct

def put(target, name, data):
    d = os.path.join("corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)

def flat(p):
    return p.replace("../", "").replace("/", "_")

# shard_index: the fixture indexes as they are, and a few hostile ones.
for p in sorted(glob.glob("../testdata/*/*/model.safetensors.index.json")):
    put("shard_index", flat(p), open(p, "rb").read())
for i, s in enumerate([
    '{"weight_map":{"a":"../x.safetensors"}}', '{"weight_map":{}}', '{"weight_map":{"a":"."}}',
    '{"weight_map":{"a":"x\\u0000y"}}', '{"weight_map":{"a":"s","b":"s","c":"t"}}',
    '{"metadata":{"total_size":1},"weight_map":{"a":1}}', '[]',
]):
    put("shard_index", f"hand_{i}", s)

# model_config: each fixture config with its own base (byte 0 picks one of the target's
# BASES; any JSON is also read on its own), and small overrides of the bases.
configs = sorted(glob.glob("../testdata/*/*/config.json")) + ["../models/demo/config.json"]
for i, p in enumerate(configs):
    put("model_config", flat(p), bytes([i % 10]) + open(p, "rb").read())
overrides = [
    {"num_hidden_layers": 3}, {"n_group": 2, "topk_group": 1}, {"head_dim": 6},
    {"rope_scaling": {"type": "yarn", "factor": 40, "mscale_all_dim": 1.0}},
    {"quantization_config": {"weight_block_size": [128, 16]}},
    {"quantization_config": {"ignore": ["re:.*mlp.gate$", "lm_head"]}},
    {"quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn"]}},
    {"layer_types": ["sliding_attention", "full_attention"]},
    {"mlp_only_layers": [0], "decoder_sparse_step": 2, "intermediate_size": 64},
    {"eos_token_id": [1, 2], "bos_token_id": None, "tie_word_embeddings": True},
]
for b in range(10):
    for j, o in enumerate(overrides):
        put("model_config", f"override_{b}_{j}", bytes([b]) + json.dumps(o).encode())

# packed_manifest: manifests laid out as `sluice pack` lays them out, from fixture headers
# (byte 0 even: the bytes as they are).
def header(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n])

SIZE = {"F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "U8": 1, "I32": 4, "I64": 8, "BOOL": 1,
        "F8_E8M0": 1, "I8": 1, "F64": 8, "U32": 4}
for d in ["../testdata/models/deepseek_v3-bf16", "../testdata/quant/gpt_oss-mxfp4",
          "../testdata/models/mixtral-fp32"]:
    shards = sorted(glob.glob(d + "/model*.safetensors"))
    groups = {}
    for s in shards:
        for name, t in header(s).items():
            if name == "__metadata__" or ".experts." in name:
                continue
            if ".layers." in name:
                g = "layer." + name.split(".layers.")[1].split(".")[0]
            elif "embed" in name:
                g = "embed"
            else:
                g = "head"
            groups.setdefault(g, []).append((name, t))
    order = ["embed"] + sorted((g for g in groups if g.startswith("layer.")),
                               key=lambda g: int(g.split(".")[1])) + ["head"]
    parts, off = [], 0
    for g in order:
        if g not in groups:
            continue
        off = (off + 4095) // 4096 * 4096
        at, ts = off, []
        for name, t in sorted(groups[g]):
            n = SIZE[t["dtype"]]
            for x in t["shape"]:
                n *= x
            ts.append({"name": name, "dtype": t["dtype"], "shape": t["shape"], "offset": at, "len": n})
            at += n
        parts.append({"name": g, "offset": off, "len": at - off, "xxh3": "0123456789abcdef", "tensors": ts})
        off = at
    m = {"format": "sluice-packed-trunk", "version": 1, "source": os.path.abspath(d),
         "source_shards": [{"name": os.path.basename(s), "len": os.path.getsize(s)} for s in shards],
         "file": "trunk.bin", "file_len": (off + 4095) // 4096 * 4096, "parts": parts}
    put("packed_manifest", flat(d), b"\x00" + json.dumps(m, indent=2).encode())
# byte 0 odd: `arbitrary` input; a few short ones to start from.
for i in range(8):
    put("packed_manifest", f"arb_{i}", bytes([1]) + bytes(range(i * 7, i * 7 + 40)))

# tokenizer_text: the fixture texts for every tokenizer (mode 0), and the reference ids of
# the expected encodings and lossy decodes (mode 1, 3 bytes per id).
TOKS = ["bpe_small", "kimi_o200k", "spm_small", "deepseek_v3"]
texts = json.load(open("../testdata/tokenizers/texts.json"))
for t, tok in enumerate(TOKS):
    for x in texts:
        put("tokenizer_text", f"{tok}_text_{x['name']}", bytes([t, 0]) + x["text"].encode())
    exp = json.load(open(f"../testdata/tokenizers/expected/{tok}.json"))
    seqs = [e["ids"] for e in exp["encodings"]] + [d["ids"] for d in exp["decodes"]]
    for j, ids in enumerate(seqs):
        ids = ids[:2000]
        put("tokenizer_text", f"{tok}_ids_{j}",
            bytes([t, 1]) + b"".join(struct.pack("<I", i)[:3] for i in ids))

# tiktoken_ranks: flags 0xFF ranks 0xFF specials 0xFF pattern 0xFF text.
table = gzip.open("../testdata/tokenizers/kimi_o200k/tiktoken.model.gz").read().split(b"\n")
cfg = json.load(open("../testdata/tokenizers/kimi_o200k/tokenizer_config.json"))
specials = "\n".join(f"{k} {v['content']}" for k, v in list(cfg["added_tokens_decoder"].items())[:8])
def b64(s):
    return base64.b64encode(s.encode()).decode()
small = "\n".join(f"{b64(s)} {256 + i}" for i, s in enumerate(["he", "ll", "hell", "hello", " w", "or", "  ", "    "]))
sample = [x["text"] for x in texts if len(x["text"].encode()) < 2000]
for i, text in enumerate(sample):
    # The first 1,000 ranks of the real table (every byte, then common merges), Kimi's specials
    # renumbered past them.
    sp = "\n".join(f"{1000 + j} {l.split(' ', 1)[1]}" for j, l in enumerate(specials.split("\n")))
    put("tiktoken_ranks", f"kimi_{i}",
        b"\x00\xff" + b"\n".join(table[:1000]) + b"\xff" + sp.encode() + b"\xff\xff" + text.encode())
    put("tiktoken_ranks", f"small_{i}",
        b"\x01\xff" + small.encode() + b"\xff300 <|end|>\xff\xff" + text.encode())
put("tiktoken_ranks", "kimi_pattern", b"\x05\xff" + small.encode() + b"\xff\xff\xffhello World 123 ok\n")
put("tiktoken_ranks", "pattern", b"\x03\xff" + small.encode() + b"\xff\xff\\w+|\\s+|.\xffhello world")

# chat_template: each conversation, JSON form, for each template, with and without the
# generation prompt.
convs = json.load(open("../testdata/tokenizers/chat/conversations.json"))
for t in range(3):
    for c in convs:
        for agp in (0, 1):
            put("chat_template", f"{t}_{c['name']}_{agp}",
                bytes([t, 2 | agp]) + json.dumps(c["messages"], ensure_ascii=False).encode())
    put("chat_template", f"{t}_tools",
        bytes([t, 3]) + json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]}, {"role": "tool", "content": "1"}], "tools": [{"type": "function", "function": {"name": "f"}}]}).encode())
PY
for d in corpus/*/; do printf '%-20s %s\n' "$(basename "$d")" "$(ls "$d" | wc -l)"; done
