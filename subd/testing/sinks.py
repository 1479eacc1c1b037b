"""Scripted caption states: a deterministic stand-in for the real-time pipeline.

Used by sink tests, the fan-out benchmark and the SIGKILL driver. Words of a text are laid on
the audio timeline at a given speaking rate; each word is tentative once its audio has been
heard and committed ``commit_lag_ms`` later, as a streaming recogniser would do; the cues
are laid out as the pipeline lays them out (once per tick, the stream's last open cue closed
at its last tick).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator, Sequence
from fractions import Fraction

from subd.layout.cues import CueLayout, LayoutConfig
from subd.types import CaptionState, TaggedWord, Word

NS_PER_S = 1_000_000_000

SPEECH = (
    "Good evening and welcome to the late news. In the city of Lyon, 25 percent of the "
    "buses were late on Monday, and the council says the new timetable will fix it by "
    "March. Meanwhile the weather: rain in the north, sunshine in the south, and up to "
    "30 degrees on the coast. Our reporter spoke to the Donaudampfschifffahrtsgesellschaft"
    "skapitaenswitwe about the river. She said it had never been this low. That is all "
    "for tonight. Thank you for watching, and good night."
)


def script_words(
    text: str = SPEECH,
    *,
    words_per_s: float = 2.5,
    start_ns: int = 0,
    pause_after_sentence_ms: int = 300,
) -> tuple[TaggedWord, ...]:
    """The words of ``text`` on the audio timeline, punctuation and case already tagged."""
    slot_ns = int(NS_PER_S / words_per_s)
    out: list[TaggedWord] = []
    t = start_ns
    for raw in text.split():
        core = raw.rstrip(".,;:?!")
        punct = raw[len(core) :][:1]
        case = "cap" if core[:1].isupper() else "lower"
        word = Word(text=core.lower(), start_ns=t, end_ns=t + slot_ns * 4 // 5)
        brk = 1.0 if punct in (".", "?", "!") else 0.6 if punct else 0.0
        out.append(TaggedWord(word, core, punct, case, brk, final=True))
        t += slot_ns * max(1, len(core) // 8 + 1)
        if punct in (".", "?", "!"):
            t += pause_after_sentence_ms * 1_000_000
    return tuple(out)


def script_states(
    words: Sequence[TaggedWord],
    *,
    fps: Fraction = Fraction(30),
    commit_lag_ms: int = 1200,
    latency_ms: int = 3000,
    t0_ns: int = 0,
    audio_per_tick: Fraction = Fraction(1),
    tail_ms: int = 3000,
    layout: LayoutConfig | None = None,
) -> Iterator[CaptionState]:
    """One state per tick: ``due_ns = t0 + (k+1)·P + D``; audio advances ``audio_per_tick``·P.

    ``audio_per_tick`` > 1 compresses time (more audio per tick), for fast tests.
    """
    cues = CueLayout(layout)
    period = Fraction(NS_PER_S) / fps
    lag_ns = commit_lag_ms * 1_000_000
    end_ns = (words[-1].word.end_ns if words else 0) + lag_ns + tail_ms * 1_000_000
    n_committed = 0
    k = 0
    while True:
        audio_end = int((k + 1) * period * audio_per_tick)
        due = t0_ns + int((k + 1) * period) + latency_ms * 1_000_000
        first = n_committed
        while n_committed < len(words) and words[n_committed].word.end_ns + lag_ns <= audio_end:
            n_committed += 1
        heard = [w for w in words[n_committed:] if w.word.end_ns <= audio_end]
        state = cues.apply(CaptionState(
            k=k,
            due_ns=due,
            audio_end_ns=audio_end,
            committed=tuple(words[first:n_committed]),
            tentative=" ".join(w.text.lower() for w in heard),
        ))
        if audio_end >= end_ns:
            closed = tuple(c for c in state.cues if c.committed)
            yield dataclasses.replace(state, cues=closed + tuple(cues.finish()))
            return
        yield state
        k += 1


async def feed(sinks: Sequence, states: Iterator[CaptionState], *, t0_ns: int | None = None,
               latency_ms: int = 0, fps: Fraction = Fraction(30)) -> int:
    """Publish ``states`` to ``sinks`` at their due times (monotonic clock); returns n ticks.

    The states' own ``due_ns`` are replaced by ``t0_ns + (k+1)·P + D`` on the real clock.
    """
    period = Fraction(NS_PER_S) / fps
    t0 = time.monotonic_ns() if t0_ns is None else t0_ns
    n = 0
    for state in states:
        due = t0 + int((state.k + 1) * period) + latency_ms * 1_000_000
        delay_s = (due - time.monotonic_ns()) / NS_PER_S
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        state = dataclasses.replace(state, due_ns=due)
        for sink in sinks:
            sink.publish(state)
        n += 1
    return n


async def _drive_srt(directory: str, speed: int, fps: int, repeat: int) -> None:
    """Feed the scripted speech into an SRT sink at tick rate, reporting progress on stdout.

    ``committed N T`` is printed when the sink has been handed its N-th cue at monotonic time T
    (ns); the SIGKILL test kills this process at random moments and checks the file.
    """
    import sys

    from subd.sinks.files import FileSinkConfig, SRTSink

    sink = SRTSink(FileSinkConfig(directory=directory))
    await sink.start()
    reported = 0

    class _Reporter:
        name = "reporter"

        def publish(self, state: CaptionState) -> None:
            nonlocal reported
            if sink.n_committed != reported:
                reported = sink.n_committed
                sys.stdout.write(f"committed {reported} {time.monotonic_ns()}\n")
                sys.stdout.flush()

    words = script_words(" ".join([SPEECH] * repeat))
    states = script_states(words, fps=Fraction(fps), audio_per_tick=Fraction(speed))
    await feed([sink, _Reporter()], states, fps=Fraction(fps))
    await sink.close()
    sys.stdout.write("done\n")


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="feed scripted captions into an SRT sink")
    parser.add_argument("directory")
    parser.add_argument("--speed", type=int, default=1, help="audio ticks per real tick")
    parser.add_argument("--fps", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=1, help="speak the script this often")
    args = parser.parse_args(argv)
    asyncio.run(_drive_srt(args.directory, args.speed, args.fps, args.repeat))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
