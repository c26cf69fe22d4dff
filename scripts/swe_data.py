"""Training data from the shallow-water solver, shared by the training scripts (not part of the package)."""

import numpy


def make_data(swe, samples, seed, steps):
    """This rank's tiles ``(samples, 3, h, w)`` of random initial states and of the same states ``steps`` steps later.

    The random initial condition of torch-harmonics' example (geopotential,
    vorticity and divergence), one state at a time through ``swe.timestep``.
    """
    start = [swe.random_initial_condition(mach=0.2, seed=seed + k) for k in range(samples)]
    end = [swe.timestep(state, steps) for state in start]
    return numpy.stack([swe.spec2grid(s) for s in start]), numpy.stack([swe.spec2grid(s) for s in end])


def standardise(fields, comm, stats=None):
    """Per-channel mean and standard deviation over the whole grid (sums over the ranks), applied.

    ``fields`` ``(samples, channels, h, w)`` tiles; ``stats`` ``(mean, std)`` to apply, or None to measure them.
    Returns the standardised tiles and ``stats``.
    """
    if stats is None:
        count = comm.allreduce(fields[:, 0].size)
        mean = comm.allreduce(fields.sum(axis=(0, 2, 3))) / count
        var = comm.allreduce(((fields - mean[None, :, None, None]) ** 2).sum(axis=(0, 2, 3))) / count
        stats = (mean, numpy.sqrt(var))
    mean, std = stats
    return (fields - mean[None, :, None, None]) / std[None, :, None, None], stats
