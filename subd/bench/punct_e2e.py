"""`subd bench punct-e2e`: punctuation F1 of the streamed output vs the recogniser's own marks.

Speech: the LibriVox clips (punctuated reference from the novel's text) and a news-style
paragraph with questions spoken by espeak-ng. Both outputs come from the same streaming run.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from subd.errors import UserError

LIBRIVOX = Path("/usr/share/pocketsphinx/test/data/librivox")
# The clips' text as printed in the novel (Debian r-cran-janeaustenr), in the clips' order; the
# reader says "might be prudently" where the book has "might prudently be".
LIBRIVOX_REFERENCE = (
    "And Mr. John Dashwood had then leisure to consider how much there might be prudently in his "
    "power to do for them. He was not an ill-disposed young man, unless to be rather cold hearted "
    "and rather selfish is to be ill-disposed: Had he married a more amiable woman, he might have "
    "been made still more respectable than he was: he might even have been made amiable himself;"
)
NEWS_PARAGRAPH = (
    "Good evening, and welcome to the late news. Tonight, the city council voted to close the old "
    "bridge. Is the bridge safe? Engineers say it is not. The mayor said the decision was "
    "difficult, but necessary. Where will the traffic go? For now, drivers will use the northern "
    "road. The work will start in March and last two years. Residents, however, are worried "
    "about the noise. What do you think? Send us your comments tonight."
)


@dataclass(frozen=True, slots=True)
class E2EResult:
    recogniser: object  # punct_eval.Scores
    tagger: object
    n_words: int


def build_speech() -> tuple[np.ndarray, str]:
    from subd.audio import load_audio

    wavs = sorted(LIBRIVOX.glob("*.wav"))
    exe = shutil.which("espeak-ng")
    if not wavs or exe is None:
        raise UserError("needs pocketsphinx-testdata and espeak-ng (scripts/install-deps.sh)")
    pause = np.zeros(12_000, np.float32)
    parts = []
    for w in wavs:
        parts += [load_audio(w), pause]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "news.wav"
        subprocess.run(
            [exe, "-v", "en-us", "-s", "160", "-w", str(out), NEWS_PARAGRAPH], check=True
        )
        parts.append(load_audio(out))
    return np.concatenate(parts), LIBRIVOX_REFERENCE + " " + NEWS_PARAGRAPH


def run_e2e(engine=None) -> E2EResult:
    from subd.models.punct import PunctTagger
    from subd.punct_eval import reference_words, score, stream_both
    from subd.punct_stream import PunctStream
    from subd.streaming import StreamingRecognizer

    audio, text = build_speech()
    rec = StreamingRecognizer(engine=engine) if engine is not None else StreamingRecognizer()
    own, tagged = stream_both(rec, PunctStream(PunctTagger.load()), audio)
    ref = reference_words(text)
    return E2EResult(score(own, ref), score(tagged, ref), len(ref))


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("punct-e2e", help="streamed punctuation F1: CRF tagger vs Whisper's")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    res = run_e2e()
    print(
        f"reference: {res.n_words} words (LibriVox clips + espeak-ng news paragraph), "
        "one streaming run, updates every 0.5 s of audio"
    )
    print(f"{'':<12}{'mark':<10}{'P':>7}{'R':>7}{'F1':>7}")
    for name, s in (("recogniser", res.recogniser), ("subd CRF", res.tagger)):
        for mark in (".", ",", "?", "sentence"):
            p, r, f = s.f1(mark)
            print(f"{name:<12}{mark:<10}{p:>7.2f}{r:>7.2f}{f:>7.2f}")
        print(
            f"{name:<12}sentence breaks at chunk edges where the reference has none: "
            f"{s.chunk_edge_breaks} of {s.chunk_edges} edges"
        )
    return 0
