"""Spectral convolution and resampling, forward + backward: mpisphere.torch_harmonics against torch-harmonics 0.9.3.

    mpiexec -n 2 python scripts/bench_local_ops.py --grids 1x2,2x1

Both libraries' distributed modules (mpisphere's drop-in and
``torch_harmonics.distributed``, the latter on torch.distributed with gloo)
on the same tiles, float32 (torch-harmonics' spectral convolution computes in
float32 whatever the input), timed in alternation round by round; the ratio
is the median of per-round ratios. ``--nlat`` x ``2 (nlat - 1)`` (default
181 x 360), ``--channels`` (8), ``--batch`` (4); the resampling goes to the
grid of twice the resolution.
"""

import argparse

import numpy
import torch
from mpi4py import MPI

import mpisphere as ms
import mpisphere.torch_harmonics as mthd
from bench_disco import torch_harmonics_groups
from benchtools import grid_shapes, measure_rounds


def layers(grid, args):
    import torch_harmonics.distributed as thd
    shape = (args.nlat, 2 * (args.nlat - 1))
    fine = (2 * args.nlat - 1, 4 * (args.nlat - 1))
    torch.manual_seed(0)
    theirs = {"spectral convolution": thd.DistributedSpectralConvS2(shape, shape, args.channels, args.channels),
              "resampling": thd.DistributedResampleS2(*shape, *fine)}
    ours = {"spectral convolution": mthd.DistributedSpectralConvS2(shape, shape, args.channels, args.channels,
                                                                    process_grid=grid),
            "resampling": mthd.DistributedResampleS2(*shape, *fine, process_grid=grid)}
    return shape, ours, theirs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grids", default=None)
    parser.add_argument("--nlat", type=int, default=181)
    parser.add_argument("--channels", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    world = MPI.COMM_WORLD
    if world.rank == 0:
        print(f"{args.nlat} x {2 * (args.nlat - 1)}, {args.channels} channels, batch {args.batch}, float32; "
              f"{world.size} ranks; forward + backward, ms; PyTorch 1 thread per rank")
    for npolar, nazimuth in grid_shapes(args.grids, world.size):
        grid = ms.ProcessGrid(world, npolar, nazimuth)
        torch_harmonics_groups(grid)
        shape, ours, theirs = layers(grid, args)
        x = torch.from_numpy(numpy.random.default_rng(grid.rank).standard_normal(
            (args.batch, args.channels) + grid.local_shape(*shape)).astype(numpy.float32))
        for name in ours:
            cases = {}
            for library, layer in (("mpisphere", ours[name]), ("torch-harmonics", theirs[name])):
                xt = x.clone().requires_grad_(True)

                def step(layer=layer, xt=xt):
                    xt.grad = None
                    layer.zero_grad()
                    y = layer(xt)
                    y.backward(torch.ones_like(y))
                cases[library] = step
            times = measure_rounds(world, cases, args.repeats, args.warmup)
            if world.rank == 0:
                ratio = numpy.median(times["mpisphere"] / times["torch-harmonics"])
                print(f"{npolar}x{nazimuth} {name}: mpisphere {numpy.median(times['mpisphere']):.1f}, "
                      f"torch-harmonics {numpy.median(times['torch-harmonics']):.1f}; ratio {ratio:.2f}", flush=True)
        grid.free()


if __name__ == "__main__":
    main()
