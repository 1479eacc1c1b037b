"""Section ``[recognizer]``'s streaming options: what the streaming recogniser decides by
(subd.recognise.streaming, subd.recognise.commit)."""

from __future__ import annotations

from dataclasses import dataclass

from subd.script import DEFAULT_CHINESE_SCRIPT, check_chinese_script
from subd.validate import check_choice, check_prompt, check_range


@dataclass(frozen=True, slots=True)
class StreamingConfig:
    model: str = "tiny.en"
    precision: str = "int8"  # "int8" or "fp32"
    threads: int = 0  # 0: all cores but one (models.engine.live_threads)
    min_update_ms: int = 200  # new audio needed before another decode
    max_tentative_ms: int = 1200  # a hypothesis word older than this is committed
    pause_commit_ms: int = 600  # silence after the last word commits the tail
    pause_context_ms: int = 0  # ... once this much speech after it was heard (cjk_policy)
    agree_guard_ms: int = 150  # agreement counts only for words ending this long before the end
    agree_min_probability: float = 0.3  # ... and only when Whisper gave the word at least this
    # ... or when this many decodes in a row, each having heard the word out, gave the same
    # words up to it. Whisper is unsure of a sentence's first word after a pause (LibriVox
    # "Unless", "Had": 0.07-0.26 over five decodes that all agree), which held the sentence
    # back until max_tentative_ms committed it. ``subd bench realtime`` (joined LibriVox clips):
    # committed p95 1.47-1.49 -> 0.86-0.87 s, WER 9.9 -> 8.5 %.
    unsure_agree_decodes: int = 3
    # Deadline mode (the pipeline gives each update a commit_until_ns): agreement commits a
    # word before its deadline only once this much audio was heard after it (LocalAgreement
    # alone committed at ~0.6 s: "old-sposed", "ask not. What"). Committed words are forced
    # as the decode's prefix, which keeps the decoded tail (an update's cost, 120-140 ms p50 on
    # one core) short and steady when D is long; at D <= 2.5 s the deadline comes first. With
    # 1 s, two early decodes at a stream's start agreed on "Go D-Link" ("Good evening") and on
    # "latest," ("late news. Tonight"), and Whisper continued that forced prefix as one run-on
    # sentence of commas. subd bench quality --pace cpu --update-ms 450,140 --synthetic, D = 4 s,
    # 1 s -> 2 s: WER dev 5.2 -> 5.2 %, espeak-ng 25.3 -> 22.7 %, '.' F1 0.75 / 0.00 -> 0.89 /
    # 0.80 (held-out, looked at only to report: 8.7 -> 6.5 %); 3 s: espeak-ng 26.7 %.
    agree_context_ms: int = 2000
    # Deadline mode: a pause of pause_commit_ms after the last word commits the tail too (its
    # text; the tagger still decides its punctuation at the deadline)
    deadline_pause_commit: bool = False
    # A word Whisper is sure of (heard out, a word after it) may commit on its first decode.
    confident_guard_ms: int = 300
    confident_min_probability: float = 1.0  # 1.0 turns single-decode commits off
    # committed audio kept in the window before trimming. Driven alone (agreement commits), 6 s:
    # with 15 s tiny.en read LibriVox's "ill-disposed" as "old sposed" (tests/test_streaming.py,
    # 8.5 % against 1.4 %); the daemon's deadline mode keeps [recognizer] trim_after_ms = 15000
    trim_after_ms: int = 6000
    # ... after an update on Whisper's full input, whose encoder sees 30 s whatever the window
    # holds: Whisper reads words and marks from their sentence (D = 2 s, dev / espeak-ng: WER
    # 7.0 / 14.7 % at 6 s, 5.2 / 5.2 % at 15 s; ',' F1 0.40 / 0 -> 0.67 / 0.50)
    full_span_trim_after_ms: int = 15000
    max_window_ms: int = 24000  # force a commit/cut before the 30 s window can overflow
    vad: bool = True
    # Offline a low-confidence window is re-decoded at higher temperatures; live, a window ending
    # inside a word re-decoded sampled invents words. Greedy, but see _trim.
    temperature_fallback: bool = False
    force_committed_prefix: bool = True  # decode only the unconfirmed tail (see _decode)
    # The cut span (subd.pipeline.deadline chooses it per update): the encoder runs over the
    # window plus this padding, rounded up to the bucket (models.engine.EncoderSpan): tiny.en
    # int8 on one core, 0.13-0.15 s an update instead of 0.4-0.45 s. 0: the full 30 s.
    encoder_pad_ms: int = 2000
    encoder_bucket_ms: int = 4000
    # "auto" (identified on the first speech, subd.recognise.language) or an ISO code
    language: str = "en"
    chinese_script: str = DEFAULT_CHINESE_SCRIPT  # subd.script.CHINESE_SCRIPTS
    # names and terms to expect, spelled as they should be written ([recognizer] prompt):
    # Whisper's initial prompt, kept before the committed words of every decode's context
    prompt: str = ""

    def __post_init__(self) -> None:
        for key, lo, hi in (
            ("min_update_ms", 20, 5000),
            ("max_tentative_ms", 200, 20000),
            ("pause_commit_ms", 100, 10000),
            ("pause_context_ms", 0, 10000),
            ("agree_guard_ms", 0, 5000),
            ("confident_guard_ms", 0, 5000),
            ("unsure_agree_decodes", 2, 100),
            ("agree_context_ms", 0, 60000),
            ("trim_after_ms", 500, 20000),
            ("full_span_trim_after_ms", 500, 20000),
            ("max_window_ms", 4000, 28000),
            ("encoder_pad_ms", 0, 30000),
            ("encoder_bucket_ms", 20, 30000),
        ):
            check_range("recognizer", key, getattr(self, key), lo, hi)
        for key in ("agree_min_probability", "confident_min_probability"):
            check_range("recognizer", key, getattr(self, key), 0.0, 1.0)
        check_choice("recognizer", "precision", self.precision, ("int8", "fp32"))
        check_chinese_script(self.chinese_script)
        check_prompt(self.prompt)
