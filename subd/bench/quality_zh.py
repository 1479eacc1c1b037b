"""``subd bench quality --language zh``: the same bench on Mandarin, scored by character error rate.

Real read Mandarin with exact texts, in data/speech (data/speech/SOURCES.md), split by speaker
before any of the clips ran through subd:

* ``zh-dev``: the three AISHELL-1 test clips that issue 20 was first tuned on, FunASR's regression
  clip, and (2026-12-07) eight AISHELL-1 clips of four more speakers and one THCHS-30 clip
  (177 characters, 68 s);
* ``zh-heldout``: PaddleSpeech's and FunASR's demo sentences, and (2026-12-07) eight AISHELL-1
  clips of three more speakers and five THCHS-30 clips of one (276 characters, 102 s), never
  tuned on.

As the English sets, each is one stream: its clips one after another with 0.75 s of silence,
streamed once per D through the pipeline's scheduler and tick clock (``--pace real``: the daemon;
``--pace cpu``: a fake clock, ``--update-ms FULL,CUT`` a device of known speed: base int8 on one
idle core of the 2-core machine is 1350,400), and transcribed offline by the same model
(``subd transcribe --language zh``'s path). Scored per run, after OpenCC's traditional ->
simplified mapping and with digits read as Chinese numerals (subd.scoring.cer): the CER of the
published characters, the offline CER and the difference in points (issue 20's acceptance: 2
points), the characters published later than D (one tick's grace), and the committed latency.
``--show`` prints each run's text and each decision: when it came, from an update of which span,
and how much audio each character it committed had after it (its right context). ``--repeats
N``: N runs, run r after r x 150 ms of silence (offline too), pooled: one run is one draw of
where the updates fall, and with 177 characters one character is 0.6 points.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from subd.bench.quality_sets import (
    GAP_S,
    SPEECH,
    Published,
    latency_summary,
    offline_engine,
    speech_table,
)
from subd.errors import UserError

# the first clips of each set (2026-12-02), then the 18 of 2026-12-07, split by speaker before
# any of them ran through subd (data/speech/SOURCES.md)
ZH_DEV_CLIPS = ("aishell-bac009s0764w0121", "aishell-bac009s0764w0122",
                "aishell-bac009s0724w0121", "funasr-sample",
                "aishell-bac009s0764w0129", "aishell-bac009s0765w0124", "aishell-bac009s0765w0130",
                "aishell-bac009s0901w0150", "aishell-bac009s0901w0151", "aishell-bac009s0915w0283",
                "aishell-bac009s0915w0292", "thchs30-d4_750")
ZH_HELDOUT_CLIPS = ("paddlespeech-zh", "funasr-asr-example",
                    "aishell-bac009s0770w0131", "aishell-bac009s0906w0125",
                    "aishell-bac009s0002w0122", "aishell-bac009s0002w0123",
                    "aishell-bac009s0002w0124", "thchs30-a2_0", "thchs30-a2_1", "thchs30-a2_2",
                    "thchs30-a2_3", "thchs30-a2_6")
ZH_SETS = {"zh-dev": ZH_DEV_CLIPS, "zh-heldout": ZH_HELDOUT_CLIPS}
ALIASES = {"dev": "zh-dev", "heldout": "zh-heldout"}  # the English bench's default --sets
TICK_GRACE_NS = 1_000_000_000 // 30  # a character is late past D plus one tick at 30 fps
# --repeats N: run r starts after r x this much silence, the same audio heard at other update
# times (one run is one draw: where the updates fall decides near-ties such as 虽然 / 孙然)
LEAD_STEP_MS = 150
# quality.streamed: (set, D ms, args, observer) -> (words as published, t0 ns)
Streamed = Callable[..., tuple[list, int]]


@dataclass(frozen=True, slots=True)
class CharSet:
    name: str
    audio: np.ndarray
    ref: str  # the clips' texts joined (no marks: none of these references has any)
    clips: tuple[str, ...]


def build_zh_set(name: str, keys: tuple[str, ...]) -> CharSet:
    from subd.sources.decode import load_audio

    rows = speech_table()
    gap = np.zeros(int(GAP_S * 16000), np.float32)
    parts, texts = [], []
    for key in keys:
        if key not in rows or rows[key][0] != "zh":
            raise UserError(f"{SPEECH / 'transcripts.tsv'}: no Mandarin clip {key}")
        parts += [load_audio(SPEECH / f"{key}.wav"), gap]
        texts.append(rows[key][2])
    return CharSet(name, np.concatenate(parts), "".join(texts), keys)


def simplified(text: str) -> str:
    """``text`` in simplified characters (Whisper writes either; the references are simplified)."""
    from subd.script import script_writer

    return script_writer("simplified", "zh")(text).strip()


@dataclass(frozen=True, slots=True)
class Decision:
    """One recogniser update that committed characters."""

    at_ns: int  # when its result was in (stream time once stream_zh took the stream's t0)
    full_span: bool | None  # Whisper's full input, the cut span; None: not known (--pace real)
    chars: tuple[tuple[str, int], ...]  # (text, right context ns: heard after its end)


class Decisions(Published):
    """Pipeline observer: each committed word as published, and each update's committed
    characters with the audio heard after them."""

    def __init__(self) -> None:
        super().__init__()
        self.recogniser = None  # cputimed.CpuTimed, set by --pace cpu: the kind of each update
        self.decisions: list[Decision] = []

    def on_hypothesis(self, result, now_ns: int) -> None:
        hyp = result.hypothesis
        if not hyp.committed:
            return
        kinds = getattr(self.recogniser, "kinds", None)
        self.decisions.append(Decision(
            now_ns, kinds[-1] if kinds else None,
            tuple((w.text, hyp.audio_end_ns - w.end_ns) for w in hyp.committed)))


@dataclass
class CharScore:
    cer: float
    n_errors: int
    n_chars: int
    text: str
    late: list[tuple[str, float]] = field(default_factory=list)  # (character, s after its end)
    latency_s: dict[str, float] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)
    latency_samples: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    runs: list[int] = field(default_factory=list)  # --repeats: each run's errors

    def as_dict(self) -> dict:
        return {"cer": self.cer, "errors": self.n_errors, "characters": self.n_chars,
                "late": len(self.late), "latency_s": self.latency_s, "text": self.text,
                **({"errors_runs": self.runs} if self.runs else {})}


def pooled(scores: list[CharScore]) -> CharScore:
    """Runs of one set pooled: errors over characters of all runs (the mean CER), every late
    character, latency over every run's characters; text and decisions are the first run's."""
    if len(scores) == 1:
        return scores[0]
    n_errors, n_chars = sum(s.n_errors for s in scores), sum(s.n_chars for s in scores)
    lat = np.concatenate([s.latency_samples for s in scores])
    return CharScore(n_errors / n_chars, n_errors, n_chars, scores[0].text,
                     [c for s in scores for c in s.late], latency_summary(lat), scores[0].decisions,
                     lat, [s.n_errors for s in scores])


def shifted(cset: CharSet, lead_ms: int) -> CharSet:
    """``cset`` after ``lead_ms`` of silence."""
    lead = np.zeros(lead_ms * 16, np.float32)
    return CharSet(cset.name, np.concatenate([lead, cset.audio]), cset.ref, cset.clips)


def score_text(cset: CharSet, text: str) -> CharScore:
    from subd.scoring.cer import cer, units

    hyp = simplified(text)
    n = len(units(cset.ref))
    value = cer(cset.ref, hyp)
    return CharScore(value, round(value * n), n, hyp)


def stream_zh(cset: CharSet, latency_ms: int, args, streamed: Streamed) -> CharScore:
    """One streamed run of ``cset`` at D = ``latency_ms`` (``streamed``: quality.streamed)."""
    from subd.script import join_words

    seen = Decisions()
    words, t0_ns = streamed(cset, latency_ms, args, seen)
    seen.decisions = [Decision(d.at_ns - t0_ns, d.full_span, d.chars) for d in seen.decisions]
    sc = score_text(cset, join_words([text for text, _, _, _ in words]))
    lat = np.array([(sent - t0_ns - end) / 1e9 for _, _, end, sent in words])
    limit_ns = latency_ms * 1_000_000 + TICK_GRACE_NS
    sc.late = [(text, (sent - t0_ns - end) / 1e9) for text, _, end, sent in words
               if sent - t0_ns - end > limit_ns]
    sc.latency_s, sc.latency_samples = latency_summary(lat), lat
    sc.decisions = seen.decisions
    return sc


def offline_zh(cset: CharSet, engine, language: str) -> CharScore:
    from subd.recognise.offline import TranscribeOptions, Transcriber
    from subd.script import join_words

    words = []
    for seg in Transcriber(engine, TranscribeOptions(language=language)).transcribe_blocks(
            [cset.audio]):
        words += seg.words
    return score_text(cset, join_words([w.text for w in words]))


def _row(name: str, sc: CharScore, offline: CharScore | None) -> str:
    lat = sc.latency_s
    lat_text = (f"{lat['p50']:5.2f} {lat['p95']:5.2f} {lat['max']:5.2f}" if lat
                else "    -     -     -")
    gap = f"{100 * (sc.cer - offline.cer):+6.1f}" if offline is not None else "     -"
    late = f"{len(sc.late):4d}" if offline is not None else "   -"
    runs = f"  (errors by run: {' '.join(map(str, sc.runs))})" if sc.runs else ""
    return (f"  {name:>8s}  {sc.cer:5.3f} {sc.n_errors:4d}/{sc.n_chars:<4d} {gap}  {late}"
            f"  {lat_text}{runs}")


def _show(sc: CharScore) -> None:
    print(f"            {sc.text}")
    for d in sc.decisions:
        kind = {True: "full", False: "cut ", None: "    "}[d.full_span]
        chars = " ".join(f"{t}{ctx / 1e9:+.2f}" for t, ctx in d.chars)
        print(f"              {d.at_ns / 1e9:6.2f} s {kind} {chars}")
    if sc.late:
        print("            late: " + " ".join(f"{t} {s:.2f} s" for t, s in sc.late))


def run_zh(args: argparse.Namespace, latencies: list[int], streamed: Streamed) -> int:
    """``subd bench quality --language zh``: CER against the same model's offline transcript.
    ``streamed``: quality's streamed run (quality checked --update-ms and --set already)."""
    from subd.script import check_language, default_model

    language = check_language(args.language, "--language")
    if args.model == "tiny.en":  # the English bench's default: the language's model instead
        args.model = default_model(language)
    elif args.model.endswith(".en"):
        raise UserError(f"--language {language}: the model {args.model!r} knows only English")
    names = [ALIASES.get(s.strip(), s.strip()) for s in args.sets.split(",") if s.strip()]
    if not names or any(n not in ZH_SETS for n in names):
        raise UserError(f"--sets {args.sets!r}: with --language zh choose from "
                        f"{', '.join(ZH_SETS)}")
    if args.synthetic:
        raise UserError("--synthetic is for the English sets")
    sets = [build_zh_set(n, ZH_SETS[n][:args.max_clips or None]) for n in names]
    engine = offline_engine(args.model, args.config)
    results: dict[str, dict[str, CharScore]] = {}
    for cset in sets:
        print(f"{cset.name}: {len(cset.audio) / 16000:.1f} s, {len(cset.ref)} characters "
              f"({', '.join(cset.clips)}), model {args.model}"
              + (f", {args.repeats} runs, each {LEAD_STEP_MS} ms later" if args.repeats > 1
                 else ""), flush=True)
        runs = [shifted(cset, r * LEAD_STEP_MS) for r in range(args.repeats)]
        res = {"offline": pooled([offline_zh(c, engine, language) for c in runs])}
        print(_row("offline", res["offline"], None), flush=True)
        for d in latencies:
            res[f"{d}"] = pooled([stream_zh(c, d, args, streamed) for c in runs])
            print(_row(f"{d}", res[f"{d}"], res["offline"]), flush=True)
        results[cset.name] = res
    print(f"\n  D (ms)      CER  errors  vs offline  late  lat p50 p95  max (s)"
          f"   [{args.pace}{' ' + args.update_ms if args.update_ms else ''}]")
    for name, res in results.items():
        print(f"{name}:")
        for key, sc in res.items():
            print(_row(key, sc, None if key == "offline" else res["offline"]))
            if args.show:
                _show(sc)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {n: {k: sc.as_dict() for k, sc in res.items()} for n, res in results.items()},
            indent=1, ensure_ascii=False), encoding="utf-8")
    return 0
