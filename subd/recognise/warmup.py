"""What a recogniser update costs on this engine, measured before a channel's first words.

The update planner (subd.pipeline.deadline) decides each word at the last update whose result is
in before its tick's fetch, so it must know what an update costs. A channel measures its own
updates as they come; before its first decoded one the planner had only a guess, tiny.en on an
idle core (Whisper's full input 0.4 s, the cut span 0.15 s). base takes 1.35 / 0.4 s on one core
here: the first update of a Mandarin stream was planned to be back in 0.55 s and came back in
1.75 s, so its first characters were shown 2.2-2.8 s after their end at D = 2 s, later than D
(docs/MEASUREMENTS.md, "Languages: Mandarin"); a larger model from a user's path is further off.

So when a channel attaches, its recogniser's process runs both kinds of update on the bundled
demo clip (speech from its first syllable), with the channel's own options over the same
engine, once each after an untimed first run (the engine's first run allocates and picks its
kernels), and the planner starts from those. Measured once per engine and options in a
process: four channels on one recogniser process wait for one measurement. A channel attached
again mid-stream (its process respawned) keeps the costs its planner has measured since.
"""

from __future__ import annotations

import time
from dataclasses import fields
from typing import Any

from subd.recognise.options import StreamingConfig
from subd.sources.decode import demo_clip_path, load_audio
from subd.types import SAMPLE_RATE_HZ, AudioChunk, UpdateCosts

FIRST_S = 2.0  # the window of the untimed first run: a stream's first words
MAX_S = 8.0  # "auto" identifies the language first: updates until one decodes, up to this

# (engine id, options) -> (the engine, kept so that its id is not reused; the costs)
_MEASURED: dict[tuple[int, StreamingConfig], tuple[Any, UpdateCosts | None]] = {}


def update_costs(recognizer: Any) -> UpdateCosts | None:
    """Both kinds of update's cost for ``recognizer``'s engine and options (a
    subd.recognise.streaming.StreamingRecognizer; its own state is not touched), measured once
    per process; None where an update of either kind did not decode."""
    engine, config = recognizer.engine, recognizer.config
    key = (id(engine), config)
    if key not in _MEASURED:
        _MEASURED[key] = (engine, _measure(type(recognizer), engine, config))
    return _MEASURED[key][1]


def _measure(cls: type, engine: Any, config: StreamingConfig) -> UpdateCosts | None:
    opts = {f.name: getattr(config, f.name) for f in fields(config) if f.name != "model"}
    probe = cls(config.model, engine=engine, **opts)
    audio = load_audio(demo_clip_path(), max_seconds=MAX_S)
    step = config.min_update_ms * SAMPLE_RATE_HZ // 1000
    end = min(len(audio), int(FIRST_S * SAMPLE_RATE_HZ))
    probe.accept(AudioChunk(start_sample=0, samples=audio[:end]))
    costs: dict[bool, int] = {}
    for full in (None, True, False):  # None: the untimed first run
        while True:
            if end + step > len(audio):
                return None
            probe.accept(AudioChunk(start_sample=end, samples=audio[end : end + step]))
            end += step
            n, t_ns = probe.n_decodes, time.monotonic_ns()
            # nothing is due: a deadline before the audio commits by agreement alone
            probe.update(commit_until_ns=0, full_span=bool(full))
            if probe.n_decodes != n:
                break
        if full is not None:
            costs[full] = time.monotonic_ns() - t_ns
    return UpdateCosts(full_ns=costs[True], cut_ns=costs[False])
