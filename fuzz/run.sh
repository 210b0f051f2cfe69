#!/usr/bin/env bash
# Runs fuzz targets one after another, each for SECONDS (default 600), at low priority, and
# prints a line per target: seconds, executions, outcome. Logs go to fuzz/logs/<target>.log
# (gitignored), crash inputs to fuzz/artifacts/<target>/.
#
#   fuzz/seed.sh && fuzz/run.sh [SECONDS] [TARGET...]
set -uo pipefail
cd "$(dirname "$0")"
secs=${1:-600}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo +nightly fuzz list)
fi
mkdir -p logs
cargo +nightly fuzz build >/dev/null 2>&1 || { echo "build failed" >&2; exit 1; }
for t in "${targets[@]}"; do
  extra=()
  # Long texts make every execution slow (each id is decoded twice while streaming); the
  # 25,000-character cuts they would reach are covered by the reference tests.
  [ "$t" = tokenizer_text ] && extra=(-max_len=4096)
  start=$(date +%s)
  nice -n 10 cargo +nightly fuzz run "$t" -- -max_total_time="$secs" -timeout=60 \
    -print_final_stats=1 "${extra[@]}" >"logs/$t.log" 2>&1
  rc=$?
  end=$(date +%s)
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "logs/$t.log" | tail -1 | grep -o '[0-9]*$')
  if [ $rc -eq 0 ]; then outcome=ok; else outcome="FAILED (exit $rc): $(grep -m1 -E 'panicked|ERROR: libFuzzer|SUMMARY' "logs/$t.log")"; fi
  printf '%-20s %5ss %12s execs  %s\n' "$t" "$((end - start))" "${execs:-?}" "$outcome"
done
