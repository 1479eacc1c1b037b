"""``subd bench quality``: live caption quality against the latency budget D, and offline.

Audio: real speech with exact transcripts (subd.bench.quality_sets), split once into a DEVELOPMENT
set (what policies are tuned on) and a HELD-OUT set (never tuned on), reported side by side;
``--synthetic`` adds espeak-ng speech; ``--language zh``: Mandarin sets by CER (quality_zh). A set
is one stream (clips 0.75 s apart), streamed once per D; ``--per-clip``: each clip a stream of
its own, as a user streams a file, scored over the set; an update's duration moves decisions:
* ``--pace real`` (default): ``subd stream``'s daemon at real time. Honest on a quiet machine;
  on a shared one, other work slows the updates and the figures show that machine, not subd.
* ``--pace cpu``: the same stages on a fake clock, each update and tag pass lasting the CPU time
  it took (one thread, as live on 2 cores): a dedicated core's decisions, however busy this is.

The same engine transcribes the set offline (``subd transcribe``'s path). Per run: WER; F1 of
'.', ',' and '?' on aligned words against the book's punctuation (clips without one count for
WER, drops and latency only); dropped spans (3+ reference words in a row missing); full stops
inside sentences (at a ';' apart); committed latency as seen (first tick showing it - its end)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
from pathlib import Path

import numpy as np

from subd.bench.cputimed import CpuTimed
from subd.bench.quality_sets import (
    SETS,
    Published,
    RunScore,
    SpeechSet,
    build_set,
    latency_summary,
    offline_engine,
    score_words,
    synthetic_set,
)
from subd.bench.quality_zh import LEAD_STEP_MS, run_zh
from subd.errors import UserError
from subd.types import ENCODER_SPANS, SAMPLE_RATE_HZ

LATENCIES_MS = (500, 1000, 2000, 4000)
TAG_MODEL_NS = 5_000_000  # a tag pass with --update-ms (see _stream_cpu)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("quality", help="caption quality vs latency D, and offline")
    p.add_argument("--latencies", default=",".join(map(str, LATENCIES_MS)),
                   help="D values in ms, comma separated (default 500,1000,2000,4000)")
    p.add_argument("--sets", default="dev,heldout", help="dev, heldout (comma separated)")
    p.add_argument("--synthetic", action="store_true", help="add espeak-ng speech as a set")
    p.add_argument("--max-clips", type=int, default=0, help="first N clips of each set (0: all)")
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--config", help="configuration file (default: built in; its [recognizer] "
                   "precision is the engine's, int8 or fp32)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="--pace cpu: a streaming recogniser option (subd.recognise.options."
                        "StreamingConfig), e.g. agree_context_ms=2000; repeatable")
    p.add_argument("--tagger", default="auto", help="[pipeline] tagger: auto, none, ...")
    p.add_argument("--punct", action="append", default=[], metavar="KEY=VALUE",
                   help="--pace cpu: a PunctConfig option of the tagger; repeatable")
    p.add_argument("--plot", default="quality_vs_latency.png", help="PNG output ('': none)")
    p.add_argument("--json", help="write the figures here as JSON")
    p.add_argument("--show", action="store_true", help="print each run's text")
    p.add_argument("--repeats", type=int, default=1,
                   help="stream each D (and transcribe offline) this many times, run r "
                        "after r x 150 ms of silence: WER/F1 means, worst drops (default 1)")
    p.add_argument("--span", choices=("config", *ENCODER_SPANS), default="config",
                   help="[recognizer] encoder_span for the streamed runs (config: as the "
                        "configuration says)")
    p.add_argument("--min-update-ms", metavar="MS|gpu",
                   help="update cadence of the streamed runs: MS, or gpu: gpu_update_ms = "
                        "\"auto\" at each D (default: [recognizer] min_update_ms)")
    p.add_argument("--pace", choices=("real", "cpu"), default="real",
                   help="real: the daemon at real time; cpu: fake clock, CPU-time updates")
    p.add_argument("--update-ms", metavar="FULL,CUT",
                   help="--pace cpu: each recogniser update lasts this long on the fake clock "
                        "(full input, cut span), a tag pass 5 ms: a device of known speed, the "
                        "same decisions however loaded this machine is (tiny.en int8 on one "
                        "idle core: 450,140; base 1350,400)")
    p.add_argument("--language", default="en", help="en; zh: Mandarin sets, CER (base model)")
    p.add_argument("--per-clip", action="store_true",
                   help="stream and transcribe each clip as a stream of its own (as `subd "
                        "stream CLIP` and `subd transcribe CLIP`), scored over the set")
    p.set_defaults(func=run)


# ---- runs -------------------------------------------------------------------------------------


async def _stream(sset: SpeechSet, latency_ms: int, args, seen=None) -> tuple[list, int]:
    from subd.service.daemon import Daemon
    from subd.sources.live import FileSource

    cfg = _config(args, latency_ms)
    cfg = cfg.replace(tick=dataclasses.replace(cfg.tick, latency_ms=latency_ms),
                      recognizer=dataclasses.replace(cfg.recognizer, model=args.model,
                                                     language=args.language),
                      pipeline=dataclasses.replace(cfg.pipeline, tagger=args.tagger))
    source = FileSource(sset.audio, jitter_ms=0, name=sset.name)
    seen = Published() if seen is None else seen
    daemon = Daemon(cfg, source, sinks=[], observer=seen)
    await daemon.run()
    return seen.words, source.t0_ns


async def _stream_cpu(sset: SpeechSet, latency_ms: int, args, seen=None) -> tuple[list, int]:
    from subd.clock import FakeClock
    from subd.history import AudioHistory
    from subd.pipeline.scheduler import Pipeline, TickSettings
    from subd.punct.stream import PunctConfig
    from subd.service.build import recognizer_spec
    from subd.sources.live import FileSource
    from subd.workers.hosts import FactorySpec, RecogniserHost, TagHost, resolve_tagger
    from subd.workers.process import InlineWorker

    cfg, t0_ns = _config(args, latency_ms), 10**12
    clock = FakeClock(start_ns=t0_ns)
    history = AudioHistory(cfg.recognizer.history_s * SAMPLE_RATE_HZ)
    spec = recognizer_spec(args.model, **{**cfg.recognizer.window_options(),
                                          "language": args.language,
                                          "precision": cfg.recognizer.precision,
                                          **recognizer_overrides(args.overrides)})
    rec = CpuTimed(RecogniserHost(spec, history.capacity, history=history), update_ms(args))
    tagger = resolve_tagger(args.tagger)
    if args.punct and tagger is not None:
        tagger = FactorySpec(tagger.target, {**tagger.kwargs, **dict(
            (k, type(getattr(PunctConfig(), k))(v)) for k, v in
            (item.split("=", 1) for item in args.punct))})
    # with modelled updates, a tag pass lasts as long as a slow one on an idle core (p99 of
    # the dev set at D = 2 s: 5 ms; p50 2.5 ms): its CPU time on a busy machine moved the
    # recogniser's decisions, so one run of the same code gave other figures than the next
    tag = CpuTimed(TagHost(tagger), fixed_ns=TAG_MODEL_NS if rec.update_ns else None)
    seen = Published() if seen is None else seen
    seen.recogniser = rec  # subd.bench.quality_zh reads the kind of each update
    r, tick = cfg.recognizer, cfg.tick
    settings = TickSettings(tick.fps, latency_ms, tick.lookahead_ms, min_update_ms=r.min_update_ms,
                            drain_timeout_s=60, encoder_span=r.encoder_span,
                            update_cost_ms=r.planned_cost_ms())
    pipeline = Pipeline(
        clock=clock, settings=settings, source=FileSource(sset.audio, name=sset.name),
        recogniser=InlineWorker("recognise", rec, clock, lambda r: rec.last_ns),
        tagger=InlineWorker("tag", tag, clock, lambda r: tag.last_ns),
        history=history, observer=seen)
    task = asyncio.ensure_future(pipeline.run())
    await clock.run_until_done(task, limit_ns=t0_ns + int((len(sset.audio) / 16000 + 120) * 1e9))
    task.result()
    costs = np.array(rec.costs_ns) / 1e6
    print(f"    recogniser updates {costs.size} every {settings.min_update_ms} ms of new audio "
          f"({pipeline.planner.n_full} on the full input): "
          f"{'CPU' if rec.update_ns is None else 'modelled'} "
          f"p50 {np.percentile(costs, 50):.0f} ms, p95 {np.percentile(costs, 95):.0f} ms",
          flush=True)
    return seen.words, t0_ns


def _config(args, latency_ms: int):
    from subd.config import load_config

    cfg = load_config(args.config)
    rec = cfg.recognizer
    if getattr(args, "min_update_ms", None) is not None:
        rec = dataclasses.replace(rec, min_update_ms=cadence_ms(args, latency_ms,
                                                                cfg.tick.lookahead_ms))
    if args.span != "config":
        rec = dataclasses.replace(rec, encoder_span=args.span)
    return cfg.replace(recognizer=rec)


def cadence_ms(args, latency_ms: int, lookahead_ms: int) -> int:
    """``--min-update-ms MS|gpu`` at this D, in ms (gpu: the GPU's automatic cadence)."""
    from subd.pipeline.cadence import auto_gpu_update_ms

    if args.min_update_ms == "gpu":
        return auto_gpu_update_ms(latency_ms, lookahead_ms)
    try:
        ms = int(args.min_update_ms)
    except ValueError:
        raise UserError(f"--min-update-ms {args.min_update_ms!r}: MS or gpu") from None
    if not 20 <= ms <= 10_000:
        raise UserError(f"--min-update-ms {args.min_update_ms!r}: must be in 20..10000")
    return ms


def update_ms(args) -> tuple[int, int] | None:
    """``--update-ms FULL,CUT`` -> (full, cut) in ns, or None."""
    if not getattr(args, "update_ms", None):
        return None
    try:
        full, cut = (int(x) for x in args.update_ms.split(","))
    except ValueError:
        raise UserError(f"--update-ms {args.update_ms!r}: e.g. 450,140") from None
    if not (1 <= full <= 10_000 and 1 <= cut <= 10_000):
        raise UserError(f"--update-ms {args.update_ms!r}: each in 1..10000 ms")
    return full * 1_000_000, cut * 1_000_000


def recognizer_overrides(items: list[str]) -> dict:
    """``KEY=VALUE`` -> StreamingConfig keyword arguments, typed as the field's default."""
    from subd.recognise.options import StreamingConfig

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        default = getattr(StreamingConfig(), key, None) if sep else None
        if key == "prompt" and sep:  # text: a channel's [recognizer] prompt
            out[key] = value
            continue
        if default is None or isinstance(default, str):
            raise UserError(f"--set {item!r}: expected NUMBER_OR_BOOL_OPTION=VALUE or "
                            "prompt=TEXT")
        try:
            out[key] = (value.lower() in ("1", "true", "yes")) if isinstance(default, bool) \
                else type(default)(value)
        except ValueError:
            raise UserError(f"--set {item!r}: {value!r} is no {type(default).__name__}") from None
    return out


def stream_runs(sset: SpeechSet, latency_ms: int, args) -> RunScore:
    """``--repeats`` runs of one D: a streamed run's decisions depend on when each update's
    result comes in, so one run is one draw. Run r hears each stream after r x LEAD_STEP_MS of
    silence: on the fake clock the same audio gives the same decisions, so only the phase of
    the updates against the speech makes another draw (pooled: ``pooled_runs``)."""
    return pooled_runs([stream_run(sset, latency_ms, args, r * LEAD_STEP_MS)
                        for r in range(args.repeats)])


def offline_runs(sset: SpeechSet, engine, args) -> RunScore:
    """The offline baseline given the same draws as the streamed runs: run r transcribes each
    stream after r x LEAD_STEP_MS of silence (Whisper's 30 s windows then fall elsewhere on the
    speech, and offline too reads some words otherwise)."""
    return pooled_runs([offline_run(sset, engine, args.per_clip, r * LEAD_STEP_MS)
                        for r in range(args.repeats)])


def pooled_runs(runs: list[RunScore]) -> RunScore:
    """Several runs of one kind as one row: WER and F1 are the runs' means (``wer_runs`` lists
    each), dropped spans and full stops inside sentences the worst run's, latency is over every
    run's words; ``text`` is the first run's, ``texts`` each run's."""
    if len(runs) == 1:
        return runs[0]
    worst = max(runs, key=lambda r: (len(r.dropped), r.stops_inside))
    out = RunScore(float(np.mean([r.wer_pct for r in runs])),
                   {k: float(np.mean([r.f1[k] for r in runs])) for k in runs[0].f1},
                   worst.dropped, max(r.stops_inside for r in runs),
                   max(r.stops_at_semicolon for r in runs), text=runs[0].text)
    lat = np.concatenate([r.latency_samples for r in runs])
    out.latency_s = latency_summary(lat) if lat.size else {}
    out.latency_samples = lat
    out.wer_runs = [r.wer_pct for r in runs]
    out.texts = [r.text for r in runs]
    return out


def _after_silence(part, lead_ms: int):
    """``part`` (a stream of the set) heard after ``lead_ms`` of silence."""
    if not lead_ms:
        return part
    lead = np.zeros(lead_ms * SAMPLE_RATE_HZ // 1000, np.float32)
    return dataclasses.replace(part, audio=np.concatenate([lead, part.audio]))


def streamed(sset, latency_ms: int, args, seen=None) -> tuple[list, int]:
    """One streamed run at ``--pace`` (quality_zh's too): the words as published, and t0."""
    if args.pace == "cpu":
        from subd.torch_threads import torch_threads

        with torch_threads(1):  # one thread, so its CPU time is the update's cost
            return asyncio.run(_stream_cpu(sset, latency_ms, args, seen))
    return asyncio.run(_stream(sset, latency_ms, args, seen))


def stream_run(sset: SpeechSet, latency_ms: int, args, lead_ms: int = 0) -> RunScore:
    """One streamed run of the set, or with ``--per-clip`` one of each of its clips, their
    words scored together in the set's order; each stream after ``lead_ms`` of silence."""
    words, lat = [], []
    for part in sset.streams(args.per_clip):
        part_words, t0_ns = streamed(_after_silence(part, lead_ms), latency_ms, args)
        words += part_words
        lat += [(sent - t0_ns - end) / 1e9 for _, _, end, sent in part_words]
    sc = score_words(sset, [(t, p) for t, p, _, _ in words])
    lat = np.array(lat)
    sc.latency_s = latency_summary(lat)
    sc.latency_samples = lat
    return sc


def offline_run(sset: SpeechSet, engine, per_clip: bool = False, lead_ms: int = 0) -> RunScore:
    from subd.recognise.offline import TranscribeOptions, Transcriber

    words = []
    for part in sset.streams(per_clip):
        audio = _after_silence(part, lead_ms).audio
        for seg in Transcriber(engine, TranscribeOptions()).transcribe_blocks([audio]):
            words += seg.words
    return score_words(sset, [(w.text, None) for w in words])


def _row(name: str, sc: RunScore) -> str:
    lat = sc.latency_s
    lat_text = (f"{lat['p50']:5.2f} {lat['p95']:5.2f} {lat['max']:5.2f}" if lat
                else "    -     -     -")
    return (f"  {name:>8s}  {sc.wer_pct:5.1f}  {sc.f1['.']:4.2f} {sc.f1[',']:4.2f} "
            f"{sc.f1['?']:4.2f}  {len(sc.dropped):3d}  {sc.stops_inside:3d}  {lat_text}"
            + (f"  ({sc.stops_at_semicolon} more at a ';')" if sc.stops_at_semicolon else "")
            + (f"  (WER runs {' '.join(f'{w:.1f}' for w in sc.wer_runs)})" if sc.wer_runs
               else ""))


def run(args: argparse.Namespace) -> int:
    try:
        latencies = [int(x) for x in args.latencies.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--latencies {args.latencies!r}: e.g. 1000,2000") from None
    if not latencies or any(not 300 <= d <= 20_000 for d in latencies):
        raise UserError(f"--latencies {args.latencies!r}: each D must be in 300..20000 ms")
    update_ms(args)  # a bad --update-ms or --set fails before any run
    recognizer_overrides(args.overrides)
    if not 1 <= args.repeats <= 20 or args.max_clips < 0:
        raise UserError("--repeats must be in 1..20 and --max-clips >= 0")
    if args.language != "en":
        return run_zh(args, latencies, streamed)
    names = [s.strip() for s in args.sets.split(",") if s.strip()]
    if not names or any(n not in SETS for n in names):
        raise UserError(f"--sets {args.sets!r}: choose from {', '.join(SETS)}")
    if (args.overrides or args.update_ms) and args.pace != "cpu":
        raise UserError("--set and --update-ms work with --pace cpu (the daemon takes its "
                        "configuration and runs at its own speed)")
    if args.min_update_ms is not None:
        cadence_ms(args, 2000, 150)  # a bad value fails before any run
    sets = [build_set(n, SETS[n][:args.max_clips or None]) for n in names]
    if args.synthetic:
        sets.append(synthetic_set())
    engine = offline_engine(args.model, args.config)
    results: dict[str, dict[str, RunScore]] = {}
    for sset in sets:
        print(f"{sset.name}: {len(sset.audio) / 16000:.1f} s, {len(sset.words)} words"
              + (f", {len(sset.clips)} streams" if args.per_clip and sset.clips else ""),
              flush=True)
        res = {"offline": offline_runs(sset, engine, args)}
        for d in latencies:
            res[f"{d}"] = stream_runs(sset, d, args)
            print(_row(f"{d}", res[f"{d}"]), flush=True)
        results[sset.name] = res
    print("\n  D (ms)    WER %   '.'  ','  '?'  drop stop  lat p50 p95  max (s)")
    for name, res in results.items():
        print(f"{name}:")
        for key, sc in res.items():
            print(_row(key, sc))
            if args.show:  # each run's text, the runs in order
                for text in sc.texts or [sc.text]:
                    print(f"            {text}")
            for span in sc.dropped:
                print(f"            dropped: {span}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {n: {k: sc.as_dict() for k, sc in res.items()} for n, res in results.items()},
            indent=1))
    if args.plot:  # --plot "": none
        _plot(results, latencies, args.plot)
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
        for q, style in (("p50", "o-"), ("p95", "s--")):
            axes[2].plot(xs, [r.latency_s.get(q, np.nan) for r in runs], style, color=color,
                         label=f"{name} {q}")
    axes[2].plot(xs, xs, "k:", lw=0.8, label="D")
    for ax, title in zip(axes, ("WER % (dotted: offline)", "punctuation F1 (dotted: offline)",
                                "committed latency as shown (s)"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("D (s)")
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot: {path}")
