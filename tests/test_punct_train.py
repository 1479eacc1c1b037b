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
        ["train-punct", "--out", "x", "--simulation", "v9"],
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith(("subd: error:", "usage:", "subd train-punct: error"))


def test_an_out_folder_that_cannot_be_written_is_refused_before_training(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """Checked before ~14 min of training, not when the weights are written."""
    (tmp_path / "notes").write_text("a file\n")
    assert main(["train-punct", "--out", str(tmp_path / "notes" / "model")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"subd: error: --out {tmp_path / 'notes' / 'model'}: cannot write ("), err


def test_simulated_recogniser_closes_its_decode_with_a_full_stop() -> None:
    import random

    from subd.models.punct.simulate import decode_batches, simulate_recogniser
    from subd.models.punct.text import label_text

    words = label_text("the man who lived in the old house by the river walked to town "
                       "every morning and he bought bread there before going home again.")
    pauses: list[float | None] = [20.0] * len(words)
    rng = random.Random(3)
    edge_stops = mid_stops = n = 0
    for _ in range(400):
        cut = rng.randint(4, len(words) - 1)
        marks = simulate_recogniser(words[:cut], pauses[:cut], False, rng, always=True)
        assert marks[-1].n_after == 0  # the window ends where the latest decode ended
        assert all(m.n_after is None or m.n_after >= 0 for m in marks)
        edge_stops += marks[-1].punct == "."
        mid_stops += sum(m.punct == "." and m.n_after >= 2 for m in marks[:-1])
        n += 1
    # Whisper writes '.' at the end of nearly every decode, almost never mid-sentence
    assert edge_stops > 0.6 * n and mid_stops < 0.05 * n
    complete = decode_batches(pauses, True, rng)
    assert complete[-1].n_tentative == 0 and sum(b.n_words for b in complete) == len(words)
    cut = decode_batches(pauses[:10], False, rng)
    assert sum(b.n_words for b in cut) + cut[-1].n_tentative == 10


def test_the_default_simulation_is_what_the_shipped_weights_were_trained_on() -> None:
    import random

    from subd.models.punct.simulate import SIMULATIONS, document_words, sample_window
    from subd.models.punct.tagger import PACKAGE_DIR
    from subd.models.punct.text import PUNCTS
    from subd.models.punct.train import TrainConfig

    shipped = json.loads((PACKAGE_DIR / "manifest.json").read_text())["train"]
    assert TrainConfig().simulation == shipped["simulation"] == "v1"
    doc = document_words(("It is late, and the bus has gone. Did you see it? We walked home "
                          "by the river, all the way back to the old house. " * 6,),
                         random.Random(0))
    # the presets are different recognisers: v2 closes nearly every cut window with a '.'
    edge_stops = {}
    for name, sim in SIMULATIONS.items():
        rng = random.Random(4)
        windows = [sample_window(doc, rng, sim=sim) for _ in range(300)]
        cut = [w for w in windows if w.n_right[-1] == 0 and w.evidence[-1, 0] != 0]
        stop = 1 + PUNCTS.index(".")  # evidence id of a recogniser '.'
        edge_stops[name] = sum(w.evidence[-1, 0] == stop for w in cut if w.puncts[-1] == "")
        edge_stops[name] /= max(1, sum(w.puncts[-1] == "" for w in cut))
    assert edge_stops["v2"] > edge_stops["v1"] + 0.3
