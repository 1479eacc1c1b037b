"""What a channel needs from the daemon that runs it, and nothing more.

The daemon builds one :class:`ChannelContext` once its shared workers are up and hands it to
every channel; on a reload it updates ``config`` and ``layout_spec`` in place. A channel never
sees the daemon itself, so the two modules do not depend on each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from subd.clock import Clock
from subd.config import Config
from subd.service.health import HealthMonitor
from subd.service.metrics import Metrics
from subd.service.notify import Notifier
from subd.service.supervisor import SharedWorker
from subd.workers.hosts import FactorySpec


@dataclass(slots=True)
class ChannelContext:
    config: Config
    clock: Clock
    metrics: Metrics
    health: HealthMonitor
    notifier: Notifier
    push_token: str | None
    recogniser: SharedWorker | None
    tagger: SharedWorker | None
    tagger_spec: FactorySpec | None
    layout_spec: Any
    recogniser_spec: FactorySpec | None  # None: the configured model

    def recogniser_host(self, history: Any) -> FactorySpec:
        """The host that runs this channel's recogniser on the shared audio ``history``."""
        from subd.service.build import recognizer_spec

        cfg = self.config.recognizer
        spec = self.recogniser_spec or recognizer_spec(cfg.model, cfg.factory,
                                                       **cfg.window_options(),
                                                       language=cfg.language,
                                                       chinese_script=cfg.chinese_script,
                                                       prompt=cfg.prompt,
                                                       precision=cfg.precision)
        where = {"history_name": history.shm_name} if cfg.process else {"history": history}
        return FactorySpec("subd.workers.hosts:RecogniserHost",
                           {"recognizer": spec, "history_capacity": history.capacity, **where})
