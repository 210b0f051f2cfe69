#!/usr/bin/env python3
"""Converts a checkpoint written by `sluice synth` to GGUF with llama.cpp's own converter.

    python benches/gguf_convert.py LLAMA_CPP_DIR MODEL_DIR OUT.gguf [--outtype bf16]

The converter identifies a BPE tokenizer by hashing how it splits a fixed text and refuses hashes
it has not seen; the synthetic tokenizer (byte-level BPE, a handful of merges) is one of those.
Its pre-tokenizer is GPT-2's, so this wrapper names it `gpt-2` when the hash is unknown and
otherwise runs the converter unchanged. Benchmarks feed token ids, so the tokenizer never matters
to the figures.
"""

import sys
from pathlib import Path


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    llama, model, out = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    extra = sys.argv[4:] or ["--outtype", "bf16"]
    sys.path.insert(0, str(llama))
    sys.path.insert(1, str(llama / "gguf-py"))
    import conversion.base as base  # noqa: E402  (llama.cpp's package)

    known = base.TextModel.get_vocab_base_pre

    def pre(self, tokenizer):
        try:
            return known(self, tokenizer)
        except NotImplementedError:
            return "gpt-2"

    base.TextModel.get_vocab_base_pre = pre
    sys.argv = ["convert_hf_to_gguf.py", model, "--outfile", out, *extra]
    import convert_hf_to_gguf  # noqa: E402

    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
