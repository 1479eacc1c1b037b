"""Dynamic time warping for word timings: the cheapest monotonic path through a cost matrix.

Whisper's word timings walk a path through each window's alignment matrix (tokens x frames;
``models.alignment``). :func:`dtw_paths` sweeps many matrices at once on the CPU with numpy
(the CPU recogniser's path, one matrix an update); :func:`dtw_paths_on_device` does the same
sweep with torch where the matrices were made, so a GPU round's matrices never leave the device:
only the steps come back (a byte a cell), and the host walks the paths back. On a GPU round of
44 windows the numpy sweep was the largest host cost of the alignment stage (MEASUREMENTS,
"The GPU recogniser waits asleep; where a round's time goes").

The sweep, both ways: a row's cells depend on each other only through right steps, and a run
of right steps from column k to j costs the row's costs k+1..j; so with C the row's running sum
and e[j] the cheaper of entering cell j from the row above (diagonal or down),
acc[j] = C[j] + min over k <= j of (e[k] - C[k - 1]), a running minimum. N vectorised steps
instead of the N + M anti-diagonals of the cell-by-cell recurrence; the sums differ from the
recurrence's by rounding only. Ties go to the diagonal, then down, then right, as Whisper's DTW
breaks them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

Reader = Callable[[list[torch.Tensor]], list[torch.Tensor]]

# cells a device sweep takes at once (rows x tokens x frames, padded): bounds its memory,
# ~40 bytes a cell at the peak (three float64 planes, the steps, their entries)
DEVICE_CELLS = 1 << 22
DIAGONAL, DOWN, RIGHT = 0, 1, 2


def dtw_path(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cheapest monotonic path through ``cost`` [N, M] (:func:`dtw_paths` of one matrix)."""
    return dtw_paths([cost])[0]


def dtw_paths(costs: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The cheapest path through each cost matrix [N, M], as (rows, columns) of its cells in
    path order, row -1 for the columns before the first row's. One sweep over the rows for all
    matrices at once (padded to the largest; a padded cell is never on a path)."""
    if not costs:
        return []
    b = len(costs)
    n = max(c.shape[0] for c in costs)
    m = max(c.shape[1] for c in costs)
    # the matrices along the last axis: the running sums and minima run down axis 1 with
    # every matrix's column in one contiguous row (along a last axis they are ~20x slower)
    cost = np.zeros((n, m, b))
    for k, c in enumerate(costs):
        cost[: c.shape[0], : c.shape[1], k] = c
    run = np.cumsum(cost, axis=1)  # every row's running sum C
    prev = np.full((m + 1, b), np.inf)  # acc of the row above; row 0: only (0, 0) reachable
    prev[0] = 0.0
    trace = np.zeros((n + 1, m + 1, b), dtype=np.int8)
    for i in range(1, n + 1):
        diag, up = prev[:-1], prev[1:]
        is_up = up < diag
        enter = np.where(is_up, up, diag)  # e[j], columns 1..m
        v = enter - (run[i - 1] - cost[i - 1])  # e[j] - C[j - 1]
        best = np.minimum.accumulate(v, axis=0)
        right = np.zeros((m, b), dtype=bool)
        np.less(best[:-1], v[1:], out=right[1:])  # the run from the left is strictly cheaper
        trace[i, 1:] = np.where(right, RIGHT, is_up)
        prev = np.empty((m + 1, b))
        prev[0] = np.inf
        np.add(run[i - 1], best, out=prev[1:])
    col = np.arange(m + 1, dtype=np.int16)[None, :, None]
    entry = np.maximum.accumulate(np.where(trace != RIGHT, col, 0), axis=1)
    return _walk_back(trace, entry, [c.shape for c in costs])


@torch.inference_mode()
def dtw_paths_on_device(costs: list[torch.Tensor], read: Reader | None = None,
                        negate: bool = False) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`dtw_paths` of matrices on one device, swept there in float64, in groups of at most
    ``DEVICE_CELLS`` padded cells; the steps and their run entries come back in one ``read`` a
    group (default: ``.cpu()``; the batched engine's ``to_host`` waits asleep). ``negate``: the
    costs are the matrices' negation (alignment weights, which the path maximises). The same
    paths as :func:`dtw_paths` up to the rounding of the running sums."""
    read = read or (lambda tensors: [t.cpu() for t in tensors])
    out: list[tuple[np.ndarray, np.ndarray]] = []
    group: list[torch.Tensor] = []
    n = m = 0  # the group's padded shape
    for c in costs:
        n_c, m_c = max(n, c.shape[0]), max(m, c.shape[1])
        if group and (len(group) + 1) * n_c * m_c > DEVICE_CELLS:
            out += _device_group(group, read, negate)
            group, n_c, m_c = [], c.shape[0], c.shape[1]
        group.append(c)
        n, m = n_c, m_c
    return out + (_device_group(group, read, negate) if group else [])


def _device_group(costs: list[torch.Tensor], read: Reader, negate: bool
                  ) -> list[tuple[np.ndarray, np.ndarray]]:
    """One group's sweep; a kernel launch is the cost here (some 8 us of host time each, the
    GPU's share a few us), so each matrix is one copy and each row six launches."""
    b, dev = len(costs), costs[0].device
    n = max(c.shape[0] for c in costs)
    m = max(c.shape[1] for c in costs)
    # each matrix's row contiguous here (a scan along a last axis is the fast one on a GPU)
    cost = torch.zeros((n, b, m), dtype=torch.float64, device=dev)
    for k, c in enumerate(costs):
        cost[: c.shape[0], k, : c.shape[1]] = c
    if negate:
        cost.neg_()
    run = torch.cumsum(cost, dim=2)
    before = cost.neg_().add_(run)  # C[j - 1], in the costs' place
    inf = float("inf")
    prev = torch.full((b, m + 1), inf, dtype=torch.float64, device=dev)
    prev[:, 0] = 0.0
    spare = [torch.full((b, m + 1), inf, dtype=torch.float64, device=dev) for _ in range(2)]
    down = torch.zeros((n + 1, b, m + 1), dtype=torch.bool, device=dev)  # the steps, as flags
    right = torch.zeros((n + 1, b, m + 1), dtype=torch.bool, device=dev)
    for i in range(1, n + 1):
        diag, up = prev[:, :-1], prev[:, 1:]
        torch.lt(up, diag, out=down[i, :, 1:])
        v = torch.minimum(up, diag).sub_(before[i - 1])  # entered from above: e[j] - C[j - 1]
        best = torch.cummin(v, dim=1).values
        torch.lt(best[:, :-1], v[:, 1:], out=right[i, :, 2:])
        prev = spare[i % 2]  # column 0 stays infinite below row 0
        torch.add(run[i - 1], best, out=prev[:, 1:])
    trace = torch.where(right, RIGHT, down.to(torch.int8))
    col = torch.arange(m + 1, dtype=torch.int16, device=dev)
    entry = torch.cummax(torch.where(right, 0, col), dim=2).values
    # the walk's layout, [N + 1, M + 1, b]
    host_trace, host_entry = read([trace.transpose(1, 2).contiguous(),
                                   entry.transpose(1, 2).contiguous()])
    return _walk_back(host_trace.numpy(), host_entry.numpy(), [tuple(c.shape) for c in costs])


def _walk_back(trace: np.ndarray, entry: np.ndarray, shapes: list[tuple[int, int]]
               ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each matrix's path from (N, M) back to (0, 0), as (rows, columns) of its cells in path
    order (a cell (i, j) of ``trace`` [N + 1, M + 1, b] is cost cell (i - 1, j - 1)).
    ``entry``: each cell's last column at or before it whose step is not right.

    Every diagonal or down step leaves a row, so all paths walk up their rows together, one
    row a step: in a row, a run of right steps ends at the row's ``entry`` of the current
    column. Column 0 is left downwards; a path in row 0 walks left to (0, 0)."""
    b = trace.shape[2]
    ns = np.array([s[0] for s in shapes])
    j = np.array([s[1] for s in shapes])
    first = np.zeros((b, trace.shape[0]), dtype=np.int64)  # each row's first column on path
    last = np.zeros_like(first)  # and its last
    every = np.arange(b)
    for step in range(int(ns.max(initial=0))):
        i = ns - step
        on = i > 0
        k, ii = every[on], i[on]
        jj = j[on]
        at = entry[ii, jj, k].astype(np.int64)
        first[k, ii], last[k, ii] = at, jj
        diag = trace[ii, at, k] == DIAGONAL
        j[on] = np.where(at == 0, 0, np.where(diag, at - 1, at))
    out = []
    for q, (n, _) in enumerate(shapes):
        lo, hi = first[q, 1 : n + 1], last[q, 1 : n + 1]
        counts = hi - lo + 1
        start = np.cumsum(counts) - counts
        rows = np.concatenate([np.full(j[q], -1), np.repeat(np.arange(n), counts)])
        cols = np.concatenate([np.arange(j[q]), np.arange(counts.sum()) - np.repeat(start, counts)
                               + np.repeat(lo, counts) - 1])
        out.append((rows, cols))
    return out
