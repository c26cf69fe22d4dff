"""DISCO convolution forward + backward: mpisphere against torch-harmonics 0.9.3's distributed module, one run.

    mpiexec -n 1 python scripts/bench_disco.py --grids 1x1
    mpiexec -n 2 python scripts/bench_disco.py --grids 1x2,2x1
    mpiexec -n 2 python scripts/bench_disco.py --grids 2x1 --library mpisphere --dtypes float32 --memory --nlat 361

Both layers on the same tiles: ``--nlat`` x ``2 (nlat - 1)`` equiangular
(default 181 x 360), ``--channels`` in and out (8), kernel ``(3,)``
piecewise linear, ``--batch`` fields (4), float32 and float64. A step is the
forward and the backward (input and weight gradients): mpisphere's
``DiscoConvS2.forward`` then ``gradients``; torch-harmonics'
``DistributedDiscreteContinuousConvS2`` (torch.distributed with gloo, the
CPU path) ``y = conv(x); y.backward(y_bar)``. The two are timed in
alternation round by round; the ratio is the median of per-round ratios.

``--memory`` measures one library, dtype and grid per launch: the growth of
the process's peak resident memory (``ru_maxrss``) from before the layer is
built to after ``--repeats`` steps, on each rank (the largest is printed),
beside the sizes of this rank's input and output tiles and of the filter's
tables.
"""

import argparse
import os
import resource
import socket

import numpy
from mpi4py import MPI

import mpisphere as ms
from benchtools import grid_shapes, measure_rounds


def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def torch_harmonics_groups(grid):
    """torch.distributed (gloo) and torch-harmonics' polar and azimuth groups laid out as ``grid``."""
    import torch.distributed as dist
    import torch_harmonics.distributed as thd
    if not dist.is_initialized():
        port = grid.cart.bcast(_free_port() if grid.rank == 0 else None)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=MPI.COMM_WORLD.rank, world_size=MPI.COMM_WORLD.size)
    world = MPI.COMM_WORLD.allgather((grid.polar_rank, grid.azimuth_rank))
    polar = azimuth = None
    for a in range(grid.nazimuth):   # every rank makes every group, in the same order
        group = dist.new_group([r for r, (_, az) in enumerate(world) if az == a])
        if a == grid.azimuth_rank:
            polar = group
    for p in range(grid.npolar):
        group = dist.new_group([r for r, (po, _) in enumerate(world) if po == p])
        if p == grid.polar_rank:
            azimuth = group
    if thd.is_initialized():
        thd.finalize()
    thd.init(polar, azimuth)


def torch_harmonics_layer(grid, args, dtype):
    """torch-harmonics' distributed layer on process groups laid out as ``grid``."""
    import torch
    import torch_harmonics.distributed as thd
    torch_harmonics_groups(grid)
    torch.manual_seed(0)
    shape = (args.nlat, 2 * (args.nlat - 1))
    layer = thd.DistributedDiscreteContinuousConvS2(args.channels, args.channels, shape, shape, (3,), bias=False)
    return layer.to({numpy.float32: torch.float32, numpy.float64: torch.float64}[dtype])


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mpisphere_layer(grid, args, dtype):
    shape = (args.nlat, 2 * (args.nlat - 1))
    weight = numpy.random.default_rng(0).standard_normal((args.channels, args.channels, 2))
    return ms.DiscoConvS2(grid, shape, shape, (3,), weight, dtype=dtype)


def steps(grid, args, dtype, libraries):
    """``{library: step}``: one forward + backward each, on the same tile."""
    shape = (args.nlat, 2 * (args.nlat - 1))
    tile = grid.local_shape(*shape)
    rng = numpy.random.default_rng(grid.rank)
    x = rng.standard_normal((args.batch, args.channels) + tile).astype(dtype)
    y_bar = rng.standard_normal((args.batch, args.channels) + tile).astype(dtype)
    cases = {}
    if "mpisphere" in libraries:
        op = mpisphere_layer(grid, args, dtype)

        def ours():
            op.forward(x)
            op.gradients(x, y_bar)
        cases["mpisphere"] = ours
        cases["_op"] = op
    if "torch-harmonics" in libraries:
        import torch
        layer = torch_harmonics_layer(grid, args, dtype)
        xt = torch.from_numpy(x).requires_grad_(True)
        yt_bar = torch.from_numpy(y_bar)

        def theirs():
            xt.grad = None
            layer.weight.grad = None
            layer(xt).backward(yt_bar)
        cases["torch-harmonics"] = theirs
    return cases, x.nbytes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grids", default=None)
    parser.add_argument("--nlat", type=int, default=181)
    parser.add_argument("--channels", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--library", default="mpisphere,torch-harmonics")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="PyTorch's intra-op threads per rank (default 1: one core per rank, as mpisphere)")
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    libraries = args.library.split(",")
    if args.memory and (len(libraries) > 1 or "," in args.dtypes or len(grid_shapes(args.grids, world.size)) > 1):
        # the peak resident memory only grows: a second case in the same process would read the first's peak
        parser.error("--memory measures one library, one dtype and one grid per launch")
    if "torch-harmonics" in libraries:
        import torch
        torch.set_num_threads(args.torch_threads)
    if world.rank == 0:
        print(f"DISCO conv {args.nlat} x {2 * (args.nlat - 1)}, {args.channels} -> {args.channels} channels, "
              f"kernel (3,) piecewise linear, batch {args.batch}; {world.size} ranks; forward + backward, ms"
              + (f"; PyTorch {args.torch_threads} thread(s) per rank" if "torch-harmonics" in libraries else ""))
    for npolar, nazimuth in grid_shapes(args.grids, world.size):
        grid = ms.ProcessGrid(world, npolar, nazimuth)
        for name in args.dtypes.split(","):
            dtype = numpy.dtype(name).type
            before = peak_mb()
            cases, tile_bytes = steps(grid, args, dtype, libraries)
            op = cases.pop("_op", None)
            if args.memory:
                for _ in range(args.repeats):
                    for fn in cases.values():
                        fn()
                grown = world.allreduce(peak_mb() - before, op=MPI.MAX)
                table = world.allreduce(sum(b.nbytes for b in op.bands) / 2**20 if op is not None else 0.0,
                                        op=MPI.MAX)
                if world.rank == 0:
                    print(f"{npolar}x{nazimuth} {name} {','.join(cases)}: peak memory grew {grown:.0f} MB per rank "
                          f"(input tile {tile_bytes / 2**20:.1f} MB, output tile the same"
                          + (f", tables {table:.1f} MB" if op is not None else "") + ")")
                continue
            times = measure_rounds(world, cases, args.repeats, args.warmup)
            if world.rank == 0:
                line = f"{npolar}x{nazimuth} {name}: " + ", ".join(
                    f"{k} {numpy.median(v):.0f}" for k, v in times.items())
                if len(times) == 2:
                    ratio = numpy.median(times["mpisphere"] / times["torch-harmonics"])
                    line += f"; mpisphere / torch-harmonics {ratio:.2f}"
                print(line, flush=True)
        grid.free()


if __name__ == "__main__":
    main()
