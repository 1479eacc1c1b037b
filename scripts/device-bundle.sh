#!/usr/bin/env bash
# Build .benchdata/: what a GPU machine with no model wheels and no package index needs to run
# `subd bench gpu` and the GPU tests (docs/MEASUREMENTS.md, "Commands"). Run from the checkout
# with the project's venv active (the packaged tiny.en is read from it). .benchdata/ is ignored
# by git; the device tool carries it (carry [".benchdata"], well under 64 MiB).
#   .benchdata/wheels/   Python 3.12 wheels of subd's dependencies the GPU image lacks
#   .benchdata/tiny_en.tgz  tiny.en as a compact int8-rounded copy (models.portable, 38 MB;
#                        29 MB packed: with the tracked tree, 25 MB since the Mandarin clips
#                        of 2026-12-07, an unpacked copy took the call past 64 MiB), unpacked
#                        to .benchdata/tiny_en by site.sh there
#   .benchdata/ps/       pocketsphinx-testdata's LibriVox and cards clips (SUBD_POCKETSPHINX
#                        there; ps/librivox: the capacity runs' clips)
#   .benchdata/cut.toml, cut23.toml  the capacity runs' configurations
#   .benchdata/cuda.toml             the quality run's: the daemon's recogniser on CUDA
#   .benchdata/site.sh   sourced there: installs the wheels and subd into /tmp/site
# and .benchdata-redis/: Debian's redis-server and the libraries it links beyond the C and C++
# runtimes (bin/redis-server runs it with them), for `subd bench edge` on the device's cores;
# apart, since .benchdata with it would pass 64 MiB (carry [".benchdata-redis",
# ".benchdata/wheels", ".benchdata/site.sh"] for device-runs.sh edge)
set -euo pipefail
out=.benchdata
ps=/usr/share/pocketsphinx/test/data
mkdir -p "$out/wheels"
pip download -q --dest "$out/wheels" --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --no-deps soundfile cffi soxr webrtcvad-wheels text2num chardet
# pure Python (some ship only as sources): wheels built here run on any Python 3
pip wheel -q --wheel-dir "$out/wheels" --no-deps pysrt pytorch-crf pycparser redis \
    whisper-normalizer more-itertools indic-numtowords
# only the LibriVox and cards parts (subd bench daemon streams both): with the rest of
# pocketsphinx-testdata the tree and .benchdata passed the device tool's 64 MiB (2026-12-05)
rm -rf "$out/ps" && mkdir -p "$out/ps" && cp -r "$ps/librivox" "$ps/cards" "$out/ps/"
# redis-server for `subd bench edge` on the device's cores (its image has none)
rs=.benchdata-redis
rm -rf "$out/redis" "$rs" && mkdir -p "$rs/bin" "$rs/lib"
cp /usr/bin/redis-server "$rs/redis-server.bin"
ldd /usr/bin/redis-server | awk '$3 ~ /^\// {print $3}' \
  | grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' \
  | xargs -I{} cp -L {} "$rs/lib/"
cat > "$rs/bin/redis-server" <<'EOF_REDIS'
#!/bin/sh
here=$(dirname "$(readlink -f "$0")")/..
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/redis-server.bin" "$@"
EOF_REDIS
chmod +x "$rs/bin/redis-server"
# the configurations of docs/MEASUREMENTS.md's capacity runs (scripts/device-runs.sh)
printf '[tick]\nlatency_ms = 2000\n\n[recognizer]\nencoder_span = "cut"\n' > "$out/cut.toml"
printf '[tick]\nlatency_ms = 2000\n\n[recognizer]\nencoder_span = "cut"\nencoder_bucket_ms = 2000\ntrim_after_ms = 3000\n' > "$out/cut23.toml"
printf '[recognizer]\ndevice = "cuda"\n' > "$out/cuda.toml"
python - "$out/tiny_en" <<'EOF'
import sys
from pathlib import Path
from subd.models.loading import PACKAGED, _pinned_path, load_model
from subd.models.portable import save_portable
spec = PACKAGED["tiny.en"]
tok = _pinned_path(spec.tokenizer, spec.pip_name)
save_portable(load_model("tiny.en"), Path(sys.argv[1]), tok)
EOF
tar -czf "$out/tiny_en.tgz" -C "$out" tiny_en && rm -rf "$out/tiny_en"
cat > "$out/site.sh" <<'EOF'
# source from the checkout's root on the GPU machine: subd and its wheels in /tmp/site
set -e
# a warm machine keeps /tmp/site between calls: install again when the wheels or the code
# changed (a stale install once ran a call's bench on the last call's wheels)
stamp=$(cat .benchdata/wheels/*.whl pyproject.toml $(find subd models kernels -name '*.py' | sort) | md5sum)
if [ "$(cat /tmp/site/.done 2>/dev/null)" != "$stamp" ]; then
  rm -rf /tmp/site
  pip install -q --no-deps --target /tmp/site .benchdata/wheels/*.whl
  pip install -q --no-deps --no-build-isolation --target /tmp/site .
  ln -sfn "$PWD/data" /tmp/site/data
  echo "$stamp" > /tmp/site/.done
fi
[ -f .benchdata/tiny_en/weights_int8.pt ] || tar -xzf .benchdata/tiny_en.tgz -C .benchdata
export PYTHONPATH=/tmp/site SUBD_POCKETSPHINX=$PWD/.benchdata/ps PATH=/tmp/site/bin:$PATH
set +e
EOF
du -sh "$out"
