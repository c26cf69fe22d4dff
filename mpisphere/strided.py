"""Index arrays read as strided views: arithmetic runs of the sources each target reads (no MPI).

A stencil whose targets read ``source[start[t]]`` is, on a regular grid, a
few arithmetic progressions: reading them as strided views (``x[a:b:step]``)
costs one vectorised pass each, where a gather (``take``) copies element by
element. The DISCO bands and the resampling stencils read their sources so.
"""

import numpy

__all__ = ["strided_pieces"]


def _runs(start, rows):
    """``[(t0, t1, first, step)]``: the target rows ``rows[t0:t1]`` read ``first + step * i``, arithmetic runs."""
    runs, i, n = [], 0, len(rows)
    while i < n:
        step = int(start[rows[i + 1]] - start[rows[i]]) if i + 1 < n else 0
        k = i + 1
        while k < n and start[rows[k]] - start[rows[k - 1]] == step and step >= 0:
            k += 1
        if step < 0:
            step, k = 0, i + 1
        runs.append((i, k, int(start[rows[i]]), step))
        i = k
    return runs


def strided_pieces(start, most=6):
    """How ``source[start[t]]`` for every target ``t`` is read as strided views.

    Parameters
    ----------
    start : ndarray of int, ``(T,)``
        The source index each target reads.
    most : int
        The most views per class of targets.

    Returns
    -------
    list of (slice, int, int) or None
        ``[(targets, first, step)]``: the targets ``targets`` (a slice) read
        ``first, first + step, ...`` (``step`` 0: all read ``first``). The
        targets are split into ``q`` interleaved classes (``t = r, r + q,
        ...``; ``q`` up to 4: a grid twice as fine reads each source twice)
        and each class into runs whose sources grow by a fixed step; a
        handful of views then covers every target, whatever the resolution.
        None when no ``q`` gives at most ``most`` views per class (the
        caller then gathers).
    """
    n = len(start)
    for q in range(1, 5):
        pieces = []
        for r in range(min(q, n)):
            rows = numpy.arange(r, n, q)
            runs = _runs(start, rows)
            if len(runs) > most:
                break
            pieces += [(slice(r + q * t0, r + q * (t1 - 1) + 1, q), first, step) for t0, t1, first, step in runs]
        else:
            return pieces
    return None
