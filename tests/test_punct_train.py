"""`subd train-punct`: same seed, same weights; the result loads; bad arguments are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from subd.cli import main
from subd.models.punct import PunctTagger
from subd.models.punct.corpus import R_LIBRARY

SMALL = ["--epochs", "1", "--steps-per-epoch", "3", "--sources", "harvard,jokes"]


def _have_small_sources() -> bool:
    try:
        import pyjokes  # noqa: F401
        import rdata  # noqa: F401
    except ImportError:
        return False
    return (R_LIBRARY / "stringr" / "data" / "Rdata.rdb").exists()


@pytest.mark.skipif(not _have_small_sources(), reason="r-cran-stringr, rdata, pyjokes needed")
def test_training_is_reproducible_and_loads(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert main(["train-punct", "--out", str(a), "--seed", "5", *SMALL]) == 0
    assert main(["train-punct", "--out", str(b), "--seed", "5", *SMALL]) == 0
    assert main(["train-punct", "--out", str(c), "--seed", "6", *SMALL]) == 0
    sha = {d: json.loads((d / "manifest.json").read_text())["sha256"] for d in (a, b, c)}
    assert sha[a] == sha[b]
    assert sha[a]["weights.pt"] != sha[c]["weights.pt"]
    manifest = json.loads((a / "manifest.json").read_text())
    held = set(manifest["data"]["held_out"])
    assert held and not held & set(manifest["data"]["train"])  # split by document
    tags = PunctTagger.load(a).tag(["hello", "world"], [30.0, 900.0])
    assert len(tags) == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["train-punct", "--out", "x", "--epochs", "0"],
        ["train-punct", "--out", "x", "--sources", "austen,klingon"],
        ["train-punct"],
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith(("subd: error:", "usage:", "subd train-punct: error"))
