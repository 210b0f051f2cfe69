#!/usr/bin/env python3
"""`sluice serve` under the requests of issue 59: how fast /health answers while grammars
compile and chat templates render, and the server's peak RSS against --memory.

    python3 benches/hostile_serve.py MODEL_DIR [--memory 64MiB] [--sluice target/release/sluice]

Two servers run on MODEL_DIR: one as it is, one with a chat template that burns its fuel (a
copy of the directory with symlinks to the model's files and its own chat_template.jinja).
While CLIENTS requests each compile a slow schema (on the first) or render the hostile template
(on the second), /health is asked every 20 ms; the medians and maxima of its answers are
printed. Then the first server answers three requests at once of n=16 choices, 400 tokens and
20 log-probabilities each, and a response_format of a 300 kB const with n=16, and its peak RSS
(VmHWM) is printed beside the budget. Standard library only.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

SLOW_SCHEMA = {"type": "string", "pattern": "^(a{1000}){1000}$"}
CHATML = ("{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}\n{% endfor %}"
          "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
HOSTILE_TEMPLATE = (
    "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
)


def start(sluice, model, memory):
    p = subprocess.Popen(
        [sluice, "serve", "--model", model, "--port", "0", "--memory", memory,
         "--batch-size", "4", "--context", "512"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    line = p.stderr.readline()
    m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
    if not m:
        p.kill()
        sys.exit(f"no port in {line!r}")
    threading.Thread(target=p.stderr.read, daemon=True).start()
    return p, int(m.group(1))


def post(port, path, body):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def health_during(port, work, clients):
    """Runs `clients` threads of `work`, asking /health every 20 ms meanwhile: the latencies."""
    threads = [threading.Thread(target=work) for _ in range(clients)]
    for t in threads:
        t.start()
    lat = []
    while any(t.is_alive() for t in threads):
        t0 = time.perf_counter()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=60) as r:
            r.read()
        lat.append(time.perf_counter() - t0)
        time.sleep(0.02)
    for t in threads:
        t.join()
    return lat


def vm_hwm(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def size(s):
    m = re.fullmatch(r"(\d+)(MiB|GiB)", s)
    return int(m.group(1)) << (20 if m.group(2) == "MiB" else 30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--memory", default="64MiB")
    ap.add_argument("--sluice", default=os.path.join(
        os.environ.get("CARGO_TARGET_DIR", "target"), "release", "sluice"))
    ap.add_argument("--clients", type=int, default=4)
    a = ap.parse_args()

    # Two copies of the model directory (symlinks), each with a chat_template.jinja: the
    # model's own (or ChatML, when it has none) and the hostile one.
    cfg = os.path.join(a.model, "tokenizer_config.json")
    has = os.path.exists(os.path.join(a.model, "chat_template.jinja")) or (
        os.path.exists(cfg) and "chat_template" in json.load(open(cfg)))
    dirs = []
    for template in [None if has else CHATML, HOSTILE_TEMPLATE]:
        d = tempfile.mkdtemp(prefix="sluice-hostile-")
        dirs.append(d)
        for f in os.listdir(a.model):
            if template is None or f != "chat_template.jinja":
                os.symlink(os.path.abspath(os.path.join(a.model, f)), os.path.join(d, f))
        if template is not None:
            with open(os.path.join(d, "chat_template.jinja"), "w") as f:
                f.write(template)
    try:
        plain, port = start(a.sluice, dirs[0], a.memory)
        bad, bad_port = start(a.sluice, dirs[1], a.memory)
        try:
            chat = {"messages": [{"role": "user", "content": "Tell me about a book."}],
                    "max_tokens": 8}
            compile_statuses, render_statuses = [], []

            def compile_work():
                body = dict(chat, response_format={"type": "json_schema", "json_schema": {
                    "name": "x", "schema": SLOW_SCHEMA}})
                compile_statuses.append(post(port, "/v1/chat/completions", body)[0])

            def render_work():
                render_statuses.append(post(bad_port, "/v1/chat/completions", chat)[0])

            for name, p, work, statuses in [("compiling", port, compile_work, compile_statuses),
                                            ("rendering", bad_port, render_work, render_statuses)]:
                lat = health_during(p, work, a.clients)
                print(f"/health while {a.clients} requests are {name}: {len(lat)} answers, "
                      f"median {1e3 * statistics.median(lat):.1f} ms, "
                      f"max {1e3 * max(lat):.1f} ms; the requests answered {sorted(set(statuses))}")

            big = dict(chat, n=16, max_tokens=400, logprobs=True, top_logprobs=20,
                       temperature=1.0)
            statuses = []
            threads = [threading.Thread(target=lambda: statuses.append(
                post(port, "/v1/chat/completions", big)[0])) for _ in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            const = dict(chat, n=16, response_format={"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"const": "z" * 300000}}})
            statuses.append(post(port, "/v1/chat/completions", const)[0])
            peak = vm_hwm(plain.pid)
            budget = size(a.memory)
            print(f"peak RSS {peak / 2**20:.1f} MiB at --memory {a.memory} (budget + "
                  f"{(peak - budget) / 2**20:.1f} MiB) after three n=16 x 400-token requests "
                  f"with 20 log-probabilities and a 300 kB const with n=16: {statuses}")
        finally:
            for p in (plain, bad):
                p.terminate()
                p.wait()
    finally:
        for d in dirs:
            for f in os.listdir(d):
                os.unlink(os.path.join(d, f))
            os.rmdir(d)


if __name__ == "__main__":
    main()
