"""How much new audio a channel waits for before its next recogniser update (the cadence).

On the CPU the cadence is ``[recognizer] min_update_ms`` (200 ms): a serial recogniser on a
core or two is its own limit there. On a GPU (the batched recogniser, subd.gpu) it is
``[recognizer] gpu_update_ms``, by default ("auto") derived from the latency budget D:

    cadence = (D - A - UPDATE_MARGIN - FULL_SPAN_CONTEXT) / 2

rounded down to 20 ms and kept within 200..1000 ms. The planner (subd.pipeline.deadline) gives
the words due before the next result ``D - A - margin - max(cost, cadence) - cost`` of right
context; the cadence above is the slowest one at which an update that takes as long as the
cadence itself (a loaded GPU: a channel's round trip is its wait for the batch in flight plus
its own batch) still leaves them FULL_SPAN_CONTEXT (0.75 s), what a decision on Whisper's full
input needs to read like offline transcription. D = 2 s: 520 ms; D = 1 s and less: 200 ms (no
slower cadence leaves that context); D >= 3 s: 1000 ms. A cadence slower than 1 s delays a
channel's first caption and its recovery after silence by as much, for a GPU that is already
idle most of the time at such D.

Measured (subd bench quality --pace cpu --update-ms 60,30, a GPU's cost modelled, and subd
bench gpu on an H200): see docs/MEASUREMENTS.md, "Serving many channels from one GPU". The
cadence is chosen when a channel starts; a live change of D keeps it until the daemon restarts.
"""

from __future__ import annotations

from subd.pipeline.deadline import FULL_SPAN_CONTEXT_NS, UPDATE_MARGIN_NS
from subd.pipeline.ticks import NS_PER_MS

GPU_UPDATE_MIN_MS = 200  # as on the CPU: no slower than the CPU's default at a short D
GPU_UPDATE_MAX_MS = 1000
CADENCE_STEP_MS = 20  # one source chunk


def auto_gpu_update_ms(latency_ms: int, lookahead_ms: int) -> int:
    """The GPU's cadence for a channel at latency ``latency_ms`` (D) and look-ahead A."""
    spare_ms = (latency_ms - lookahead_ms - (UPDATE_MARGIN_NS + FULL_SPAN_CONTEXT_NS)
                // NS_PER_MS) // 2
    stepped = spare_ms // CADENCE_STEP_MS * CADENCE_STEP_MS
    return max(GPU_UPDATE_MIN_MS, min(GPU_UPDATE_MAX_MS, stepped))


def update_cadence_ms(recognizer, latency_ms: int, lookahead_ms: int, gpu: bool) -> int:
    """The cadence a channel runs at: ``recognizer`` is the ``[recognizer]`` section
    (subd.config.RecognizerConfig); ``gpu``: its recogniser is the batched one on a GPU."""
    if not gpu:
        return recognizer.min_update_ms
    if recognizer.gpu_update_ms == "auto":
        return auto_gpu_update_ms(latency_ms, lookahead_ms)
    return recognizer.gpu_update_ms
