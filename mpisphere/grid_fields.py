"""A process grid's own whole-field movement: ``ProcessGrid.scatter`` and ``gather`` of regular fields.

Unlike a :class:`~mpisphere.tiling.Tiling`'s, these calls are not told the
field's extents: ``scatter`` learns them from root's field, ``gather`` from
the tiles (which must fit together as the ``split_sizes`` tiles of one
field). Both then move the field as the tiling of those extents does
(``scatter_parts``, ``gather_parts``),
with the same preludes (``check_root``,
``check_whole``, ``check_part``).
"""

import warnings

import numpy

from . import collectives
from .agreement import Call, InputError
from .partition import split_sizes
from .tiling import RegularTiling, check_part, check_root, check_whole, gather_parts, scatter_parts

__all__ = ["scatter_field", "gather_tiles", "fit_tiles", "check_alive"]


def check_alive(grid):
    """A RuntimeError when ``grid`` was freed (the one message of a grid used after ``free()``)."""
    if grid.freed:
        raise RuntimeError("ProcessGrid: used after free(); its communicators no longer exist")


def scatter_field(grid, field, root):
    """``ProcessGrid.scatter``: this rank's tile of the whole ``field`` ``(..., nlat, nlon)`` on ``root``."""
    check_alive(grid)
    call = Call(grid.cart, "ProcessGrid.scatter")
    with call.local():
        root = check_root(grid, root, "scatter")
        if grid.rank == root:
            check_whole(field, 2, root)
            try:
                grid._check_extents(field.shape[-2], field.shape[-1], "scatter")
            except ValueError as exc:
                raise InputError(str(exc).removeprefix("ProcessGrid.scatter: ")) from None
    call.agree(root=root)
    meta = (tuple(field.shape), numpy.dtype(field.dtype).str) if grid.rank == root else None
    shape, dtype = call.share(meta, root=root)
    return scatter_parts(RegularTiling(grid, shape[-2], shape[-1]), call, field, shape, dtype, root)


def gather_tiles(grid, tile, root, warn_balanced):
    """``ProcessGrid.gather``: the whole field on ``root`` from every rank's ``tile`` (``None`` elsewhere).

    ``warn_balanced``: warn when ``tile`` has the shape and dtype of a
    balanced transform's coefficient block (whose columns are not in order).
    """
    check_alive(grid)
    who = "ProcessGrid.gather"
    call = Call(grid.cart, who)
    with call.local():
        root = check_root(grid, root, "gather")
        check_part(tile, 2, "tile, an array with at least 2 axes")
    call.agree(root=root)
    if warn_balanced and (tuple(tile.shape[-2:]), numpy.dtype(tile.dtype).str) in grid.balanced_blocks:
        warnings.warn(f"{who}: this array has the shape and dtype of the coefficient block of a transform "
                      "built with orders='balanced' on this grid, whose columns are not the contiguous "
                      "orders grid.gather assumes: the gathered array would hold them in the wrong places. "
                      "Gather coefficients with sht.gather_coefficients(block) (either order layout)",
                      UserWarning, stacklevel=4)
    everyone = collectives.allgather_object(grid.cart, (tuple(tile.shape), numpy.dtype(tile.dtype).str))
    shape = fit_tiles(grid, everyone)
    return gather_parts(RegularTiling(grid, shape[-2], shape[-1]), call, tile, root)


def fit_tiles(grid, everyone):
    """The whole shape from every rank's ``(shape, dtype)``; a ValueError (the same on every rank) if they do not
    fit together as the ``split_sizes`` tiles of one field."""
    lead, dtype = everyone[0][0][:-2], everyone[0][1]
    odd = [r for r, (s, d) in enumerate(everyone) if s[:-2] != lead or d != dtype]
    if odd:
        raise ValueError(
            "ProcessGrid.gather: tiles disagree in leading shape or dtype: rank 0 has "
            f"{everyone[0][0]} {numpy.dtype(dtype).name}, "
            + ", ".join(f"rank {r} has {everyone[r][0]} {numpy.dtype(everyone[r][1]).name}" for r in odd))
    npolar, nazimuth = grid.npolar, grid.nazimuth
    heights = numpy.array([s[-2] for s, _ in everyone]).reshape(npolar, nazimuth)
    widths = numpy.array([s[-1] for s, _ in everyone]).reshape(npolar, nazimuth)
    problems = []
    # every row of the grid shares its height and every column its width ...
    for p in range(npolar):
        if len(set(heights[p])) > 1:
            problems.append(f"polar row {p} (ranks {p * nazimuth}..{(p + 1) * nazimuth - 1}) has "
                            f"tile heights {heights[p].tolist()}, which must be equal")
    for a in range(nazimuth):
        if len(set(widths[:, a])) > 1:
            problems.append(f"azimuth column {a} (ranks {a}, {a + nazimuth}, ...) has tile widths "
                            f"{widths[:, a].tolist()}, which must be equal")
    # ... and the heights and widths are split_sizes of their sums
    if not problems:
        for what, sizes, parts in (("heights", heights[:, 0], npolar), ("widths", widths[0], nazimuth)):
            total = int(sizes.sum())
            if total < parts or sizes.tolist() != split_sizes(total, parts):
                problems.append(f"tile {what} {sizes.tolist()} along the grid are not split_sizes({total}, "
                                f"{parts}) = {split_sizes(total, parts) if total >= parts else '(too few)'}")
    if problems:
        table = ", ".join(f"rank {r}: {tuple(s[-2:])}" for r, (s, _) in enumerate(everyone))
        raise ValueError("ProcessGrid.gather: the tiles do not fit together as one field: "
                         + "; ".join(problems) + f" (tiles: {table})")
    return lead + (int(heights[:, 0].sum()), int(widths[0].sum()))
