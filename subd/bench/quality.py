"""``subd bench quality``: live caption quality against the latency budget D, and offline.

Audio: real speech with exact transcripts that the project's machines have (Debian
pocketsphinx-testdata): the five LibriVox clips and the five "cards" clips. They are split once
into a DEVELOPMENT set (what policies are tuned on) and a HELD-OUT set (never tuned on); both are
reported side by side. ``--synthetic`` adds espeak-ng speech (questions, commas) as a third,
supplementary set; it is never the acceptance set.

Each set is one stream: its clips one after another with 0.75 s of silence. It is streamed
through the real pipeline (``subd stream``'s daemon: ingest, recogniser and tagger processes,
tick clock, publisher) at real time, once per D: the recogniser's decisions depend on how long an
update takes against the audio clock, so a faster-than-real-time pace would change them. The
same engine then transcribes the set offline (``subd transcribe``'s path). Reported per run:

* WER (subd.scoring.wer) against the pocketsphinx transcripts;
* punctuation F1 for '.', ',' and '?' on aligned words, against the book's punctuation (the
  cards clips have no punctuated reference: they count for WER, drops and latency only);
* dropped spans: runs of 3 or more consecutive reference words missing from the output;
* full stops inside sentences: a sentence end on a word whose reference has none;
* committed latency as a viewer sees it: the publication time of the first tick carrying the
  word as committed, minus the word's end (p50, p95, max).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from subd.errors import UserError
from subd.scoring.punct import MARKS, SENTENCE_END, Scores, reference_words, split_marked
from subd.scoring.wer import normalise, word_errors

POCKETSPHINX = Path("/usr/share/pocketsphinx/test/data")
GAP_S = 0.75
LATENCIES_MS = (500, 1000, 2000, 4000)
# The split: chosen before any tuning, both sets mixing long and short clips.
DEV_CLIPS = ("librivox/0870", "librivox/0890", "librivox/0920")
HELDOUT_CLIPS = ("librivox/0880", "librivox/0930", "cards/001", "cards/002", "cards/003",
                 "cards/004", "cards/005")
SETS = {"dev": DEV_CLIPS, "heldout": HELDOUT_CLIPS}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("quality", help="caption quality vs latency D, and offline")
    p.add_argument("--latencies", default=",".join(map(str, LATENCIES_MS)),
                   help="D values in ms, comma separated (default 500,1000,2000,4000)")
    p.add_argument("--sets", default="dev,heldout", help="dev, heldout (comma separated)")
    p.add_argument("--synthetic", action="store_true", help="add espeak-ng speech as a set")
    p.add_argument("--max-clips", type=int, default=0, help="first N clips of each set (0: all)")
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--tagger", default="auto", help="[pipeline] tagger: auto, none, ...")
    p.add_argument("--plot", default="quality_vs_latency.png", help="PNG output")
    p.add_argument("--json", help="write the figures here as JSON")
    p.add_argument("--show", action="store_true", help="print each run's text")
    p.set_defaults(func=run)


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


def _clip(key: str) -> ClipRef:
    from subd.bench.punct_e2e import LIBRIVOX_CLIPS
    from subd.sources.decode import load_audio

    folder, clip = key.split("/")
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
        ref = reference_words(book)
        # the clip ends a sentence in the stream: the next clip is not what the book says next
        ref[-1] = (ref[-1][0], ref[-1][1] if ref[-1][1] in SENTENCE_END else ".")
        marks = _marks_on(words, ref)
    return ClipRef(key, load_audio(path), words, marks)


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
    parts, words, marks = [], [], []
    for key in keys:
        clip = _clip(key)
        parts += [clip.audio, gap]
        words += clip.words
        marks += list(clip.marks) if clip.marks is not None else [None] * len(clip.words)
    return SpeechSet(name, np.concatenate(parts), words, marks)


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
    ref = reference_words(NEWS_PARAGRAPH)
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


@dataclass
class RunScore:
    wer_pct: float
    f1: dict[str, float]
    dropped: list[str]
    stops_inside: int
    latency_s: dict[str, float] = field(default_factory=dict)
    text: str = ""

    def as_dict(self) -> dict:
        return {"wer_pct": self.wer_pct, "f1": self.f1, "dropped_spans": len(self.dropped),
                "dropped": self.dropped, "full_stops_inside_sentences": self.stops_inside,
                "latency_s": self.latency_s}


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
    stops = 0
    for r, h in enumerate(align):
        truth = sset.marks[r]
        if h is None or truth is None:
            continue
        mark = hyp[h][1]
        for key in MARKS:
            s.add(key, mark == key, truth == key)
        stops += mark in SENTENCE_END and truth not in SENTENCE_END
    return RunScore(100 * word_errors(sset.words, words) / max(1, len(sset.words)),
                    {k: s.f1(k)[2] for k in MARKS}, _dropped_spans(sset.words, deleted), stops,
                    text=" ".join(t + (m or "") for t, m in shown))


# ---- runs -------------------------------------------------------------------------------------


class _Seen:
    """Pipeline observer: each committed word as published, with its publication time."""

    def __init__(self) -> None:
        self.words: list[tuple[str, str, int, int]] = []  # (text, punct, end_ns, sent_ns)

    def on_hypothesis(self, result, now_ns: int) -> None:
        pass

    def on_publish(self, state, sent_ns: int) -> None:
        for tw in state.committed:
            self.words.append((tw.text, tw.punct, tw.word.end_ns, sent_ns))


async def _stream(sset: SpeechSet, latency_ms: int, args) -> tuple[list, int]:
    import dataclasses

    from subd.config import load_config
    from subd.service.daemon import Daemon
    from subd.sources.live import FileSource

    cfg = load_config(None)
    cfg = cfg.replace(tick=dataclasses.replace(cfg.tick, latency_ms=latency_ms),
                      recognizer=dataclasses.replace(cfg.recognizer, model=args.model),
                      pipeline=dataclasses.replace(cfg.pipeline, tagger=args.tagger))
    source = FileSource(sset.audio, jitter_ms=0, name=sset.name)
    seen = _Seen()
    daemon = Daemon(cfg, source, sinks=[], observer=seen)
    await daemon.run()
    return seen.words, source.t0_ns


def stream_run(sset: SpeechSet, latency_ms: int, args) -> RunScore:
    words, t0_ns = asyncio.run(_stream(sset, latency_ms, args))
    sc = score_words(sset, [(t, p) for t, p, _, _ in words])
    lat = np.array([(sent - t0_ns - end) / 1e9 for _, _, end, sent in words])
    if lat.size:
        sc.latency_s = {"p50": float(np.percentile(lat, 50)),
                        "p95": float(np.percentile(lat, 95)), "max": float(lat.max())}
    return sc


def offline_run(sset: SpeechSet, engine) -> RunScore:
    from subd.recognise.offline import TranscribeOptions, Transcriber

    words = []
    for seg in Transcriber(engine, TranscribeOptions()).transcribe_blocks([sset.audio]):
        words += seg.words
    return score_words(sset, [(w.text, None) for w in words])


def _row(name: str, sc: RunScore) -> str:
    lat = sc.latency_s
    lat_text = (f"{lat['p50']:5.2f} {lat['p95']:5.2f} {lat['max']:5.2f}" if lat
                else "    -     -     -")
    return (f"  {name:>8s}  {sc.wer_pct:5.1f}  {sc.f1['.']:4.2f} {sc.f1[',']:4.2f} "
            f"{sc.f1['?']:4.2f}  {len(sc.dropped):3d}  {sc.stops_inside:3d}  {lat_text}")


def run(args: argparse.Namespace) -> int:
    try:
        latencies = [int(x) for x in args.latencies.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--latencies {args.latencies!r}: e.g. 1000,2000") from None
    if not latencies or any(not 300 <= d <= 20_000 for d in latencies):
        raise UserError(f"--latencies {args.latencies!r}: each D must be in 300..20000 ms")
    names = [s.strip() for s in args.sets.split(",") if s.strip()]
    if not names or any(n not in SETS for n in names):
        raise UserError(f"--sets {args.sets!r}: choose from {', '.join(SETS)}")
    if args.max_clips < 0:
        raise UserError("--max-clips must be >= 0")
    sets = [build_set(n, SETS[n][:args.max_clips or None]) for n in names]
    if args.synthetic:
        sets.append(synthetic_set())
    from subd.models.engine import WhisperEngine

    # the engine `subd transcribe` uses on this machine: int8 on the CPU, all cores
    engine = WhisperEngine.load(args.model, quantize=True)
    results: dict[str, dict[str, RunScore]] = {}
    for sset in sets:
        print(f"{sset.name}: {len(sset.audio) / 16000:.1f} s, {len(sset.words)} words",
              flush=True)
        res = {"offline": offline_run(sset, engine)}
        for d in latencies:
            res[f"{d}"] = stream_run(sset, d, args)
            print(f"  D = {d} ms done", flush=True)
        results[sset.name] = res
    print("\n  D (ms)    WER %   '.'  ','  '?'  drop stop  lat p50 p95  max (s)")
    for name, res in results.items():
        print(f"{name}:")
        for key, sc in res.items():
            print(_row(key, sc))
            if args.show:
                print(f"            {sc.text}")
            for span in sc.dropped:
                print(f"            dropped: {span}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {n: {k: sc.as_dict() for k, sc in res.items()} for n, res in results.items()},
            indent=1))
    _plot(results, latencies, args.plot)
    print(f"plot: {args.plot}")
    return 0


def _plot(results: dict[str, dict[str, RunScore]], latencies: list[int], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    xs = [d / 1000 for d in latencies]
    for (name, res), color in zip(results.items(), ("C0", "C1", "C2"), strict=False):
        runs = [res[f"{d}"] for d in latencies]
        off = res["offline"]
        axes[0].plot(xs, [r.wer_pct for r in runs], "o-", color=color, label=name)
        axes[0].axhline(off.wer_pct, color=color, ls=":", label=f"{name} offline")
        for mark, style in ((".", "o-"), (",", "s--")):
            axes[1].plot(xs, [r.f1[mark] for r in runs], style, color=color,
                         label=f"{name} '{mark}'")
            axes[1].axhline(off.f1[mark], color=color, ls=":", lw=0.8)
        axes[2].plot(xs, [r.latency_s.get("p50", np.nan) for r in runs], "o-", color=color,
                     label=f"{name} p50")
        axes[2].plot(xs, [r.latency_s.get("p95", np.nan) for r in runs], "s--", color=color,
                     label=f"{name} p95")
    axes[2].plot(xs, xs, "k:", lw=0.8, label="D")
    for ax, title in zip(axes, ("WER % (dotted: offline)", "punctuation F1 (dotted: offline)",
                                "committed latency as shown (s)"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("D (s)")
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
