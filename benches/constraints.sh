#!/usr/bin/env bash
# The decode cost of constrained output: tokens/s of `sluice run` without a grammar and with a
# JSON schema that cannot end before --max-tokens (an array of at least 60 short strings), in
# alternating pairs, REPS pairs per model, medians printed. Both runs generate the same number
# of tokens (the schema keeps the generation going to the limit; --ignore-eos the plain one).
#
#   bash benches/constraints.sh MODEL_DIR [MODEL_DIR ...]
#
# Settings (environment variables, defaults in brackets):
#   SLUICE   the sluice binary                 [$CARGO_TARGET_DIR or target]/release/sluice
#   TOKENS   generated tokens per run          [128]
#   THREADS  threads                           [nproc]
#   REPS     alternating pairs per model       [5]
#   PROMPT   the prompt (raw, no template)     [Describe a person living in Bath as a JSON object.]
# Needs python3 (to read the --json output).
set -euo pipefail

SLUICE=${SLUICE:-${CARGO_TARGET_DIR:-target}/release/sluice}
TOKENS=${TOKENS:-128}
THREADS=${THREADS:-$(nproc)}
REPS=${REPS:-5}
PROMPT=${PROMPT:-Describe a person living in Bath as a JSON object.}
[ $# -ge 1 ] || { echo "usage: $0 MODEL_DIR [MODEL_DIR ...]" >&2; exit 2; }

schema=$(mktemp --suffix=.json)
trap 'rm -f "$schema"' EXIT
echo '{"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 60}' >"$schema"

# Decode tokens/s of one run: (decode_tokens - 1) / decode_seconds, as sluice bench reports it.
rate() {
    "$SLUICE" run --model "$1" --raw --json --max-tokens "$TOKENS" --ignore-eos \
        --threads "$THREADS" "${@:2}" "$PROMPT" 2>/dev/null |
        python3 -c 'import json, sys
v = json.load(sys.stdin); s = v["stats"]
assert v["finish_reason"] == "length", v["finish_reason"]
print("%.1f" % ((s["decode_tokens"] - 1) / s["decode_seconds"]))'
}

median() { tr ' ' '\n' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

printf '| model | vocabulary | plain tok/s (%s runs) | median | with the schema | median | ratio |\n' "$REPS"
printf '|---|---:|---|---:|---|---:|---:|\n'
for m in "$@"; do
    vocab=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$m/config.json")
    plain=() constrained=()
    for _ in $(seq "$REPS"); do
        plain+=("$(rate "$m")")
        constrained+=("$(rate "$m" --json-schema "$schema")")
    done
    mp=$(echo "${plain[*]}" | median)
    mc=$(echo "${constrained[*]}" | median)
    ratio=$(awk -v a="$mc" -v b="$mp" 'BEGIN {printf "%.2f", a / b}')
    printf '| %s | %s | %s | %s | %s | %s | %s× |\n' "$(basename "$m")" "$vocab" \
        "$(echo "${plain[*]}" | sed 's| | / |g')" "$mp" \
        "$(echo "${constrained[*]}" | sed 's| | / |g')" "$mc" "$ratio"
done
