"""`subd bench punct-e2e`: punctuation F1 of the streamed output vs the recogniser's own marks.

Speech: the LibriVox clips (punctuated reference from the novel's text) and a news-style
paragraph with questions spoken by espeak-ng. Both outputs come from the same streaming run.

``--heldout-sessions N`` adds N streams of about a minute each: paragraphs of the tagger's
*held-out* documents (models/punct/corpus.py, never trained on) spoken by espeak-ng in varied
voices and speeds, so the comparison rests on more than 145 words. The same generator over
*training* documents (``spoken_sessions(held_out=False)``) is what the simulated recogniser
marks, pauses and word durations of models/punct/simulate.py were calibrated on.
"""

from __future__ import annotations

import argparse
import random
import re
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


_VOICES = ("en-us", "en-gb", "en-us+m3", "en-gb-x-rp+f2", "en-us+Alex", "en-029",
           "en-gb-scotland+m2", "en-us+Andrea")
_SOURCE_SHARES = {"austen": 0.35, "fortunes": 0.35, "jokes": 0.1, "harvard": 0.12,
                  "mobydick": 0.08}
_SPEAKABLE = re.compile(r"[A-Za-z ,.;:?!'\-]+")
SESSION_S = 55.0  # speech per stream (a stream ends after the paragraph that passes this)
HELDOUT_SEED = 29


@dataclass(frozen=True, slots=True)
class SpokenSession:
    """One stream of espeak-ng speech: the paragraphs (document id, text) in order."""

    voice: str
    speed_wpm: int
    paragraphs: tuple[tuple[str, str], ...]
    audio: np.ndarray  # float32 [n] at 16 kHz, paragraphs separated by 0.4-0.9 s of silence


def _espeak(exe: str, voice: str, speed_wpm: int, text: str) -> np.ndarray:
    from subd.audio import load_audio

    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "speech.wav"
        subprocess.run([exe, "-v", voice, "-s", str(speed_wpm), "-w", str(wav), text], check=True)
        return load_audio(wav)


def spoken_sessions(held_out: bool, n_sessions: int, seed: int) -> list[SpokenSession]:
    """Streams of speakable paragraphs (12-60 words, plain letters and marks) from the held-out
    documents, or from the training documents (then never *Sense and Sensibility*, the book of
    the LibriVox clips)."""
    from subd.models.punct import corpus

    exe = shutil.which("espeak-ng")
    if exe is None:
        raise UserError("needs espeak-ng (scripts/install-deps.sh)")
    docs, _ = corpus.load_documents(list(_SOURCE_SHARES))
    by_source: dict[str, list] = {}
    for d in docs:
        if corpus.is_held_out(d) == held_out and d.name != "sensesensibility":
            by_source.setdefault(d.source, []).append(d)
    if not by_source:
        raise UserError("no text documents found (r-cran-janeaustenr, fortunes, ... installed?)")
    names = [n for n in _SOURCE_SHARES if n in by_source]
    rng = random.Random(seed)

    def paragraph() -> tuple[str, str]:
        source = rng.choices(names, [_SOURCE_SHARES[n] for n in names])[0]
        for _ in range(200):
            doc = rng.choice(by_source[source])
            text = rng.choice(doc.paragraphs)
            if (12 <= len(text.split()) <= 60 and _SPEAKABLE.fullmatch(text)
                    and not text.isupper()):
                break
        return doc.doc_id, text

    out = []
    for k in range(n_sessions):
        voice = _VOICES[(k + (3 if held_out else 0)) % len(_VOICES)]
        speed = rng.randint(140, 170)
        paras: list[tuple[str, str]] = []
        parts: list[np.ndarray] = []
        seconds = 0.0
        while seconds < SESSION_S:
            doc_id, text = paragraph()
            speech = _espeak(exe, voice, speed, text)
            parts += [speech, np.zeros(rng.randint(6000, 14000), np.float32)]
            paras.append((doc_id, text))
            seconds += len(speech) / 16_000
        out.append(SpokenSession(voice, speed, tuple(paras), np.concatenate(parts)))
    return out


def session_reference(session: SpokenSession) -> list[tuple[str, str]]:
    """Reference words of a stream; a paragraph ends a sentence even where its text has a
    clause mark or none (the next paragraph is unrelated text after a pause)."""
    from subd.punct_eval import SENTENCE_END, reference_words

    ref: list[tuple[str, str]] = []
    for _, text in session.paragraphs:
        words = reference_words(text)
        if words and words[-1][1] not in SENTENCE_END:
            words[-1] = (words[-1][0], ".")
        ref += words
    return ref


def run_heldout(n_sessions: int, seed: int = HELDOUT_SEED, engine=None) -> E2EResult:
    """Recogniser vs tagger over ``n_sessions`` espeak-ng streams of held-out text, pooled."""
    from subd.models.punct import PunctTagger
    from subd.punct_eval import Scores, score, stream_both
    from subd.punct_stream import PunctStream
    from subd.streaming import StreamingRecognizer

    tagger = PunctTagger.load()
    own_all, tagged_all, n_words = Scores(), Scores(), 0
    for session in spoken_sessions(True, n_sessions, seed):
        # the daemon's recogniser settings; one engine (model load) for all streams
        rec = StreamingRecognizer(engine=engine) if engine is not None else StreamingRecognizer()
        engine = rec.engine
        own, tagged = stream_both(rec, PunctStream(tagger), session.audio)
        ref = session_reference(session)
        own_all.add_scores(score(own, ref))
        tagged_all.add_scores(score(tagged, ref))
        n_words += len(ref)
    return E2EResult(own_all, tagged_all, n_words)


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
    p.add_argument("--heldout-sessions", type=int, default=0,
                   help="also score N ~1-minute espeak-ng streams of held-out text (slow: "
                        "about 1-2 min of CPU each; 4 is the model card's figure)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.heldout_sessions <= 50:
        raise UserError(f"--heldout-sessions must be 0..50, got {args.heldout_sessions}")
    res = run_e2e()
    print(
        f"reference: {res.n_words} words (LibriVox clips + espeak-ng news paragraph), "
        "one streaming run, updates every 0.5 s of audio"
    )
    _print_scores(res)
    if args.heldout_sessions:
        held = run_heldout(args.heldout_sessions)
        print(f"\nheld-out text spoken by espeak-ng: {held.n_words} reference words in "
              f"{args.heldout_sessions} streams (seed {HELDOUT_SEED})")
        _print_scores(held)
    return 0


def _print_scores(res: E2EResult) -> None:
    print(f"{'':<12}{'mark':<10}{'P':>7}{'R':>7}{'F1':>7}")
    for name, s in (("recogniser", res.recogniser), ("subd CRF", res.tagger)):
        for mark in (".", ",", "?", "sentence"):
            p, r, f = s.f1(mark)
            print(f"{name:<12}{mark:<10}{p:>7.2f}{r:>7.2f}{f:>7.2f}")
        print(
            f"{name:<12}sentence breaks at chunk edges where the reference has none: "
            f"{s.chunk_edge_breaks} of {s.chunk_edges} edges"
        )
