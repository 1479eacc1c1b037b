"""Word timings from cross-attention: the model's alignment heads, a median filter and DTW.

As in Whisper: the text tokens are run through the decoder once more, the attention of the
alignment heads over the audio frames is normalised per head, smoothed over time, averaged, and
a monotonic path through it (dynamic time warping) gives each token's first frame.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from subd.models.dtw import dtw_path
from subd.models.tokenizer import WhisperTokenizer
from subd.models.whisper import KVCache, TextDecoder
from subd.models.words import Splitter

FRAMES_PER_TOKEN_S = 0.02  # one encoder output frame = 20 ms
MEDIAN_FILTER_WIDTH = 7


@dataclass(frozen=True, slots=True)
class WordTiming:
    text: str  # with its leading space, as the tokenizer spells it
    tokens: tuple[int, ...]
    start_s: float  # relative to the window start
    end_s: float
    probability: float
    joined: bool = False  # the rest of the forced prefix's last word (words_from_path)
    # (p('.'), p(',')) where the decode chose what follows the word's letters (its mark, or
    # none); None: not known (the step was forced, or the decode did not say)
    mark_p: tuple[float, float] | None = None


def _median_filter(x: torch.Tensor, width: int) -> torch.Tensor:
    """Median over the last axis with reflect padding (x [..., M])."""
    if x.shape[-1] <= width // 2:
        return x
    pad = width // 2
    flat = x.reshape(-1, 1, x.shape[-1])  # reflect padding wants [N, C, M]
    padded = torch.nn.functional.pad(flat, (pad, pad), mode="reflect").reshape(*x.shape[:-1], -1)
    return padded.unfold(-1, width, 1).median(dim=-1).values


@torch.inference_mode()
def align_words(
    decoder: TextDecoder,
    audio_features: torch.Tensor,  # [1, T, D]
    tokenizer: WhisperTokenizer,
    sot_sequence: list[int],
    text_tokens: list[int],
    n_audio_frames: int,  # frames of real audio in the window (10 ms units)
    alignment_heads: tuple[tuple[int, int], ...],
    n_known_tokens: int = 0,
    cross_from: KVCache | None = None,
    split: Splitter | None = None,
    marks_after: Sequence[tuple[float, float] | None] | None = None,
) -> list[WordTiming]:
    """Word timings for ``text_tokens``. The words made of the first ``n_known_tokens`` tokens
    (a forced prefix, timed by an earlier window) still anchor the alignment but are not
    returned, and their tokens are not projected onto the vocabulary (the costly part).
    ``cross_from``: a cache for the same audio whose cross-attention keys/values are reused.
    ``split``: how tokens group into words (``models.words.word_splitter``; default: at spaces).
    ``marks_after``: per text token, the decode's mark probabilities after it
    (``DecodeResult.marks_after_text``), given to each word as ``mark_p``."""
    if not text_tokens:
        return []
    sp = tokenizer.special
    tokens = [*sot_sequence, sp.no_timestamps, *text_tokens, sp.eot]
    known = min(max(0, n_known_tokens), len(text_tokens))
    cache = decoder.new_cache(audio_features, cross_from=cross_from)
    # row len(sot) + j predicts text token j
    rows = tuple(range(len(sot_sequence) + known, len(sot_sequence) + len(text_tokens)))
    logits, qks = decoder(
        torch.tensor([tokens], device=audio_features.device),
        cache,
        return_cross_qk=alignment_heads,
        logit_rows=rows,
    )
    token_probs = np.full(len(text_tokens), np.nan)
    if rows:
        probs = torch.softmax(logits[0].float(), dim=-1)  # [n_text - known, V]
        wanted = torch.tensor(text_tokens[known:])
        token_probs[known:] = probs[torch.arange(len(rows)), wanted].cpu().numpy()
    n_frames = max(1, min(n_audio_frames // 2, audio_features.shape[1]))
    qk_cpu = torch.stack([qk[0] for qk in qks]).float().cpu()  # [heads, L, T]
    matrix = alignment_matrix(qk_cpu, n_frames, len(sot_sequence))
    text_idx, time_idx = dtw_path(-matrix.double().numpy())
    return words_from_path(tokenizer, text_tokens, known, token_probs, text_idx, time_idx, split,
                           marks_after)


def alignment_matrix(qk: torch.Tensor, n_frames: int, n_sot: int) -> torch.Tensor:
    """The alignment heads' attention [heads, L, T] (float32, on any device) over the first
    ``n_frames`` audio frames -> the matrix DTW walks [L - n_sot - 1, n_frames]: softmax over
    frames, normalised per head over tokens, median-filtered over time, averaged over heads;
    rows are <|notimestamps|> and the text tokens."""
    weights = qk[:, :, :n_frames].softmax(dim=-1)
    std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)
    weights = (weights - mean) / (std + 1e-10)
    weights = _median_filter(weights, MEDIAN_FILTER_WIDTH)
    return weights.mean(dim=0)[n_sot:-1]


def alignment_matrices(qk: torch.Tensor, n_frames: list[int], lengths: list[int],
                       n_sots: list[int]) -> list[torch.Tensor]:
    """:func:`alignment_matrix` of every row of ``qk`` [R, heads, L, T] (row r: its first
    ``lengths[r]`` tokens over its first ``n_frames[r]`` frames) in one pass of batched kernels
    rather than some twenty launches a row; equal to the row-by-row matrices up to float
    rounding (the sums run over padded rows). The frames past a row's own are masked out of
    its softmax, its padding tokens out of its per-head normalisation, and its median filter
    reflects at its own last frame, as the row alone would."""
    rows, n_tok, n_fr = qk.shape[0], max(lengths), max(n_frames)
    pad = MEDIAN_FILTER_WIDTH // 2
    short = [r for r in range(rows) if n_frames[r] <= pad]  # unfiltered there: row by row
    # one host block, one copy: frame mask, token mask, each row's reflect-padded frame indices
    frames, tokens = torch.tensor(n_frames)[:, None], torch.tensor(lengths)[:, None]
    top = (frames - 1).clamp(min=0)
    at = torch.arange(-pad, n_fr + pad).abs()[None, :]
    reflect = torch.minimum(torch.where(at > top, 2 * top - at, at).clamp(min=0), top)
    host = torch.cat([torch.arange(n_fr) < frames, torch.arange(n_tok) < tokens], dim=1)
    dev = torch.cat([host.long(), reflect], dim=1).to(qk.device, non_blocking=True)
    frame_ok = dev[:, :n_fr].bool()[:, None, None, :]
    tok_ok = dev[:, n_fr : n_fr + n_tok].to(qk.dtype)[:, None, :, None]
    reflect = dev[:, n_fr + n_tok :]
    x = qk[:, :, :n_tok, :n_fr].masked_fill(~frame_ok, float("-inf")).softmax(dim=-1)
    count = tok_ok.sum(dim=-2, keepdim=True)  # each row's own tokens
    mean = (x * tok_ok).sum(dim=-2, keepdim=True) / count
    std = (((x - mean) * tok_ok).square().sum(dim=-2, keepdim=True) / count).sqrt()
    x = (x - mean) / (std + 1e-10)
    index = reflect[:, None, None, :].expand(*x.shape[:3], reflect.shape[-1])
    x = x.gather(-1, index).unfold(-1, MEDIAN_FILTER_WIDTH, 1).median(dim=-1).values
    x = x.mean(dim=1)  # [R, L, T]
    out = [x[r, n_sots[r] : lengths[r] - 1, : n_frames[r]] for r in range(rows)]
    for r in short:
        out[r] = alignment_matrix(qk[r, :, : lengths[r]], n_frames[r], n_sots[r])
    return out


def words_from_path(tokenizer: WhisperTokenizer, text_tokens: list[int], known: int,
                    token_probs: np.ndarray, text_idx: np.ndarray, time_idx: np.ndarray,
                    split: Splitter | None = None,
                    marks_after: Sequence[tuple[float, float] | None] | None = None,
                    ) -> list[WordTiming]:
    """Word timings from the DTW path (token -> first frame), leaving out the words of the
    first ``known`` tokens; ``marks_after`` as in ``align_words``."""
    sp = tokenizer.special
    words, word_tokens = (split or tokenizer.split_to_words)(text_tokens + [sp.eot])
    if len(word_tokens) <= 1:
        return []
    boundaries = np.zeros(len(word_tokens), dtype=np.int64)
    np.cumsum([len(t) for t in word_tokens[:-1]], out=boundaries[1:])
    jumps = np.ones(len(text_idx), dtype=bool)  # where the path enters a new token
    np.not_equal(text_idx[1:], text_idx[:-1], out=jumps[1:])
    probs = token_probs.tolist()
    jump_times = time_idx[jumps] * FRAMES_PER_TOKEN_S
    starts = jump_times[boundaries[:-1]]
    ends = jump_times[boundaries[1:]]
    out: list[WordTiming] = []
    for k, (word, toks) in enumerate(zip(words[:-1], word_tokens[:-1], strict=True)):
        lo, hi = boundaries[k], boundaries[k + 1]
        new = probs[max(lo, known) : hi]  # a word may straddle the prefix's end
        letters_end = hi - 1  # the word's last token before its closing marks
        while letters_end > lo and text_tokens[letters_end] in tokenizer.closing_ids:
            letters_end -= 1
        out.append(
            WordTiming(
                text=word,
                tokens=tuple(toks),
                start_s=float(starts[k]),
                end_s=float(ends[k]),
                probability=_mean(new),
                mark_p=marks_after[letters_end] if marks_after else None,
            )
        )
    # durations are tidied over all words (the median includes the prefix), then the known
    # words are left out
    n_known_words = int(np.searchsorted(boundaries[1:], known, side="right"))
    out = _tidy_durations(out)[n_known_words:]
    first = int(boundaries[n_known_words])  # the first returned word's first token
    if out and first < known:  # the prefix ends inside this word
        added = tokenizer.decode(list(word_tokens[n_known_words][known - first:]))
        letters = [ch for ch in added if ch.isalnum()]
        if not letters or (len(letters) == 1 and letters[0].isalpha() and added[0] != "-"):
            # only a mark after the prefix's last word ("circumstances" + ","): that word
            # again, not a new one. Timed from this window it can start 100 ms before the
            # committed end, and the stream committed it twice ("the circumstances
            # circumstances, which"). One letter more is no word either: it re-spells the
            # committed word ("man" + "e", "Guinevere" + "r"), which cannot change, and alone
            # it read as one ("ride a man e into the woods")
            out = out[1:]
        else:
            # the prefix's last word continued ("Gint" + "lane", "ill" + "-disposed"): it was
            # a cut-off start and is committed, so only the rest is new, timed from its own
            # tokens; the whole word after it read as a stutter ("Gint Gintlane had the sides")
            w = out[0]
            out[0] = replace(w, text=added.lstrip(),
                             tokens=tuple(word_tokens[n_known_words][known - first:]),
                             start_s=max(w.start_s, float(jump_times[known])), joined=True)
    return out


def within_segments(words: list[WordTiming], tokens: tuple[int, ...] | list[int],
                    timestamp_begin: int, slack_s: float = 1.0) -> list[WordTiming]:
    """A decode that closed its last segment and ended there: its words the alignment ran
    past that segment's end by over ``slack_s``, moved back before it, as Whisper prefers its
    segment's end timestamp to a word that runs long. ``tokens``: the decode's tokens with
    its timestamps (``words`` time the last of its text tokens). A stream's last decode closed
    its segment at 6.16 s and ended, speech going on to 7.9 s, and the alignment timed its
    last word "and" 7.28-7.84 s: over the words it left out ("an esclavine of leather")."""
    if not words or not tokens or tokens[-1] < timestamp_begin:
        return words  # the decode ended inside its segment, or read nothing
    close_s = (tokens[-1] - timestamp_begin) * FRAMES_PER_TOKEN_S
    prev_end, out = 0.0, []
    for w in words:
        if w.end_s > close_s + slack_s:
            end = max(close_s, prev_end)
            start = min(w.start_s, max(prev_end, end - min(w.end_s - w.start_s, 0.5)))
            w = replace(w, start_s=start, end_s=end)
        out.append(w)
        prev_end = w.end_s
    return out


def _mean(values: list[float]) -> float:
    """``float(np.mean(values))`` (nan for none), bit for bit: numpy adds fewer than 8 values
    one after another, as this loop does, and a word seldom has more tokens. A row's words
    are many, and numpy's call costs ~10 us each."""
    if not values or len(values) >= 8:
        return float(np.mean(values)) if values else float("nan")
    total = 0.0
    for v in values:
        total += v
    return total / len(values)


def _tidy_durations(words: list[WordTiming]) -> list[WordTiming]:
    """Cap implausibly long words (the DTW path can stick at pauses) as Whisper does."""
    durations = np.array([w.end_s - w.start_s for w in words])
    positive = durations[durations > 0]
    median = float(np.median(positive)) if len(positive) else 0.0
    max_dur = min(0.7, median) * 2 if median > 0 else 1.4
    out = []
    for w in words:
        start, end = w.start_s, w.end_s
        if end - start > max_dur:
            if w.text.strip()[-1:] in ".!?,。！？，":
                end = start + max_dur
            else:
                start = max(start, end - max_dur)
        out.append(w if (start, end) == (w.start_s, w.end_s)
                   else replace(w, start_s=start, end_s=end))
    return out
