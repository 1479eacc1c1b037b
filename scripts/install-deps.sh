#!/usr/bin/env bash
# System packages subd needs (Debian/Ubuntu, as root): libsndfile and ffmpeg for audio input,
# PortAudio to build PyAudio (microphone), and for the tests: real speech (pocketsphinx-testdata),
# speech synthesis (espeak-ng), sox, Chromium (overlay test), systemd-analyze (unit checks),
# and public-domain text for the punctuation model's training recipe.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  libsndfile1 ffmpeg portaudio19-dev gcc \
  pocketsphinx-testdata espeak-ng sox chromium systemd \
  r-cran-janeaustenr r-cran-stringr r-cran-tokenizers fortunes >/dev/null
