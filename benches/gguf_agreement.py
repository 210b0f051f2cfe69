#!/usr/bin/env python3
"""How often sluice's greedy tokens agree with llama.cpp's on the same GGUF file.

    python benches/gguf_agreement.py MODEL.gguf TOKENIZER.json [--tokens 32]

Both engines continue each prompt below greedily (sluice: `sluice run --raw --json
--temperature 0`, as a file's `general.sampling.*` defaults would otherwise sample; llama.cpp:
`llama-completion --temp 0 -no-cnv`) for `--tokens` tokens. llama.cpp's text is encoded back
with TOKENIZER.json (the model's tokenizer, e.g. the one transformers writes for the GGUF) and
compared with sluice's ids: per prompt the number of leading tokens that agree, and whether all
do. The two are not expected to agree everywhere: llama.cpp quantizes the activations to 8 bits
for its integer dot products, sluice dots the exactly dequantized weights with f32 activations
(as transformers does), so near-ties can go either way and the texts then part.

Settings (environment): SLUICE (the binary) [target/release/sluice], LLAMA_BIN (directory with
llama-completion) [/work/llama/src/build/bin], THREADS [2], NUMERICS (sluice's --numerics: exact,
or int8 for llama.cpp's own numerics) [exact]. Needs the `tokenizers` package.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from tokenizers import Tokenizer

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at a temperature of",
    "In 1969, the first humans",
    "The quick brown fox",
    "To make a cup of tea, first",
    "The largest planet in our solar system is",
    "Machine learning is a field of",
    "import numpy as np\n",
    "The meaning of life is",
]


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) < 2:
        sys.exit(__doc__)
    n = 32
    if "--tokens" in sys.argv:
        n = int(sys.argv[sys.argv.index("--tokens") + 1])
    model, tok_path = args[0], args[1]
    repo = Path(__file__).resolve().parents[1]
    sluice = os.environ.get("SLUICE", str(repo / "target/release/sluice"))
    llama = Path(os.environ.get("LLAMA_BIN", "/work/llama/src/build/bin")) / "llama-completion"
    threads = os.environ.get("THREADS", "2")
    numerics = os.environ.get("NUMERICS", "exact")
    tok = Tokenizer.from_file(tok_path)
    full = 0
    agree = []
    for p in PROMPTS:
        out = subprocess.run(
            [sluice, "run", "--model", model, "--raw", p, "--max-tokens", str(n), "--json",
             "--temperature", "0", "--threads", threads, "--numerics", numerics],
            check=True, capture_output=True, text=True,
        ).stdout
        ours = json.loads(out)["ids"]
        text = subprocess.run(
            [str(llama), "-m", model, "-p", p, "-n", str(n), "--temp", "0", "-no-cnv", "-nr",
             "--no-display-prompt", "--simple-io", "--no-warmup", "-t", threads],
            check=True, capture_output=True, text=True,
        ).stdout
        theirs = tok.encode(text, add_special_tokens=False).ids[: len(ours)]
        k = 0
        while k < min(len(ours), len(theirs)) and ours[k] == theirs[k]:
            k += 1
        agree.append(k)
        full += k == len(ours)
        print(f"{k:3d}/{len(ours)} agree  {p!r}")
    print(
        f"{full} of {len(PROMPTS)} prompts agree on all {n} tokens; "
        f"mean agreeing prefix {sum(agree) / len(agree):.1f} tokens"
    )


if __name__ == "__main__":
    main()
