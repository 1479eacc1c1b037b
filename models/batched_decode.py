"""The batched decoder step: static key/value cache, per-row positions, rules on the GPU.

Everything a decode step needs lives in preallocated tensors (``DecodeBuffers``), so one step
(and a chunk of steps) has fixed shapes and addresses and can be captured in a CUDA graph: the
host only launches graph replays and, once per chunk, reads one "all done" flag through pinned
memory, one chunk late (deferred), so the step loop never waits on the GPU.

The timestamp rules of ``models.decoding.LogitFilter`` are applied to the whole batch with
tensor masks; the repetition-loop guard of ``tail_loop`` is kept exactly as per-row run lengths
of ``token[i] == token[i-g]`` for g = 1..16, also on the GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from subd.kernels import select_gpu
from subd.models.decoding import DecodeOptions
from subd.models.tokenizer import TIME_PRECISION_S, SpecialTokens
from subd.models.whisper import TextDecoder

NEG_INF = float("-inf")
MAX_GRAM = 16  # tail_loop looks at n-grams up to this length


@dataclass(frozen=True, slots=True)
class StepShape:
    n_rows: int  # batch bucket
    n_audio: int  # encoder frames T (cross-attention length)
    n_ctx: int  # self-attention length bucket (prompt + new tokens)


def bytes_per_row(dims, dtype: torch.dtype, max_new: int) -> int:
    """What :class:`DecodeBuffers` hold on the device for each of their rows: every decoder
    layer's self- and cross-attention keys and values (the cross ones over Whisper's whole
    1500 frames; large-v3 in float16: 319 MB a row), the logits, the output tokens with their
    log-probabilities and mark probabilities, and the per-row state."""
    kv = dims.n_text_layer * 2 * dims.n_text_state * (dims.n_text_ctx + dims.n_audio_ctx) \
        * dtype.itemsize
    state = 8 * (8 + MAX_GRAM) + 4 + 3  # 8 long counters and tokens, the n-gram runs,
    # the temperature, 3 flags
    return kv + 4 * dims.n_vocab + 20 * max_new + state  # token 8, log-prob 4, marks 2 x 4


class DecodeBuffers:
    """Static per-engine state for up to ``max_rows`` sequences (views are taken per bucket)."""

    def __init__(self, decoder: TextDecoder, max_rows: int, max_audio: int, max_new: int, *,
                 dtype: torch.dtype, device: torch.device):
        d = decoder.dims
        h, dh = d.n_text_head, d.n_text_state // d.n_text_head
        kv = (d.n_text_layer, max_rows, h)
        self.self_k = torch.zeros(*kv, d.n_text_ctx, dh, dtype=dtype, device=device)
        self.self_v = torch.zeros_like(self.self_k)
        self.cross_k = torch.zeros(*kv, max_audio, dh, dtype=dtype, device=device)
        self.cross_v = torch.zeros_like(self.cross_k)
        z = dict(device=device)
        self.tokens_in = torch.zeros(max_rows, dtype=torch.long, **z)
        self.plen = torch.ones(max_rows, dtype=torch.long, **z)  # prompt length per row
        self.max_new = torch.zeros(max_rows, dtype=torch.long, **z)
        self.n_gen = torch.zeros(max_rows, dtype=torch.long, **z)
        self.last_tok = torch.zeros(max_rows, dtype=torch.long, **z)
        self.prev_tok = torch.zeros(max_rows, dtype=torch.long, **z)
        self.last_stamp = torch.full((max_rows,), -1, dtype=torch.long, **z)
        self.done = torch.ones(max_rows, dtype=torch.bool, **z)
        self.looped = torch.zeros(max_rows, dtype=torch.bool, **z)
        self.runs = torch.zeros(max_rows, MAX_GRAM, dtype=torch.long, **z)
        # tokens forced at the start of a row's transcript (a committed prefix): they count in
        # n_gen, but the loop guard, like tail_loop, looks only at what is decoded after them
        self.n_forced = torch.zeros(max_rows, dtype=torch.long, **z)
        # rows whose first token after the forced prefix continues it (DecodeOptions.
        # continue_prefix; models.decoding.LogitFilter): no timestamp right after the prefix
        self.cont = torch.zeros(max_rows, dtype=torch.bool, **z)
        self.out_tok = torch.zeros(max_rows, max_new, dtype=torch.long, **z)
        self.out_lp = torch.zeros(max_rows, max_new, dtype=torch.float32, **z)
        # (p('.'), p(',')) of the step that chose each column (DecodeResult.mark_probs)
        self.out_mark = torch.zeros(max_rows, max_new, 2, dtype=torch.float32, **z)
        self.temperature = torch.zeros(max_rows, dtype=torch.float32, **z)  # 0: greedy row
        self.logits = torch.zeros(max_rows, d.n_vocab, dtype=torch.float32, **z)
        self.all_done = torch.zeros((), dtype=torch.bool, **z)
        self.rng_seed = torch.zeros(1, dtype=torch.int32, **z)  # Philox key of sampled steps
        # teacher forcing [max_rows, max_new] (capacity mode of subd bench gpu only: random
        # weights given a real transcript's tokens, -1 past them); None: the model chooses
        self.forced: torch.Tensor | None = None
        self.max_rows, self.max_audio, self.max_new_cap = max_rows, max_audio, max_new


class BatchRules:
    """Vectorised LogitFilter + greedy/temperature choice + loop guard for a batch."""

    def __init__(self, special: SpecialTokens, options: DecodeOptions, suppress: tuple[int, ...],
                 n_vocab: int, device: torch.device, mark_ids: tuple[int, ...] = ()):
        self.sp = special
        self.mark_ids = torch.tensor(mark_ids, dtype=torch.long, device=device) \
            if mark_ids else None
        mask = torch.zeros(n_vocab, dtype=torch.bool)
        for t in suppress:
            if 0 <= t < n_vocab:
                mask[t] = True
        for t in (special.no_timestamps, special.sot, special.sot_prev, special.transcribe,
                  special.translate, special.no_speech):
            mask[t] = True
        self.suppress = mask.to(device)
        self.suppress_u8 = self.suppress.byte()
        self.col = torch.arange(n_vocab, device=device)
        max_init = self.max_init = int(round(options.max_initial_timestamp_s / TIME_PRECISION_S))
        ts = special.timestamp_begin
        first = self.col < ts  # a window starts with a timestamp ...
        first |= self.col > ts + max_init  # ... no later than max_initial_timestamp_s
        self.first_mask = first | self.suppress
        self.grams = torch.arange(1, MAX_GRAM + 1, device=device)
        need = [(max(options.loop_min_repeats, math.ceil(options.loop_min_tokens / g)) - 1) * g
                for g in range(1, MAX_GRAM + 1)]
        self.need_run = torch.tensor(need, device=device)

    def _choose(self, buf: DecodeBuffers, n: int, sample: bool, n_gen: torch.Tensor,
                last: torch.Tensor, prev: torch.Tensor, stamp: torch.Tensor, cont: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """The reference path (and the sampled one): masks, then reductions, in torch."""
        sp, ts, col = self.sp, self.sp.timestamp_begin, self.col
        logits = buf.logits[:n]
        first = (n_gen == 0)[:, None]
        last_ts = (n_gen > 0) & (last >= ts)
        penult = (n_gen < 2) | (prev >= ts)
        # a pair just closed, or the prefix's text continues: text or eot next
        pair_closed = ((last_ts & penult) | cont)[:, None] & (col >= ts)
        opening = (last_ts & ~penult)[:, None] & (col < sp.eot)
        floor = torch.where(last_ts & ~penult, stamp, stamp + 1)
        backwards = (stamp >= 0)[:, None] & (col >= ts) & (col < floor[:, None])
        later = self.suppress | pair_closed | opening | backwards
        mask = torch.where(first, self.first_mask, later)
        logits = logits.masked_fill(mask, NEG_INF)  # the one [n, V] float temporary
        # timestamps forced when their total probability beats every text token; the
        # log-softmax normaliser is common to both sides, so compare raw logits
        force_ts = ~first[:, 0] & (torch.logsumexp(logits[:, ts:], dim=-1)
                                   > logits[:, :ts].max(dim=-1).values)
        logits.masked_fill_(force_ts[:, None] & (col < ts), NEG_INF)
        token = logits.argmax(dim=-1)
        if sample:
            temp = buf.temperature[:n]
            u = torch.rand_like(logits).clamp_(1e-20, 1.0).log_().neg_().log_()
            sampled = (logits / temp.clamp_min(1e-6)[:, None] - u).argmax(dim=-1)
            token = torch.where(temp > 0, sampled, token)
        token_lp = logits.gather(1, token[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)
        return token, token_lp

    def _fused(self, logits: torch.Tensor, n_gen: torch.Tensor, last: torch.Tensor,
               prev: torch.Tensor, stamp: torch.Tensor, cont: torch.Tensor,
               temperature: torch.Tensor | None = None,
               seed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The same choice in one pass over the logits (kernels/select_gpu.py): greedy, or with
        ``temperature`` [n] and a device ``seed``, sampled for the rows whose temperature > 0
        (the draws come from Philox, not torch's generator)."""
        ts, n_vocab = self.sp.timestamp_begin, self.col.shape[0]
        first = n_gen == 0
        last_ts = ~first & (last >= ts)
        penult = (n_gen < 2) | (prev >= ts)
        opening, closed = last_ts & ~penult, (last_ts & penult) | cont
        floor = torch.where(opening, stamp, stamp + 1)
        lo = torch.where(closed, n_vocab, torch.where(stamp >= 0, floor, ts))
        lo = torch.where(first, ts, lo)
        hi = torch.where(first, ts + self.max_init, n_vocab - 1)
        return select_gpu.select(logits, self.suppress_u8, (~first & ~opening).byte(), lo, hi,
                                 first.byte(), self.sp.eot, ts, temperature, seed)

    def select(self, buf: DecodeBuffers, n: int, sample: bool,
               only: torch.Tensor | None = None) -> None:
        """Filter buf.logits[:n], choose a token per row, record it and update row state.

        Row b writes its token at column n_gen[b] (rows join and leave the batch at different
        times). ``sample``: rows with temperature > 0 sample, the others stay greedy (without
        it every row is greedy). ``only`` [≥ n] bool limits the update to those rows (rows
        just admitted, whose first token comes from their prefill's logits).
        """
        sp, ts = self.sp, self.sp.timestamp_begin
        n_gen, last, prev, stamp = buf.n_gen[:n], buf.last_tok[:n], buf.prev_tok[:n], \
            buf.last_stamp[:n]
        # the first token after a forced prefix of text that the row continues
        cont = buf.cont[:n] & (n_gen == buf.n_forced[:n]) & (n_gen > 0) & (last < ts)
        marks = None
        if self.mark_ids is not None:  # before the rules touch the logits, as decode_window
            logits = buf.logits[:n]
            marks = torch.log_softmax(logits, dim=-1)[:, self.mark_ids].exp()  # as decode_window
        if select_gpu.available(buf.logits):
            temperature = seed = None
            if sample:  # a new draw per step, also when a CUDA graph replays this
                buf.rng_seed.add_(1)
                temperature, seed = buf.temperature[:n], buf.rng_seed
            token, token_lp = self._fused(buf.logits[:n], n_gen, last, prev, stamp, cont,
                                          temperature, seed)
        else:
            token, token_lp = self._choose(buf, n, sample, n_gen, last, prev, stamp, cont)
        if buf.forced is not None:  # the row's transcript token at this column, where given
            want = buf.forced[:n].gather(1, n_gen.clamp(max=buf.forced.shape[1] - 1)[:, None])
            token = torch.where(want[:, 0] >= 0, want[:, 0], token)
        active = ~buf.done[:n]
        if only is not None:
            active &= only[:n]
        at = n_gen[:, None]  # [n, 1] column of this token
        buf.out_tok[:n].scatter_(1, at, torch.where(active, token, buf.out_tok[:n].gather(
            1, at)[:, 0])[:, None])
        buf.out_lp[:n].scatter_(1, at, torch.where(active, token_lp, buf.out_lp[:n].gather(
            1, at)[:, 0])[:, None])
        if marks is not None:
            at2 = at[:, :, None].expand(n, 1, 2)
            buf.out_mark[:n].scatter_(1, at2, torch.where(
                active[:, None], marks, buf.out_mark[:n].gather(1, at2)[:, 0])[:, None])
        appended = active & (token != sp.eot)
        # tail_loop, exactly: run[g] = length of the run of token[i] == token[i-g] ending here
        back = n_gen[:, None] - self.grams[None, :]  # [n, G]
        earlier = buf.out_tok[:n].gather(1, back.clamp(min=0))  # [n, G]
        same = (earlier == token[:, None]) & (back >= buf.n_forced[:n, None])
        runs = torch.where(same, buf.runs[:n] + 1, torch.zeros_like(buf.runs[:n]))
        buf.runs[:n] = torch.where(appended[:, None], runs, buf.runs[:n])
        looped = appended & (buf.runs[:n] >= self.need_run).any(dim=1)
        buf.prev_tok[:n] = torch.where(appended, last, prev)
        buf.last_tok[:n] = torch.where(appended, token, last)
        buf.last_stamp[:n] = torch.where(appended & (token >= ts), token, stamp)
        buf.n_gen[:n] += appended.long()
        buf.looped[:n] |= looped
        buf.done[:n] |= active & ((token == sp.eot) | looped | (buf.n_gen[:n] >= buf.max_new[:n]))
        buf.tokens_in[:n] = torch.where(active, token, buf.tokens_in[:n])
        buf.all_done.copy_(buf.done[:n].all())


def cross_fill(decoder: TextDecoder, buf: DecodeBuffers, audio: torch.Tensor, row0: int) -> None:
    """Write cross-attention keys/values of ``audio`` [b, T, D] into rows row0..row0+b."""
    b, t, _ = audio.shape
    for i, block in enumerate(decoder.blocks):
        ca = block.cross_attn
        buf.cross_k[i, row0 : row0 + b, :, :t] = ca.split(ca.key(audio))
        buf.cross_v[i, row0 : row0 + b, :, :t] = ca.split(ca.value(audio))


def _mlp_and_cross(block, x: torch.Tensor, ck: torch.Tensor, cv: torch.Tensor) -> torch.Tensor:
    ca = block.cross_attn
    q = ca.split(ca.query(block.cross_attn_ln(x)))
    x = x + ca.out(ca.merge(F.scaled_dot_product_attention(q, ck, cv)))
    return x + block.mlp(block.mlp_ln(x))


def prefill(decoder: TextDecoder, buf: DecodeBuffers, prompts: torch.Tensor, plen: torch.Tensor,
            sot_index: torch.Tensor, shape: StepShape, no_speech: int,
            slots: torch.Tensor | None = None, audio: torch.Tensor | None = None) -> torch.Tensor:
    """Run right-padded prompts [n, P] (row b valid up to plen[b]); fill the rows' logits with
    the logits after each row's last prompt token; return each row's no-speech probability [n].

    The rows are buf rows [:n], or ``slots`` [n] (rows joining a running batch). With ``audio``
    [n, T, D] the rows' cross-attention keys/values are computed here and stored (one pass
    instead of ``cross_fill`` then a read back); without it they are read from the buffers.
    """
    n, p = prompts.shape
    t = shape.n_audio
    rows = slice(0, n) if slots is None else slots
    dtype = buf.self_k.dtype
    x = (decoder.token_embedding(prompts) + decoder.positional_embedding[:p]).to(dtype)
    causal = decoder.causal_mask[:p, :p].to(dtype)
    for i, block in enumerate(decoder.blocks):
        sa = block.attn
        h = block.attn_ln(x)
        k, v = sa.split(sa.key(h)), sa.split(sa.value(h))
        buf.self_k[i][rows, :, :p] = k
        buf.self_v[i][rows, :, :p] = v
        q = sa.split(sa.query(h))
        x = x + sa.out(sa.merge(F.scaled_dot_product_attention(q, k, v, attn_mask=causal)))
        if audio is not None:
            ca = block.cross_attn
            ck, cv = ca.split(ca.key(audio)), ca.split(ca.value(audio))
            buf.cross_k[i][rows, :, :t] = ck
            buf.cross_v[i][rows, :, :t] = cv
        else:
            ck, cv = buf.cross_k[i][rows, :, :t], buf.cross_v[i][rows, :, :t]
        x = _mlp_and_cross(block, x, ck, cv)
    idx = torch.arange(n, device=prompts.device)
    picked = torch.stack([x[idx, plen - 1], x[idx, sot_index]], dim=1)  # [n, 2, D]
    logits = decoder.output(decoder.ln(picked)).float()
    buf.logits[rows] = logits[:, 0]
    return torch.softmax(logits[:, 1], dim=-1)[:, no_speech]


def step(decoder: TextDecoder, buf: DecodeBuffers, shape: StepShape) -> None:
    """One token for rows [:n]: input buf.tokens_in at position plen + n_gen - 1."""
    n, t, c = shape.n_rows, shape.n_audio, shape.n_ctx
    dtype = buf.self_k.dtype
    pos = (buf.plen[:n] + buf.n_gen[:n] - 1).clamp(0, c - 1)
    x = decoder.token_embedding(buf.tokens_in[:n]) + decoder.positional_embedding[pos]
    x = x.to(dtype)[:, None, :]  # [n, 1, D]
    rows = torch.arange(n, device=x.device)
    visible = (torch.arange(c, device=x.device)[None, :] <= pos[:, None])[:, None, None, :]
    for i, block in enumerate(decoder.blocks):
        sa = block.attn
        h = block.attn_ln(x)
        sk, sv = buf.self_k[i, :n, :, :c], buf.self_v[i, :n, :, :c]
        sk[rows, :, pos] = sa.split(sa.key(h))[:, :, 0]
        sv[rows, :, pos] = sa.split(sa.value(h))[:, :, 0]
        q = sa.split(sa.query(h))
        x = x + sa.out(sa.merge(F.scaled_dot_product_attention(q, sk, sv, attn_mask=visible)))
        x = _mlp_and_cross(block, x, buf.cross_k[i, :n, :, :t], buf.cross_v[i, :n, :, :t])
    buf.logits[:n] = decoder.output(decoder.ln(x[:, 0]))  # widened to float32 by the copy


def decode_step(decoder: TextDecoder, rules: BatchRules, buf: DecodeBuffers, shape: StepShape,
                sample: bool) -> None:
    """Feed the last chosen tokens, then choose the next ones (one step of a graph chunk)."""
    step(decoder, buf, shape)
    rules.select(buf, shape.n_rows, sample)
