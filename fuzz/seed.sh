#!/usr/bin/env bash
# Seeds the safetensors_header corpus with the headers of the committed fixtures.
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p corpus/safetensors_header
for f in ../testdata/models/*/*.safetensors; do
  n=$(python3 -c "import struct,sys; print(struct.unpack('<Q', open(sys.argv[1],'rb').read(8))[0])" "$f")
  name=$(echo "${f#../}" | tr '/' '_')
  # A leading 0 byte: the parser is told the true length of these bytes.
  { printf '\x00'; head -c $((8 + n)) "$f"; } > "corpus/safetensors_header/$name"
done
ls corpus/safetensors_header | wc -l
