"""The real FFT back ends on the transforms' batch: NumPy, scipy.fft and ducc0.fft, timed in alternation.

    python scripts/bench_fft.py                  # 32 x 361 x 720 float64
    python scripts/bench_fft.py --large --batch 8

One process, one thread each (``workers=1``, ``nthreads=1``). Each round
runs every back end once on the same arrays, so the machine's drift hits
all of them; the medians and the median of the per-round ratios against
ducc0 are printed, with a plain copy of the spectrum's bytes as the
memory-bound reference. NumPy (2.0 and newer) and ducc0 write into a given
output; ``scipy.fft`` has no ``out=`` and returns a new array each call.
``rfft`` is the analysis's FFT (``norm="forward"``), ``irfft`` the
synthesis's (unnormalised); ``into the Legendre layout`` is what the
transforms do on one rank: ducc0 writing the batch-innermost layout directly.
"""

import argparse
import time

import numpy

from benchtools import write_results


def _backends(x, spectrum, out, n):
    """``{name: (rfft, irfft)}``, each a callable of no arguments."""
    import ducc0.fft
    import scipy.fft
    layout = numpy.empty(spectrum.shape[1:] + spectrum.shape[:1], spectrum.dtype).transpose(2, 0, 1)
    return {
        "numpy": (lambda: numpy.fft.rfft(x, axis=-1, norm="forward", out=spectrum),
                  lambda: numpy.fft.irfft(spectrum, n=n, axis=-1, norm="forward", out=out)),
        "scipy.fft": (lambda: scipy.fft.rfft(x, axis=-1, norm="forward", workers=1),
                      lambda: scipy.fft.irfft(spectrum, n=n, axis=-1, norm="forward", workers=1)),
        "ducc0": (lambda: ducc0.fft.r2c(x, axes=(-1,), forward=True, inorm=2, out=spectrum, nthreads=1),
                  lambda: ducc0.fft.c2r(spectrum, axes=(-1,), lastsize=n, forward=False, inorm=0, out=out,
                                        nthreads=1)),
        "ducc0 into the Legendre layout": (
            lambda: ducc0.fft.r2c(x, axes=(-1,), forward=True, inorm=2, out=layout, nthreads=1), None),
        "copy of the spectrum's bytes": (lambda: numpy.copyto(layout, spectrum), None),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nlat", type=int, default=361)
    parser.add_argument("--nlon", type=int, default=720)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--large", action="store_true", help="721 x 1440 (0.25 degree)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.large:
        args.nlat, args.nlon = 721, 1440
    n = args.nlon
    x = numpy.random.default_rng(0).standard_normal((args.batch, args.nlat, n))
    spectrum = numpy.fft.rfft(x, axis=-1, norm="forward")
    out = numpy.empty_like(x)
    calls = {}
    for name, (forward, inverse) in _backends(x, spectrum, out, n).items():
        calls[(name, "rfft")] = forward
        if inverse is not None:
            calls[(name, "irfft")] = inverse
    for fn in calls.values():  # plans and first-touch pages
        fn()
    times = {key: [] for key in calls}
    for _ in range(args.rounds):
        for key, fn in calls.items():
            start = time.perf_counter()
            fn()
            times[key].append(1e3 * (time.perf_counter() - start))
    print(f"{args.batch} x {args.nlat} x {n} float64, one thread, {args.rounds} rounds in alternation")
    rows = []
    for (name, kind), values in times.items():
        reference = numpy.array(times[("ducc0", kind)])
        ratio = float(numpy.median(numpy.array(values) / reference))
        median = float(numpy.median(values))
        rows.append({"backend": name, "fft": kind, "median_ms": median, "ratio_to_ducc0": ratio})
        print(f"  {kind:5s} {name:32s} {median:8.1f} ms   / ducc0 {ratio:5.2f}")
    if args.json:
        write_results(args.json, {"nlat": args.nlat, "nlon": n, "batch": args.batch, "rounds": args.rounds}, rows)


if __name__ == "__main__":
    main()
