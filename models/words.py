"""Whisper's tokens grouped into words for scripts written without spaces (Chinese, Japanese...).

Whisper spells Chinese with byte-level tokens: one character may take two or three tokens (none
of which is valid UTF-8 alone), and one token may hold a common pair ("我们"). Splitting at
spaces, as for English, makes a whole sentence one "word", which then can neither commit nor
break a line before its end. Here the unit is the smallest piece whose time the alignment heads
give: the tokens that decode to whole characters, one word per such piece. Marks join the word
before them (a line never starts with "，"); a Latin word inside Chinese text ("Debian") is one
word, as in English. Commit, agreement and deadline logic then work on these units unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from subd.script import CLOSING, is_cjk, join_words, spaceless

Splitter = Callable[[list[int]], tuple[list[str], list[list[int]]]]
MAX_PROMPT_TOKENS = 223  # half the text context, as the reference runtimes keep
# of them at most this many for a user's prompt ([recognizer] prompt): the rest holds the words
# just said, without which a live decode re-reads or skips them
USER_PROMPT_TOKENS = 111


def user_prompt_tokens(tokenizer, text: str) -> tuple[int, ...]:
    """The tokens of a user's prompt as Whisper reads an initial prompt (" " + the text), at
    most ``USER_PROMPT_TOKENS`` of them: a longer one keeps its start, and a warning says so."""
    text = text.strip()
    if not text:
        return ()
    tokens = tuple(tokenizer.encode(" " + text))
    if len(tokens) > USER_PROMPT_TOKENS:
        import logging

        logging.getLogger("subd.recognise").warning(
            "[recognizer] prompt: %d tokens, only the first %d are read (the rest of Whisper's "
            "context holds the words just said)", len(tokens), USER_PROMPT_TOKENS)
        tokens = tokens[:USER_PROMPT_TOKENS]
    return tokens


def with_user_prompt(user: Sequence[int], previous: Sequence[int] | None) -> list[int] | None:
    """A decode's previous-text context: the user's prompt (names and terms to expect) first,
    then as many of the latest ``previous`` tokens as Whisper's context keeps after it. Kept in
    front of every decode, not only the first (as the reference runtimes keep an initial
    prompt until the text after it fills the context): a channel runs for hours."""
    if not user:
        return list(previous) if previous else None
    room = MAX_PROMPT_TOKENS - len(user)
    return [*user, *(previous[-room:] if previous and room > 0 else ())]


def split_spaceless(tokenizer, tokens: list[int]) -> tuple[list[str], list[list[int]]]:
    """Group ``tokens`` (text tokens, possibly ending in end-of-text) into words as the
    alignment wants them: ``(texts, tokens per word)``; a special token is a word of its own."""
    words: list[str] = []
    word_tokens: list[list[int]] = []
    current: list[int] = []
    eot = tokenizer.special.eot
    for token in tokens:
        if token >= eot:
            if current:
                _append(words, word_tokens, tokenizer.decode(current), current, join=True)
                current = []
            words.append("")
            word_tokens.append([token])
            continue
        current.append(token)
        text = tokenizer.decode(current)
        if "\ufffd" in text or not text.strip():  # part of a character (or a lone space
            continue  # before one): wait for the rest of its bytes
        _append(words, word_tokens, text, current, join=_joins_previous(words, text))
        current = []
    if current:
        _append(words, word_tokens, tokenizer.decode(current), current, join=True)
    return words, word_tokens


def _joins_previous(words: list[str], text: str) -> bool:
    """Does this piece continue the word before it?"""
    if not words or not words[-1]:
        return False
    if text.startswith(" "):
        return False
    first, last = text[0], words[-1][-1]
    if first in CLOSING:
        return True  # a mark belongs to the word it closes
    if is_cjk(first) or is_cjk(last):
        return False  # every CJK piece is a word; a Latin piece after CJK starts one
    return True  # the rest of a Latin word or number ("Deb" + "ian")


def _append(words, word_tokens, text: str, tokens: list[int], join: bool) -> None:
    if join and words and words[-1]:
        words[-1] += text
        word_tokens[-1].extend(tokens)
    else:
        words.append(text)
        word_tokens.append(list(tokens))


def word_splitter(tokenizer, language: str | None) -> Splitter:
    """The grouping for ``language``: by characters for scripts without spaces, else Whisper's
    usual split at spaces."""
    if spaceless(language):
        return lambda tokens: split_spaceless(tokenizer, tokens)
    return tokenizer.split_to_words


def prompt_of(words) -> str:
    """``prompt_text`` of committed words (subd.types.Word), each ``joined`` one spelled as
    part of the word before it, as Whisper wrote them ("letter" + "press": " letterpress")."""
    texts: list[str] = []
    for word in words:
        if word.joined and texts:
            texts[-1] += word.text
        else:
            texts.append(word.text)
    return prompt_text(texts)


def prompt_text(texts: list[str] | tuple[str, ...]) -> str:
    """Words as Whisper would have written them, to encode as a prompt or a forced prefix:
    English " one two", Chinese "很难避免" (no spaces, no leading space), mixed "用 Debian 系统"."""
    text = join_words(texts)
    return text if not text or is_cjk(text[0]) else " " + text
