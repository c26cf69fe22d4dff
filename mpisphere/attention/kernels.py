"""The local arithmetic of attention on the sphere: projections, q/k normalisation, the quadrature-weighted softmax.

No MPI. Heads are an axis: queries ``(B, H, dk, ...)``, keys ``(B, H, dk,
N)``, values ``(B, H, dv, N)``. The softmax of an output point over its
input points ``n`` weighs each by its ring's quadrature weight ``w_n``
(torch-harmonics' convention): ``y = sum_n p_n v_n`` with
``p_n = w_n exp(s_n) / sum_m w_m exp(s_m)``, ``s_n = q . k_n``.

The scores are never held for a whole tile: keys come in blocks (the arcs of
one ring, or a block of the global keys) and a running maximum, sum and
weighted values are carried from block to block (the online softmax). The
forward keeps ``lse = max + log(sum)`` per output point, so the backward
recomputes each block's probabilities as ``w_n exp(s_n - lse)`` and needs
no second pass over the keys for the normalisation: with ``D = dy . y``,
``ds_n = p_n (dy . v_n - D)``, ``dq = sum_n ds_n k_n``, ``dk_n += ds_n q``
and ``dv_n += p_n dy``.
"""

import numpy

from .. import backend

__all__ = ["project", "project_adjoint", "rms_norm", "rms_norm_adjoint", "OnlineSoftmax", "block_scores",
           "softmax_backward"]


def project(weight, bias, x):
    """``weight @ x + bias``: ``weight`` ``(O, C)``, ``x`` ``(B, C, N)`` -> ``(B, O, N)`` (a 1 x 1 convolution)."""
    xp = backend.array_module(x)
    out = xp.matmul(weight, x)
    if bias is not None:
        out += bias[:, None]
    return out


def project_adjoint(weight, x, y_bar, bias=True):
    """The gradients of ``<y_bar, project(weight, bias, x)>``: ``(x_bar, weight_bar, bias_bar)`` (this rank's parts)."""
    xp = backend.array_module(x)
    x_bar = xp.matmul(weight.T, y_bar)
    weight_bar = xp.matmul(y_bar, x.swapaxes(-1, -2)).sum(axis=0)
    bias_bar = y_bar.sum(axis=(0, 2)) if bias else None
    return x_bar, weight_bar, bias_bar


def rms_norm(x, gain, heads):
    """torch's ``rms_norm`` over each head's channels with weight ``1 + gain``: ``x`` ``(B, C, N)``.

    Returns the normalised ``(B, C, N)`` and the reciprocal root mean squares ``(B, H, 1, N)`` (for the adjoint).
    """
    xp = backend.array_module(x)
    b, c, n = x.shape
    grouped = x.reshape(b, heads, c // heads, n)
    eps = numpy.finfo(x.dtype).eps
    inverse = 1.0 / xp.sqrt((grouped * grouped).mean(axis=2, keepdims=True) + eps)
    return (grouped * inverse * (1.0 + gain)[:, None]).reshape(b, c, n), inverse


def rms_norm_adjoint(x, gain, inverse, y_bar, heads):
    """The gradients of ``<y_bar, rms_norm(x, gain)>``: ``(x_bar, gain_bar)``, shapes of ``x`` and ``gain``."""
    b, c, n = x.shape
    grouped = x.reshape(b, heads, c // heads, n)
    normalised = grouped * inverse
    bar = y_bar.reshape(grouped.shape)
    gain_bar = (bar * normalised).sum(axis=(0, 1, 3))
    scaled = bar * (1.0 + gain)[:, None]
    x_bar = inverse * (scaled - normalised * (scaled * normalised).mean(axis=2, keepdims=True))
    return x_bar.reshape(b, c, n), gain_bar


class OnlineSoftmax:
    """The running state of one block of output points: maximum, sum and weighted values, block after block.

    Parameters
    ----------
    xp : module
    lead : tuple
        ``(B, H)``.
    points : int
        The output points of the block.
    dv : int
        Value channels per head.
    dtype : dtype
    """

    def __init__(self, xp, lead, points, dv, dtype):
        self.xp = xp
        self.maximum = xp.full(lead + (points,), -numpy.inf, dtype=dtype)
        self.total = xp.zeros(lead + (points,), dtype=dtype)
        self.values = xp.zeros(lead + (dv, points), dtype=dtype)

    @classmethod
    def over(cls, xp, maximum, total, values):
        """A state kept in the caller's arrays (views of a larger block's), updated in place."""
        state = cls.__new__(cls)
        state.xp, state.maximum, state.total, state.values = xp, maximum, total, values
        return state

    def add(self, scores, weights, weighted):
        """One block of keys: ``scores`` ``(B, H, n, points)``, ``weights`` (quadrature: ``(n, 1)`` or a scalar),
        ``weighted(p)``: the block's values weighted by ``p`` ``(B, H, n, points)``, ``(B, H, dv, points)``."""
        xp = self.xp
        new = xp.maximum(self.maximum, scores.max(axis=2))
        factor = xp.exp(self.maximum - new)
        p = xp.exp(scores - new[:, :, None]) * weights
        self.total *= factor
        self.total += p.sum(axis=2)
        self.values *= factor[:, :, None]
        self.values += weighted(p)
        self.maximum[...] = new

    def result(self):
        """``(y, lse)``: the attention ``(B, H, dv, points)`` and ``max + log(sum)`` ``(B, H, points)``."""
        return self.values / self.total[:, :, None], self.maximum + self.xp.log(self.total)


def block_scores(query, keys):
    """``s[b, h, n, q] = query[b, h, :, q] . keys[b, h, :, n]``: ``(B, H, n, points)``."""
    xp = backend.array_module(query)
    return xp.matmul(keys.swapaxes(-1, -2), query)


def softmax_backward(scores, weights, lse, dp, d):
    """One block's probabilities and score cotangents (see the module docstring): ``(ds, p)``.

    ``dp[b, h, n, q] = y_bar[q] . v_n``; ``d = y_bar . y`` per output point.
    """
    xp = backend.array_module(scores)
    p = xp.exp(scores - lse[:, :, None]) * weights
    return p * (dp - d[:, :, None]), p
