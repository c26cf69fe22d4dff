"""Neighbourhood attention forward + backward: mpisphere against torch-harmonics 0.9.3's serial CPU kernel, one run.

    mpiexec -n 1 python scripts/bench_attention.py --grids 1x1
    mpiexec -n 2 python scripts/bench_attention.py --grids 1x2,2x1
    mpiexec -n 4 python scripts/bench_attention.py --grids 2x2

Self-attention on ``--nlat`` x ``2 (nlat - 1)`` equiangular (default 91 x
180), ``--channels`` (32), ``--heads`` (4), ``--batch`` (2), float32, the
default cutoff. A step is the forward and the backward of every input and
parameter: mpisphere's ``DistributedNeighborhoodAttentionS2`` (``y =
layer(x); y.backward(y_bar)``; with ``--no-torch`` the operator's
``forward`` then ``gradients``, which runs the forward again); on one rank
also torch-harmonics' ``NeighborhoodAttentionS2``
(its compiled CPU kernel when available) ``y = layer(x); y.backward(y_bar)``,
timed in alternation round by round (the ratio is the median of per-round
ratios; its distributed module needs CUDA and NCCL, so there is none to run
here).

Bytes, per rank and layer (forward; the backward's adjoint sends as many):

* mpisphere: the input points this rank receives (``NeighbourGather``), times
  ``batch * channels * 4``;
* the minimum: the input points within the cutoff of any of this rank's
  output points that other ranks hold, counted here from great-circle
  distances (independent of the arcs), times the same;
* torch-harmonics' layout at the same split: the polar halo (``r`` rows
  each side) of the projected keys and values, then its ring passing every
  other azimuth rank's halo-extended keys and values, ``(k_channels +
  out_channels) * batch * 4`` bytes a point.

BLAS runs one thread a rank (``OMP_NUM_THREADS`` and the like default to 1
here, as in the test suite); torch-harmonics runs one thread too.

``--memory``: the peak of the memory NumPy allocates (``tracemalloc``)
during one step, beside this rank's tile and its received points (one grid
per launch).
"""

import argparse
import math
import os
import time
import tracemalloc

for _threads in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")   # one BLAS thread a rank: ranks share the cores (measured: 19x slower at
                                           # 1 x 2 on two cores with two OpenBLAS threads a rank)
import numpy  # noqa: E402 (after the thread counts)
from mpi4py import MPI  # noqa: E402

import mpisphere as ms  # noqa: E402
from benchtools import grid_shapes, measure_rounds, mpi_version  # noqa: E402
from mpisphere.attention import NeighborhoodAttentionS2  # noqa: E402
from mpisphere.quadrature import latitudes  # noqa: E402


def parameters(channels, rng):
    shapes = {n: (channels, channels) for n in ("q_weights", "k_weights", "v_weights", "proj_weights")}
    shapes.update({n: (channels,) for n in ("q_bias", "k_bias", "v_bias", "proj_bias")})
    return {n: (0.2 * rng.standard_normal(s)).astype(numpy.float32) for n, s in shapes.items()}


def minimum_points(op):
    """Input points within the cutoff of this rank's output points and held elsewhere (by distances)."""
    (nlat, nlon) = op.in_shape
    theta, _ = latitudes(nlat, "equiangular")
    phi = 2 * math.pi * numpy.arange(nlon) / nlon
    t, p = numpy.meshgrid(theta, phi, indexing="ij")
    xyz = numpy.stack([numpy.sin(t) * numpy.cos(p), numpy.sin(t) * numpy.sin(p), numpy.cos(t)], -1)
    lat, lon = op.tiling_out.slices()
    mine = xyz[lat, lon].reshape(-1, 3)
    reached = numpy.zeros(nlat * nlon, dtype=bool)
    cosine = math.cos((1 + 1e-3) * op.theta_cutoff)
    flat = xyz.reshape(-1, 3)
    for start in range(0, len(mine), 256):
        reached |= (mine[start:start + 256] @ flat.T >= cosine).any(axis=0)
    own = numpy.zeros((nlat, nlon), dtype=bool)
    own[op.tiling_in.slices()] = True
    return int((reached & ~own.reshape(-1)).sum())


def ring_points(op, grid):
    """torch-harmonics' layout: the polar halo rows and the ring of every other azimuth rank's extended tile."""
    lat, lon = op.tiling_out.slices()
    rows = [hi for ho in range(lat.start, lat.stop) for arcs in op.arcs.rows[ho] for hi, _, _ in arcs]
    tile_lat, _ = op.tiling_in.slices()
    r = max(0, tile_lat.start - min(rows), max(rows) + 1 - tile_lat.stop)
    h, w = op.tile_in
    halo = (min(r, tile_lat.start) + min(r, op.in_shape[0] - tile_lat.stop)) * w if grid.npolar > 1 else 0
    extended = h + (2 * r if grid.npolar > 1 else 0)
    ring = sum(extended * op.tiling_in.local_shape(grid.polar_rank * grid.nazimuth + a)[1]
               for a in range(grid.nazimuth) if a != grid.azimuth_rank)
    return halo + ring


def dropin_step(args, grid, x):
    """mpisphere's drop-in module on this rank's tile: ``y = layer(x); y.backward(ones)``."""
    import torch
    import mpisphere.torch_harmonics as thd
    torch.set_num_threads(1)
    shape = (args.nlat, 2 * (args.nlat - 1))
    layer = thd.DistributedNeighborhoodAttentionS2(args.channels, shape, shape, num_heads=args.heads,
                                                   process_grid=grid)
    thd.replicate(layer, grid)
    tile = torch.from_numpy(x).requires_grad_(True)

    def step():
        y = layer(tile)
        y.backward(torch.ones_like(y))
    return step


def torch_harmonics_step(args):
    import torch
    import torch_harmonics as th
    torch.set_num_threads(1)
    shape = (args.nlat, 2 * (args.nlat - 1))
    layer = th.NeighborhoodAttentionS2(args.channels, shape, shape, num_heads=args.heads)
    x = torch.randn(args.batch, args.channels, *shape, requires_grad=True)

    def step():
        y = layer(x)
        y.backward(torch.ones_like(y))
    return step, layer.optimized_kernel


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grids", default=None)
    parser.add_argument("--nlat", type=int, default=91)
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--no-torch", action="store_true", help="mpisphere only (no torch-harmonics on one rank)")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    shape = (args.nlat, 2 * (args.nlat - 1))
    if comm.rank == 0:
        print(f"# {mpi_version()}; {comm.size} rank(s); {shape[0]} x {shape[1]}, {args.channels} channels, "
              f"{args.heads} heads, batch {args.batch}, float32", flush=True)
    grids = grid_shapes(args.grids, comm.size)
    assert not args.memory or len(grids) == 1, "--memory measures one grid per launch"
    for dims in grids:
        grid = ms.ProcessGrid(comm, *dims)
        name = f"{dims[0]}x{dims[1]}"
        op = NeighborhoodAttentionS2(grid, args.channels, shape, shape, args.heads, dtype=numpy.float32)
        op.set_parameters(**parameters(args.channels, numpy.random.default_rng(0)))
        rng = numpy.random.default_rng(1 + grid.rank)
        x = rng.standard_normal((args.batch, args.channels) + op.tile_out).astype(numpy.float32)
        y_bar = numpy.ones((args.batch, args.channels) + op.tile_out, dtype=numpy.float32)

        def ours():
            op.forward(x)
            op.gradients(x, y_bar)
        if not args.no_torch:
            ours = dropin_step(args, grid, x)
        cases = {"mpisphere": ours}
        kernel = None
        if grid.size == 1 and not args.no_torch:
            cases["torch-harmonics"], kernel = torch_harmonics_step(args)
        if args.memory:
            tracemalloc.start()
            ours()
            peak = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
            point = args.batch * args.channels * 4 / 2**20
            tile = math.prod(op.tile_in) * point
            received = op.neighbours.received * point
            found = comm.gather((peak, tile, received, peak / (tile + received)))
            if comm.rank == 0:
                worst = max(found, key=lambda f: f[3])
                print(f"{name} memory: peak {worst[0]:.1f} MB per rank (largest ratio), tile {worst[1]:.1f} MB, "
                      f"received {worst[2]:.1f} MB: {worst[3]:.1f}x the tile and the received points", flush=True)
            grid.free()
            continue
        start = time.perf_counter()
        times = measure_rounds(grid.cart, cases, args.repeats, args.warmup)
        elapsed = time.perf_counter() - start
        point_bytes = args.batch * args.channels * 4
        received = op.neighbours.received * point_bytes
        minimum = minimum_points(op) * point_bytes
        theirs = ring_points(op, grid) * args.batch * 2 * args.channels * 4
        rows = comm.gather((grid.rank, received, minimum, theirs))
        if comm.rank == 0:
            line = f"{name}: mpisphere {numpy.median(times['mpisphere']):.0f} ms a step (median of {args.repeats})"
            if "torch-harmonics" in times:
                ratio = numpy.median(times["mpisphere"] / times["torch-harmonics"])
                line += (f", torch-harmonics {numpy.median(times['torch-harmonics']):.0f} ms "
                         f"({'compiled' if kernel else 'torch'} kernel): ratio {ratio:.3f}")
            print(line + f" [{elapsed:.0f} s]", flush=True)
            for rank, got, least, ring in rows:
                print(f"  rank {rank}: receives {got / 2**20:.2f} MB a layer, minimum {least / 2**20:.2f} MB "
                      f"({got / least if least else 1.0:.2f}x), torch-harmonics' ring {ring / 2**20:.2f} MB",
                      flush=True)
        grid.free()


if __name__ == "__main__":
    main()
