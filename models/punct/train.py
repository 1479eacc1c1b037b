"""Training recipe of the punctuation tagger (run by ``subd train-punct``).

Reproducible: one seed drives the data simulation, the split is fixed by document name, torch
runs on one thread, and the number of steps is fixed (never a time budget).
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from . import corpus
from .features import Featuriser, Vocabulary, stack
from .model import NetConfig, PunctNet, tag_index
from .simulate import DEFAULT_SIMULATION, Sample, document_words, sample_window, simulation
from .tagger import MANIFEST_NAME, VOCAB_NAME, WEIGHTS_NAME, sha256_of
from .text import LabelledWord

log = logging.getLogger("subd.punct.train")

# Share of training windows per source: modern and speech-like text gets more than its size.
SOURCE_WEIGHTS = {"austen": 0.33, "fortunes": 0.27, "mobydick": 0.12, "shakespeare": 0.14,
                  "harvard": 0.07, "jokes": 0.07}
VOCAB_SIZE = 16_000
MIN_COUNT = 3


@dataclass(frozen=True, slots=True)
class TrainConfig:
    epochs: int = 10
    steps_per_epoch: int = 500
    batch_size: int = 32
    seed: int = 1
    lr: float = 3e-3
    word_dropout: float = 0.06
    break_weight: float = 0.5
    sources: tuple[str, ...] = tuple(corpus.SOURCES)
    simulation: str = DEFAULT_SIMULATION  # simulate.SIMULATIONS: the recogniser's view


@dataclass(frozen=True, slots=True)
class SplitData:
    train: dict[str, list[list[LabelledWord]]]  # source -> documents
    held_out: dict[str, list[list[LabelledWord]]]
    doc_ids: dict[str, list[str]]  # "train"/"held_out" -> document ids
    missing: list[str]


def load_split(seed: int, sources: list[str] | None = None) -> SplitData:
    docs, missing = corpus.load_documents(sources)
    if not docs:
        raise FileNotFoundError("no training text found: " + "; ".join(missing))
    rng = random.Random(seed)
    train: dict[str, list[list[LabelledWord]]] = {}
    held: dict[str, list[list[LabelledWord]]] = {}
    ids: dict[str, list[str]] = {"train": [], "held_out": []}
    for doc in docs:
        words = document_words(doc.paragraphs, rng)
        if len(words) < 8:
            continue
        part = "held_out" if corpus.is_held_out(doc) else "train"
        (held if part == "held_out" else train).setdefault(doc.source, []).append(words)
        ids[part].append(doc.doc_id)
    return SplitData(train, held, ids, missing)


def build_vocab(train: dict[str, list[list[LabelledWord]]]) -> Vocabulary:
    counts: Counter[str] = Counter()
    for docs in train.values():
        for doc in docs:
            counts.update(w.word for w in doc)
    ranked = [w for w, c in counts.most_common(VOCAB_SIZE) if c >= MIN_COUNT]
    return Vocabulary(tuple(ranked))


def _batch(
    samples: list[Sample], feat: Featuriser, rng: random.Random, word_dropout: float
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
    seqs = []
    for s in samples:
        enc = feat.encode(s.words, s.pauses_ms, s.n_right, s.evidence)
        for i, w in enumerate(s.words):
            if rng.random() < word_dropout:  # teach the OOV buckets and the n-grams
                enc["word"][i] = feat.oov_id(w)
        seqs.append(enc)
    arrays, mask = stack(seqs)
    t_max = mask.shape[1]
    tags = np.zeros((len(samples), t_max), dtype=np.int64)
    breaks = np.zeros((len(samples), t_max), dtype=np.float32)
    for b, s in enumerate(samples):
        tags[b, : len(s.words)] = [tag_index(p, c) for p, c in zip(s.puncts, s.cases, strict=True)]
        breaks[b, : len(s.words)] = s.breaks
    x = {k: torch.from_numpy(v) for k, v in arrays.items()}
    return x, torch.from_numpy(mask), torch.from_numpy(tags), torch.from_numpy(breaks)


def train(out_dir: Path, cfg: TrainConfig, progress: Callable[[str], None] = log.info) -> dict:
    """Train, write weights.pt + vocab.txt + manifest.json into ``out_dir``; returns manifest."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # reproducible, and leaves the other core to the rest
    try:
        return _train(out_dir, cfg, progress)
    finally:
        torch.set_num_threads(threads)


def _train(out_dir: Path, cfg: TrainConfig, progress: Callable[[str], None]) -> dict:
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    sim = simulation(cfg.simulation)
    t0 = time.monotonic()
    data = load_split(cfg.seed, list(cfg.sources))
    for note in data.missing:
        progress(f"source skipped: {note}")
    vocab = build_vocab(data.train)
    feat = Featuriser(vocab)
    net_cfg = NetConfig(n_ids=vocab.n_ids)
    net = PunctNet(net_cfg)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    total = cfg.epochs * cfg.steps_per_epoch
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 - 0.9 * step / max(1, total))
    sources = sorted(data.train)
    weights = [SOURCE_WEIGHTS.get(s, 0.05) for s in sources]
    doc_lengths = {s: [len(d) for d in data.train[s]] for s in sources}
    n_train = sum(sum(v) for v in doc_lengths.values())
    progress(f"{len(data.doc_ids['train'])} training documents ({n_train} words), "
             f"{len(data.doc_ids['held_out'])} held out; vocabulary {len(vocab.words)}")
    net.train()
    for epoch in range(cfg.epochs):
        running = 0.0
        for _ in range(cfg.steps_per_epoch):
            samples = []
            for _ in range(cfg.batch_size):
                src = rng.choices(sources, weights)[0]
                doc = rng.choices(data.train[src], doc_lengths[src])[0]
                samples.append(sample_window(doc, rng, sim=sim))
            x, mask, tags, breaks = _batch(samples, feat, rng, cfg.word_dropout)
            emissions, brk_logits = net(x)
            nll = -net.crf(emissions, tags, mask=mask, reduction="token_mean")
            brk = torch.nn.functional.binary_cross_entropy_with_logits(
                brk_logits[mask], breaks[mask])
            loss = nll + cfg.break_weight * brk
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 5.0)
            opt.step()
            sched.step()
            running += float(loss.detach())
        progress(f"epoch {epoch + 1}/{cfg.epochs}: loss {running / cfg.steps_per_epoch:.4f} "
                 f"({time.monotonic() - t0:.0f} s)")
    net.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.save(net.state_dict(), out_dir / WEIGHTS_NAME)
    (out_dir / VOCAB_NAME).write_text("\n".join(vocab.words) + "\n", encoding="utf-8")
    manifest = {
        "net": net_cfg.to_dict(),
        "train": {"epochs": cfg.epochs, "steps_per_epoch": cfg.steps_per_epoch,
                  "batch_size": cfg.batch_size, "seed": cfg.seed, "lr": cfg.lr,
                  "sources": list(cfg.sources), "simulation": cfg.simulation,
                  "train_words": n_train, "source_weights": SOURCE_WEIGHTS,
                  "seconds": round(time.monotonic() - t0, 1)},
        "data": data.doc_ids,
        "sha256": {name: sha256_of(out_dir / name) for name in (WEIGHTS_NAME, VOCAB_NAME)},
    }
    (out_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest
