"""``subd transcribe IN -o OUT``: a whole file (or stdin PCM) to SRT, WebVTT or JSON words."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import pysrt

from subd.errors import UserError
from subd.script import CHINESE_SCRIPTS, DEFAULT_CHINESE_SCRIPT, TITLE_ABBREVIATIONS
from subd.types import Cue, TaggedWord, Word
from subd.validate import (
    PROMPT_HELP,
    cannot_write,
    check_piped_stdin,
    check_prompt,
    check_writable_folder,
)

OUTPUT_SUFFIXES = (".srt", ".vtt", ".json")
PROGRESS_MIN_S = 5.0  # show a progress bar for inputs longer than this


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "transcribe", help="transcribe a file or stdin PCM to .srt/.vtt/.json"
    )
    p.add_argument(
        "input", help="audio file (WAV/FLAC/OGG, others through ffmpeg) or - for stdin PCM"
    )
    p.add_argument("-o", "--output", help="output file: .srt, .vtt or .json (default: the cues "
                   "printed on stdout, as subd stream prints them)")
    p.add_argument("--model", help="tiny.en (default for English), base (default for other "
                   "languages and auto), or a model path")
    p.add_argument("--language", default="en",
                   help="ISO code of the speech (en, zh, ja, ...; default en) or auto (Whisper "
                   "identifies it on the first speech)")
    p.add_argument("--chinese-script", default=DEFAULT_CHINESE_SCRIPT,
                   choices=tuple(CHINESE_SCRIPTS),
                   help="the script Chinese is written in (default simplified; decoded: as "
                   "Whisper wrote it, either)")
    p.add_argument(
        "--format",
        dest="pcm_format",
        default="s16le",
        choices=("s16le", "f32le"),
        help="stdin PCM sample format",
    )
    p.add_argument("--rate", type=int, default=16000, help="stdin PCM sample rate in Hz")
    p.add_argument("--channels", type=int, default=1, help="stdin PCM channel count")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: all cores)")
    p.add_argument(
        "--precision",
        default="auto",
        choices=("auto", "int8", "fp32", "fp16", "bf16"),
        help="auto: int8 on the CPU (quantised linears, fastest), fp16 on CUDA; fp32: "
        "reference-exact; fp16/bf16: CUDA only",
    )
    p.add_argument("--device", default="auto",
                   help="auto (a GPU if torch sees one, else the CPU), cpu, cuda or cuda:N")
    p.add_argument("--prompt", default="", help=PROMPT_HELP)
    p.add_argument("--no-vad", action="store_true", help="decode every window, even without speech")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


class Progress:
    """A one-line progress bar on stderr, redrawn at most 5 times a second."""

    def __init__(self, total_s: float | None, enabled: bool):
        self.total_s = total_s
        self.enabled = enabled
        self._last = 0.0
        self._start = time.monotonic()
        self._drawn = ""

    def __call__(self, n_samples: int, final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not final and now - self._last < 0.2:
            return
        self._last = now
        done_s = n_samples / 16000
        speed = done_s / max(now - self._start, 1e-6)
        if self.total_s:
            frac = min(1.0, done_s / self.total_s)
            bar = "#" * int(frac * 30)
            line = f"\r[{bar:<30}] {frac:4.0%} {done_s:7.1f}/{self.total_s:.1f} s  {speed:5.1f}x"
        else:
            line = f"\r{done_s:8.1f} s  {speed:5.1f}x"
        if line == self._drawn and not final:
            return
        sys.stderr.write(("" if line == self._drawn else line) + ("\n" if final else ""))
        self._drawn = line
        sys.stderr.flush()


def _tagged(word: Word) -> TaggedWord:
    """The recogniser's own punctuation as tags (offline output has full right context)."""
    text = word.text
    punct = text[-1] if text[-1:] in (",", ".", "?", "!", "，", "。", "？", "！") else ""
    if text.lower() in TITLE_ABBREVIATIONS:
        punct = ""
    return TaggedWord(
        word=word,
        text=text,
        punct=punct,
        break_after=1.0 if punct and punct in ".?!。？！" else 0.0,
        final=True,
    )


def _cues(words: list[Word]) -> list[Cue]:
    from subd.layout.cues import CueLayout

    layout = CueLayout()
    cues = layout.push([_tagged(w) for w in words], audio_end_ns=words[-1].end_ns if words else 0)
    return cues + layout.finish()


def _srt_time(ns: int) -> pysrt.SubRipTime:
    return pysrt.SubRipTime(milliseconds=max(0, ns) // 1_000_000)


def render(words: list[Word], suffix: str) -> str:
    from subd.sinks.files import vtt_time

    if suffix == ".json":
        items = [
            {
                "w": w.text,
                "start_ms": w.start_ns // 1_000_000,
                "end_ms": w.end_ns // 1_000_000,
                "p": round(w.probability, 4),
            }
            for w in words
        ]
        return json.dumps({"words": items}, ensure_ascii=False, indent=1) + "\n"
    cues = _cues(words)
    if suffix == ".srt":
        subs = pysrt.SubRipFile(
            items=[
                pysrt.SubRipItem(i, _srt_time(c.start_ns), _srt_time(c.end_ns), "\n".join(c.lines))
                for i, c in enumerate(cues, 1)
            ]
        )
        return "".join(f"{item}\n" for item in subs)
    body = "".join(
        f"\n{vtt_time(max(0, c.start_ns) // 1_000_000)} --> "
        f"{vtt_time(max(0, c.end_ns) // 1_000_000)}\n" + "\n".join(c.lines) + "\n"
        for c in cues
    )
    return "WEBVTT\n" + body


def _write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` whole or not at all (a reader never sees half a file), with the
    mode a plain write gives: the old file's, else 0666 less the umask (mkstemp's 0600 kept
    a web server or another user from reading the captions)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def place_or_exit(device: str, precision: str):
    """--device/--precision -> a placement; CUDA asked for and absent: one line, exit 2."""
    from subd.gpu.device import place

    try:
        return place(device, precision)
    except UserError as exc:
        raise UserError(str(exc).replace("[recognizer] device", "--device")
                        .replace("[recognizer] precision", "--precision")) from None


def language_and_model(language: str, model: str | None) -> tuple[str, str]:
    """--language (checked, one line on a bad code) and the model: as given, else the default
    for the language (tiny.en for English, the multilingual base otherwise)."""
    from subd.errors import ConfigError
    from subd.script import check_language, default_model

    try:
        code = check_language(language, "--language")
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    return code, model or default_model(code)


def run(args: argparse.Namespace) -> int:
    from subd.gpu.device import load_engine
    from subd.recognise.offline import TranscribeOptions, Transcriber
    from subd.sources import decode as audio

    out = Path(args.output) if args.output else None
    if out is not None:
        if out.suffix.lower() not in OUTPUT_SUFFIXES:
            raise UserError(f"{out}: output must end in .srt, .vtt or .json")
        if out.exists() and out.is_dir():
            raise UserError(f"{out}: is a directory")
        check_writable_folder(out.parent, str(out))
    check_prompt(args.prompt, "--prompt")  # one line, before the model loads
    placement = place_or_exit(args.device, args.precision)  # before any audio is read
    language, model = language_and_model(args.language, args.model)
    if args.input == "-":
        check_piped_stdin("subd transcribe")
        spec = audio.PcmSpec.parse(args.pcm_format, args.rate, args.channels)
        blocks = audio.iter_pcm_blocks(
            sys.stdin.buffer, fmt=spec.fmt, rate_hz=spec.rate_hz, channels=spec.channels
        )
        total_s = None
    else:
        blocks = audio.iter_audio_blocks(args.input)
        total_s = audio.total_duration_s(args.input)
    engine = load_engine(model, placement, threads=args.threads or None)
    if not engine.tokenizer.multilingual and language not in ("en", "auto"):
        raise UserError(f"--language {language}: the model {model!r} knows only English "
                        "(use --model base)")
    transcriber = Transcriber(engine, TranscribeOptions(
        vad=not args.no_vad, language=language, chinese_script=args.chinese_script,
        prompt=args.prompt))
    show = not args.quiet and (total_s is None or total_s > PROGRESS_MIN_S)
    progress = Progress(total_s, enabled=show)
    words: list[Word] = []
    n_done = 0

    def on_progress(n: int) -> None:
        nonlocal n_done
        n_done = n
        progress(n)

    for segment in transcriber.transcribe_blocks(blocks, on_progress):
        words.extend(segment.words)
    progress(n_done, final=True)
    if out is None:
        from subd.sinks.text import format_cue

        sys.stdout.write("".join(format_cue(c) for c in _cues(words)))
    else:
        try:
            _write_atomic(out, render(words, out.suffix.lower()))
        except OSError as exc:  # the disk filled, or the folder went, during the work
            raise cannot_write(str(out), exc) from None
    if not words and not args.quiet:  # a valid file with no cue: say why, not nothing
        held = f"{out} holds no cue" if out is not None else "no cue printed"
        print(f"subd: no speech found in {args.input}; {held}", file=sys.stderr)
    return 0
