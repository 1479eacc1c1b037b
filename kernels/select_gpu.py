"""Greedy token choice under Whisper's timestamp rules in one pass over the logits (Triton).

``BatchRules.select`` (models/batched_decode.py) builds five [rows, vocab] masks, masks the
logits, reduces them four times (timestamp log-sum-exp, text max, argmax, log-sum-exp): about
ten passes over [rows, 51864] per step, a third of a decode step at 2048 rows. The masks have a
simple shape per row, so here one program per row reads its logits once and keeps six running
figures (max, first argmax and sum of exponentials, for text and for timestamp columns), then
applies the forced-timestamp rule and writes the token and its log-probability.

Row rules (the same as the torch path, which stays the reference and the CPU path):
* columns < eot: masked on a row's first step, while a timestamp pair is open, or if suppressed;
* eot ≤ column < timestamp_begin: masked on the first step or if suppressed;
* timestamp columns: allowed in [lo, hi] per row (first step: up to max_initial_timestamp;
  after a closed pair: none; otherwise not before the last timestamp) and if not suppressed;
* timestamps are forced when their total probability beats every text token (not on the first
  step); ties resolve to the lowest index, as ``torch.argmax`` does.
"""

from __future__ import annotations

import torch

try:  # Triton comes with CUDA builds of torch; without it the torch path is used
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None

BLOCK = 2048


def available(t: torch.Tensor) -> bool:
    return triton is not None and t.is_cuda


if triton is not None:

    @triton.jit
    def _greedy_kernel(logits, stride, suppress, text_ok, lo, hi, first, out_tok, out_lp,
                       eot, ts, n_vocab: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        ok_text = tl.load(text_ok + row) != 0
        is_first = tl.load(first + row) != 0
        lo_r = tl.load(lo + row)
        hi_r = tl.load(hi + row)
        neg = float("-inf")
        m_t = neg
        s_t = 0.0
        a_t = 0
        m_s = neg
        s_s = 0.0
        a_s = 0
        for start in range(0, n_vocab, BLOCK):
            col = start + tl.arange(0, BLOCK)
            inside = col < n_vocab
            x = tl.load(logits + row * stride + col, mask=inside, other=neg)
            sup = tl.load(suppress + col, mask=inside, other=1) != 0
            is_ts = col >= ts
            allowed = inside & ~sup
            # text: per-row rule; eot and the other specials: never on the first step;
            # timestamps: the row's allowed range
            allowed &= tl.where(col < eot, ok_text,
                                tl.where(is_ts, (col >= lo_r) & (col <= hi_r), ~is_first))
            x = tl.where(allowed, x, neg)
            xt = tl.where(is_ts, neg, x)
            xs = tl.where(is_ts, x, neg)
            # text columns: running max, first argmax, sum of exp relative to the max
            bm = tl.max(xt, axis=0)
            ba = tl.argmax(xt, axis=0) + start
            new_m = tl.maximum(m_t, bm)
            safe = tl.where(new_m == neg, 0.0, new_m)
            s_t = s_t * tl.exp(m_t - safe) + tl.sum(tl.exp(xt - safe), axis=0)
            a_t = tl.where(bm > m_t, ba, a_t)
            m_t = new_m
            bm = tl.max(xs, axis=0)
            ba = tl.argmax(xs, axis=0) + start
            new_m = tl.maximum(m_s, bm)
            safe = tl.where(new_m == neg, 0.0, new_m)
            s_s = s_s * tl.exp(m_s - safe) + tl.sum(tl.exp(xs - safe), axis=0)
            a_s = tl.where(bm > m_s, ba, a_s)
            m_s = new_m
        lse_t = tl.where(m_t == neg, neg, m_t + tl.log(s_t))
        lse_s = tl.where(m_s == neg, neg, m_s + tl.log(s_s))
        force = ~is_first & (lse_s > m_t)
        text_wins = m_t >= m_s
        both = tl.maximum(lse_t, lse_s)
        safe = tl.where(both == neg, 0.0, both)
        lse_all = safe + tl.log(tl.exp(lse_t - safe) + tl.exp(lse_s - safe))
        tok = tl.where(force, a_s, tl.where(text_wins, a_t, a_s))
        lp = tl.where(force, m_s - lse_s, tl.where(text_wins, m_t, m_s) - lse_all)
        tl.store(out_tok + row, tok.to(tl.int64))
        tl.store(out_lp + row, lp)


def greedy_select(logits: torch.Tensor, suppress: torch.Tensor, text_ok: torch.Tensor,
                  lo: torch.Tensor, hi: torch.Tensor, first: torch.Tensor, eot: int,
                  timestamp_begin: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits float32 [n, V] (rows contiguous), suppress bool [V], per row: text_ok bool,
    lo/hi int64 (allowed timestamp columns), first bool -> (token int64 [n], log-prob [n])."""
    n, n_vocab = logits.shape
    tok = torch.empty(n, dtype=torch.long, device=logits.device)
    lp = torch.empty(n, dtype=torch.float32, device=logits.device)
    _greedy_kernel[(n,)](logits, logits.stride(0), suppress, text_ok, lo, hi, first, tok, lp,
                         eot, timestamp_begin, n_vocab=n_vocab, BLOCK=BLOCK)
    return tok, lp
