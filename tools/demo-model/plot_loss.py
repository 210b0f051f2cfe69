"""Plot loss.csv (train loss per 10 steps, held-out loss every 200) to loss.png.

    /work/venv/ref/bin/python tools/demo-model/plot_loss.py tools/demo-model/loss.csv tools/demo-model/loss.png
(needs matplotlib, which is not in requirements.txt: it plays no part in the model.)
"""

import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

rows = list(csv.DictReader(open(sys.argv[1])))
step = [int(r["step"]) for r in rows]
train = [float(r["train_loss"]) for r in rows]
held = [(int(r["step"]), float(r["heldout_loss"])) for r in rows if r["heldout_loss"]]
fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
ax.plot(step, train, label="train (mean of the last 10 steps)", lw=1)
if held:
    ax.plot(*zip(*held), "o-", label="held-out (64 windows)", ms=4)
ax.set_xlabel("step (16 x 255 target tokens each)")
ax.set_ylabel("cross-entropy (nats/token)")
ax.set_ylim(min(train) - 0.3, min(8.5, max(train) + 0.1))
ax.grid(alpha=0.3)
ax.legend()
ax.set_title("sluice demo model (deepseek_v3, 16 experts top-2)")
fig.tight_layout()
fig.savefig(sys.argv[2])
