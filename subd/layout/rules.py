"""Where a subtitle line or cue may end: break scores, glue words and over-long words.

Conventions follow common broadcast subtitle guidelines (BBC, EBU, Netflix): prefer breaking
after sentence punctuation, then after clause punctuation or where the tagger prefers, then
before a conjunction; never leave an article, a preposition or a possessive determiner at the
end of a line (it belongs with its noun), and never separate a number from what it counts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from subd.script import CLOSING, OPENING, TITLE_ABBREVIATIONS, columns, is_cjk, is_wide, joiner

# Words that must stay with the word after them (the noun phrase they introduce).
GLUE_WORDS = frozenset(
    """
    a an the this that these those my your his her its our their whose
    of to in on at for with by from into onto about over under after before between through
    during without within upon as per via across against among around behind below beneath
    beside besides beyond despite except inside near off outside since toward towards until
    unlike up than
    mr mrs ms dr st prof
    """.split()
)

# Breaking *before* these is good style ("… the river | and the hills").
CONJUNCTIONS = frozenset("and or but so because although though while whereas nor yet if".split())

SENTENCE_END = frozenset(".?!。？！")
CLAUSE_END = frozenset(",;:，；：、")

FORBIDDEN_PENALTY = 100.0  # used only when there is no other legal place
_NUMBER_RE = re.compile(r"^[+-]?[$€£]?\d[\d.,:]*$")
_UNIT_RE = re.compile(r"^(%|[a-zA-Zµ°$€£]+\.?)$")


@dataclass(frozen=True, slots=True)
class Token:
    """One layout unit: a word as displayed (case and punctuation applied), with audio times.

    ``glue_before`` marks the continuation piece of a word split because it was longer than a
    line, or the rest of a word committed cut short (``Word.joined``): nothing may be inserted
    between the pieces except a line break.
    """

    text: str
    start_ns: int
    end_ns: int
    punct: str = ""
    break_after: float = 0.0
    glue_before: bool = False
    tentative: bool = False  # not yet committed (display only)

    @property
    def bare(self) -> str:
        return self.text.rstrip(".,;:?!\"')»”").lstrip("\"'(«“").lower()


def is_number(text: str) -> bool:
    return bool(_NUMBER_RE.match(text.rstrip(".,;:?!")))


def break_score(left: Token, right: Token | None) -> float:
    """How good it is to end a line/cue after ``left`` (higher is better; < 0 is bad)."""
    if right is not None and right.glue_before:
        if takes_rest(left.text, right.text) and not left.text.endswith("-") \
                and not is_cjk(left.text[-1]):
            # the rest of a word committed cut short ("am" + "iable,"): the word stays whole
            return -FORBIDDEN_PENALTY
        return 0.5  # inside a split long word: allowed (the piece ends in a hyphen), neutral
    punct = left.punct or (left.text[-1] if left.text and not left.text[-1].isalnum() else "")
    if left.text.lower() in TITLE_ABBREVIATIONS:
        punct = ""
    score = 0.0
    if punct in SENTENCE_END:
        score += 3.0
    elif punct in CLAUSE_END:
        score += 2.0
    score += 2.0 * max(0.0, min(1.0, left.break_after))
    if punct == "" and left.bare in GLUE_WORDS:
        score -= FORBIDDEN_PENALTY
    if right is not None:
        unit = _UNIT_RE.match(right.bare or "x") and right.bare not in GLUE_WORDS | CONJUNCTIONS
        if punct == "" and is_number(left.text) and unit:
            score -= FORBIDDEN_PENALTY  # "25 | percent", "10 | km"
        if right.bare in CONJUNCTIONS:
            score += 0.5
        if right.text[:1] in CLOSING:
            score -= FORBIDDEN_PENALTY  # no line starts with a closing mark ("，" "。" "」")
    if left.text[-1:] in OPENING:
        score -= FORBIDDEN_PENALTY  # nor ends with an opening one ("「" "（")
    return score


def split_long(token: Token, max_chars: int) -> list[Token]:
    """Split a token longer than ``max_chars`` into hyphenated pieces that each fit a line.

    Times are shared out in proportion to characters so each piece keeps a plausible timing.
    ``max_chars`` counts half-width columns; CJK text is cut between characters, without a
    hyphen, and a piece never starts with a closing mark (it stays on the line before).
    """
    if columns(token.text) <= max_chars:
        return [token]
    if any(is_wide(ch) for ch in token.text):
        pieces = _cut_wide(token.text, max_chars)
        hyphen = ""
    else:
        width = max_chars - 1  # room for the hyphen
        pieces = [token.text[i : i + width] for i in range(0, len(token.text), width)]
        hyphen = "-"
    n_chars = len(token.text)
    out: list[Token] = []
    done = 0
    span = token.end_ns - token.start_ns
    for idx, piece in enumerate(pieces):
        last = idx == len(pieces) - 1
        start = token.start_ns + span * done // n_chars
        done += len(piece)
        end = token.start_ns + span * done // n_chars
        out.append(
            Token(
                text=piece if last else piece + hyphen,
                start_ns=start,
                end_ns=end,
                punct=token.punct if last else "",
                break_after=token.break_after if last else 0.0,
                glue_before=idx > 0 or token.glue_before,
            )
        )
    return out


def _cut_wide(text: str, max_cols: int) -> list[str]:
    pieces: list[str] = []
    cur = ""
    for ch in text:
        if cur and columns(cur + ch) > max_cols and ch not in CLOSING:
            pieces.append(cur)
            cur = ""
        cur += ch
    return pieces + [cur] if cur else pieces


def takes_rest(left: str, right: str = "") -> bool:
    """Whether the rest of a word (a split piece, ``Word.joined``), ``right``, is glued to
    ``left``: where that ends in a letter, a digit or a hyphen; after a mark the two stay apart
    ("letter, press"), and so do CJK and Latin text ("情况" and "12": spaced as two words)."""
    if left[-1:] and right[:1] and is_cjk(left[-1]) != is_cjk(right[0]):
        return False
    return left[-1:].isalnum() or left.endswith("-")


def _sep(left: Token, right: Token) -> str:
    """Between two tokens of a line: nothing inside a split word (a long one, or one committed
    cut short and continued: ``takes_rest``) or between CJK characters, else a space
    (subd.script.joiner)."""
    glued = right.glue_before and takes_rest(left.text, right.text)
    return "" if glued else joiner(left.text, right.text)


def line_text(tokens: list[Token] | tuple[Token, ...]) -> str:
    parts: list[str] = []
    for i, tok in enumerate(tokens):
        if i:
            parts.append(_sep(tokens[i - 1], tok))
        parts.append(tok.text)
    return "".join(parts)


def line_len(tokens: list[Token] | tuple[Token, ...]) -> int:
    """Width in half-width columns (a CJK character is two; English text: its length)."""
    return columns(line_text(tokens))


def wrap(
    tokens: list[Token], max_chars: int, max_lines: int, strict: bool = False
) -> list[list[Token]] | None:
    """Best split of ``tokens`` into at most ``max_lines`` lines of ``max_chars``, or None.

    ``strict``: a line may not end where it is forbidden (after an article, before a unit).

    Dynamic programming over break positions: the cost favours good break places (punctuation,
    tagger preference), forbids glue breaks, and prefers balanced, bottom-heavy lines. Text that
    fits on fewer lines takes fewer, as broadcasters' style guides ask (a cue is one line unless
    it is too long for one): a good break place alone split "And so," into "And" / "so,".
    """
    n = len(tokens)
    if n == 0:
        return []
    inf = float("inf")
    # best[j][l]: cost of laying out tokens[:j] in exactly l lines
    best = [[inf] * (max_lines + 1) for _ in range(n + 1)]
    back = [[-1] * (max_lines + 1) for _ in range(n + 1)]
    best[0][0] = 0.0
    for j in range(1, n + 1):
        width = 0  # the line tokens[i:j] in columns, grown leftwards one token at a time
        for i in range(j - 1, -1, -1):
            width += columns(tokens[i].text)
            if i + 1 < j:
                width += len(_sep(tokens[i], tokens[i + 1]))
            if width > max_chars:
                break
            brk = -break_score(tokens[j - 1], tokens[j]) if j < n else 0.0
            if strict and brk > FORBIDDEN_PENALTY / 2:
                continue
            slack = (max_chars - width) / max_chars
            for lines in range(1, max_lines + 1):
                prev = best[i][lines - 1]
                if prev == inf:
                    continue
                cost = prev + brk + (slack * slack if j < n else 0.0) + 0.25
                if cost < best[j][lines]:
                    best[j][lines] = cost
                    back[j][lines] = i
    lines = next((k for k in range(1, max_lines + 1) if best[n][k] < inf), None)
    if lines is None:
        return None
    out: list[list[Token]] = []
    j = n
    while lines > 0:
        i = back[j][lines]
        out.append(tokens[i:j])
        j, lines = i, lines - 1
    out.reverse()
    return out
