#!/usr/bin/env bash
# sluice beside llama.cpp on the same synthetic DeepSeek-V3-shaped model (BF16 in both), the same
# prompt length, generation length and thread count: (a) in RAM, (b) under a memory cap the model
# is at least 4x larger than, enforced by a child memory cgroup this script creates and removes.
# Prompt processing and decode are measured in alternating pairs (llama.cpp, then sluice), REPS
# times per setting, and the medians are printed with their ratios.
#
#   bash benches/vs_llamacpp.sh
#
# Needs: a release build of sluice (cargo build --release), llama.cpp built outside the repository
# (llama-bench), and a Python with torch and transformers for llama.cpp's converter. Settings
# (environment variables, defaults in brackets):
#   LLAMA_DIR  llama.cpp source tree with convert_hf_to_gguf.py           [/work/llama/src]
#   LLAMA_BIN  directory with llama-bench                                 [$LLAMA_DIR/build/bin]
#   PYTHON     Python for the converter                                   [python3]
#   SLUICE     the sluice binary                       [$CARGO_TARGET_DIR or target]/release/sluice
#   WORK       where the model and its GGUF are written (kept for reuse)  [/work/bench-data/vs]
#   THREADS    threads for both engines                                   [nproc]
#   CAP        memory cap of the cgroup run, MiB                          [512]
#   PROMPT     prompt tokens in RAM                                       [512]
#   CAP_PROMPT prompt tokens under the cap                                [2048]
#   GEN        generated tokens (in RAM / under the cap)                  [32 / 16]
#   REPS       alternating pairs per setting                              [3]
#   DEPTH      context llama.cpp decodes at: "prompt" (the prompt's length, where sluice decodes:
#              llama-bench -d) or 0 (llama-bench's own tg test, from an empty context, as this
#              script measured before 2026-12-05)                               [prompt]
#   MOE_INTER  expert intermediate size of the synthetic model            [768]
#   GGUF_QUANT a llama-quantize type (Q4_K_M, Q8_0, ...): both engines then read the same
#              quantized GGUF ($WORK/model-<type>.gguf, made from the BF16 one), sluice
#              multiplying its blocks in place; unset, llama.cpp reads the BF16 GGUF and sluice
#              the safetensors checkpoint                                      [unset]
#   NUMERICS   sluice's --numerics: exact (f32 products of the decoded weights) or int8 (8-bit
#              activations and integer dot products, llama.cpp's numerics)      [exact]
#
# llama.cpp's CPU weight repacking (llama-bench --repack 1, its default) aborts on the quantized
# GGUF of this DeepSeek-V3-shaped model in the build used here (GGML_ASSERT(*cur_backend_id !=
# -1) in ggml-backend.cpp; the BF16 file runs), so the quantized mode runs it with --repack 0.
#
# llama.cpp is built, for example, from the source distribution of llama-cpp-python:
#   pip download llama-cpp-python --no-binary llama-cpp-python --no-deps
#   tar xzf llama_cpp_python-*.tar.gz; cd llama_cpp_python-*/vendor/llama.cpp
#   cmake -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF && cmake --build build -j --target llama-bench
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
LLAMA_DIR=${LLAMA_DIR:-/work/llama/src}
LLAMA_BIN=${LLAMA_BIN:-$LLAMA_DIR/build/bin}
PYTHON=${PYTHON:-python3}
SLUICE=${SLUICE:-${CARGO_TARGET_DIR:-$repo/target}/release/sluice}
WORK=${WORK:-/work/bench-data/vs}
THREADS=${THREADS:-$(nproc)}
CAP=${CAP:-512}
PROMPT=${PROMPT:-512}
CAP_PROMPT=${CAP_PROMPT:-2048}
REPS=${REPS:-3}
GEN_RAM=${GEN:-32}
GEN_CAP=${GEN:-16}
MOE_INTER=${MOE_INTER:-768}
DEPTH=${DEPTH:-prompt}
NUMERICS=${NUMERICS:-exact}
case "$DEPTH" in prompt|0) ;; *) echo "DEPTH must be prompt or 0, not '$DEPTH'" >&2; exit 2 ;; esac

GGUF_QUANT=${GGUF_QUANT:-}
for f in "$SLUICE" "$LLAMA_BIN/llama-bench" "$LLAMA_DIR/convert_hf_to_gguf.py"; do
    [ -e "$f" ] || { echo "missing: $f (see the header of $0)" >&2; exit 2; }
done
mkdir -p "$WORK"
model=$WORK/model
gguf=$WORK/model-bf16.gguf

if [ ! -f "$model/config.json" ]; then
    echo "== writing the synthetic model" >&2
    "$SLUICE" synth "$model" --moe-inter "$MOE_INTER"
fi
if [ ! -f "$gguf" ]; then
    echo "== converting it to GGUF (BF16) with llama.cpp's converter" >&2
    "$PYTHON" "$here/gguf_convert.py" "$LLAMA_DIR" "$model" "$gguf.tmp" --outtype bf16 >&2
    mv "$gguf.tmp" "$gguf"
fi
# What sluice reads: the checkpoint, or in the quantized mode the file llama.cpp reads.
sluice_model=$model
sluice_files=("$model"/*.safetensors)
llama_extra=()
if [ -n "$GGUF_QUANT" ]; then
    q=$WORK/model-$(echo "$GGUF_QUANT" | tr 'A-Z' 'a-z').gguf
    if [ ! -f "$q" ]; then
        echo "== quantizing the GGUF to $GGUF_QUANT with llama-quantize" >&2
        "$LLAMA_BIN/llama-quantize" "$gguf" "$q.tmp" "$GGUF_QUANT" "$THREADS" >&2
        mv "$q.tmp" "$q"
    fi
    gguf=$q
    sluice_model=$q
    sluice_files=("$q")
    llama_extra=(--repack 0)
fi
model_bytes=$(du -b --apparent-size -c "${sluice_files[@]}" | tail -1 | cut -f1)
gguf_bytes=$(stat -c %s "$gguf")
cap_bytes=$((CAP * 1024 * 1024))
if [ $((model_bytes)) -lt $((4 * cap_bytes)) ]; then
    echo "note: the model ($model_bytes B) is less than 4x the cap ($cap_bytes B)" >&2
fi
# Prompt ids as `sluice bench` makes them: deterministic, in [2, vocab).
vocab=$("$PYTHON" -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$model/config.json")
prompt_ids() { seq 0 $(($1 - 1)) | awk -v v="$vocab" '{printf "%s%d", (NR>1?",":""), ($1*7919+13)%(v-2)+2}'; }

# Drops the page-cache pages of files so nothing is read from memory charged to someone else.
drop() { for f in "$@"; do dd if="$f" iflag=nocache count=0 status=none 2>/dev/null || true; done; }

# The cgroup: a child of this shell's own memory cgroup (v1), or of its v2 cgroup.
cg=""
cleanup() {
    if [ -n "$cg" ] && [ -d "$cg" ]; then
        # Processes left in it (none once the runs returned) go back to the parent first.
        if [ -f "$cg/cgroup.procs" ]; then
            while read -r p; do echo "$p" > "$(dirname "$cg")/cgroup.procs" 2>/dev/null || true; done < "$cg/cgroup.procs"
        fi
        rmdir "$cg" 2>/dev/null || echo "warning: could not remove $cg" >&2
    fi
}
trap cleanup EXIT
make_cgroup() {
    local rel
    if [ -d /sys/fs/cgroup/memory ]; then
        rel=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3}' /proc/self/cgroup)
        cg=/sys/fs/cgroup/memory${rel%/}/sluice-vs-$$
        mkdir "$cg"
        echo "$cap_bytes" > "$cg/memory.limit_in_bytes"
        # No swap here, but keep the cap whole where there is some.
        [ -f "$cg/memory.memsw.limit_in_bytes" ] && echo "$cap_bytes" > "$cg/memory.memsw.limit_in_bytes" 2>/dev/null || true
    else
        rel=$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup)
        cg=/sys/fs/cgroup${rel%/}/sluice-vs-$$
        mkdir "$cg"
        echo "$cap_bytes" > "$cg/memory.max"
        echo 0 > "$cg/memory.swap.max" 2>/dev/null || true
    fi
}
# Runs a command inside the cgroup.
in_cg() { sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh "$cg" "$@"; }

# llama-bench: prompt processing and generation tokens/s as "pp tg" (prompt of $1 tokens, $2
# generated, one repetition after llama-bench's own warm-up). With DEPTH=prompt the generation
# test decodes after a context of $1 tokens (-d), as sluice does after its prompt: llama-bench's
# tg test otherwise starts from an empty context, where attention costs nothing. Two calls, so
# the prompt test itself runs from an empty context either way.
llama() {
    local prompt=$1 gen=$2 depth=0; shift 2
    [ "$DEPTH" = prompt ] && depth=$prompt
    drop "$gguf"
    {
        "$@" "$LLAMA_BIN/llama-bench" -m "$gguf" -p "$prompt" -n 0 -t "$THREADS" -r 1 "${llama_extra[@]}" -o jsonl 2>/dev/null
        "$@" "$LLAMA_BIN/llama-bench" -m "$gguf" -p 0 -n "$gen" -d "$depth" -t "$THREADS" -r 1 "${llama_extra[@]}" -o jsonl 2>/dev/null
    } | "$PYTHON" -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
pp = [r["avg_ts"] for r in rows if r["n_prompt"] > 0 and r["n_gen"] == 0]
tg = [r["avg_ts"] for r in rows if r["n_gen"] > 0 and r["n_prompt"] == 0 and r["n_depth"] == int(sys.argv[1])]
print(f"{pp[0] if pp else 0:.3f} {tg[0] if tg else 0:.3f}")' "$depth"
}
# sluice: prefill and decode tokens/s, peak RSS and prefill expert bytes read / bytes of the
# distinct experts the prompt touched (after a warm-up generation, as llama-bench warms up),
# as "pp tg rss read_over_touched". The prefix cache is off: the warm-up's prompt would
# otherwise serve the measured one, leaving no prefill to time.
sluice() {
    local prompt=$1 gen=$2 memory=$3; shift 3
    drop "${sluice_files[@]}"
    "$@" "$SLUICE" run --model "$sluice_model" --prompt-ids "$(prompt_ids "$prompt")" --max-tokens $((gen + 1)) \
        --memory "$memory" --threads "$THREADS" --context $((prompt + gen + 8)) --warmup --prefix-cache off \
        --numerics "$NUMERICS" --json |
        "$PYTHON" -c '
import json, sys
s = json.load(sys.stdin)["stats"]
if s["prefill_tokens"] == 0 or s["prefill_seconds"] <= 0:
    sys.exit("sluice computed no prompt tokens (prefix cache?): nothing to time")
# max_tokens = gen + 1: the first token comes from the prompt pass, then gen decode passes.
passes = max(s["decode_tokens"] - 1, 1)
pp = s["prefill_tokens"] / s["prefill_seconds"]
touched = s["prefill_expert_touched_bytes"]
ratio = s["prefill_expert_bytes_read"] / touched if touched else 0.0
print("%.3f %.3f %d %.3f" % (pp, passes / s["decode_seconds"], s["peak_rss_bytes"], ratio))'
}
median() { tr ' ' '\n' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
# "min / max" of the values on stdin.
span() { tr ' ' '\n' | sort -g | awk 'NF {a[++n]=$1} END {printf "%s / %s", a[1], a[n]}'; }
load() { cut -d' ' -f1-3 /proc/loadavg; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }'; }

# REPS alternating pairs; sets $1_pp/$1_tg (llama.cpp) and $2_pp/$2_tg/$2_rss/$2_rt (sluice)
# to medians.
pairs() {
    local prompt=$1 gen=$2 memory=$3 wrap=$4
    local lpp="" ltg="" spp="" stg="" srss="" srt="" a b c d
    for _ in $(seq "$REPS"); do
        read -r a b < <(llama "$prompt" "$gen" $wrap)
        lpp="$lpp $a"; ltg="$ltg $b"
        read -r a b c d < <(sluice "$prompt" "$gen" "$memory" $wrap)
        spp="$spp $a"; stg="$stg $b"; srss="$srss $c"; srt="$srt $d"
    done
    P_LPP=$(echo $lpp | median); P_LTG=$(echo $ltg | median)
    P_SPP=$(echo $spp | median); P_STG=$(echo $stg | median)
    P_SRSS=$(echo $srss | median); P_SRT=$(echo $srt | median)
    P_MM=("$(echo $lpp | span)" "$(echo $ltg | span)" "$(echo $spp | span)" "$(echo $stg | span)")
    P_ALL="llama.cpp pp [$lpp ] tg [$ltg ]; sluice pp [$spp ] tg [$stg ]"
}

echo "== in RAM: $THREADS threads, prompt $PROMPT, generate $GEN_RAM, $REPS pairs" >&2
ram_load="$(load) before"
pairs "$PROMPT" "$GEN_RAM" unlimited ""
ram=("$P_LPP" "$P_LTG" "$P_SPP" "$P_STG" "$P_SRSS" "$P_SRT"); ram_all=$P_ALL; ram_mm=("${P_MM[@]}")
ram_load="$ram_load, $(load) after"

echo "== under a ${CAP} MiB cgroup cap: prompt $CAP_PROMPT, generate $GEN_CAP, $REPS pairs" >&2
make_cgroup
# sluice's budget leaves room in the cap for the binary, thread stacks and allocator slack.
budget=$(( (CAP - 64) * 1024 * 1024 ))
cap_load="$(load) before"
pairs "$CAP_PROMPT" "$GEN_CAP" "$budget" in_cg
cap=("$P_LPP" "$P_LTG" "$P_SPP" "$P_STG" "$P_SRSS" "$P_SRT"); cap_all=$P_ALL; cap_mm=("${P_MM[@]}")
cap_load="$cap_load, $(load) after"
peak=$(cat "$cg/memory.max_usage_in_bytes" 2>/dev/null || cat "$cg/memory.peak" 2>/dev/null || echo 0)
cleanup
cg=""

echo
echo "model: $sluice_model ($((model_bytes / 1048576)) MiB read by sluice, $((gguf_bytes / 1048576)) MiB GGUF read by llama.cpp${GGUF_QUANT:+: both the same $GGUF_QUANT file}), $THREADS threads, medians of $REPS alternating pairs; llama.cpp decodes after a context of $([ "$DEPTH" = prompt ] && echo "the prompt's length (llama-bench -d), as sluice does" || echo "0 tokens (llama-bench's tg test), sluice after its prompt")"
echo
echo "| setting | engine | prompt | prefill tok/s median (min / max) | prefill vs llama.cpp | decode tok/s median (min / max) | decode vs llama.cpp |"
echo "|---|---|---:|---:|---:|---:|---:|"
echo "| in RAM | llama.cpp | $PROMPT | ${ram[0]} (${ram_mm[0]}) | 1.00x | ${ram[1]} (${ram_mm[1]}) | 1.00x |"
echo "| in RAM | sluice | $PROMPT | ${ram[2]} (${ram_mm[2]}) | $(ratio "${ram[2]}" "${ram[0]}") | ${ram[3]} (${ram_mm[3]}) | $(ratio "${ram[3]}" "${ram[1]}") |"
echo "| ${CAP} MiB cap | llama.cpp | $CAP_PROMPT | ${cap[0]} (${cap_mm[0]}) | 1.00x | ${cap[1]} (${cap_mm[1]}) | 1.00x |"
echo "| ${CAP} MiB cap | sluice (--memory $((budget / 1048576))MiB) | $CAP_PROMPT | ${cap[2]} (${cap_mm[2]}) | $(ratio "${cap[2]}" "${cap[0]}") | ${cap[3]} (${cap_mm[3]}) | $(ratio "${cap[3]}" "${cap[1]}") |"
echo
echo "load average (1, 5, 15 min): in RAM $ram_load; under the cap $cap_load"
echo
echo "sluice prefill expert bytes read / bytes of the distinct experts the prompt touched, measured run (after the warm-up): ${ram[5]} in RAM, ${cap[5]} under the cap"
echo "sluice peak RSS: $((${ram[4]%.*} / 1048576)) MiB in RAM, $((${cap[4]%.*} / 1048576)) MiB under the cap; cgroup peak (page cache included): $((peak / 1048576)) MiB"
echo "in RAM: $ram_all"
echo "under the cap: $cap_all"
