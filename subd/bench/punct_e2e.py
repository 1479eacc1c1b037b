"""`subd bench punct-e2e`: punctuation F1 of the streamed output vs the recogniser's own marks.

Speech: the LibriVox clips (punctuated reference from the novel's text) and a news-style
paragraph with questions spoken by espeak-ng. Both outputs come from the same streaming run.

``--heldout-sessions N`` adds N streams of about a minute each: paragraphs of the tagger's
*held-out* documents (models/punct/corpus.py, never trained on) spoken by espeak-ng in varied
voices and speeds, so the comparison rests on more than 145 words. The same generator over
*training* documents (``spoken_sessions(held_out=False)``) is what the simulated recogniser
marks, pauses and word durations of models/punct/simulate.py were calibrated on;
``--dev-sessions N`` scores those (a development set for tagger changes, not an evaluation).

The recogniser's hypotheses are cached per stream (``--cache-dir``), keyed by the audio and the
recogniser's code, so a second run, or a run after a tagger change, takes seconds.
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
# What each clip says, as printed in the novel (Debian r-cran-janeaustenr), in the clips' order;
# the reader says "might be prudently" where the book has "might prudently be". The clips are
# not one passage: 0900 and 0910 are not in the test data, so the audio goes straight from
# "ill-disposed" to "Had he married" (the book has a whole sentence, ending "duties.", in
# between), and the last clip is followed by the unrelated news paragraph. Where the audio
# skips text, the reference ends a sentence, as ``session_reference`` does between paragraphs.
LIBRIVOX_CLIPS = (
    ("0870", "And Mr. John Dashwood had then leisure to consider how much there might be "
             "prudently in his power to do for them.", True),
    ("0880", "He was not an ill-disposed young man,", True),
    ("0890", "unless to be rather cold hearted and rather selfish is to be ill-disposed:", False),
    ("0920", "Had he married a more amiable woman, he might have been made still more "
             "respectable than he was:", True),
    ("0930", "he might even have been made amiable himself;", False),
)  # (clip, text, the next clip continues the text)
LIBRIVOX_REFERENCE = " ".join(t for _, t, _ in LIBRIVOX_CLIPS)  # the book's own punctuation


def librivox_reference() -> list[tuple[str, str]]:
    """Reference words of the clips as heard: a sentence ends where the audio skips text."""
    from subd.scoring.punct import SENTENCE_END, reference_words

    ref: list[tuple[str, str]] = []
    for _, text, continues in LIBRIVOX_CLIPS:
        words = reference_words(text)
        if not continues and words[-1][1] not in SENTENCE_END:
            words[-1] = (words[-1][0], ".")
        ref += words
    return ref


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
    errors: tuple[str, ...] = ()  # punct_eval.boundary_errors, stream by stream


def build_speech() -> tuple[np.ndarray, list[tuple[str, str]]]:
    """The acceptance audio (LibriVox clips, then the news paragraph) and its reference words."""
    from subd.sources.decode import load_audio

    wavs = sorted(LIBRIVOX.glob("*.wav"))
    exe = shutil.which("espeak-ng")
    if not wavs or exe is None:
        raise UserError("needs pocketsphinx-testdata and espeak-ng (scripts/install-deps.sh)")
    if [w.stem[-4:] for w in wavs] != [clip for clip, _, _ in LIBRIVOX_CLIPS]:
        raise UserError(f"{LIBRIVOX}: expected the clips {[c for c, _, _ in LIBRIVOX_CLIPS]}")
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
    from subd.scoring.punct import reference_words

    return np.concatenate(parts), librivox_reference() + reference_words(NEWS_PARAGRAPH)


_VOICES = ("en-us", "en-gb", "en-us+m3", "en-gb-x-rp+f2", "en-us+Alex", "en-029",
           "en-gb-scotland+m2", "en-us+Andrea")
_SOURCE_SHARES = {"austen": 0.35, "fortunes": 0.35, "jokes": 0.1, "harvard": 0.12,
                  "mobydick": 0.08}
_SPEAKABLE = re.compile(r"[A-Za-z ,.;:?!'\-]+")
SESSION_S = 55.0  # speech per stream (a stream ends after the paragraph that passes this)
HELDOUT_SEED = 29
DEV_SEED = 11  # the calibration streams (models/punct/calibrate.py --sessions 8)


@dataclass(frozen=True, slots=True)
class SpokenSession:
    """One stream of espeak-ng speech: the paragraphs (document id, text) in order."""

    voice: str
    speed_wpm: int
    paragraphs: tuple[tuple[str, str], ...]
    audio: np.ndarray  # float32 [n] at 16 kHz, paragraphs separated by 0.4-0.9 s of silence


def _espeak(exe: str, voice: str, speed_wpm: int, text: str) -> np.ndarray:
    from subd.sources.decode import load_audio

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
    from subd.scoring.punct import SENTENCE_END, reference_words

    ref: list[tuple[str, str]] = []
    for _, text in session.paragraphs:
        words = reference_words(text)
        if words and words[-1][1] not in SENTENCE_END:
            words[-1] = (words[-1][0], ".")
        ref += words
    return ref


class _Recogniser:
    """Makes a fresh streaming recogniser per stream, loading the model once and only when a
    stream is not in the cache."""

    def __init__(self, engine=None) -> None:
        self.engine = engine

    def __call__(self):
        from subd.recognise.streaming import StreamingRecognizer

        rec = (StreamingRecognizer(engine=self.engine) if self.engine is not None
               else StreamingRecognizer())  # the daemon's recogniser settings
        self.engine = rec.engine
        return rec


def _score_streams(
    streams: list[tuple[np.ndarray, list[tuple[str, str]]]], engine=None,
    cache_dir: Path | None = None, stream_config=None, tagger=None,
) -> E2EResult:
    """Recogniser vs tagger over (audio, reference) streams, scores pooled."""
    from subd.models.punct import PunctTagger
    from subd.punct.stream import PunctStream
    from subd.scoring.punct import Scores, boundary_errors, cached_hypotheses, replay, score

    tagger = tagger or PunctTagger.load()
    make = _Recogniser(engine)
    own_all, tagged_all, n_words = Scores(), Scores(), 0
    errors: list[str] = []
    for k, (audio, ref) in enumerate(streams):
        hyps = cached_hypotheses(audio, make, cache_dir)
        own, tagged = replay(hyps, PunctStream(tagger, stream_config))
        own_all.add_scores(score(own, ref))
        tagged_all.add_scores(score(tagged, ref))
        prefix = f"stream {k}: " if len(streams) > 1 else ""
        errors += [prefix + line for line in boundary_errors(own, tagged, ref)]
        n_words += len(ref)
    return E2EResult(own_all, tagged_all, n_words, tuple(errors))


def run_heldout(
    n_sessions: int, seed: int = HELDOUT_SEED, engine=None, cache_dir: Path | None = None,
    stream_config=None, held_out: bool = True, tagger=None,
) -> E2EResult:
    """Recogniser vs tagger over ``n_sessions`` espeak-ng streams of held-out text, pooled
    (``held_out=False``: of training text, the development/calibration streams)."""
    streams = [(s.audio, session_reference(s))
               for s in spoken_sessions(held_out, n_sessions, seed)]
    return _score_streams(streams, engine, cache_dir, stream_config, tagger)


def run_e2e(
    engine=None, cache_dir: Path | None = None, stream_config=None, tagger=None
) -> E2EResult:
    """The acceptance set: LibriVox clips + the espeak-ng news paragraph, one stream."""
    return _score_streams([build_speech()], engine, cache_dir, stream_config, tagger)


def register(subparsers: argparse._SubParsersAction) -> None:
    from subd.scoring.punct import default_cache_dir

    p = subparsers.add_parser("punct-e2e", help="streamed punctuation F1: CRF tagger vs Whisper's")
    p.add_argument("--heldout-sessions", type=int, default=0,
                   help="also score N ~1-minute espeak-ng streams of held-out text (slow when "
                        "not cached: about 1-2 min of CPU each; the model card gives 4 and 8)")
    p.add_argument("--dev-sessions", type=int, default=0,
                   help="also score N espeak-ng streams of training text (the calibration "
                        f"streams, seed {DEV_SEED}: a development set, not an evaluation)")
    p.add_argument("--errors", action="store_true",
                   help="list every word where either output misplaces a sentence boundary")
    p.add_argument("--cache-dir", type=Path, default=default_cache_dir(),
                   help="where the recogniser's streamed hypotheses are kept, keyed by audio "
                        "and recogniser code (default %(default)s)")
    p.add_argument("--no-cache", action="store_true", help="always run the recogniser")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    for name in ("heldout_sessions", "dev_sessions"):
        if not 0 <= getattr(args, name) <= 50:
            raise UserError(f"--{name.replace('_', '-')} must be 0..50, got "
                            f"{getattr(args, name)}")
    cache = None if args.no_cache else args.cache_dir
    res = run_e2e(cache_dir=cache)
    print(
        f"reference: {res.n_words} words (LibriVox clips + espeak-ng news paragraph), "
        "one streaming run, updates every 0.5 s of audio"
    )
    _print_scores(res, args.errors)
    for n, held_out, seed, what in (
        (args.heldout_sessions, True, HELDOUT_SEED, "held-out text"),
        (args.dev_sessions, False, DEV_SEED, "training text (development streams)"),
    ):
        if n:
            more = run_heldout(n, seed, cache_dir=cache, held_out=held_out)
            print(f"\n{what} spoken by espeak-ng: {more.n_words} reference words in {n} "
                  f"streams (seed {seed})")
            _print_scores(more, args.errors)
    return 0


def _print_scores(res: E2EResult, errors: bool = False) -> None:
    print(f"{'':<12}{'mark':<10}{'P':>7}{'R':>7}{'F1':>7}")
    for name, s in (("recogniser", res.recogniser), ("subd CRF", res.tagger)):
        for mark in (".", ",", "?", "sentence"):
            p, r, f = s.f1(mark)
            print(f"{name:<12}{mark:<10}{p:>7.2f}{r:>7.2f}{f:>7.2f}")
        print(
            f"{name:<12}false sentence breaks at chunk edges: {s.chunk_edge_breaks} of "
            f"{s.chunk_edges} edges; inside a phrase (reference: no mark): "
            f"{s.edge_breaks_inside_phrase}; at a clause mark (, ; : dash): "
            f"{s.edge_breaks_at_clause}"
        )
    if errors:
        print("sentence-boundary errors (reference | recogniser | subd; edge: which output "
              "had the word at the end of a commit):")
        for line in res.errors:
            print("  " + line)
