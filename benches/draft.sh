#!/usr/bin/env bash
# Speculative decoding against plain decoding: `sluice run --json` with `--draft off` and
# `--draft ngram` (or `--draft mtp`: DRAFT=mtp), in alternating pairs (REPS per setting, which
# of the two runs first alternating from pair to pair),
# medians of the decode rate, the drafts kept, and the bytes read from disk per generated token
# (experts and trunk, prefill excluded). The two runs must give the same ids; the script stops if they do not.
#
#   bash benches/draft.sh MODEL_DIR MEMORY MAX_TOKENS PROMPT [extra sluice run flags...]
#
# MEMORY is a --memory value (`unlimited` for all in RAM). Settings (environment variables):
#   SLUICE   the sluice binary                 [$CARGO_TARGET_DIR or target]/release/sluice
#   THREADS  threads                           [nproc]
#   REPS     alternating pairs                 [3]
#   DRAFT    the drafter                       [ngram]
#   DRAFT_FLAGS  flags for the drafting run only (e.g. "--draft-tokens 2")  []
#   DRAFT_MEMORY --memory of the drafting run  [MEMORY] (MEMORY plus what the MTP layer takes
#                gives the model the same plan in both runs)
# Prints a table row, then each pair's ratio with their median and range.
# Needs python3 (to read the --json output).
set -euo pipefail

SLUICE=${SLUICE:-${CARGO_TARGET_DIR:-target}/release/sluice}
THREADS=${THREADS:-$(nproc)}
REPS=${REPS:-3}
DRAFT=${DRAFT:-ngram}
read -r -a draft_flags <<<"${DRAFT_FLAGS:-}"
[ $# -ge 4 ] || { echo "usage: $0 MODEL_DIR MEMORY MAX_TOKENS PROMPT [flags...]" >&2; exit 2; }
model=$1 memory=$2 tokens=$3 prompt=$4
shift 4
draft_memory=${DRAFT_MEMORY:-$memory}

one() {
    local mem=$1
    shift
    "$SLUICE" run --model "$model" --memory "$mem" --json --temperature 0 \
        --max-tokens "$tokens" --threads "$THREADS" "$@" "$prompt" 2>/dev/null
}

summary=$(mktemp)
trap 'rm -f "$summary"' EXIT
for i in $(seq "$REPS"); do
    # Which runs first alternates: a pair's second run tends to be the faster on a busy host
    # (the same flags twice gave a median second ÷ first of 1.05–1.09).
    order=(off "$DRAFT")
    [ $((i % 2)) = 1 ] || order=("$DRAFT" off)
    for d in "${order[@]}"; do
        flags=() mem=$memory
        [ "$d" = off ] || { flags=("${draft_flags[@]}"); mem=$draft_memory; }
        one "$mem" --draft "$d" "${flags[@]}" "$@" | python3 -c '
import json, sys
v = json.load(sys.stdin); s = v["stats"]; n = s["decode_tokens"]
read = (s["expert_bytes_read"] - s["prefill_expert_bytes_read"]) + (s["trunk_bytes_read"] - s["prefill_trunk_bytes_read"])
print(sys.argv[1], hash(tuple(v["ids"])), n, (n - 1) / s["decode_seconds"], s["draft_proposed"], s["draft_accepted"], read / n)
' "$d" >>"$summary"
    done
done
python3 - "$summary" "$model" "$memory" "$DRAFT" <<'EOF'
import statistics, sys
draft = sys.argv[4]
rows = [l.split() for l in open(sys.argv[1])]
ids = {r[1] for r in rows}
if len(ids) != 1:
    sys.exit("drafting changed the output: " + str(ids))
by = {d: [r for r in rows if r[0] == d] for d in ("off", draft)}
med = lambda d, i: statistics.median(float(r[i]) for r in by[d])
runs = lambda d: " / ".join(f"{float(r[3]):.1f}" for r in by[d])
off, on = med("off", 3), med(draft, 3)
p, a = by[draft][0][4], by[draft][0][5]
print(f"| {sys.argv[2].rstrip('/').split('/')[-1]} | {sys.argv[3]} | {by['off'][0][2]} | {runs('off')} | {runs(draft)} | {on / off:.2f}× "
      f"| {a} of {p} | {med('off', 6) / 2**20:.2f} → {med(draft, 6) / 2**20:.2f} MiB |")
pairs = [float(b[3]) / float(o[3]) for o, b in zip(by["off"], by[draft])]
print("pairs:", " ".join(f"{x:.2f}" for x in pairs),
      f"median {statistics.median(pairs):.2f}× ({min(pairs):.2f}–{max(pairs):.2f})")
EOF
