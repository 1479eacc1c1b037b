"""Greedy/sampled decoding of one 30 s window with Whisper's timestamp rules.

The logit filters follow the reference decoders: suppressed tokens, no blank at the start,
timestamps in pairs and never decreasing, the first timestamp ≤ ``max_initial_timestamp_s``,
and timestamps forced when their total probability beats every text token. A repetition-loop
guard stops decoding as soon as the tail repeats itself, so a loop costs a few tokens instead of
the whole 448-token budget, and the caller's temperature fallback sees it at once.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import torch

from subd.models.tokenizer import TIME_PRECISION_S, SpecialTokens, WhisperTokenizer
from subd.models.whisper import KVCache, TextDecoder

NEG_INF = float("-inf")


@dataclass(frozen=True, slots=True)
class DecodeOptions:
    temperature: float = 0.0
    max_new_tokens: int = 224
    max_initial_timestamp_s: float = 1.0
    suppress_blank: bool = True
    suppress_tokens: tuple[int, ...] = ()
    loop_min_repeats: int = 3  # a tail n-gram seen this many times in a row ...
    loop_min_tokens: int = 20  # ... covering at least this many tokens is a loop
    seed: int = 0
    # the first token after a forced prefix of text continues its segment: text or the end,
    # never a timestamp (see LogitFilter)
    continue_prefix: bool = False


@dataclass(frozen=True, slots=True)
class DecodeResult:
    tokens: tuple[int, ...]  # generated tokens (text + timestamps), without the prompt or eot
    sum_logprob: float
    avg_logprob: float
    no_speech_prob: float
    temperature: float
    compression_ratio: float
    looped: bool
    capped: bool = False  # stopped by ``max_new_tokens`` (its repeating tail, if any, cut)
    # (p('.'), p(',')) at each decode step, before the timestamp rules: step i chose
    # tokens[n_forced + i], the last one the end of text; what Whisper weighed at a word's
    # end, not only what it wrote there
    mark_probs: tuple[tuple[float, float], ...] = field(default=(), compare=False)
    n_forced: int = 0  # tokens of the forced prefix at the start of ``tokens``

    def text_tokens(self, timestamp_begin: int) -> list[int]:
        return [t for t in self.tokens if t < timestamp_begin]

    def marks_after_text(self, timestamp_begin: int) -> list[tuple[float, float] | None]:
        """For each text token, the mark probabilities of the step right after it (whatever
        that step chose: a mark, a timestamp, the next word, the end); None where that step
        was forced, not decoded."""
        out: list[tuple[float, float] | None] = []
        for pos, t in enumerate(self.tokens):
            if t < timestamp_begin:
                step = pos + 1 - self.n_forced
                out.append(self.mark_probs[step] if 0 <= step < len(self.mark_probs) else None)
        return out


def steps_recorded(n_new: int, capped: bool, looped: bool) -> int:
    """How many decode steps a result's ``mark_probs`` keeps: one per new token, and the end
    of text's own step where the decode ended there (not cut by its budget or a loop)."""
    return n_new + (not capped and not looped)


def compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def tail_loop(tokens: list[int], min_repeats: int, min_tokens: int) -> bool:
    """True when the end of ``tokens`` is one n-gram repeated ``min_repeats``+ times in a row."""
    n_total = len(tokens)
    for n in range(1, min(16, n_total // min_repeats) + 1):
        gram = tokens[-n:]
        repeats = 1
        while (repeats + 1) * n <= n_total and tokens[-(repeats + 1) * n : -repeats * n] == gram:
            repeats += 1
        if repeats >= min_repeats and repeats * n >= min_tokens:
            return True
    return False


def periodic_tail_start(tokens: list[int], min_period: int = 4) -> int | None:
    """Where the repetition at the end of ``tokens`` starts, keeping its first period.

    ``tokens`` ends in a run that repeats with some period p (at least twice, p ≥
    ``min_period``); returns the length to keep: the run's start plus one period. The period
    whose run starts earliest wins. None when the end does not repeat. A runaway decode
    ("A B C. A B C. A B" until the token budget is spent) keeps "A B C.".
    """
    n = len(tokens)
    best: tuple[int, int] | None = None
    for p in range(min_period, n // 2 + 1):
        i = n - 1
        while i >= p and tokens[i] == tokens[i - p]:
            i -= 1
        start = i + 1 - p  # tokens[start:] is p-periodic
        if n - start >= 2 * p and (best is None or start < best[0]):
            best = (start, p)
    return None if best is None else best[0] + best[1]


class LogitFilter:
    """In-place logit rules for one sequence; ``generated`` excludes the prompt."""

    def __init__(self, special: SpecialTokens, options: DecodeOptions, n_vocab: int,
                 n_prefix: int = 0):
        self.sp = special
        self.options = options
        # a forced prefix of committed text is continued, not closed (options.continue_prefix):
        # its words' times are not among its tokens, so a timestamp right after them is the
        # model's guess at a boundary it never decoded. Guessed early (LibriSpeech "the
        # adventure of the cart.<|2.00|><|2.00|>", speech resuming at 3.0 s), the next words
        # were read from the pause ("Hit B cell" for "It befell"); continued, as a decode
        # without the prefix reads them, they come out right
        self.continue_at = n_prefix if options.continue_prefix else 0
        mask = torch.zeros(n_vocab, dtype=torch.bool)
        for t in options.suppress_tokens:
            if 0 <= t < n_vocab:
                mask[t] = True
        for t in (
            special.no_timestamps,
            special.sot,
            special.sot_prev,
            special.transcribe,
            special.translate,
            special.no_speech,
        ):
            mask[t] = True
        self.suppress_mask = mask
        self.max_initial_index = int(round(options.max_initial_timestamp_s / TIME_PRECISION_S))

    def apply(self, logits: torch.Tensor, generated: list[int]) -> None:
        sp, ts = self.sp, self.sp.timestamp_begin
        logits.masked_fill_(self.suppress_mask, NEG_INF)
        if not generated:
            if self.options.suppress_blank:
                logits[sp.eot] = NEG_INF
                logits[220] = NEG_INF  # a lone space
            logits[:ts] = NEG_INF  # a window starts with a timestamp
            logits[ts + self.max_initial_index + 1 :] = NEG_INF
            return
        last_ts = generated[-1] >= ts
        penultimate_ts = len(generated) < 2 or generated[-2] >= ts
        if len(generated) == self.continue_at and not last_ts:
            logits[ts:] = NEG_INF  # right after the prefix's text: text or eot next
            return
        if last_ts:
            if penultimate_ts:  # a pair just closed: text or eot next
                logits[ts:] = NEG_INF
            else:  # an opening timestamp: its closing partner or eot next
                logits[: sp.eot] = NEG_INF
        stamps = [t for t in generated if t >= ts]
        if stamps:
            floor = stamps[-1] if (last_ts and not penultimate_ts) else stamps[-1] + 1
            logits[ts:floor] = NEG_INF
        logprobs = torch.log_softmax(logits, dim=-1)
        if torch.logsumexp(logprobs[ts:], dim=-1) > logprobs[:ts].max():
            logits[:ts] = NEG_INF


@torch.inference_mode()
def decode_window(
    decoder: TextDecoder,
    audio_features: torch.Tensor,  # [1, T, D]
    prompt: list[int],
    sot_index: int,
    tokenizer: WhisperTokenizer,
    options: DecodeOptions,
    prefix: tuple[int, ...] = (),
    cross_from: KVCache | None = None,
) -> DecodeResult:
    """Decode one window after ``prompt``; ``sot_index`` is where <|startoftranscript|> sits.

    ``prefix``: tokens forced at the start of the transcript (text already committed in this
    window): they cost one batched forward pass instead of one step each, and the result's
    tokens start with them. Log-probabilities count only the tokens decoded here.
    ``cross_from``: a cache for the same audio whose cross-attention keys/values are reused.
    """
    special = tokenizer.special
    cache = decoder.new_cache(audio_features, cross_from=cross_from)
    n_vocab = decoder.dims.n_vocab
    filt = LogitFilter(special, options, n_vocab, len(prefix))
    gen = torch.Generator().manual_seed(options.seed)
    max_new = min(options.max_new_tokens, decoder.dims.n_text_ctx - len(prompt) - len(prefix))
    first = torch.tensor([prompt + list(prefix)], device=audio_features.device)
    # Every row is projected onto the vocabulary although two are read (``logit_rows`` would
    # save 15-85 ms): with int8 weights the activations are quantised per tensor, so a subset
    # of rows gets another scale and other tokens (streaming WER on LibriVox 1.4 -> 7.0 %).
    logits, _ = decoder(first, cache)
    no_speech_prob = float(torch.softmax(logits[0, sot_index].float(), -1)[special.no_speech])
    step_logits = logits[0, -1].float().cpu()
    generated: list[int] = list(prefix)
    marks = tokenizer.mark_ids
    mark_probs: list[tuple[float, float]] = []
    sum_logprob = 0.0
    looped = False
    capped = max_new > 0
    for _ in range(max(0, max_new)):
        # the marks' weight before the timestamp rules (the batched decoders read it alike);
        # log_softmax, not logits - logsumexp: one fused pass over the vocabulary, 31 against
        # 68 us a step on one core of this machine (decode_window was 14 % slower with the latter)
        mark_probs.append(tuple(torch.log_softmax(step_logits, -1)[marks].exp().tolist()))
        filt.apply(step_logits, generated)
        if options.temperature > 0:
            probs = torch.softmax(step_logits / options.temperature, dim=-1)
            token = int(torch.multinomial(probs, 1, generator=gen))
        else:
            token = int(step_logits.argmax())
        sum_logprob += float(torch.log_softmax(step_logits, -1)[token])
        if token == special.eot:
            capped = False
            break
        generated.append(token)
        if tail_loop(generated[len(prefix) :], options.loop_min_repeats, options.loop_min_tokens):
            looped, capped = True, False
            break
        logits, _ = decoder(torch.tensor([[token]], device=audio_features.device), cache)
        step_logits = logits[0, -1].float().cpu()
    if capped:  # out of budget: a repeating tail (a loop longer than tail_loop's n-grams) goes
        ts = special.timestamp_begin  # timestamps differ between copies: compare them as one
        keep = periodic_tail_start([min(t, ts) for t in generated[len(prefix) :]])
        if keep is not None:
            generated = generated[: len(prefix) + keep]
            looped = True
    text = tokenizer.decode([t for t in generated if t < special.timestamp_begin])
    n_new = len(generated) - len(prefix)
    return DecodeResult(
        mark_probs=tuple(mark_probs[: steps_recorded(n_new, capped, looped)]),
        n_forced=len(prefix),
        tokens=tuple(generated),
        sum_logprob=sum_logprob,
        avg_logprob=sum_logprob / (n_new + 1),
        no_speech_prob=no_speech_prob,
        temperature=options.temperature,
        compression_ratio=compression_ratio(text),
        looped=looped,
        capped=capped,
    )


@torch.inference_mode()
def detect_language(
    decoder: TextDecoder,
    audio_features: torch.Tensor,  # [1, T, D]
    tokenizer: WhisperTokenizer,
    cross_from: KVCache | None = None,
) -> dict[str, float]:
    """Probability of each language for the audio, as Whisper decides it: the distribution of
    the token after <|startoftranscript|>, over the language tokens only."""
    languages = tokenizer.language_tokens()
    if not languages:
        return {"en": 1.0}  # an English-only model
    cache = decoder.new_cache(audio_features, cross_from=cross_from)
    sot = torch.tensor([[tokenizer.special.sot]], device=audio_features.device)
    logits, _ = decoder(sot, cache)
    codes = list(languages)
    ids = torch.tensor([languages[c] for c in codes])
    probs = torch.softmax(logits[0, -1].float().cpu()[ids], dim=-1)
    return dict(zip(codes, probs.tolist(), strict=True))
