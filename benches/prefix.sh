#!/usr/bin/env bash
# The prefix cache on a document asked several questions: `sluice batch --batch-size 1` over
# QUESTIONS jobs that share DOC_FILE's text as their prompt's start, with `--prefix-cache off`
# and with it on, in alternating pairs (REPS per setting). Reports medians of the whole run's
# wall time and of the prompts' summed prefill seconds, and the prompt tokens taken from the
# cache. Both settings must give the same texts; the script stops if they do not.
#
#   bash benches/prefix.sh MODEL_DIR MEMORY DOC_FILE [extra sluice batch flags...]
#
# MEMORY is a --memory value (`unlimited` for all in RAM). Settings (environment variables):
#   SLUICE     the sluice binary               [$CARGO_TARGET_DIR or target]/release/sluice
#   THREADS    threads                         [nproc]
#   REPS       alternating pairs               [3]
#   QUESTIONS  jobs                            [4]
#   TOKENS     max tokens per job              [16]
#   CACHE      --prefix-cache value when on    [the default]
# Needs python3 (to write the jobs and read the output).
set -euo pipefail

SLUICE=${SLUICE:-${CARGO_TARGET_DIR:-target}/release/sluice}
THREADS=${THREADS:-$(nproc)}
REPS=${REPS:-3}
QUESTIONS=${QUESTIONS:-4}
TOKENS=${TOKENS:-16}
[ $# -ge 3 ] || { echo "usage: $0 MODEL_DIR MEMORY DOC_FILE [flags...]" >&2; exit 2; }
model=$1 memory=$2 doc=$3
shift 3

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$doc" "$QUESTIONS" "$TOKENS" >"$work/in.jsonl" <<'EOF'
import json, sys
doc = open(sys.argv[1]).read()
asks = ["Who is it about?", "Where does it happen?", "What happens first?", "How does it end?",
        "Who speaks most?", "What is the weather like?", "What is the title?", "Why?"]
for i in range(int(sys.argv[2])):
    q = asks[i % len(asks)] + (f" ({i})" if i >= len(asks) else "")
    print(json.dumps({"id": str(i), "prompt": f"{doc}\n\nQuestion: {q}\nAnswer:",
                      "max_tokens": int(sys.argv[3]), "temperature": 0}))
EOF

on=()
[ -n "${CACHE:-}" ] && on=(--prefix-cache "$CACHE")
for r in $(seq "$REPS"); do
    for mode in off on; do
        out="$work/$mode-$r.jsonl"
        if [ "$mode" = off ]; then flags=(--prefix-cache off); else flags=("${on[@]}"); fi
        t0=$(date +%s.%N)
        "$SLUICE" batch --model "$model" --memory "$memory" --threads "$THREADS" \
            --batch-size 1 --input "$work/in.jsonl" --output "$out" "${flags[@]}" "$@" \
            2>"$work/err" || { cat "$work/err" >&2; exit 1; }
        t1=$(date +%s.%N)
        echo "$mode $r $(echo "$t1 - $t0" | bc)" >>"$work/times"
    done
done
python3 - "$work" "$model" "$memory" <<'EOF'
import json, statistics, sys, glob
work = sys.argv[1]
rows = [l.split() for l in open(f"{work}/times")]
texts, prefill, cached, prompt = {}, {"off": [], "on": []}, 0, 0
for mode, r, secs in rows:
    lines = sorted((json.loads(l) for l in open(f"{work}/{mode}-{r}.jsonl")), key=lambda d: int(d["id"]))
    texts.setdefault(tuple(d["text"] for d in lines), []).append(mode)
    prefill[mode].append(sum(d["prefill_seconds"] for d in lines))
    if mode == "on":
        cached = sum(d.get("cached_tokens", 0) for d in lines)
        prompt = sum(d["prompt_tokens"] for d in lines)
if len(texts) != 1:
    sys.exit("the prefix cache changed the output")
wall = {m: statistics.median(float(s) for mm, _, s in rows if mm == m) for m in ("off", "on")}
pre = {m: statistics.median(v) for m, v in prefill.items()}
name = sys.argv[2].rstrip("/").split("/")[-1]
print(f"| {name} | {sys.argv[3]} | {cached} of {prompt} | {pre['off']:.2f} → {pre['on']:.2f} s "
      f"({pre['off'] / max(pre['on'], 1e-9):.1f}×) | {wall['off']:.2f} → {wall['on']:.2f} s ({wall['off'] / wall['on']:.2f}×) |")
EOF
