"""Stage payloads and the stage hosts that run inside workers (a process, or inline for tests).

* :class:`RecogniserHost` owns the streaming recogniser, which reads its window in place from
  the shared-memory :class:`~subd.history.AudioHistory` (the pipe carries only sample indices;
  the host moves the recogniser's :class:`~subd.history.HistoryReader` on) and returns the
  ``update`` hypothesis.
* :class:`TagHost` runs the streaming tagger over new words at a tick's look-ahead fetch.

Both are built from :class:`FactorySpec` (an importable "module:callable" plus keyword
arguments) so a spawned process can construct them. The tagger is pluggable; without one,
:class:`PassThroughTagger` keeps the recogniser's words as they are.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from subd.errors import ConfigError
from subd.history import AudioHistory, HistoryReader
from subd.torch_threads import torch_threads
from subd.types import AudioChunk, Hypothesis, TaggedWord, UpdateCosts, Word

log = logging.getLogger("subd.workers.hosts")


@dataclass(frozen=True, slots=True)
class FactorySpec:
    """``target`` is "package.module:callable"; called with ``kwargs`` in the worker."""

    target: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def build(self) -> Any:
        module_name, _, attr = self.target.partition(":")
        if not attr:
            raise ConfigError(f"{self.target!r}: expected 'module:callable'")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigError(f"{self.target!r}: cannot import {module_name} ({exc})") from None
        try:
            factory = getattr(module, attr)
        except AttributeError:
            raise ConfigError(f"{self.target!r}: {module_name} has no {attr}") from None
        return factory(**self.kwargs)


# ---- recognise stage ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UpdateRequest:
    end_sample: int  # audio [accepted, end_sample) is in the history ring
    # Deadline: every word ending by this audio time must be committed by this update (the
    # look-ahead fetch of its tick comes before the next update's result can be in). None:
    # the recogniser commits by its own policy alone.
    commit_until_ns: int | None = None
    # the encoder runs over Whisper's whole 30 s input, not the recogniser's cut span
    # (subd.pipeline.deadline); False: the recogniser's own setting
    full_span: bool = False
    # the stream's last update, before its final decode: a due guess at a window's edge waits
    # for that decode (StreamingRecognizer.update's ``ending``)
    ending: bool = False
    # For a recogniser shared by channels (subd.service.batching): when its result must be in
    # (the clock's ns: the look-ahead fetch T(k) - A of the first tick whose words it may
    # decide; None: no deadline), and whether the channel has shown no caption yet
    due_ns: int | None = None
    first_caption: bool = False
    # False: degraded, the update could not make ``due_ns``: no new audio is read and nothing
    # is decoded, the due words are decided from the last reading (subd.gpu.scheduler)
    decode: bool = True
    # the channel's names and terms to expect, as it has them now (a reload changes them
    # live); None: the recogniser keeps the prompt it was built with
    prompt: str | None = None


@dataclass(frozen=True, slots=True)
class FinishRequest:
    end_sample: int
    prompt: str | None = None  # as UpdateRequest's


@dataclass(frozen=True, slots=True)
class RecogniseResult:
    hypothesis: Hypothesis
    accepted_sample: int
    duration_ns: int
    lost_samples: int = 0  # audio overwritten before the recogniser read it (live overrun)
    # the model ran (False: a window without speech, or too little new audio): only such
    # updates tell what an update costs (subd.pipeline.deadline)
    decoded: bool = True
    # CPU time the update took in the recogniser's thread (duration_ns less the time other
    # processes held the core): what ``subd bench serial --update-ms ''`` lets it last
    cpu_ns: int = 0
    degraded: bool = False  # answered without a decode: it would have missed its due time


class RecogniserHost:

    def __init__(self, recognizer: FactorySpec, history_capacity: int,
                 history_name: str | None = None, history: AudioHistory | None = None,
                 start_sample: int = 0, measure_costs: bool = True) -> None:
        self.history = history if history is not None else AudioHistory(
            history_capacity, name=history_name)
        self.recognizer = recognizer.build()
        self.accepted_sample = start_sample  # > 0: respawned mid-stream (subd.workers.resume)
        # the recogniser reads its window in place from the shared history through this view
        # (no copy of the audio of its own); one without read_from is fed copies by accept()
        self.reader = HistoryReader(self.history, start_sample)
        read_from = getattr(self.recognizer, "read_from", None)
        self.in_place = read_from is not None
        if read_from is not None:
            read_from(self.reader)
        start_at = getattr(self.recognizer, "start_at", None)
        if start_sample and start_at is not None:
            start_at(start_sample)
        # what its ``update`` takes (a plugged-in recogniser may take neither: it then commits
        # by its own policy, on its own span)
        self.takes_deadline = accepts(self.recognizer.update, "commit_until_ns")
        self.takes_span = accepts(self.recognizer.update, "full_span")
        self.takes_ending = accepts(self.recognizer.update, "ending")
        self.takes_decode = accepts(self.recognizer.update, "decode")
        self.prompt: str | None = None  # the last one a request carried (set_prompt)
        # what its updates cost, measured before the channel's first words (the planner's
        # first expectation, subd.recognise.warmup); not again for a channel resumed
        # mid-stream, whose planner has measured its own
        measure = getattr(self.recognizer, "measure_update_costs", None)
        self.update_costs: UpdateCosts | None = (
            measure() if measure is not None and measure_costs and not start_sample
            and self.takes_deadline and self.takes_span else None)

    def _accept_until(self, end_sample: int) -> int:
        lost = 0
        if end_sample <= self.accepted_sample:
            return 0
        oldest = end_sample - self.history.capacity
        start = self.accepted_sample
        if start < oldest:  # the writer lapped us: skip what is gone, say how much
            lost = oldest - start
            start = oldest
        if self.in_place:
            self.reader.advance(end_sample)
        else:
            chunk = AudioChunk(start_sample=start, samples=self.history.read(start, end_sample))
            self.recognizer.accept(chunk)
        self.accepted_sample = end_sample
        return lost

    def handle(self, request: Any) -> RecogniseResult:
        t_ns, cpu_ns = time.monotonic_ns(), time.thread_time_ns()
        n_decodes = getattr(self.recognizer, "n_decodes", None)
        degraded = isinstance(request, UpdateRequest) and not request.decode
        lost = 0 if degraded else self._accept_until(request.end_sample)
        prompt = request.prompt
        if prompt is not None and prompt != self.prompt:
            set_prompt = getattr(self.recognizer, "set_prompt", None)
            if set_prompt is not None:  # a plugged-in recogniser may have no prompt
                set_prompt(prompt)
            self.prompt = prompt
        if isinstance(request, FinishRequest):
            hyp = self.recognizer.finish()
        elif request.commit_until_ns is not None and self.takes_deadline:
            kwargs = {"full_span": True} if request.full_span and self.takes_span else {}
            if request.ending and self.takes_ending:
                kwargs["ending"] = True
            if degraded and self.takes_decode:
                kwargs["decode"] = False
            hyp = self.recognizer.update(commit_until_ns=request.commit_until_ns, **kwargs)
        else:
            hyp = self.recognizer.update()
        decoded = n_decodes is None or self.recognizer.n_decodes != n_decodes
        return RecogniseResult(hyp, self.accepted_sample, time.monotonic_ns() - t_ns, lost,
                               decoded, time.thread_time_ns() - cpu_ns, degraded)

    def close(self) -> None:
        self.history.close()


def accepts(method: Any, name: str) -> bool:
    """Whether ``method`` takes a keyword argument ``name`` (plugged-in stages may not)."""
    try:
        return name in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


# ---- tag stage ------------------------------------------------------------------------------


class StreamTagger(Protocol):
    """A streaming tagger (subd.punct.stream.PunctStream has this shape).

    ``update`` receives the words committed since the last call and the current tentative
    tail; it returns ``final`` (words whose punctuation/case are now decided, in order, each
    exactly once) and ``provisional`` (the undecided rest, display only).
    """

    def update(self, committed: Sequence[Word], tentative: Sequence[Word],
               audio_end_ns: int) -> Any: ...

    def flush(self, audio_end_ns: int | None = None) -> Any: ...
    # a tagger whose flush also takes ``committed`` (the stream's last words) gets them there;
    # another gets them in one last ``update`` before its flush


class PassThroughTagger:
    """No tagger: committed words are final at once, as the recogniser spelled them."""

    def update(self, committed: Sequence[Word], tentative: Sequence[Word],
               audio_end_ns: int) -> TagUpdate:
        return TagUpdate(tuple(passthrough(w, True) for w in committed),
                         tuple(passthrough(w, False) for w in tentative))

    def flush(self, audio_end_ns: int | None = None) -> TagUpdate:
        return TagUpdate((), ())


def passthrough(word: Word, final: bool) -> TaggedWord:
    return TaggedWord(word=word, text=word.text, final=final)


@dataclass(frozen=True, slots=True)
class TagUpdate:
    final: tuple[TaggedWord, ...]
    provisional: tuple[TaggedWord, ...]


@dataclass(frozen=True, slots=True)
class TagRequest:
    """Tick k's look-ahead fetch: the committed words the tagger has not seen (global indices
    from ``first_idx``), the tentative tail, and how far the recogniser has heard. Words past
    tick k's end are right context: tagged now, published at later ticks."""

    k: int
    first_idx: int
    committed: tuple[Word, ...]
    tentative: tuple[Word, ...]
    audio_end_ns: int
    flush: bool = False  # end of stream: decide everything
    # words ending by this audio time (tick k's end) are due: decided by this pass at the latest
    decide_until_ns: int | None = None


@dataclass(frozen=True, slots=True)
class TagResult:
    k: int
    first_final_idx: int  # global index of final[0]
    final: tuple[TaggedWord, ...]
    provisional: tuple[TaggedWord, ...]
    duration_ns: int = 0


def make_punct_stream(**config: Any) -> StreamTagger:
    """The CRF tagger behind subd.punct.stream, with its shipped weights."""
    from subd.punct.marks import ScriptTagger
    from subd.punct.stream import PunctConfig, PunctStream

    # Chinese and Japanese words keep the recogniser's marks (subd.punct.marks)
    cfg = PunctConfig(**config)
    return PunctStream(ScriptTagger(shipped_tagger(), cfg.pause_commit_ms), cfg)


_TAGGERS: dict[tuple[int, int], Any] = {}


def shipped_tagger() -> Any:
    """The shipped CRF tagger, loaded once in this process (again if its manifest changes,
    as `subd train-punct` rewrites it) and shared by every channel: a channel's state is its
    own PunctStream, and the tagger itself keeps none. Loaded for each channel, it took 40-48
    ms (hashing, unpickling, building the net) in the tag process that serves the others, so
    a channel that joined or restarted held their tag passes back."""
    from subd.models.punct import PunctTagger
    from subd.models.punct.tagger import MANIFEST_NAME, PACKAGE_DIR

    try:
        stat = (PACKAGE_DIR / MANIFEST_NAME).stat()
    except OSError:
        return PunctTagger.load()  # says what is missing
    key = (stat.st_mtime_ns, stat.st_size)
    if key not in _TAGGERS:
        _TAGGERS.clear()
        _TAGGERS[key] = PunctTagger.load()
    return _TAGGERS[key]


def resolve_tagger(spec: str) -> FactorySpec | None:
    """Config value -> factory (None = pass-through)."""
    if spec == "none":
        return None
    if spec == "auto":
        if importlib.util.find_spec("subd.punct.stream") is None:
            log.info("tagger: subd.punct.stream is not installed; words pass through untagged")
            return None
        return FactorySpec("subd.workers.hosts:make_punct_stream")
    return FactorySpec(spec)


class TagHost:
    _deadline_aware: bool | None = None  # whether the tagger takes deadlines (first call)
    _flush_takes_words: bool | None = None  # whether its flush takes the last words

    def __init__(self, tagger: FactorySpec | None = None, first_final_idx: int = 0) -> None:
        self.tagger: StreamTagger = tagger.build() if tagger else PassThroughTagger()
        self.n_final = first_final_idx  # > 0: respawned mid-stream (subd.workers.resume)

    def _takes_deadline(self) -> bool:
        if self._deadline_aware is None:
            self._deadline_aware = accepts(self.tagger.update, "decide_until_ns")
        return self._deadline_aware

    def handle(self, req: TagRequest) -> TagResult:
        # A tag pass is a few small matrix products: with torch's default of one intra-op
        # thread per core, the second thread spun after each and burned as much CPU as the
        # tagger itself (soak: the tag process used a third of the recogniser's CPU), on the
        # core the publisher needs.
        with torch_threads(1):
            return self._handle(req)

    def _handle(self, req: TagRequest) -> TagResult:
        t_ns = time.monotonic_ns()
        if req.flush:
            final, provisional = self._flush(req), ()
        else:
            kwargs = {}
            if req.decide_until_ns is not None and self._takes_deadline():
                kwargs["decide_until_ns"] = req.decide_until_ns
            upd = self.tagger.update(req.committed, req.tentative, req.audio_end_ns, **kwargs)
            final, provisional = tuple(upd.final), tuple(upd.provisional)
        first = self.n_final
        self.n_final += len(final)
        return TagResult(req.k, first, final, provisional, time.monotonic_ns() - t_ns)

    def _flush(self, req: TagRequest) -> tuple[TaggedWord, ...]:
        """End of stream: the last committed words and every pending one, decided knowing the
        stream is complete (as due words first, "easier to read." lost its full stop: the
        recogniser's last decode is a window edge; complete, the stream ends there)."""
        if self._flush_takes_words is None:
            self._flush_takes_words = accepts(self.tagger.flush, "committed")
        if self._flush_takes_words:
            return tuple(self.tagger.flush(req.audio_end_ns, committed=req.committed).final)
        last = self.tagger.update(req.committed, (), req.audio_end_ns)
        return tuple(last.final) + tuple(self.tagger.flush(req.audio_end_ns).final)

    def close(self) -> None:
        pass
