"""Whisper's byte-level BPE tokenizer (tokenizer.json) plus the special and timestamp tokens."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

TIME_PRECISION_S = 0.02  # one timestamp token step
N_TIMESTAMPS = 1501  # <|0.00|> .. <|30.00|>: the vocabulary ends with them


@dataclass(frozen=True, slots=True)
class SpecialTokens:
    eot: int
    sot: int
    sot_prev: int
    no_speech: int
    no_timestamps: int
    timestamp_begin: int
    transcribe: int
    translate: int
    first_language: int | None  # None for English-only models


class WhisperTokenizer:
    def __init__(self, path: Path | None, multilingual: bool, *, json_text: str | None = None):
        # ``json_text``: a tokenizer.json built in memory (models.loading: large-v3's vocabulary)
        self._tok = Tokenizer.from_str(json_text) if json_text is not None \
            else Tokenizer.from_file(str(path))
        self.multilingual = multilingual
        tid = self._tok.token_to_id
        no_speech = tid("<|nospeech|>") or tid("<|nocaptions|>")
        no_ts = tid("<|notimestamps|>")
        self.special = SpecialTokens(
            eot=tid("<|endoftext|>"),
            sot=tid("<|startoftranscript|>"),
            sot_prev=tid("<|startofprev|>"),
            no_speech=no_speech,
            no_timestamps=no_ts,
            timestamp_begin=no_ts + 1,
            transcribe=tid("<|transcribe|>"),
            translate=tid("<|translate|>"),
            first_language=tid("<|en|>") if multilingual else None,
        )
        # the full stop and the comma as Whisper writes them after a word (one token each)
        self.mark_ids = [self.encode(".")[0], self.encode(",")[0]]
        # single tokens of marks that close a word (its letters end before them)
        self.closing_ids = frozenset(
            ids[0] for ids in map(self.encode, (".", ",", "?", "!", ";", ":", "...", "。", "，",
                                                "？", "！"))
            if len(ids) == 1)
        self._languages = {}
        if multilingual:
            vocab = self._tok.get_vocab()
            for token, idx in vocab.items():
                if token.startswith("<|") and token.endswith("|>") and 2 <= len(token) - 4 <= 3:
                    code = token[2:-2]
                    if code.isalpha() and code.islower():
                        self._languages[code] = idx

    def language_tokens(self) -> dict[str, int]:
        """Language code -> its token (``<|zh|>``); empty for an English-only model."""
        return dict(self._languages)

    def sot_sequence(self, language: str = "en", task: str = "transcribe") -> list[int]:
        if not self.multilingual:
            return [self.special.sot]
        lang = self._languages.get(language)
        if lang is None:
            raise ValueError(f"unknown language {language!r}")
        task_id = self.special.transcribe if task == "transcribe" else self.special.translate
        return [self.special.sot, lang, task_id]

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, tokens: list[int]) -> str:
        return self._tok.decode(
            [t for t in tokens if t < self.special.eot], skip_special_tokens=False
        )

    def token_text(self, token: int) -> str:
        return self._tok.decode([token], skip_special_tokens=False)

    def split_to_words(self, tokens: list[int]) -> tuple[list[str], list[list[int]]]:
        """Group text tokens into words at spaces/punctuation (English-style scripts).

        A token whose text does not decode to valid UTF-8 on its own is kept with its neighbours.
        """
        words: list[str] = []
        word_tokens: list[list[int]] = []
        current: list[int] = []
        for token in tokens:
            if token >= self.special.eot:  # a special token is a "word" of its own: never glued
                if current:  # to the last word (the aligner drops the trailing end-of-text)
                    self._close_word(words, word_tokens, current)
                    current = []
                words.append("")
                word_tokens.append([token])
                continue
            current.append(token)
            text = self.decode(current)
            if "\ufffd" in text:
                continue
            # A leading space starts a word; anything else (pieces, punctuation) joins the last.
            if words and not text.startswith(" "):
                words[-1] += text
                word_tokens[-1].extend(current)
            else:
                words.append(text)
                word_tokens.append(list(current))
            current = []
        if current:
            self._close_word(words, word_tokens, current)
        return words, word_tokens

    def _close_word(self, words: list[str], word_tokens: list[list[int]], current: list[int]):
        """Tokens that never decoded to valid UTF-8 on their own join the last word."""
        text = self.decode(current)
        if words and words[-1]:
            words[-1] += text
            word_tokens[-1].extend(current)
        else:
            words.append(text)
            word_tokens.append(list(current))
