"""Token choice under Whisper's timestamp rules in one pass over the logits (Triton).

``BatchRules.select`` (models/batched_decode.py) builds five [rows, vocab] masks, masks the
logits, reduces them four times (timestamp log-sum-exp, text max, argmax, log-sum-exp): about
ten passes over [rows, 51864] per step, a third of a decode step at 2048 rows. The masks have a
simple shape per row, so here one program per row reads its logits once and keeps running
figures for text and for timestamp columns (max, first argmax, sum of exponentials and, for a
sampled row, the Gumbel-max draw), then applies the forced-timestamp rule and writes the token
and its log-probability.

Row rules (the same as the torch path, which stays the reference and the CPU path):
* columns < eot: masked on a row's first step, while a timestamp pair is open, or if suppressed;
* eot ≤ column < timestamp_begin: masked on the first step or if suppressed;
* timestamp columns: allowed in [lo, hi] per row (first step: up to max_initial_timestamp;
  after a closed pair: none; otherwise not before the last timestamp) and if not suppressed;
* timestamps are forced when their total probability beats every text token (not on the first
  step); ties resolve to the lowest index, as ``torch.argmax`` does.
* a row with temperature t > 0 samples: argmax of logits / t + Gumbel noise over the allowed
  columns (after the forcing rule), which draws from softmax(logits / t). The noise comes from
  Philox keyed by a device-side counter, so a CUDA graph replay draws new numbers.
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
    def _fold(x, g, m, s, a, gm, ga, gx, start, SAMPLE: tl.constexpr, BLOCK: tl.constexpr):
        """Fold one block of masked logits ``x`` into the running max ``m``, first argmax ``a``
        and sum of exp(x - m) ``s``; when sampling, also the block's Gumbel scores ``g`` into
        the running best score ``gm`` with its column ``ga`` and logit ``gx``."""
        neg = float("-inf")
        bm = tl.max(x, axis=0)
        ba = tl.argmax(x, axis=0) + start
        new_m = tl.maximum(m, bm)
        safe = tl.where(new_m == neg, 0.0, new_m)
        s = s * tl.exp(m - safe) + tl.sum(tl.exp(x - safe), axis=0)
        a = tl.where(bm > m, ba, a)
        if SAMPLE:
            bg = tl.max(g, axis=0)
            bi = tl.argmax(g, axis=0)
            bx = tl.sum(tl.where(tl.arange(0, BLOCK) == bi, x, 0.0), axis=0)
            better = bg > gm
            ga = tl.where(better, bi + start, ga)
            gx = tl.where(better, bx, gx)
            gm = tl.maximum(gm, bg)
        return new_m, s, a, gm, ga, gx

    @triton.jit
    def _select_kernel(logits, stride, suppress, text_ok, lo, hi, first, temperature, seed_ptr,
                       out_tok, out_lp, eot, ts, n_vocab: tl.constexpr, SAMPLE: tl.constexpr,
                       BLOCK: tl.constexpr):
        row = tl.program_id(0)
        ok_text = tl.load(text_ok + row) != 0
        is_first = tl.load(first + row) != 0
        lo_r = tl.load(lo + row)
        hi_r = tl.load(hi + row)
        neg = float("-inf")
        if SAMPLE:
            temp = tl.load(temperature + row)
            seed = tl.load(seed_ptr)
            inv_t = 1.0 / tl.maximum(temp, 1e-6)
        m_t = neg
        s_t = 0.0
        a_t = 0
        g_t = neg
        ga_t = 0
        gx_t = neg
        m_s = neg
        s_s = 0.0
        a_s = 0
        g_s = neg
        ga_s = 0
        gx_s = neg
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
            if SAMPLE:
                u = tl.rand(seed, row * n_vocab + col)
                gumbel = -tl.log(-tl.log(tl.maximum(u, 1e-20)))
                g = tl.where(temp > 0, x * inv_t + gumbel, x)
            else:
                g = x
            m_t, s_t, a_t, g_t, ga_t, gx_t = _fold(tl.where(is_ts, neg, x),
                                                   tl.where(is_ts, neg, g),
                                                   m_t, s_t, a_t, g_t, ga_t, gx_t, start,
                                                   SAMPLE, BLOCK)
            m_s, s_s, a_s, g_s, ga_s, gx_s = _fold(tl.where(is_ts, x, neg),
                                                   tl.where(is_ts, g, neg),
                                                   m_s, s_s, a_s, g_s, ga_s, gx_s, start,
                                                   SAMPLE, BLOCK)
        lse_t = tl.where(m_t == neg, neg, m_t + tl.log(s_t))
        lse_s = tl.where(m_s == neg, neg, m_s + tl.log(s_s))
        force = ~is_first & (lse_s > m_t)
        both = tl.maximum(lse_t, lse_s)
        safe = tl.where(both == neg, 0.0, both)
        lse_all = safe + tl.log(tl.exp(lse_t - safe) + tl.exp(lse_s - safe))
        if SAMPLE:
            # a greedy row's score is its logit, so the same choice covers both kinds of row
            text_wins = g_t >= g_s
            tok = tl.where(force, ga_s, tl.where(text_wins, ga_t, ga_s))
            x_tok = tl.where(force, gx_s, tl.where(text_wins, gx_t, gx_s))
        else:
            text_wins = m_t >= m_s
            tok = tl.where(force, a_s, tl.where(text_wins, a_t, a_s))
            x_tok = tl.where(force, m_s, tl.where(text_wins, m_t, m_s))
        lp = x_tok - tl.where(force, lse_s, lse_all)
        tl.store(out_tok + row, tok.to(tl.int64))
        tl.store(out_lp + row, lp)


def select(logits: torch.Tensor, suppress: torch.Tensor, text_ok: torch.Tensor,
           lo: torch.Tensor, hi: torch.Tensor, first: torch.Tensor, eot: int,
           timestamp_begin: int, temperature: torch.Tensor | None = None,
           seed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits float32 [n, V] (rows contiguous), suppress bool [V], per row: text_ok bool,
    lo/hi int64 (allowed timestamp columns), first bool -> (token int64 [n], log-prob [n]).

    With ``temperature`` [n] float32 and ``seed`` (int32 [1] on the device, advanced by the
    caller between steps), rows with temperature > 0 sample; the others stay greedy."""
    n, n_vocab = logits.shape
    tok = torch.empty(n, dtype=torch.long, device=logits.device)
    lp = torch.empty(n, dtype=torch.float32, device=logits.device)
    sample = temperature is not None
    if sample and seed is None:
        raise ValueError("sampling needs a device-side seed")
    _select_kernel[(n,)](logits, logits.stride(0), suppress, text_ok, lo, hi, first,
                         temperature if sample else lp, seed if sample else tok, tok, lp, eot,
                         timestamp_begin, n_vocab=n_vocab, SAMPLE=sample, BLOCK=BLOCK)
    return tok, lp


def greedy_select(logits: torch.Tensor, suppress: torch.Tensor, text_ok: torch.Tensor,
                  lo: torch.Tensor, hi: torch.Tensor, first: torch.Tensor, eot: int,
                  timestamp_begin: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The greedy choice for every row (see ``select``)."""
    return select(logits, suppress, text_ok, lo, hi, first, eot, timestamp_begin)
