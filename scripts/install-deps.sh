#!/usr/bin/env bash
# System packages subd needs (Debian/Ubuntu, as root): libsndfile and ffmpeg for audio input,
# PortAudio to build PyAudio (microphone), and for the tests: real speech (pocketsphinx-testdata),
# speech synthesis (espeak-ng), sox, Chromium (overlay test), systemd-analyze (unit checks),
# public-domain text for the punctuation model's training recipe, and redis-server (the caption
# bus: tests and benchmarks start their own instance; no system service is needed); for Chinese:
# the Noto CJK fonts (overlay test) and punctuated Chinese text (fortunes-zh).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  libsndfile1 ffmpeg portaudio19-dev gcc \
  pocketsphinx-testdata espeak-ng sox chromium systemd \
  r-cran-janeaustenr r-cran-stringr r-cran-tokenizers fortunes redis-server \
  fonts-noto-cjk fortunes-zh >/dev/null
# the distribution may start Redis as a service on install: subd needs none on this machine
systemctl disable --now redis-server >/dev/null 2>&1 || true
