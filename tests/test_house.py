"""The shape of the package: no import circles, small modules, a publisher without torch, and
one copy of the audio (the recogniser reads the shared history in place)."""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import os
import re
import signal
import textwrap
import tomllib
from pathlib import Path

import numpy as np
import pytest
from daemon_helpers import START_LIMIT_S, free_port, healthz, start_daemon, wait_for

from subd.history import AudioHistory, HistoryReader
from subd.types import SAMPLE_RATE_HZ

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"subd": "subd", "models": "subd.models", "kernels": "subd.kernels"}
MAX_LINES = 400
MAX_TOP_LEVEL = 10


def package_modules() -> dict[str, Path]:
    """Every module of the installed package by its import name (models/ is subd.models)."""
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


def imported_modules(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Package modules that ``name`` imports anywhere: module level, in functions, and under
    ``TYPE_CHECKING`` (a type-only import is still a dependency between the two)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    found = set()
    for target in names:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)
    return found


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def test_the_cycle_finder_sees_a_circle():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_has_no_cycles():
    modules = package_modules()
    graph = {name: imported_modules(name, path, modules) for name, path in modules.items()}
    cycles = import_cycles(graph)
    # a package __init__ that re-exports its own children is not a circle between two rooms
    cycles = [c for c in cycles if not all(m.startswith(c[0] + ".") for m in c[1:])]
    assert cycles == []


def room_of(name: str) -> str:
    """The folder a module lives in (``subd.sinks.sse.sink`` -> ``subd.sinks``), or "top"."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or name in PACKAGES.values() else "top"


def test_folders_import_one_way():
    """No circle between folders either (pipeline -> layout -> pipeline was one), and the
    top-level modules of subd/ import no folder: they are the floor."""
    modules = package_modules()
    rooms: dict[str, set[str]] = {}
    for name, path in modules.items():
        here = room_of(name)
        for target in imported_modules(name, path, modules):
            there = room_of(target)
            if there != here:
                rooms.setdefault(here, set()).add(there)
                rooms.setdefault(there, set())
    assert rooms.get("top", set()) == set()
    assert import_cycles(rooms) == []


def test_type_checking_imports_count(tmp_path):
    module = tmp_path / "x.py"
    module.write_text(textwrap.dedent("""
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from subd.service.daemon import Daemon
        def later():
            from . import y
    """))
    known = {"subd.service.daemon": module, "subd.x": module, "subd.y": module}
    assert imported_modules("subd.x", module, known) == {"subd.service.daemon", "subd.y"}


def test_only_the_benchmarks_import_the_test_doubles_and_the_benchmarks():
    """subd.testing (scripted stand-ins) and subd.bench are tools: nothing the daemon or the
    other commands run imports them (the CLI loads subd.bench only for ``subd bench``)."""
    modules = package_modules()
    wrong = []
    for name, path in modules.items():
        if name.startswith(("subd.bench", "subd.testing")) or name == "subd.cli":
            continue
        for target in imported_modules(name, path, modules):
            if target.startswith(("subd.bench", "subd.testing")):
                wrong.append(f"{name} -> {target}")
    assert wrong == []


def docstring_says_why(path: Path) -> bool:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return "over 400 lines" in " ".join(doc.lower().split())


def test_no_module_is_over_400_lines_without_saying_why():
    long = []
    for path in package_modules().values():
        n_lines = len(path.read_text(encoding="utf-8").splitlines())
        if n_lines > MAX_LINES and not docstring_says_why(path):
            long.append(f"{path.relative_to(ROOT)}: {n_lines} lines")
    assert long == []


def test_few_modules_are_left_at_the_top_of_subd():
    top = sorted(p.name for p in (ROOT / "subd").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL, top


def test_every_folder_says_what_it_is_for_and_what_it_may_import():
    missing = []
    for folder in PACKAGES:
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
            if len(doc.split()) < 5 or "import" not in doc.lower():
                missing.append(str(init.relative_to(ROOT)))
    assert missing == []


def test_every_folder_is_installed_as_a_package():
    """A non-editable install ships only the packages pyproject.toml lists."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    folders = {name for name, path in package_modules().items() if path.name == "__init__.py"}
    assert folders - listed == set()


def test_the_readme_points_at_nothing_outside_the_repository():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "../" not in text
    # every Markdown link to a file of the repository names one that exists
    targets = re.findall(r"\]\(([^)#:]+)\)", text)
    assert "docs/MEASUREMENTS.md" in targets and "docs/DESIGN.md" in targets
    assert [t for t in targets if not (ROOT / t).is_file()] == []


# ---- tasks -------------------------------------------------------------------------------------


def test_every_task_the_daemon_runs_is_started_through_subd_tasks():
    """No ``create_task``/``ensure_future`` outside subd/tasks.py in what the daemon runs (the
    benchmarks and test doubles are tools, not the daemon)."""
    found = []
    for path in sorted((ROOT / "subd").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "subd/tasks.py" or rel.startswith(("subd/bench/", "subd/testing/")):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("create_task", "ensure_future"):
                found.append(f"{rel}:{node.lineno}")
    assert found == []


def test_a_task_is_named_its_failure_logged_and_it_is_cancelled_at_shutdown(caplog):
    from subd.tasks import cancel_all, start_task

    async def fail() -> None:
        raise ValueError("boom")

    async def main() -> tuple[str, list[str], bool]:
        failing = start_task(fail(), "house:fail")
        sleeper = start_task(asyncio.sleep(3600), "house:sleep")
        await asyncio.wait([failing])
        left = await cancel_all()
        return failing.get_name(), left, sleeper.cancelled()

    with caplog.at_level(logging.INFO, logger="subd.tasks"):
        name, left, cancelled = asyncio.run(main())
    assert name == "house:fail"
    assert "task house:fail failed: ValueError: boom" in caplog.text
    assert left == ["house:sleep"] and cancelled


def test_an_expected_failure_is_the_awaiters_and_not_logged(caplog):
    """A stage call's StageDown is handled by its caller: the task does not log it as a
    failure (every respawn logged "task call:recognise failed: StageDown")."""
    from subd.service.stages import StageDown
    from subd.tasks import start_task

    async def down() -> None:
        raise StageDown("recognise stage is restarting")

    async def main() -> str:
        task = start_task(down(), "call:recognise", expected=(StageDown,))
        try:
            await task
        except StageDown as exc:
            return str(exc)
        return ""

    with caplog.at_level(logging.INFO, logger="subd.tasks"):
        assert asyncio.run(main()) == "recognise stage is restarting"
    assert "failed" not in caplog.text


# ---- one copy of the audio ------------------------------------------------------------------


def test_a_reader_reads_the_writers_samples_in_place():
    """What the writer puts in the shared segment after the reader attached is what the reader
    reads: the reader holds no copy, only an end mark."""
    owner = AudioHistory(4 * SAMPLE_RATE_HZ, shared=True)
    try:
        attached = AudioHistory(owner.capacity, name=owner.shm_name)
        reader = HistoryReader(attached)
        assert not hasattr(reader, "__dict__")  # slots only: history, end mark, a counter
        owner.write(0, np.full(SAMPLE_RATE_HZ, 0.25, dtype=np.float32))
        reader.advance(SAMPLE_RATE_HZ)
        assert attached.end_sample == SAMPLE_RATE_HZ  # the writer's mark, seen across the map
        assert np.all(reader.read(0, SAMPLE_RATE_HZ) == 0.25)
        owner.write(0, np.full(SAMPLE_RATE_HZ, -0.5, dtype=np.float32))  # rewritten in place
        assert np.all(reader.read(0, SAMPLE_RATE_HZ) == -0.5)
        # the writer laps the reader's span: lapped samples come back as silence, counted
        owner.write(SAMPLE_RATE_HZ, np.full(4 * SAMPLE_RATE_HZ, 0.75, dtype=np.float32))
        span = reader.read(SAMPLE_RATE_HZ // 2, 2 * SAMPLE_RATE_HZ)
        assert np.all(span[: SAMPLE_RATE_HZ // 2] == 0.0)
        assert np.all(span[SAMPLE_RATE_HZ // 2:] == 0.75)
        assert reader.n_overwritten == SAMPLE_RATE_HZ // 2
        attached.close()
    finally:
        owner.close()


def test_the_recogniser_reads_its_window_from_the_shared_history():
    """The daemon's recogniser (in its host, attached to the channel's shared segment by name,
    as in its process) transcribes audio it never received a copy of."""
    pytest.importorskip("subd.recognise.streaming")
    from subd.recognise.streaming import StreamingRecognizer
    from subd.sources.decode import load_audio
    from subd.workers.hosts import FactorySpec, FinishRequest, RecogniserHost, UpdateRequest

    audio = load_audio(ROOT / "subd" / "data" / "demo.wav")[: 8 * SAMPLE_RATE_HZ]
    owner = AudioHistory(40 * SAMPLE_RATE_HZ, shared=True)
    host = RecogniserHost(FactorySpec("subd.service.supervisor:shared_streaming_recognizer",
                                      {"model": "tiny.en"}),
                          owner.capacity, history_name=owner.shm_name)
    try:
        rec = host.recognizer
        assert isinstance(rec, StreamingRecognizer)
        assert host.in_place and rec.audio is host.reader
        assert host.reader.history is host.history and host.history.shm_name == owner.shm_name
        words = []
        step = SAMPLE_RATE_HZ
        for end in range(step, audio.shape[0] + 1, step):
            owner.write(end - step, audio[end - step:end])
            words += host.handle(UpdateRequest(end)).hypothesis.committed
        words += host.handle(FinishRequest(audio.shape[0])).hypothesis.committed
        text = " ".join(w.text.lower().strip(".,") for w in words)
        assert "dashwood" in text and "leisure" in text
        assert rec._audio is host.reader  # no private ring was ever made
        assert host.reader.n_overwritten == 0
    finally:
        host.close()
        owner.close()


# ---- the publisher's process ----------------------------------------------------------------

PROBE = """\
import atexit, os, sys

def _dump():
    out = os.environ.get("SUBD_MODULES_DIR")
    if out:
        with open(os.path.join(out, f"modules.{os.getpid()}.json"), "w") as fh:
            fh.write(__import__("json").dumps(sorted(sys.modules)))

atexit.register(_dump)
"""


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _maps_torch(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_subd_run_keeps_torch_and_benchmarks_out_of_the_publisher(tmp_path):
    """``subd run`` on the demo clip (the default tagger, two sinks): the main process, which
    publishes, maps no libtorch while it runs and has imported neither torch nor any subd.bench
    module when it exits; its recogniser process does map libtorch (the probe sees it)."""
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(PROBE)
    port = free_port()
    config = f"""
[source]
kind = "file"
loop = true
[server]
port = {port}
[sinks]
enabled = ["sse", "srt"]
[sinks.srt]
directory = "{tmp_path / 'out'}"
"""
    path = os.pathsep.join([str(probe), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    daemon = start_daemon(tmp_path, config, port,
                          env={"PYTHONPATH": path, "SUBD_MODULES_DIR": str(probe)})
    try:
        wait_for(lambda: healthz(port)[1]["status"] == "ok", START_LIMIT_S, "/healthz ok",
                 daemon.proc, daemon.log)
        wait_for(lambda: (healthz(port)[1]["channels"]["main"]["last_tick"] or 0) > 30, 60,
                 "ticks", daemon.proc, daemon.log)
        main_pid = daemon.proc.pid
        assert not _maps_torch(main_pid)
        workers = _children(main_pid)
        assert any(_maps_torch(pid) for pid in workers), "the probe never saw libtorch"
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.proc.wait(30) == 0, daemon.log_text()[-2000:]
    finally:
        daemon.stop()
    loaded = json.loads((probe / f"modules.{main_pid}.json").read_text())
    assert "subd.service.daemon" in loaded  # the dump is the daemon's
    assert [m for m in loaded if m == "torch" or m.startswith("torch.")] == []
    assert [m for m in loaded if m.startswith(("subd.bench", "subd.testing"))] == []
