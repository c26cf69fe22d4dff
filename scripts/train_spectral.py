"""Train a small spherical Fourier neural operator on distributed fields to learn one day of shallow water.

    mpiexec -n 4 python -m mpi4py scripts/train_spectral.py            # 2 x 2 ranks, about two minutes here
    mpiexec -n 4 python -m mpi4py scripts/train_spectral.py --epochs 5 --samples 8 --require-falling

A torch-harmonics user's spectral layer, with the transforms distributed:
each layer maps this rank's tile of ``C`` channels to coefficients
(``DistributedRealSHT`` through :func:`mpisphere.torch.apply`), mixes the
channels with learned weights per degree (as a spherical Fourier neural
operator layer does: the same weights for every order of a degree, so the
layer commutes with rotations), transforms back and adds a pointwise
channel mix. The weights are replicated: every rank holds all of them and
uses the degrees it owns, through ``CopyTo(grid.cart)``, whose adjoint sums
the ranks' partial gradients (an Allreduce), so every rank's optimiser sees
the whole gradient and takes the same step.

The data: random initial states of mpisphere's shallow-water model (the
random initial condition of torch-harmonics' example: geopotential,
vorticity and divergence up to degree 120, here the grid's own truncation)
and the same states one model day later, on a 32 x 64 Gauss grid; the
network learns the one-day map on standardised fields. Each rank computes
its local loss, ``backward`` runs the adjoint transforms on every rank, and
the printed loss is the sum over the grid (``ReduceFrom``). At the end rank
0 writes ``train_spectral.png``: one test state's geopotential after a day,
the model's and the network's (matplotlib: the ``plot`` extra), and the
largest difference of the replicated weights between ranks (0 when the
steps stayed identical).
"""

import argparse
import math
import sys
import time

import numpy
import torch
from mpi4py import MPI

import mpisphere.torch as mt
from mpisphere import CopyTo, DistributedInverseRealSHT, DistributedRealSHT, ProcessGrid, ReduceFrom
from mpisphere.examples import ShallowWaterSolver
from swe_data import make_data, standardise


class SpectralLayer(torch.nn.Module):
    """``x -> isht(W(l) sht(x)) + K x + b`` on this rank's tiles ``(B, C_in, h, w) -> (B, C_out, h, w)``.

    ``W`` ``(C_out, C_in, lmax)`` real, one channel mix per degree; ``K``
    ``(C_out, C_in)`` pointwise; ``b`` ``(C_out,)``. All replicated over the
    grid; ``share`` (``CopyTo(grid.cart)``) hands them to this rank's work
    and sums their gradients over the grid in backward.
    """

    def __init__(self, sht, isht, share, c_in, c_out, generator):
        super().__init__()
        self.sht, self.isht, self.share = sht, isht, share
        self.degrees = torch.from_numpy(numpy.asarray(sht.local_degrees))
        scale = 1.0 / math.sqrt(c_in)
        self.spectral = torch.nn.Parameter(scale * torch.randn(c_out, c_in, sht.lmax, generator=generator,
                                                               dtype=torch.float64))
        self.pointwise = torch.nn.Parameter(scale * torch.randn(c_out, c_in, generator=generator,
                                                                dtype=torch.float64))
        self.bias = torch.nn.Parameter(torch.zeros(c_out, dtype=torch.float64))

    def forward(self, x):
        spectral = mt.apply(self.share, self.spectral)[:, :, self.degrees]
        pointwise, bias = mt.apply(self.share, self.pointwise), mt.apply(self.share, self.bias)
        coefficients = mt.apply(self.sht, x)                                   # (B, C_in, l_loc, m_loc)
        mixed = torch.einsum("oil,bilm->bolm", spectral.to(coefficients.dtype), coefficients)
        return mt.apply(self.isht, mixed) + torch.einsum("oi,bihw->bohw", pointwise, x) + bias[:, None, None]


class SpectralNetwork(torch.nn.Module):
    """Two spectral layers with a GELU between them, plus the input (the network learns the day's change)."""

    def __init__(self, sht, isht, share, channels, width, seed=0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)  # the same initial weights on every rank
        self.first = SpectralLayer(sht, isht, share, channels, width, generator)
        self.second = SpectralLayer(sht, isht, share, width, channels, generator)

    def forward(self, x):
        return x + self.second(torch.nn.functional.gelu(self.first(x)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nlat", type=int, default=32)
    parser.add_argument("--nlon", type=int, default=64)
    parser.add_argument("--samples", type=int, default=24, help="training states (plus a quarter as many tests)")
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--width", type=int, default=16, help="hidden channels")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--dt", type=float, default=300.0,
                        help="model time step (s); 600 s blows up on this grid (third-order Adams-Bashforth)")
    parser.add_argument("--plot", default="train_spectral.png")
    parser.add_argument("--require-falling", action="store_true",
                        help="exit with status 1 unless the last epoch's loss is below the first's (for CI)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    grid = ProcessGrid(MPI.COMM_WORLD)
    comm = grid.cart
    say = print if grid.rank == 0 else (lambda *a, **k: None)
    swe = ShallowWaterSolver(grid, args.nlat, args.nlon, args.dt, quadrature="legendre-gauss")
    day_steps = round(86400.0 / args.dt)
    tests = max(1, args.samples // 4)
    started = time.perf_counter()
    inputs, targets = make_data(swe, args.samples + tests, 100, day_steps)
    say(f"{grid.npolar} x {grid.nazimuth} ranks, {args.nlat} x {args.nlon} Gauss grid, lmax {swe.lmax}: "
        f"{args.samples} + {tests} states run one model day ({day_steps} steps of {args.dt:g} s) in "
        f"{time.perf_counter() - started:.1f} s")
    x, stats = standardise(inputs, comm)
    y, _ = standardise(targets, comm, stats)
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    x_train, y_train, x_test, y_test = x[:args.samples], y[:args.samples], x[args.samples:], y[args.samples:]

    sht = DistributedRealSHT(grid, args.nlat, args.nlon, quadrature="legendre-gauss")
    isht = DistributedInverseRealSHT(grid, args.nlat, args.nlon, quadrature="legendre-gauss")
    share, total = CopyTo(comm), ReduceFrom(comm)
    network = SpectralNetwork(sht, isht, share, 3, args.width)
    optimiser = torch.optim.Adam(network.parameters(), lr=args.lr)
    cells = args.nlat * args.nlon * 3

    def mean_square(prediction, truth):
        """The whole grid's mean squared error; each rank's share of it, and the total (the same everywhere)."""
        local = ((prediction - truth) ** 2).sum() / (cells * truth.shape[0])
        return local, mt.apply(total, local.reshape(1))[0]

    order = numpy.random.default_rng(1)  # the same batches on every rank
    losses = []
    with torch.no_grad():
        _, persistence = mean_square(x_test, y_test)
    say(f"test loss of persistence (tomorrow = today): {float(persistence):.4f}")
    for epoch in range(args.epochs):
        running = 0.0
        for chunk in numpy.array_split(order.permutation(args.samples), max(1, args.samples // args.batch)):
            optimiser.zero_grad()
            local, whole = mean_square(network(x_train[chunk]), y_train[chunk])
            local.backward()  # every rank: the adjoint transforms, and CopyTo's Allreduce of the gradients
            optimiser.step()
            running += float(whole.detach()) * len(chunk) / args.samples
        with torch.no_grad():
            _, test = mean_square(network(x_test), y_test)
        losses.append(running)
        say(f"epoch {epoch + 1:3d}  train loss {running:.4f}  test loss {float(test):.4f}")

    spread = 0.0
    for p in network.parameters():
        values = p.detach().numpy()
        spread = max(spread, float(numpy.max(abs(values - comm.bcast(values, root=0)))))
    spread = comm.allreduce(spread, op=MPI.MAX)
    say(f"largest difference of the replicated weights between ranks: {spread:.1e}")

    with torch.no_grad():
        prediction = network(x_test[:1]).numpy()[0, 0]
    fields = [grid.gather(a) for a in (x_test[0, 0].numpy(), y_test[0, 0].numpy(), prediction)]
    if grid.rank == 0:
        plot(args.plot, fields, stats)
    falling = losses[-1] < losses[0]
    say(f"loss {'fell' if falling else 'did not fall'}: {losses[0]:.4f} -> {losses[-1]:.4f}")
    return 0 if falling or not args.require_falling else 1


def plot(path, fields, stats):
    """Geopotential height (m) at the start, after a day, and the network's day."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install '.[plot]' in the mpisphere clone): no picture")
        return
    mean, std = stats
    height = [(f * std[0] + mean[0]) / 9.80616 for f in fields]
    low, high = min(h.min() for h in height), max(h.max() for h in height)
    figure, axes = plt.subplots(1, 4, figsize=(16, 3.2), constrained_layout=True)
    titles = ("start", "after one day (model)", "after one day (network)", "network - model")
    for ax, title, values in zip(axes, titles, height + [height[2] - height[1]]):
        limits = dict(vmin=low, vmax=high) if title != "network - model" else {}
        image = ax.imshow(values, cmap="RdBu_r" if title == "network - model" else "viridis", **limits)
        ax.set_title(title)
        ax.set_xticks([])
        ax.set_yticks([])
        figure.colorbar(image, ax=ax, shrink=0.8, label="m")
    figure.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
