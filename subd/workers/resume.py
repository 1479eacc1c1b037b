"""Picking a channel's stage up again after its process was respawned.

A stage process holds per-channel state (the recogniser's window and commit point, the
tagger's undecided words). When the process dies, that state is gone; the fresh process gets a
host built so that the channel goes on where it was, and the request that was in flight is sent
again in a form the fresh host can answer:

* recogniser (:class:`RecogniserResume`): the fresh recogniser starts at the end of the audio
  the lost request carried. What it had not committed yet (its tentative tail) is lost; every
  committed word was already handed to the pipeline, so no committed word is lost or repeated.
  Audio that arrives while the process reloads stays in the shared history and is heard by the
  next update (the recogniser's own window bounds that catch-up).
* tagger (:class:`TagResume`): the committed words sent to the tagger but not yet returned as
  decided are kept here (a few words: the tagger decides each within its right context), and
  sent again, with the fresh host numbering its decided words from where the old one stopped.
  The pipeline then sees one continuous stream of decided words.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import Any

from subd.workers.hosts import FactorySpec, FinishRequest, TagRequest, UpdateRequest


class Resume:
    """No state to carry over: the host is rebuilt as it was and the request sent again."""

    def sent(self, request: Any) -> None:
        """``request`` (as the pipeline made it) is about to go to the stage, once."""

    def answered(self, request: Any, result: Any) -> None:
        """The stage answered ``request``."""

    def host(self, base: FactorySpec) -> FactorySpec:
        """The host to attach in a respawned process."""
        return base

    def retry(self, request: Any) -> Any:
        """``request`` as the respawned host must get it."""
        return request


class RecogniserResume(Resume):
    def __init__(self) -> None:
        self.resume_sample = 0

    def sent(self, request: Any) -> None:
        if isinstance(request, (UpdateRequest, FinishRequest)):
            self.resume_sample = request.end_sample

    def host(self, base: FactorySpec) -> FactorySpec:
        return FactorySpec(base.target, {**base.kwargs, "start_sample": self.resume_sample})


class TagResume(Resume):
    def __init__(self) -> None:
        self.n_final = 0  # words the tagger has returned as decided (global count)
        self._undecided: deque[Any] = deque()  # committed words [n_final, n_fed), in order

    @property
    def n_fed(self) -> int:
        return self.n_final + len(self._undecided)

    def sent(self, request: Any) -> None:
        if isinstance(request, TagRequest) and request.first_idx + len(request.committed) \
                > self.n_fed:
            skip = self.n_fed - request.first_idx  # words of it already kept (a retry)
            self._undecided.extend(request.committed[max(skip, 0):])

    def answered(self, request: Any, result: Any) -> None:
        n = getattr(result, "first_final_idx", None)
        if n is None:
            return
        n_new = n + len(result.final) - self.n_final
        for _ in range(min(max(n_new, 0), len(self._undecided))):
            self._undecided.popleft()
        self.n_final = max(self.n_final, n + len(result.final))

    def host(self, base: FactorySpec) -> FactorySpec:
        return FactorySpec(base.target, {**base.kwargs, "first_final_idx": self.n_final})

    def retry(self, request: Any) -> Any:
        if not isinstance(request, TagRequest):
            return request
        return dataclasses.replace(request, first_idx=self.n_final,
                                   committed=tuple(self._undecided))


def resume_for(host: FactorySpec) -> Resume:
    """The resume rule for a stage host, by its factory."""
    name = host.target.rpartition(":")[2]
    if name == "RecogniserHost":
        return RecogniserResume()
    if name == "TagHost":
        return TagResume()
    return Resume()
