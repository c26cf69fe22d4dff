"""Small helpers shared by the tests (no fixtures here; see conftest.py)."""

import contextlib
import re

import numpy
import pytest
from mpi4py import MPI

from mpisphere import ProcessGrid
from mpisphere.partition import chunk_slice
from mpisphere.testing import grid_shapes

FLOAT_TOL = {
    numpy.dtype(numpy.float64): 1e-13,
    numpy.dtype(numpy.complex128): 1e-13,
    numpy.dtype(numpy.float32): 1e-5,
    numpy.dtype(numpy.complex64): 1e-5,
    numpy.dtype(numpy.float16): 5e-3,
}


def random_array(rng, shape, dtype):
    """Normal random numbers of ``dtype`` (complex: independent real and imaginary parts)."""
    dtype = numpy.dtype(dtype)
    x = rng.standard_normal(shape)
    if dtype.kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def chunk(x, axis, parts, index):
    """Chunk ``index`` of ``x`` split along ``axis`` into ``parts`` (the split every operator uses)."""
    axis %= x.ndim
    return x[(slice(None),) * axis + (chunk_slice(x.shape[axis], parts, index),)]


def rank_rng(comm, seed=7):
    """A generator that differs per rank (for distributed test data)."""
    return numpy.random.default_rng([seed, comm.Get_rank(), comm.Get_size()])


def every_rank(size):
    """How an error found on every rank names them: ``rank 0 of 1``, ``ranks 0, 1 of 2``, ``ranks 0-3 of 4``."""
    if size == 1:
        return "rank 0 of 1"
    if size == 2:
        return "ranks 0, 1 of 2"
    return f"ranks 0-{size - 1} of {size}"


def whole_message(exc):
    """An mpisphere error's whole message on every rank (one rank prints it; the others print one line)."""
    return getattr(exc, "mpisphere_message", str(exc))


@contextlib.contextmanager
def raises(kind, match=None):
    """``pytest.raises`` matched against the whole message, which every rank keeps (:func:`whole_message`).

    An error raised on every rank by an agreement is printed in full by one
    rank; the others' ``str()`` is one line naming it.
    """
    with pytest.raises(kind) as caught:
        yield caught
    if match is not None:
        text = whole_message(caught.value)
        assert re.search(match, text), f"Regex pattern did not match.\n  Expected regex: {match!r}\n  Actual: {text!r}"


def quoted(text, rank, size):
    """A regex for ``text`` as this rank's own line of an error quoting each rank (the first four are quoted)."""
    return rf"rank {rank} of {size}: {text}" if rank < 4 else rf"\| and {size - 4} more ranks?$"


def tile(f, grid):
    """This rank's tile of the whole field(s) ``f`` (..., nlat, nlon), C-contiguous."""
    lat, lon = grid.local_slices(*f.shape[-2:])
    return numpy.ascontiguousarray(f[..., lat, lon])


def block(c, grid, lmax, mmax):
    """This rank's block of the whole coefficients ``c`` (..., lmax, mmax) in the contiguous order layout."""
    return c[..., chunk_slice(lmax, grid.npolar, grid.polar_rank), chunk_slice(mmax, grid.nazimuth, grid.azimuth_rank)]


def sub_grids(comm):
    """Grids of every shape on the first ``k`` ranks of ``comm``, ``k = 1 .. comm.size``; ``None`` elsewhere.

    Collective over ``comm``: every rank iterates the same sequence (a grid
    on the ranks in it, ``None`` on the ranks left out), so a loop over it
    reads a store written on ``comm`` back on every smaller grid too.
    """
    for k in range(1, comm.size + 1):
        sub = comm.Split(0 if comm.rank < k else MPI.UNDEFINED)
        for shape in grid_shapes(k) + ([(1, k)] if k > 1 and (1, k) not in grid_shapes(k) else []):
            if sub == MPI.COMM_NULL:
                yield None
            else:
                with ProcessGrid(sub, *shape) as grid:
                    yield grid
        if sub != MPI.COMM_NULL:
            sub.Free()


def message_sizes(monkeypatch):
    """A list that fills with the size in bytes of every message a neighbour round (a halo's) sends from now on."""
    from mpisphere.halo.round import NeighbourRound
    sizes = []
    post = NeighbourRound._post

    def spy(self, out, dest, tag, request=None):
        sizes.append(int(out.size))
        return post(self, out, dest, tag, request)

    monkeypatch.setattr(NeighbourRound, "_post", spy)
    return sizes


def padded_reference(field, rows, cols):
    """The global field with zero rows past the poles and periodic longitude columns (a halo's serial reference)."""
    nlat, nlon = field.shape[-2:]
    out = numpy.zeros(field.shape[:-2] + (nlat + 2 * rows, nlon + 2 * cols), field.dtype)
    columns = (numpy.arange(nlon + 2 * cols) - cols) % nlon
    out[..., rows:rows + nlat, :] = field[..., :, columns]
    return out


def expected_tile(grid, field, rows, cols):
    """This rank's padded tile of :func:`padded_reference`: what a halo update must give it."""
    lat, lon = grid.local_slices(*field.shape[-2:])
    return padded_reference(field, rows, cols)[..., lat.start:lat.stop + 2 * rows, lon.start:lon.stop + 2 * cols]


def near_ranks(grid, rank):
    """Grid ranks in the 3x3 neighbourhood of ``rank`` (periodic in azimuth): the ranks a halo mistake reaches."""
    p0, a0 = divmod(rank, grid.nazimuth)
    return {p * grid.nazimuth + (a0 + da) % grid.nazimuth
            for p in (p0 - 1, p0, p0 + 1) if 0 <= p < grid.npolar for da in (-1, 0, 1)}


def await_failure_note(grid):
    """Wait until a halo failure's note (mpisphere.agreement.failures) has reached this rank.

    A rank the failure did not reach raises at the end of its first call that begins after the note arrived;
    a test waits for it so that its verdict does not depend on how fast the note travels.
    """
    import time
    # the call that failed may have read the note already (at its end), and kept it for the next call
    while not grid.cart.failures.noted():
        time.sleep(0.001)


def the_call_after_a_failure(grid, near, call):
    """Every rank's next call after a halo call that raised on the ranks ``near`` the mistake: it completes on every
    rank; the ranks farther away (their call returned normally) first wait for the failure's note, then raise at
    its end for the earlier call. Returns the call's result on the near ranks, ``None`` on the others."""
    if grid.rank in near:
        return call()
    await_failure_note(grid)
    with raises(ValueError, match=r"failed on rank \d+ .* in an earlier call"):
        call()
    return None


def free_after_a_failure(grid, near, kind=ValueError):
    """Free ``grid`` after a halo call that raised on the ranks ``near`` the mistake: the grid is freed on every
    rank, and the ranks farther away (their call returned normally) raise in ``free``, which the grid's agreement
    told of the failure (whether or not its note has arrived)."""
    if grid.rank in near:
        grid.free()
        return
    with raises(kind, match=r"^ProcessGrid.free: rank \d+ of \d+: .* failed on rank \d+ .* in an earlier call.*"
                            r"\(the grid is freed on every rank\)"):
        grid.free()
    assert grid.freed
