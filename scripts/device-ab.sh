#!/usr/bin/env bash
# Unpack another commit into .ab/ for `scripts/device-runs.sh ab` (capacity trials alternated
# between that commit and this tree on the GPU machine). Run from the checkout's root:
#   scripts/device-ab.sh COMMIT
# .ab/ holds the commit's code only (its data, docs, tests, demo clip and punctuation weights
# are left out: the capacity bench reads none of them), so that the tree, .benchdata and .ab
# stay under the 64 MiB the device tool carries; carry [".benchdata", ".ab"]. .ab/ is kept out
# of git (.git/info/exclude).
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 COMMIT" >&2; exit 2; }
cd "$(dirname "$0")/.."
commit=$(git rev-parse --short "$1^{commit}")
rm -rf .ab && mkdir .ab
git archive "$commit" | tar -x -C .ab
rm -rf .ab/data .ab/docs .ab/tests .ab/models/punct/weights.pt .ab/subd/data/demo.wav
echo "$commit" > .ab/.commit
grep -qx '.ab' .git/info/exclude 2>/dev/null || echo '.ab' >> .git/info/exclude
echo "$0: .ab holds $commit ($(du -sh .ab | cut -f1)); the tracked tree, .benchdata and .ab:" \
  "$(( ($(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1) \
        + $(du -sb .benchdata 2>/dev/null | cut -f1 || echo 0) + $(du -sb .ab | cut -f1)) >> 20 )) MiB of 64"
