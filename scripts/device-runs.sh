#!/usr/bin/env bash
# Runs on the GPU machine, from the checkout's root, with .benchdata carried
# (scripts/device-bundle.sh builds it here first). Output goes to stdout, plots to $OUT.
#   scripts/device-runs.sh check
#       the GPU tests, then `subd bench daemon --device cpu,cuda` (4 channels, float32 on both,
#       updates planned at 700 / 650 ms: the same captions expected on both devices)
#   scripts/device-runs.sh capacity CONFIG STREAMS NAIVE [SIZE [DECISIONS]]
#       `subd bench gpu --policy daemon` with 8 recogniser processes under CUDA MPS; CONFIG a
#       file in .benchdata (cut.toml, cut23.toml), SIZE a capacity-mode size (large-v3-turbo),
#       DECISIONS its --capacity-decisions (transcript, the default, or model); MAX_ROWS in
#       the environment: --max-rows (256; 48 keeps 8 large-v3-turbo-sized processes in an H100)
#   scripts/device-runs.sh round [ROWS]
#       `subd bench round --profile`: one batched round of tiny.en, stage by stage (44 rows)
#   scripts/device-runs.sh edge WORKERS [CLIENTS]
#       `subd bench edge` on the machine's cores (no GPU used): 1 daemon, redis-server
#       (.benchdata-redis), 2 edges, 2 x CLIENTS SSE clients (1000), half never reading;
#       WORKERS a comma list of fan-out workers per server, one bench a value
#   scripts/device-runs.sh ab CONFIG STREAMS ORDER...
#       capacity trials (as `capacity CONFIG STREAMS 0`, 12 s each) alternated between this
#       tree ("new") and the commit scripts/device-ab.sh unpacked into .ab ("old"), e.g.
#       `ab cut23.toml 1024 old new new old`, with /proc/stat's steal read around each trial
#       (carry [".benchdata", ".ab"]): these hosts drift within a call, so a change is judged
#       on runs alternated, never on two runs one after the other
#   scripts/device-runs.sh quality SETS
#       `subd bench quality --pace real` at D = 2 s, the daemon's recogniser on CUDA
#       (.benchdata/cuda.toml), each clip its own stream; SETS: dev, heldout or dev,heldout
#       (~6 min a set: run one a call)
set -uo pipefail
case "${1:-}" in
  check) ;;
  capacity) [ $# -ge 4 ] || { echo "usage: $0 capacity CONFIG STREAMS NAIVE [SIZE [DECISIONS]]" >&2; exit 2; } ;;
  quality) [ $# -ge 2 ] || { echo "usage: $0 quality SETS" >&2; exit 2; } ;;
  ab) [ $# -ge 4 ] && [ -d .ab ] || { echo "usage: $0 ab CONFIG STREAMS ORDER... (old, new; .ab from scripts/device-ab.sh)" >&2; exit 2; } ;;
  round) ;;
  edge) [ $# -ge 2 ] || { echo "usage: $0 edge WORKERS [CLIENTS]" >&2; exit 2; } ;;
  *) echo "usage: $0 check | capacity CONFIG STREAMS NAIVE [SIZE [DECISIONS]] | ab CONFIG STREAMS ORDER... | round [ROWS] | edge WORKERS [CLIENTS] | quality SETS" >&2; exit 2 ;;
esac
command -v nvidia-smi >/dev/null || { echo "$0: no NVIDIA GPU here (run it on the GPU machine)" >&2; exit 2; }
cd "$(dirname "$0")/.."
R=$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
rm -f subd/models subd/kernels  # links from a local checkout would confuse the install
source .benchdata/site.sh
mps_start() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d
}
# one capacity trial: trial CONFIG STREAMS NAIVE PLOT [bench gpu options...], from /tmp
trial() {
  local config=$1 streams=$2 naive=$3 plot=$4
  shift 4
  (cd /tmp && python -m subd.cli bench gpu --policy daemon --model "$R/.benchdata/tiny_en" \
    --clips "$R/.benchdata/ps/librivox" "$@" --streams "$streams" --naive-streams "$naive" \
    --duration-s 12 --ramp-s 3 --warm-s 5 --max-rows "${MAX_ROWS:-256}" --gpu-processes 8 \
    --config "$R/.benchdata/$config" --plot "$plot" 2>&1 | grep -v "^INFO")
}
case "${1:-}" in
  check)
    # the tests import subd from the checkout, which needs its two mapped packages
    ln -sfn ../models subd/models && ln -sfn ../kernels subd/kernels
    export SUBD_GPU_TEST_MODEL="$R/.benchdata/tiny_en"  # the tests load tiny.en from here
    python -m pytest -q -p no:cacheprovider tests/test_layer_norm.py tests/test_gpu.py \
      tests/test_gpu_policy.py tests/test_gpu_marks.py tests/test_gpu_memory.py \
      tests/test_device_config.py 2>&1 | tail -n 15
    rm -f subd/models subd/kernels
    cd /tmp && python -m subd.cli bench daemon --model "$R/.benchdata/tiny_en" --device cpu,cuda \
      --processes auto --update-ms 700 --update-cost-ms 650 --precision fp32 --channels 4 \
      --seconds 30 2>&1 | grep -v "^INFO" | tail -n 40
    ;;
  capacity)
    mps_start
    cap=()
    [ -n "${5:-}" ] && cap=(--capacity "$5" --capacity-decisions "${6:-transcript}")
    # the device's memory as the processes use it (each one's share: [recognizer] gpu_processes)
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -lms 500 \
      > /tmp/apps.csv 2>/dev/null & apps=$!
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits -lms 500 \
      > /tmp/used.csv 2>/dev/null & used=$!
    trial "$2" "$3" "$4" "${OUT:-/tmp}/capacity.png" "${cap[@]}" | tail -n 60
    kill $apps $used 2>/dev/null
    awk -F', ' '{if ($2 > m[$1]) m[$1] = $2} END {n = 0; for (p in m) {n++; printf "%s%d", (n > 1 ? ", " : ""), m[p]}; if (n) printf " MiB: peak of each of %d processes on the GPU\n", n}' /tmp/apps.csv
    awk -F', ' '{if ($1 > m) m = $1; t = $2} END {if (t) printf "device memory used at peak: %d of %d MiB\n", m, t}' /tmp/used.csv
    echo quit | nvidia-cuda-mps-control
    ;;
  ab)
    # the other commit beside this tree's install (/tmp/site): its own modules first
    if [ "$(cat /tmp/site_ab/.done 2>/dev/null)" != "$(cat .ab/.commit)" ]; then
      rm -rf /tmp/site_ab
      pip install -q --no-deps --no-build-isolation --target /tmp/site_ab .ab >/dev/null 2>&1 \
        || { echo "$0: .ab does not install" >&2; exit 1; }
      cat .ab/.commit > /tmp/site_ab/.done
    fi
    mps_start
    steal() { awk '/^cpu /{printf "steal %d of busy %d jiffies", $9, $2+$3+$4+$7+$8}' /proc/stat; }
    config=$2 streams=$3
    shift 3
    for v in "$@"; do
      case $v in
        old) path=/tmp/site_ab:/tmp/site; what="old ($(cat .ab/.commit))" ;;
        new) path=/tmp/site; what="new (this tree)" ;;
        *) echo "$0: ab: trials are old or new, not $v" >&2; continue ;;
      esac
      echo "=== $what $(date +%T), $(steal)"
      PYTHONPATH=$path trial "$config" "$streams" 0 "" | grep -E "^batched N|host CPU" | cut -c1-400
      echo "    after: $(steal)"
    done
    echo quit | nvidia-cuda-mps-control
    ;;
  round)
    cd /tmp && python -m subd.cli bench round --model "$R/.benchdata/tiny_en" \
      --clips "$R/.benchdata/ps/librivox" --rows "${2:-44}" --profile 2>&1 | grep -v "^INFO"
    ;;
  edge)
    export PATH="$R/.benchdata-redis/bin:$PATH"
    nproc; uptime
    for w in ${2//,/ }; do
      echo "== --workers $w"
      (cd /tmp && python -m subd.cli bench edge --workers "$w" --clients "${3:-1000}" 2>&1 \
        | grep -v "^INFO" | tail -n 40)
    done
    ;;
  quality)
    cd /tmp && python -m subd.cli bench quality --model "$R/.benchdata/tiny_en" \
      --config "$R/.benchdata/cuda.toml" --sets "$2" --per-clip --pace real --latencies 2000 \
      --plot "" --show 2>&1 | grep -v "^INFO\|recogniser updates"
    ;;
esac
