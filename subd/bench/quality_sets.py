"""The speech sets of ``subd bench quality`` and how a run's words are scored against them.

Real speech with exact transcripts: Debian's pocketsphinx-testdata, the LibriVox clips (their
punctuation is the book's, subd.bench.punct_e2e) and the "cards" clips, and the project's own
licensed clips in data/speech (JFK, LJSpeech, LibriSpeech, AMI; data/speech/SOURCES.md). Clips
without a punctuated reference (cards, LibriSpeech, AMI, LJSpeech's normalised texts) count for
WER, drops and latency only. A set is one stream: its clips one after another
with 0.75 s of silence; a clip ends a sentence, since the next one is not what the book says
next. espeak-ng speech (questions, commas) is a supplementary set, never the acceptance set.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from subd.errors import UserError
from subd.layout.rules import takes_rest
from subd.scoring.punct import MARKS, SENTENCE_END, Scores, reference_words, split_marked
from subd.scoring.wer import normalise, word_errors

# Debian's pocketsphinx-testdata; SUBD_POCKETSPHINX: a copy of it where the package is not
# installed (the GPU machine: its librivox/ and cards/ folders)
POCKETSPHINX = Path(os.environ.get("SUBD_POCKETSPHINX", "/usr/share/pocketsphinx/test/data"))
SPEECH = Path(__file__).resolve().parents[2] / "data" / "speech"  # the repository's clips
GAP_S = 0.75
# The split: chosen before any tuning, both sets mixing long and short clips. The data/speech
# clips came later (none had been run through the streaming recogniser before they were
# split): JFK, the one with punctuation and the speech the issue quotes, is held out.
# lj002-0020 is left out: its reference spells "eighteen thirteen", which the scorer does not
# equate with "1813".
# The twelve clips added on 2026-12-03 (six LJ Speech, six LibriSpeech / LibriTTS readers) were
# split before any of them ran through subd: LJ Speech and LibriSpeech alike three and three, a
# speaker already in a set joins that set (2412 in dev).
# The twenty added on 2026-12-04 (nine LJ Speech, two LibriTTS, five VCTK, four LibriSpeech
# readers, data/speech/SOURCES.md) were split by name, alternating within each corpus, before
# any of them ran through the streaming recogniser; LibriSpeech speaker 251's three go together.
DEV_CLIPS = ("librivox/0870", "librivox/0890", "librivox/0920",
             "speech/libri-2412-153948-0000", "speech/lj050-0131", "speech/ami-es2011a-40s",
             "speech/lj001-0001", "speech/lj001-0010", "speech/lj001-0015",
             "speech/libri-1272-128104-0000", "speech/libri-3436-172162-0000",
             "speech/libri-2412-153948-0001",
             "speech/lj001-0003", "speech/lj001-0012", "speech/lj001-0017", "speech/lj001-0027",
             "speech/lj001-0030", "speech/libritts-5895-34622-000026-000002",
             "speech/vctk-p255-367", "speech/vctk-p314-272", "speech/libri-3536-23268-0010")
HELDOUT_CLIPS = ("librivox/0880", "librivox/0930", "cards/001", "cards/002", "cards/003",
                 "cards/004", "cards/005", "speech/jfk", "speech/libri-1995-1837-0001",
                 "speech/lj002-0035", "speech/lj001-0009", "speech/lj001-0014",
                 "speech/lj001-0025", "speech/libritts-1089-134686-000007-000004",
                 "speech/libri-198-209-0000", "speech/libri-61-70968-0000",
                 "speech/lj001-0005", "speech/lj001-0016", "speech/lj001-0021", "speech/lj001-0028",
                 "speech/libritts-84-121550-000074-000000", "speech/vctk-p238-165",
                 "speech/vctk-p301-102", "speech/vctk-p376-193", "speech/libri-251-137823-0002",
                 "speech/libri-251-137823-0003", "speech/libri-251-118436-0001")
SETS = {"dev": DEV_CLIPS, "heldout": HELDOUT_CLIPS}


@dataclass(frozen=True, slots=True)
class ClipRef:
    name: str
    audio: np.ndarray
    words: tuple[str, ...]  # normalised reference words (WER)
    marks: tuple[str, ...] | None  # punctuation after each word; None: no punctuated reference


@dataclass(frozen=True, slots=True)
class SpeechSet:
    name: str
    audio: np.ndarray
    words: list[str]
    marks: list[str | None]
    # the set's clips, each alone (their audio without the gap): ``--per-clip`` streams and
    # transcribes each as a stream of its own, as ``subd stream CLIP`` and ``subd transcribe``
    clips: tuple[SpeechSet, ...] = ()

    def streams(self, per_clip: bool) -> tuple[SpeechSet, ...]:
        """What is streamed (or transcribed) for this set: each clip alone, or the set."""
        return (self.clips if per_clip else ()) or (self,)


def _clip(key: str) -> ClipRef:
    from subd.bench.punct_e2e import LIBRIVOX_CLIPS
    from subd.sources.decode import load_audio

    folder, clip = key.split("/")
    if folder == "speech":
        return _speech_clip(key, clip)
    if folder == "librivox":
        path = next(iter((POCKETSPHINX / folder).glob(f"*-{clip}.wav")), None)
        table = POCKETSPHINX / folder / "transcription"
        book = next(t for c, t, _ in LIBRIVOX_CLIPS if c == clip)
    else:
        path = POCKETSPHINX / folder / f"{clip}.wav"
        table = POCKETSPHINX / folder / f"{folder}.transcription"
        book = None
    if path is None or not path.exists() or not table.exists():
        raise UserError(f"{POCKETSPHINX}/{folder}: clip {clip} is missing "
                        "(apt-get install pocketsphinx-testdata)")
    m = re.search(rf"<s>\s*(.*?)\s*</s>\s*\(\S*{clip}\)", table.read_text())
    if m is None:
        raise UserError(f"{table}: no transcript for {clip}")
    words = tuple(normalise(m.group(1)))
    marks = None
    if book is not None:
        ref = reference_words(book, semicolons=True)
        # the clip ends a sentence in the stream: the next clip is not what the book says next
        ref[-1] = (ref[-1][0], ref[-1][1] if ref[-1][1] in SENTENCE_END else ".")
        marks = _marks_on(words, ref)
    return ClipRef(key, load_audio(path), words, marks)


def offline_engine(model: str, config: str | None):
    """`subd transcribe`'s engine on this machine's CPU, in ``config``'s [recognizer] precision
    (int8 by default): what the streamed runs are measured against."""
    from subd.config import load_config
    from subd.gpu.device import load_engine, place

    return load_engine(model, place("cpu", load_config(config).recognizer.precision))


def speech_table() -> dict[str, tuple[str, str, str]]:
    """data/speech/transcripts.tsv: clip name (no .wav) -> (language, punctuated, text)."""
    table = SPEECH / "transcripts.tsv"
    if not table.exists():
        raise UserError(f"{SPEECH}: the repository's speech clips are missing (run subd bench "
                        "quality from a checkout: pip install -e .)")
    rows = {}
    for line in table.read_text(encoding="utf-8").splitlines()[1:]:
        name, lang, punctuated, text = line.split("\t")
        rows[name.removesuffix(".wav")] = (lang, punctuated, text)
    return rows


def _speech_clip(key: str, clip: str) -> ClipRef:
    from subd.sources.decode import load_audio

    row = speech_table().get(clip)
    if row is None:
        raise UserError(f"{SPEECH / 'transcripts.tsv'}: no clip {clip}")
    _lang, punctuated, text = row
    name = f"{clip}.wav"
    words = tuple(normalise(text))
    marks = None
    if punctuated == "yes":
        ref = reference_words(text, semicolons=True)
        ref[-1] = (ref[-1][0], ref[-1][1] if ref[-1][1] in SENTENCE_END else ".")
        marks = _marks_on(words, ref)
    return ClipRef(key, load_audio(SPEECH / name), words, marks)


def _marks_on(words: tuple[str, ...], ref: list[tuple[str, str]]) -> tuple[str, ...]:
    """The book's marks moved onto the transcript's words (the reader's "a amiable")."""
    import difflib

    out = [""] * len(words)
    book = [normalise(w)[0] if normalise(w) else w for w, _ in ref]
    sm = difflib.SequenceMatcher(a=list(words), b=book, autojunk=False)
    for block in sm.get_matching_blocks():
        for k in range(block.size):
            out[block.a + k] = ref[block.b + k][1]
    out[-1] = ref[-1][1]
    return tuple(out)


def build_set(name: str, keys: tuple[str, ...]) -> SpeechSet:
    gap = np.zeros(int(GAP_S * 16000), np.float32)
    parts, words, marks, clips = [], [], [], []
    for key in keys:
        clip = _clip(key)
        parts += [clip.audio, gap]
        clip_marks = list(clip.marks) if clip.marks is not None else [None] * len(clip.words)
        clips.append(SpeechSet(key, clip.audio, list(clip.words), clip_marks))
        words += clip.words
        marks += clip_marks
    return SpeechSet(name, np.concatenate(parts), words, marks, tuple(clips))


def synthetic_set() -> SpeechSet:
    import shutil
    import subprocess
    import tempfile

    from subd.bench.punct_e2e import NEWS_PARAGRAPH
    from subd.sources.decode import load_audio

    exe = shutil.which("espeak-ng")
    if exe is None:
        raise UserError("--synthetic needs espeak-ng (scripts/install-deps.sh)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "news.wav"
        subprocess.run([exe, "-v", "en-us", "-s", "160", "-w", str(out), NEWS_PARAGRAPH],
                       check=True)
        audio = load_audio(out)
    ref = reference_words(NEWS_PARAGRAPH, semicolons=True)
    return SpeechSet("synthetic", np.concatenate([audio, np.zeros(12_000, np.float32)]),
                     [w for w, _ in ref], [m for _, m in ref])


# ---- scoring ----------------------------------------------------------------------------------


def _align(ref: list[str], hyp: list[str]) -> tuple[list[int | None], list[bool]]:
    """A minimum-edit-distance alignment: per reference word, the hypothesis word equal to it
    (None: substituted or deleted), and whether it was deleted (no hypothesis word at all)."""
    n, m = len(ref), len(hyp)
    d = np.zeros((n + 1, m + 1), np.int32)
    d[:, 0] = np.arange(n + 1)
    d[0, :] = np.arange(m + 1)
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            d[i, j] = min(d[i - 1, j] + 1, d[i, j - 1] + 1,
                          d[i - 1, j - 1] + (ref[i - 1] != hyp[j - 1]))
    matched: list[int | None] = [None] * n
    deleted = [False] * n
    i, j = n, m
    while i > 0:
        if j > 0 and d[i, j] == d[i - 1, j - 1] + (ref[i - 1] != hyp[j - 1]):
            matched[i - 1] = j - 1 if ref[i - 1] == hyp[j - 1] else None
            i, j = i - 1, j - 1
        elif d[i, j] == d[i - 1, j] + 1:
            deleted[i - 1] = True
            i -= 1
        else:
            j -= 1
    return matched, deleted


def _dropped_spans(ref: list[str], deleted: list[bool]) -> list[str]:
    """Runs of >= 3 consecutive reference words that the alignment deletes."""
    spans, run = [], []
    for word, gone in zip([*ref, ""], [*deleted, False], strict=True):
        if gone:
            run.append(word)
            continue
        if len(run) >= 3:
            spans.append(" ".join(run))
        run = []
    return spans


class Published:
    """Pipeline observer: each committed word as published, with its publication time."""

    def __init__(self) -> None:
        self.words: list[tuple[str, None, int, int]] = []  # (text with mark, -, end, sent ns)

    def on_hypothesis(self, result, now_ns: int) -> None:
        pass

    def on_publish(self, state, sent_ns: int) -> None:
        for tw in state.committed:  # untagged words keep their mark in the text ("them.")
            text = tw.text + tw.punct
            last = self.words[-1][0] if self.words else ""
            if tw.word.joined and takes_rest(last, text):  # the rest of the word before, as shown
                self.words[-1] = (last + text, *self.words[-1][1:])
            else:
                self.words.append((text, None, tw.word.end_ns, sent_ns))


def latency_summary(lat: np.ndarray) -> dict[str, float]:
    """p50, p95 and max of latencies in seconds ({} for none)."""
    if not lat.size:
        return {}
    return {"p50": float(np.percentile(lat, 50)), "p95": float(np.percentile(lat, 95)),
            "max": float(lat.max())}


@dataclass
class RunScore:
    wer_pct: float
    f1: dict[str, float]
    dropped: list[str]
    stops_inside: int
    # full stops where the reference has a semicolon: between two clauses that can each stand
    # as a sentence ("my native country; the narrative would be..."), not a pause inside one
    stops_at_semicolon: int = 0
    latency_s: dict[str, float] = field(default_factory=dict)
    text: str = ""
    texts: list[str] = field(default_factory=list)  # pooled (--repeats): each run's text
    wer_runs: list[float] = field(default_factory=list)  # each run's WER (--repeats)
    latency_samples: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)

    def as_dict(self) -> dict:
        return {"wer_pct": self.wer_pct, "f1": self.f1, "dropped_spans": len(self.dropped),
                "dropped": self.dropped, "full_stops_inside_sentences": self.stops_inside,
                "full_stops_at_semicolons": self.stops_at_semicolon,
                "latency_s": self.latency_s,
                **({"wer_runs": self.wer_runs} if self.wer_runs else {})}


def score_words(sset: SpeechSet, shown: list[tuple[str, str]]) -> RunScore:
    """``shown``: (word as the recogniser spelt it, mark after it), in order."""
    hyp: list[tuple[str, str]] = []
    for text, mark in shown:
        parts = split_marked(text)
        for i, (w, own) in enumerate(parts):
            for piece in normalise(w):
                hyp.append((piece, ""))
            if hyp and i == len(parts) - 1:
                hyp[-1] = (hyp[-1][0], mark if mark is not None else own)
    words = [w for w, _ in hyp]
    align, deleted = _align(sset.words, words)
    s = Scores()
    stops = at_semicolon = 0
    for r, h in enumerate(align):
        truth = sset.marks[r]
        if h is None or truth is None:
            continue
        mark = hyp[h][1]
        for key in MARKS:  # a semicolon scores as the comma it stands for
            s.add(key, mark == key, (truth if truth != ";" else ",") == key)
        if mark in SENTENCE_END and truth not in SENTENCE_END:
            at_semicolon += truth == ";"
            stops += truth != ";"
    # WER on the text as a whole, as the reference was normalised: the normaliser reads
    # numbers across words ("twenty five" -> "25"); per word they would not match
    spoken = normalise(" ".join(t for t, _ in shown))
    return RunScore(100 * word_errors(sset.words, spoken) / max(1, len(sset.words)),
                    {k: s.f1(k)[2] for k in MARKS}, _dropped_spans(sset.words, deleted), stops,
                    at_semicolon, text=" ".join(t + (m or "") for t, m in shown))
