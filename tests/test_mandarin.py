"""Mandarin end to end, on two kinds of speech:

* espeak-ng's Mandarin voice reading five sentences of Debian's code of conduct (as fortunes-zh
  ships it, the Latin words left out): 100 characters, so one character is 1 point of CER;
* three real AISHELL-1 test-set recordings (Apache 2.0, data/speech/SOURCES.md), 38 characters,
  joined into one stream with 0.75 s of silence between them: one stream, not three, because
  live speech comes as utterances with pauses, and what carries over a pause (the prompt, the
  window moving on, the commit of a tail at a pause) is what a stream must get right.

The packaged multilingual base transcribes each offline (``subd transcribe --language zh``) and
streams it with language "zh" and "auto". Character error rates are taken after OpenCC's
traditional -> simplified mapping (Whisper writes either), digits read as Chinese numerals. What
is asserted is what streaming must not lose: its CER within 2 points of offline transcription of
the same audio with the same model, "auto" identifying Chinese, and cues that follow the CJK
layout rules.
"""

from __future__ import annotations

import asyncio
import csv
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pysrt
import pytest
import soundfile as sf

from subd.bench.quality_zh import simplified
from subd.clock import FakeClock
from subd.config import RecognizerConfig
from subd.history import AudioHistory
from subd.layout.cjk import line_faults
from subd.layout.cues import CueLayout
from subd.models.engine import WhisperEngine
from subd.models.punct import PunctTagger
from subd.pipeline.contracts import TickSettings
from subd.pipeline.scheduler import Pipeline
from subd.punct.marks import ScriptTagger
from subd.punct.stream import PunctStream
from subd.recognise.loops import loop_start
from subd.recognise.streaming import StreamingRecognizer
from subd.scoring.cer import cer, units
from subd.scoring.punct import stream_hypotheses
from subd.script import has_cjk, join_words
from subd.sources.live import FileSource
from subd.types import UpdateCosts
from subd.workers.hosts import FactorySpec, RecogniserHost, TagHost
from subd.workers.process import InlineWorker

SENTENCES = (
    "在这种规模的项目中，很难避免遇到与你意见不和，或者难以合作的人。",
    "请接受这一事实，并保持礼貌。",
    "意见不一致并不是糟糕举止或者人身攻击的借口。",
    "请始终假设其他人都在为这一目标而付诸努力。",
    "我们之中的许多贡献者的母语并不是英语。",
)
TEXT = "".join(SENTENCES)
SPEECH = Path(__file__).resolve().parent.parent / "data" / "speech"
AISHELL = ("aishell-bac009s0764w0121.wav", "aishell-bac009s0764w0122.wav",
           "aishell-bac009s0724w0121.wav")
GAP_S = 0.75  # silence between the AISHELL utterances
# espeak-ng's plain "cmn" voice reads Chinese characters as pinyin spelt out in English
# ("hen3" -> "hen three"); its pinyin variant speaks the same language with Mandarin sounds
VOICE = "cmn-latn-pinyin"
pytestmark = pytest.mark.skipif(
    not (shutil.which("espeak-ng") and shutil.which("sox")),
    reason="espeak-ng and sox are needed")




@pytest.fixture(scope="module")
def mandarin_wav(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("mandarin")
    subprocess.run(["espeak-ng", "-v", VOICE, "-s", "150", "-w", str(d / "raw.wav"), TEXT],
                   check=True)
    out = d / "zh.wav"
    # -D: no dither. sox dithers a 16-bit output with random noise, so each run heard other
    # audio, and streaming on it came out anywhere from 58 to 72 % CER (offline 49-51 %)
    subprocess.run(["sox", str(d / "raw.wav"), "-D", "-r", "16000", "-c", "1", str(out)],
                   check=True)
    return str(out)


def transcribe_offline(wav: str, out_dir: Path) -> dict:
    """``subd transcribe --language zh`` of ``wav``: the text, and the lines of its SRT."""
    for suffix in (".json", ".srt"):
        subprocess.run([sys.executable, "-m", "subd.cli", "transcribe", wav, "-o",
                        str(out_dir / f"zh{suffix}"), "--language", "zh", "--quiet",
                        "--threads", "1"], check=True)
    words = json.loads((out_dir / "zh.json").read_text(encoding="utf-8"))["words"]
    srt = [line for item in pysrt.open(str(out_dir / "zh.srt"), encoding="utf-8")
           for line in item.text.split("\n")]
    return {"text": join_words([w["w"] for w in words]), "srt_lines": srt}


@pytest.fixture(scope="module")
def offline(mandarin_wav, tmp_path_factory) -> dict:
    return transcribe_offline(mandarin_wav, tmp_path_factory.mktemp("offline"))


@pytest.fixture(scope="module")
def aishell(tmp_path_factory) -> dict:
    """The three AISHELL-1 clips as one stream, their reference and its offline transcript."""
    with open(SPEECH / "transcripts.tsv", encoding="utf-8", newline="") as f:
        refs = {row["file"]: row["transcript"] for row in csv.DictReader(f, delimiter="\t")}
    gap = np.zeros(int(GAP_S * 16000), np.float32)
    parts = []
    for name in AISHELL:
        audio, rate = sf.read(SPEECH / name, dtype="float32")
        assert rate == 16000 and audio.ndim == 1, name
        parts += [gap, audio] if parts else [audio]
    d = tmp_path_factory.mktemp("aishell")
    wav = str(d / "aishell.wav")
    sf.write(wav, np.concatenate(parts), 16000, subtype="PCM_16")
    return {"wav": wav, "ref": "".join(refs[name] for name in AISHELL),
            "offline": transcribe_offline(wav, d)}


# the suite streams each bench set's first clips (those of 2026-12-02: 49 and 39 characters),
# not all of them (177 and 276): the four daemon-path runs would take ~20 min, not ~5
FIRST_CLIPS = {"zh-dev": 4, "zh-heldout": 2}


def bench_set(name: str, tmp_path_factory) -> dict:
    """The first clips of a set of ``subd bench quality --language zh`` (subd.bench.quality_zh:
    its clips joined with 0.75 s of silence), their reference and their offline transcript."""
    from subd.bench.quality_zh import ZH_SETS, build_zh_set

    cset = build_zh_set(name, ZH_SETS[name][:FIRST_CLIPS[name]])
    d = tmp_path_factory.mktemp(name)
    wav = str(d / f"{name}.wav")
    sf.write(wav, cset.audio, 16000, subtype="PCM_16")
    return {"wav": wav, "ref": cset.ref, "offline": transcribe_offline(wav, d)}


@pytest.fixture(scope="module")
def zh_dev(tmp_path_factory) -> dict:
    """The AISHELL-1 clips and FunASR's regression clip: 49 characters, tuned on."""
    return bench_set("zh-dev", tmp_path_factory)


@pytest.fixture(scope="module")
def zh_heldout(tmp_path_factory) -> dict:
    """PaddleSpeech's and FunASR's demo sentences: 39 characters, never tuned on."""
    return bench_set("zh-heldout", tmp_path_factory)


@pytest.fixture(scope="module")
def espeak(mandarin_wav, offline) -> dict:
    return {"wav": mandarin_wav, "ref": TEXT, "offline": offline}


@pytest.fixture(scope="module")
def engine() -> WhisperEngine:
    return WhisperEngine.load("base", threads=1, quantize=True)


def streamed(engine: WhisperEngine, audio: np.ndarray, language: str):
    rec = StreamingRecognizer("base", engine=engine, language=language)
    hyps = stream_hypotheses(rec, audio, 16000 // 2)
    return rec, hyps


@pytest.fixture(scope="module")
def streams(request, engine):
    """One streaming run per (speech, language), shared by the layout and the CER tests."""
    runs: dict[tuple[str, str], tuple] = {}

    def run(speech: str, language: str) -> tuple[dict, StreamingRecognizer, list]:
        if (speech, language) not in runs:
            case = request.getfixturevalue(speech)
            audio, _ = sf.read(case["wav"], dtype="float32")
            runs[speech, language] = (case, *streamed(engine, audio, language))
        return runs[speech, language]
    return run


CASES = [(speech, language) for speech in ("espeak", "aishell") for language in ("zh", "auto")]


def test_offline_transcript_is_chinese(offline):
    text = offline["text"]
    assert sum(has_cjk(u) for u in units(text)) >= 0.8 * len(units(TEXT)), text
    assert cer(TEXT, simplified(text)) < 0.7  # robotic speech, small model: 53 % measured
    assert [f for line in offline["srt_lines"] for f in line_faults(line, 16)] == []


def test_offline_transcript_of_real_mandarin(aishell):
    """Real read speech: offline base gets nearly all of it (2 of 38 characters wrong: 房 -> 佛,
    介 -> 间), so the stream has a real reference to be held to."""
    text = aishell["offline"]["text"]
    assert text == simplified(text)  # written in simplified characters, as configured
    assert cer(aishell["ref"], text) < 0.15
    assert [f for line in aishell["offline"]["srt_lines"] for f in line_faults(line, 16)] == []


# Issue 20's acceptance, the recogniser driven alone (agreement): met on the real recordings,
# and since 2026-12-07 on espeak-ng's robotic voice (the daemon's path: test_daemon_path_*).
# * AISHELL: stream 0.053 = transcribe 0.053 ("zh" and "auto"; 2 of 38 characters, 房 -> 佛 and
#   介 -> 间, both). Before subd.recognise.cjk_policy the stream was at 0.158: 停滞 -> 停制 and
#   虽然 -> 孙然 are near-ties (Whisper's probability 0.4-0.7 either way) that agreement settled
#   from decodes of part of the phrase, each forced to continue the characters already
#   committed. Chinese now commits by utterance (at the pause that ends it) from decodes without
#   a forced prefix: both come out right. Mean errors over 6 runs (update steps 0.4/0.5/0.6 s,
#   0 or 0.3 s of silence first) 6.8 -> 4.8, and on held-out real clips never tuned on
#   (WenetSpeech and AISHELL-2, 76 characters, not in the repository) 26.7 -> 19.0 (transcribe
#   17): this run passed with no character to spare. On an AVX2 CPU (no AVX-512) it missed by
#   three (0.132: 城市虽然 -> 尝试孙然): every decode of the stream up to the pause after that
#   phrase read it so, and the pause committed it (decoded apart, 3 of 30 windows ending in the
#   pause read it right, 8 of 10 that also heard the next utterance). Chinese now commits an
#   utterance once the decode heard 1 s of the speech after its pause
#   (cjk_policy.UTTERANCE_CONTEXT_MS), as offline hears it: 2 of 38 in each of the 6 runs above
#   (3.8 before; transcribe 2).
#   "12" for 一二 is Whisper's choice of numerals, a coin flip offline too (0.4 s of silence
#   first and transcribe writes "12"): the CER reads digits as Chinese numerals in both texts
#   (subd.scoring.cer); without that the stream is at 0.105.
# * espeak-ng: stream 0.67 against transcribe 0.53 (0.62 before cjk_policy; a held-out espeak-ng
#   text of 114 characters: 0.53 -> 0.59, transcribe 0.53). One robotic voice reads the five
#   sentences with short pauses: the committed text forced as the prefix had carried Whisper
#   from one sentence to the next; without it, base reads more characters wrong (Latin words
#   among them: "或著喊一 or 做的人"). Sentence by sentence stream and offline are equal (0.70 /
#   0.71): offline's 30 s windows hold several sentences, which base needs for this voice.
# * Not causes, measured before: int8 vs fp32, traditional vs simplified, the agreement guard
#   alone (500 / 800 ms), the prefix alone, the cut span, the update step, the temperature
#   fallback (espeak-ng 0.54 but held-out espeak-ng 0.53 -> 0.61 and held-out real 0.28 -> 0.36).
# * 2026-12-07: espeak-ng 0.67 -> 0.52 (transcribe 0.53), "zh" and "auto"; AISHELL unchanged.
#   The window, once it holds trim_after_ms of committed audio, moves on to the start of an
#   utterance, not to 1 s before the commit point inside one: a decode without a forced prefix
#   reads its window from the first sample, fragment and all (settle.utterance_start). The
#   expected failure this test carried for espeak-ng since 2026-12-01 is gone.


@pytest.mark.parametrize(("speech", "language"), CASES)
def test_streamed_cues_follow_cjk_layout(streams, speech, language):
    case, rec, hyps = streams(speech, language)
    assert rec.languages.language == "zh"  # "auto" identified Chinese on the first speech
    committed = [w for h in hyps for w in h.committed]
    # words are characters (not one sentence-long "word"), committed in time order
    assert len(committed) >= len(units(case["ref"])) // 2
    assert all(a.end_ns <= b.start_ns + 1 for a, b in zip(committed, committed[1:], strict=False))
    # the cues a viewer sees: tagged with the recogniser's marks, laid out by the CJK rules
    punct = PunctStream(ScriptTagger(PunctTagger.load()))
    layout = CueLayout()
    cues = []
    for h in hyps:
        upd = punct.update(h.committed, h.tentative, h.audio_end_ns)
        cues += layout.push(upd.final, h.audio_end_ns)
    cues += layout.push(punct.flush().final, hyps[-1].audio_end_ns) + layout.finish()
    lines = [line for c in cues for line in c.lines]
    assert lines and [f for line in lines for f in line_faults(line, 16)] == []
    # ... holding the committed text, marks and spaces aside ("12 线" may break as "12" / "线")
    bare = str.maketrans("", "", ",.?!，。？！、 ")
    assert "".join(lines).translate(bare) == join_words([w.text for w in committed]).translate(bare)


@pytest.mark.parametrize(("speech", "language"), CASES)
def test_streamed_cer_within_2_points_of_transcribe(streams, speech, language):
    case, _, hyps = streams(speech, language)
    ref = case["ref"]
    written = join_words([w.text for h in hyps for w in h.committed])
    # one script, the configured one (chinese_script = "simplified"): Whisper writes either
    assert written == simplified(written), written
    stream_text, offline_text = written, simplified(case["offline"]["text"])
    stream_cer, offline_cer = cer(ref, stream_text), cer(ref, offline_text)
    raw = [cer(ref, t, digits_as_numerals=False) for t in (stream_text, offline_text)]
    print(f"\nCER {speech} {language}: stream {stream_cer:.3f}, transcribe {offline_cer:.3f}"
          f" (digits as written: {raw[0]:.3f}, {raw[1]:.3f})"
          f" ({len(units(ref))} characters)\n  stream:     {stream_text}\n"
          f"  transcribe: {offline_text}")
    assert stream_cer <= offline_cer + 0.02


def test_streamed_full_input_commits_no_character_loop(mandarin_wav, engine):
    """On Whisper's full input (the daemon's choice on a fast device) base loops on espeak-ng's
    first sentences ("不和和和和和和的人千千千千千千千千千千和和和和"): each copy of the one
    character was timed, heard out and committed by agreement. The loop is cut and its decode
    redone without the committed text (subd.recognise.loops); the stream goes on with words."""
    audio, _ = sf.read(mandarin_wav, dtype="float32")
    rec = StreamingRecognizer("base", engine=engine, language="zh", encoder_pad_ms=0)
    hyps = stream_hypotheses(rec, audio[:13 * 16000], 16000 // 2)
    committed = [w for h in hyps for w in h.committed]
    assert loop_start(committed) is None, join_words([w.text for w in committed])
    cjk = [u for u in units(join_words([w.text for w in committed])) if has_cjk(u)]
    assert len(cjk) >= 30  # 13 s of speech at ~3.5 characters a second (measured: 37)


def test_subd_stream_writes_chinese_cues(aishell, tmp_path):
    """The daemon's own path: --language zh picks base, the recogniser groups characters, the
    tag stage keeps Whisper's marks, the layout writes lines of at most 16 characters into the
    live SRT. On the real recordings: on the 33 s of espeak-ng one live run in four ran into a
    loop ("千千千千千千千乖乖乖乖") and kept 33 characters of 100."""
    srt = tmp_path / "live.srt"
    proc = subprocess.run([sys.executable, "-m", "subd.cli", "stream", aishell["wav"],
                           "--language", "zh", "--srt", str(srt), "--latency-ms", "3000"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for item in pysrt.open(str(srt), encoding="utf-8")
             for line in item.text.split("\n")]
    # live on a shared 2-core machine the decodes fall where the CPU lets them: what is heard
    # varies from run to run (the CER comparison is the paced test above); the script and the
    # layout do not
    cjk = [u for u in units("".join(lines)) if has_cjk(u)]
    assert len(cjk) >= len(units(aishell["ref"])) // 2, lines
    assert [f for line in lines for f in line_faults(line, 16)] == []


# ---- the daemon's path: deadline mode ---------------------------------------------------------
# `subd stream` and `subd run` decide each character at its tick's deadline T(k) - A, from the
# hypothesis with the most right context in by then (subd.pipeline.deadline): the pipeline's
# scheduler and update planner over the streaming recogniser. Here on a fake clock on which an
# update lasts what base int8 takes on one idle core of the 2-core machine these figures were
# measured on (the daemon's recogniser thread: Whisper's full 30 s input 1.29-1.45 s, the cut
# span 0.38-0.40 s, measured on AISHELL): the decisions `subd stream --language zh` makes
# there at the default D = 2 s, the same in every run, however busy the machine is.
BASE_UPDATE_MS = {True: 1350, False: 400}  # full input, cut span
TAG_PASS_MS = 5
T0_NS = 10**12

# Not met on this machine (see docs/MEASUREMENTS.md, Languages). Traced decision by decision on
# AISHELL:
# * the planner kept its horizons per kind of update (db57349): characters get ~1 s of right
#   context, and AISHELL went from 0.132-0.211 to 0.079 in all six runs (3 update-cost models x
#   0 or 0.3 s of silence first);
# * the character left is 虽 (虽然 -> 孙然 / 渇然 / 渲然), a near-tie that base reads right on
#   Whisper's full input only, and there in 2 decodes of 5. Decoded apart, windows starting at
#   0, 4.5, 5.0 or 5.6 s and ending at 7.3-9.3 s: the cut span never read 虽 (24 decodes,
#   padding 2 s; 16 more with the daemon's window and prompt, padding 2, 6, 10 and 14 s), the
#   full input in 11 of 28. The full input costs 1.35 s here, too much at D = 2 s
#   (and at 3 and 4 s it stays wrong: 渇然, 孙然). Where it costs 0.3 s (a faster device, every
#   update on it) 虽然 comes out right and 城市 -> 尝试 wrong: 0.105;
# * a due character is decided only once 0.5 s was heard after it (cjk_policy.DEADLINE_GUARD_MS):
#   the stream's first update on the cut span no longer decides everything it heard. espeak-ng
#   0.680 -> 0.640 (characters late 7 -> 5); AISHELL and the held-out real clips unchanged.
# The characters that were still late (AISHELL 2-5 of 38, 2.0-3.0 s after their end) were the
# stream's first: its first update on the full input was planned on a first guess (0.4 s,
# tiny.en's) and cost base 1.35 s. Since 2026-12-04 the recogniser's process measures both kinds
# of update as the channel attaches (subd.recognise.warmup; here modelled as BASE_UPDATE_MS).
# Since 2026-12-02 the real speech is subd bench quality's Mandarin sets (subd.bench.quality_zh),
# split before any run: zh-dev (the 3 AISHELL clips and FunASR's regression clip, 49 characters)
# and zh-heldout (2 demo sentences, 39). Here: dev 0.102 vs 0.082 (5 vs 4 characters: 虽然 ->
# 渇然 again), held-out 0.077 vs 0.026 (3 vs 1: 达摩 -> 答案, read so by every cut-span decode
# from 8.9 s on, each with 1.2-1.4 s of audio after the character). One character is 2.0 points
# on dev, 2.6 on held-out: the acceptance holds only where the stream misreads no character that
# offline reads right. Both misreadings are near-ties offline settles with the whole utterance:
# on the full input at D = 4 s (1.3-2.3 s after each character) dev reads 尝试孙然 (0.143), and
# with a fast device's costs (300/100 ms, nearly every update on the full input, ~1.4 s after
# each character) dev 0.122 (城市 -> 尝试), held-out 0.051 (达 -> 打); held-out is met at D = 4 s
# (0.026) and with a 6 s cut-span pad at 560 ms an update (0.026; dev then 0.204).
# 2026-12-05: every decode written in one script (chinese_script, simplified) and a committed
# word re-stated under other word boundaries dropped (readings._restated_characters): held-out
# 0.103 -> 0.026 ("我认为为跑步" and 达摩 -> 打案 -> 打摩: 1 of 39 left), dev 0.122 and espeak-ng
# 0.590 (offline 0.480) unchanged.
# 2026-12-05, the cut span with 15 s kept the default (encoder_span = "cut", every update here
# on the cut span at 400 ms): zh-dev 0.122 -> 0.143, zh-heldout 0.026 -> 0.051, espeak-ng 0.590
# -> 0.620; with every update its own CPU time over three draws (subd bench quality --language
# zh --repeats 3) dev 0.122 -> 0.150, held-out 0.077 -> 0.060 (docs/MEASUREMENTS.md, "The cut
# span by default").
# 2026-12-07: a Chinese window moves on to the start of an utterance, not into one (settle.
# utterance_start): espeak-ng 0.710 -> 0.600. The bench's sets grew to 177 / 276 characters
# (here their first clips): there, D = 2 s, dev 0.209 -> 0.203 and held-out 0.232 -> 0.236
# against offline's 0.136 / 0.199; D = 4 s 0.209 -> 0.181 and 0.228 -> 0.214 (docs/
# MEASUREMENTS.md, "Mandarin on four times the speech").
DEADLINE_NOT_MET = pytest.mark.xfail(strict=False, reason=(
    "issue 20 acceptance not met on the daemon's path at D = 2 s with base's costs on one core "
    "(1350/400 ms): the bench's zh-dev 0.196 vs 0.141 over three draws (zh-heldout 0.214 vs "
    "0.208: met there); espeak-ng 0.600 vs 0.530: characters offline reads with the sentences "
    "around them"))


class _Published:
    """Pipeline observer: each committed word as a viewer gets it, and when it was published."""

    def __init__(self) -> None:
        self.words: list[tuple[str, int, int]] = []  # (text with its mark, end ns, sent ns)

    def on_hypothesis(self, result, now_ns: int) -> None:
        pass

    def on_publish(self, state, sent_ns: int) -> None:
        self.words += [(tw.text + tw.punct, tw.word.end_ns, sent_ns) for tw in state.committed]


def daemon_path(engine: WhisperEngine, audio: np.ndarray, language: str,
                latency_ms: int = 2000) -> tuple[list[tuple[str, int, int]], Pipeline]:
    """The words `subd stream --language LANGUAGE --latency-ms LATENCY_MS` publishes for
    ``audio``, decided as on one idle core (``BASE_UPDATE_MS``), with their publication times."""
    clock = FakeClock(start_ns=T0_NS)
    history = AudioHistory(40 * 16000)  # [recognizer] history_s
    spec = FactorySpec("subd.recognise.streaming:StreamingRecognizer",
                       {"model": "base", "engine": engine, "language": language,
                        **RecognizerConfig().window_options()})  # the daemon's window
    recogniser = RecogniserHost(spec, history.capacity, history=history, measure_costs=False)
    # what that core measures before the first words (subd.recognise.warmup), as modelled
    recogniser.update_costs = UpdateCosts(full_ns=BASE_UPDATE_MS[True] * 1_000_000,
                                          cut_ns=BASE_UPDATE_MS[False] * 1_000_000)
    settings = TickSettings(latency_ms=latency_ms, drain_timeout_s=60)
    seen = _Published()
    pipeline = Pipeline(
        clock=clock, settings=settings, source=FileSource(audio, name="mandarin"),
        recogniser=InlineWorker("recognise", recogniser, clock, lambda request: BASE_UPDATE_MS[
            bool(getattr(request, "full_span", False))] * 1_000_000),
        tagger=InlineWorker("tag", TagHost(None), clock, lambda request: TAG_PASS_MS * 1_000_000),
        history=history, observer=seen)

    async def run() -> None:
        task = asyncio.ensure_future(pipeline.run())
        await clock.run_until_done(task, limit_ns=T0_NS + int((len(audio) / 16000 + 120) * 1e9))
        task.result()
    asyncio.run(run())
    return seen.words, pipeline


@pytest.fixture(scope="module")
def daemon_runs(request, engine):
    runs: dict[tuple[str, str], tuple] = {}

    def run(speech: str, language: str):
        if (speech, language) not in runs:
            case = request.getfixturevalue(speech)
            audio, _ = sf.read(case["wav"], dtype="float32")
            runs[speech, language] = (case, *daemon_path(engine, audio, language))
        return runs[speech, language]
    return run


# the bench's sets (subd bench quality --language zh): dev with "zh" and "auto", held-out and
# espeak-ng with "zh" ("auto" gave the same figures on each: it names Chinese on the first
# speech, test_streamed_cues_follow_cjk_layout). The four runs and three transcribes: ~5 min
DAEMON_CASES = [("espeak", "zh"), ("zh_dev", "zh"), ("zh_dev", "auto"), ("zh_heldout", "zh")]


@pytest.mark.parametrize(("speech", "language"), [
    pytest.param(speech, language, marks=DEADLINE_NOT_MET) for speech, language in DAEMON_CASES])
def test_daemon_path_cer_within_2_points_of_transcribe(daemon_runs, speech, language):
    """Deadline mode at the default D = 2 s, as `subd stream --language zh` decides: each
    character published by its tick, and the text within 2 points of `subd transcribe`."""
    case, words, pipeline = daemon_runs(speech, language)
    ref = case["ref"]
    late = [(text, (sent - T0_NS - end) / 1e9) for text, end, sent in words
            if sent - T0_NS - end > 2_000_000_000 + 1_000_000_000 // 30]
    stream_text = simplified(join_words([text for text, _, _ in words]))
    offline_text = simplified(case["offline"]["text"])
    stream_cer, offline_cer = cer(ref, stream_text), cer(ref, offline_text)
    print(f"\nCER daemon path D = 2 s {speech} {language}: stream {stream_cer:.3f}, transcribe "
          f"{offline_cer:.3f} ({len(units(ref))} characters; {len(late)} late; "
          f"{pipeline.planner.n_full} updates on the full input) {late}\n"
          f"  stream:     {stream_text}\n  transcribe: {offline_text}")
    assert sum(has_cjk(u) for u in units(stream_text)) >= len(units(ref)) // 2
    assert stream_cer <= offline_cer + 0.02


# ---- subd bench quality --language zh ----------------------------------------------------------


def test_the_mandarin_bench_sets_are_split_and_carry_their_texts():
    """zh-dev and zh-heldout share no clip and no speaker; each text is the clip's, as
    transcripts.tsv says; the suite's first clips are the AISHELL-1 clips tuned on and FunASR's
    regression clip (dev), two demo sentences never tuned on (held-out)."""
    from subd.bench.quality_zh import ZH_DEV_CLIPS, ZH_HELDOUT_CLIPS, build_zh_set

    assert not set(ZH_DEV_CLIPS) & set(ZH_HELDOUT_CLIPS)

    def speakers(clips):  # AISHELL-1's BAC009S0764W0121 -> S0764, THCHS-30's a2_0 -> a2
        return {c.split("-")[1][6:11] if c.startswith("aishell") else c.split("-")[1][:2]
                for c in clips if c.startswith(("aishell", "thchs30"))}
    assert not speakers(ZH_DEV_CLIPS) & speakers(ZH_HELDOUT_CLIPS)
    assert speakers(ZH_DEV_CLIPS) >= {"s0764", "s0724", "d4"}
    assert set(AISHELL) == {f"{c}.wav" for c in ZH_DEV_CLIPS[:FIRST_CLIPS["zh-dev"]]
                            if c.startswith("aishell")}
    dev, held = (build_zh_set(n, c) for n, c in (("zh-dev", ZH_DEV_CLIPS),
                                                 ("zh-heldout", ZH_HELDOUT_CLIPS)))
    assert (len(units(dev.ref)), len(units(held.ref))) == (177, 276)
    assert dev.ref.startswith("甚至出现交易") and held.ref.startswith("我认为跑步")
    assert held.ref.endswith("还有光风丽日")
    # 12 clips of 2.9-9.7 s and 12 of 3.9-10.8 s, each followed by 0.75 s of silence
    assert 67 < len(dev.audio) / 16000 < 70 and 101 < len(held.audio) / 16000 < 104
    first = {n: build_zh_set(n, c[:FIRST_CLIPS[n]])
             for n, c in (("zh-dev", ZH_DEV_CLIPS), ("zh-heldout", ZH_HELDOUT_CLIPS))}
    assert [len(units(s.ref)) for s in first.values()] == [49, 39]


def test_bench_quality_in_mandarin_prints_cer_against_offline_and_each_decision(tmp_path):
    """The held-out set's first two clips on the daemon's path at D = 2 s, base's costs on one
    core modelled: the offline row, the streamed row with its CER and its difference to
    offline, and with --show each decision (characters with the audio heard after them). ~40 s
    on this CPU."""
    out_json = tmp_path / "zh.json"
    proc = subprocess.run([sys.executable, "-m", "subd.cli", "bench", "quality", "--language",
                           "zh", "--sets", "heldout", "--max-clips", "2", "--latencies", "2000",
                           "--pace", "cpu", "--update-ms", "1350,400", "--show",
                           "--json", str(out_json)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = proc.stdout.split("D (ms)")[-1]
    assert "zh-heldout:" in table and "[cpu 1350,400]" in table
    figures = json.loads(out_json.read_text(encoding="utf-8"))["zh-heldout"]
    assert figures["offline"]["characters"] == figures["2000"]["characters"] == 39
    assert figures["offline"]["cer"] < 0.15  # base reads these demo sentences nearly right
    assert figures["2000"]["latency_s"]["p50"] >= 2.0  # never before D
    # a decision: its time, the span, then each character with its right context in seconds
    assert re.search(r"^\s+\d+\.\d\d s (cut |full) (\S+[+-]\d\.\d\d ?)+$", table, re.M), table
    assert simplified("體驗") == "体验"


def test_bench_quality_in_mandarin_refuses_english_only_models_and_english_sets():
    for extra, message in ((["--model", "small.en"], "knows only English"),
                           (["--sets", "zh-dev,cards"], "choose from zh-dev, zh-heldout")):
        proc = subprocess.run([sys.executable, "-m", "subd.cli", "bench", "quality",
                               "--language", "zh", "--pace", "cpu", *extra],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
