"""Train torch-harmonics' example SFNO, distributed by ``distribute(model)``, to step the shallow-water equations.

    mpiexec -n 4 python -m mpi4py scripts/train_sfno.py                       # 2 x 2 ranks, a few minutes here
    mpiexec -n 4 python -m mpi4py scripts/train_sfno.py --samples 8 --epochs 3 --require-falling   # CI, small
    mpiexec -n 2 python -m mpi4py scripts/train_sfno.py --time-steps 10 --nlat 91 --nlon 180 --batch 4 \\
        --epochs 0                                       # the time per training step on 1x1, 1x2 and 2x1

The data, as torch-harmonics' own shallow-water training makes it with its
solver: random initial states of mpisphere's distributed shallow-water model
(geopotential, vorticity and divergence) and the same states a few hours
later (``--hours``), on an equiangular grid, standardised per channel over the
whole sphere. The network: ``torch_harmonics.examples.models.
SphericalFourierNeuralOperator`` built serially with a seed on every rank and
distributed by ``mpisphere.torch_harmonics.distribute``; the loss is the
quadrature of the squared error over the sphere (``DistributedQuadratureS2``),
the same on every rank. At the end rank 0 saves the distributed model's
``state_dict`` (``--checkpoint``), loads it into a serial torch-harmonics
SFNO and evaluates that on the whole test fields on one rank: the serial and
distributed predictions and test losses are printed side by side, and the
loss curve drawn (``--plot``; matplotlib, the ``plot`` extra).

``--time-steps K`` times ``K`` rounds after ``--warmup``: each round runs one
training step on every grid of ``--grids`` (each on the first ranks of the
launch, the others waiting at a barrier) and one of the serial
torch-harmonics model on rank 0, on the same whole fields; medians per case.
"""

import argparse
import statistics
import time

import numpy
import torch
from mpi4py import MPI

import mpisphere.torch_harmonics as thd
from mpisphere import ProcessGrid
from mpisphere.examples import ShallowWaterSolver
from swe_data import make_data, standardise


def build(args):
    from torch_harmonics.examples.models import SphericalFourierNeuralOperator
    torch.manual_seed(args.seed)      # the same serial model on every rank
    return SphericalFourierNeuralOperator(img_size=(args.nlat, args.nlon), grid="equiangular", in_chans=3,
                                          out_chans=3, embed_dim=args.width, num_layers=args.layers,
                                          scale_factor=args.scale_factor, normalization_layer="instance_norm",
                                          pos_embed="learnable latlon")


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", default=None, help="NPOLARxNAZIMUTH (default: MPI's balanced split)")
    parser.add_argument("--nlat", type=int, default=33)
    parser.add_argument("--nlon", type=int, default=64)
    parser.add_argument("--samples", type=int, default=32, help="training states (plus a quarter as many tests)")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--width", type=int, default=16, help="the SFNO's embed_dim")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--scale-factor", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--hours", type=float, default=6.0, help="how far the network steps")
    parser.add_argument("--dt", type=float, default=300.0, help="the solver's time step (s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default="train_sfno.png")
    parser.add_argument("--checkpoint", default="train_sfno.pt")
    parser.add_argument("--time-steps", type=int, default=0, help="time this many training steps (see above)")
    parser.add_argument("--grids", default="1x1,1x2,2x1", help="the grids --time-steps times, in one launch")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--require-falling", action="store_true",
                        help="exit with status 1 unless the last epoch's loss is below the first's (for CI)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    torch.set_num_threads(1)
    shape = None if args.grid is None else tuple(int(v) for v in args.grid.lower().split("x"))
    grid = ProcessGrid(MPI.COMM_WORLD, *(shape or (None, None)))
    comm = grid.cart
    say = print if grid.rank == 0 else (lambda *a, **k: None)
    thd.init(grid)
    lat, lon = grid.local_slices(args.nlat, args.nlon)
    quadrature = thd.DistributedQuadratureS2((args.nlat, args.nlon), normalize=True)

    def loss_of(prediction, truth):
        return quadrature((prediction - truth) ** 2).mean()

    serial = build(args)
    say(f"SFNO {args.nlat} x {args.nlon}, embed_dim {args.width}, {args.layers} layers, "
        f"{sum(p.numel() for p in serial.parameters())} parameters")
    if args.time_steps:
        time_steps(args, serial)
    if args.epochs == 0:
        thd.finalize()
        grid.free()
        return 0
    model = thd.distribute(serial)
    say(f"training on {grid.npolar} x {grid.nazimuth} ranks")

    swe = ShallowWaterSolver(grid, args.nlat, args.nlon, args.dt, quadrature="equiangular")
    steps = round(args.hours * 3600.0 / args.dt)
    tests = max(1, args.samples // 4)
    started = time.perf_counter()
    inputs, targets = make_data(swe, args.samples + tests, 100, steps)
    say(f"{args.samples} + {tests} states stepped {args.hours:g} h ({steps} steps) by the distributed solver in "
        f"{time.perf_counter() - started:.1f} s")
    x, stats = standardise(inputs, comm)
    y, _ = standardise(targets, comm, stats)
    x, y = torch.from_numpy(x).float(), torch.from_numpy(y).float()
    x_train, y_train, x_test, y_test = x[:args.samples], y[:args.samples], x[args.samples:], y[args.samples:]

    optimiser = torch.optim.Adam(model.parameters(), lr=args.lr)
    order = numpy.random.default_rng(1)        # the same batches on every rank
    losses, tests_curve = [], []
    with torch.no_grad():
        say(f"test loss of persistence (later = now): {float(loss_of(x_test, y_test)):.4f}")
    for epoch in range(args.epochs):
        model.train()
        running = 0.0
        for chunk in numpy.array_split(order.permutation(args.samples), max(1, args.samples // args.batch)):
            optimiser.zero_grad()
            loss = loss_of(model(x_train[chunk]), y_train[chunk])
            loss.backward()
            optimiser.step()
            running += float(loss.detach()) * len(chunk) / args.samples
        model.eval()
        with torch.no_grad():
            test = float(loss_of(model(x_test), y_test))
        losses.append(running)
        tests_curve.append(test)
        say(f"epoch {epoch + 1:3d}  train loss {running:.4f}  test loss {test:.4f}")

    check_serially(args, grid, model, x_test, y_test)
    if grid.rank == 0:
        plot(args.plot, losses, tests_curve)
    falling = losses[-1] < losses[0]
    say(f"loss {'fell' if falling else 'did not fall'}: {losses[0]:.4f} -> {losses[-1]:.4f}")
    thd.finalize()
    grid.free()
    return 0 if falling or not args.require_falling else 1


def check_serially(args, grid, model, x_test, y_test):
    """The checkpoint into a serial torch-harmonics SFNO on rank 0: its prediction and test loss beside ours."""
    import torch_harmonics as th
    state = model.state_dict()
    with torch.no_grad():
        mine = model(x_test).numpy()
    whole = [grid.gather(numpy.ascontiguousarray(mine[:, c])) for c in range(mine.shape[1])]
    truth = [grid.gather(numpy.ascontiguousarray(y_test.numpy()[:, c])) for c in range(3)]
    inputs = [grid.gather(numpy.ascontiguousarray(x_test.numpy()[:, c])) for c in range(3)]
    if grid.rank != 0:
        return
    torch.save(state, args.checkpoint)
    serial = build(args)
    serial.load_state_dict(torch.load(args.checkpoint))
    serial.eval()
    x = torch.from_numpy(numpy.stack(inputs, axis=1))
    y = torch.from_numpy(numpy.stack(truth, axis=1))
    ours = torch.from_numpy(numpy.stack(whole, axis=1))
    with torch.no_grad():
        theirs = serial(x)
    quadrature = th.QuadratureS2((args.nlat, args.nlon), normalize=True)
    serial_loss = float(quadrature((theirs - y) ** 2).mean())
    ours_loss = float(quadrature((ours - y) ** 2).mean())
    difference = float((theirs - ours).abs().max() / theirs.abs().max())
    print(f"checkpoint {args.checkpoint} loaded by a serial torch-harmonics SFNO on one rank: test loss "
          f"{serial_loss:.6f} (distributed {ours_loss:.6f}); largest difference of the predictions "
          f"{difference:.1e} of the largest value")


def time_steps(args, serial):
    """Median time of a training step on each grid of ``--grids`` and of the serial torch-harmonics model (on rank 0),
    in interleaved rounds of one launch: each round runs every case once, the ranks outside a case waiting."""
    import torch_harmonics as th
    world = MPI.COMM_WORLD
    torch.manual_seed(1)
    x = torch.randn(args.batch, 3, args.nlat, args.nlon)
    y = torch.randn(args.batch, 3, args.nlat, args.nlon)
    cases = []                        # (name, step or None on the ranks outside it)
    for name in args.grids.split(","):
        npolar, nazimuth = (int(v) for v in name.lower().split("x"))
        inside = world.rank < npolar * nazimuth
        sub = world.Split(0 if inside else MPI.UNDEFINED, world.rank)
        if not inside:
            cases.append((name, None))
            continue
        grid = ProcessGrid(sub, npolar, nazimuth)
        model = thd.distribute(serial, process_grid=grid)
        quadrature = thd.DistributedQuadratureS2((args.nlat, args.nlon), normalize=True, process_grid=grid)
        lat, lon = grid.local_slices(args.nlat, args.nlon)
        cases.append((name, _stepper(model, quadrature, x[..., lat, lon].contiguous(),
                                     y[..., lat, lon].contiguous())))
    if world.rank == 0:
        cases.append(("torch-harmonics", _stepper(serial, th.QuadratureS2((args.nlat, args.nlon), normalize=True),
                                                  x, y)))
    else:
        cases.append(("torch-harmonics", None))
    times = {name: [] for name, _ in cases}
    for k in range(args.warmup + args.time_steps):
        for name, step in cases:
            world.Barrier()
            start = time.perf_counter()
            if step is not None:
                step()
            world.Barrier()
            if k >= args.warmup:
                times[name].append(time.perf_counter() - start)
    if world.rank == 0:
        base = statistics.median(times[cases[0][0]])
        print(f"time per training step, batch {args.batch}, {args.nlat} x {args.nlon}, medians of {args.time_steps} "
              f"interleaved rounds ({world.size} ranks launched):")
        for name, _ in cases:
            median = statistics.median(times[name])
            print(f"  {name:>16s}: {median * 1e3:8.1f} ms  ({median / base:.2f}x {cases[0][0]})")


def _stepper(model, quadrature, x, y):
    optimiser = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step():
        optimiser.zero_grad()
        quadrature((model(x) - y) ** 2).mean().backward()
        optimiser.step()
    return step


def plot(path, losses, tests):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install '.[plot]' in the mpisphere clone): no picture")
        return
    figure, ax = plt.subplots(figsize=(6, 3.5), constrained_layout=True)
    epochs = numpy.arange(1, len(losses) + 1)
    ax.semilogy(epochs, losses, label="training loss")
    ax.semilogy(epochs, tests, label="test loss")
    ax.set_xlabel("epoch")
    ax.set_ylabel("quadrature of the squared error")
    ax.set_title("SFNO (torch-harmonics' example), distributed by mpisphere")
    ax.legend()
    figure.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
