"""A mistake on one rank raises on every rank, never a hang or a returned result (issues 11 and 24).

Each row of the table is a case in misuse_cases.py. The cases run under
``mpiexec`` at 2 and 4 ranks, debug mode off and on, one launch per
combination with a hard timeout. A row passes when every rank raised the
expected exception with a message matching the expected pattern (or, for the
legal programs marked ``returned``, when every rank returned); a rank that
did otherwise, a rank stuck in the case (the launch's watchdog ends it) or a
crash fails the row.

Issue 24's rows were run against 0.2 (the code before the change) with the
same case file: every one of them failed there (hangs, results returned on
some or all ranks, errors on one rank only); the issue's closing note lists
what each did. Issue 39's rows (the I/O, checkpoints, model histories and
parameters, each mistake on the last rank) likewise against e18babc.
"""

import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from mpisphere.testing import mpiexec_command

HERE = Path(__file__).parent
LAUNCH_TIMEOUT = 240

# case -> (exception type, pattern that every rank's message matches); {last} is the last rank
EXPECTED = {
    "disco_tile_on_the_last_rank": ("ValueError", r"^DiscoConvS2.forward: rank {last} of {size}: input: the last three "
                                                  r"axes of \(1, 2, \d+, \d+\) are not \(channels, \*this rank's tile\)"
                                                  r"\n  fix: pass \(\.\.\., 2, \*grid.local_shape\(13, 20\)\)"),
    "disco_weight_on_the_last_rank": ("ValueError", r"^DiscoConvS2.forward: the {size} ranks disagree on what they are "
                                                    r"about to do: weight: {first} '\(2, 2, 2\) float64 [0-9a-f]+', "
                                                    r"rank {last} '\(2, 2, 2\) float64 [0-9a-f]+'\n  fix: pass the "
                                                    r"same weight on every rank"),
    "disco_bias_in_the_gradients_on_the_last_rank": (
        "ValueError", r"^DiscoConvS2.gradients: the {size} ranks disagree on what they are about to do: bias: {first} "
                      r"'\(2,\) float64 [0-9a-f]+', rank {last} '\(2,\) float64 [0-9a-f]+'\n  fix: pass the same "
                      r"bias on every rank"),
    "attention_heads_on_the_last_rank": ("ValueError", r"^NeighborhoodAttentionS2: the {size} ranks built .*num_heads"),
    "attention_key_tile_on_the_last_rank": (
        "ValueError", r"^NeighborhoodAttentionS2.forward: rank {last} of {size}: key: the last three axes of "
                      r"\(1, 2, \d+, \d+\) are not \(channels, \*this rank's tile\)"),
    "spectral_convolution_whole_field_on_the_last_rank": (
        "ValueError", r"^SpectralConvS2.forward: rank {last} of {size}: input: got the whole 13 x 20 field where this "
                      r"rank's tile belongs"),
    "resample_dtype_on_the_last_rank": ("TypeError", r"^ResampleS2.forward: rank {last} of {size}: expected float64, "
                                                     r"got float32"),
    "machine_model_missing_on_the_last_rank": ("ValueError", r"^DistributedRealSHT: rank {last} of {size}: "
                                                             r"MPISPHERE_MACHINE_MODEL='/nonexistent/machine\.json': "
                                                             r"not a machine model written by"),
    "machine_model_missing_on_rank_0": ("ValueError", r"^DistributedRealSHT: rank 0 of {size}: "
                                                      r"MPISPHERE_MACHINE_MODEL='/nonexistent/machine\.json': not a "
                                                      r"machine model written by"),
    "chunk_width": ("ValueError", r"^GatherFrom.forward: rank {last} of {size}: expected 3 entries along axis -1"),
    "batch_gather_from": ("ValueError", r"^GatherFrom.forward: the {size} ranks disagree on what they are about to "
                                        r"do: input: {most} shape \(2, '\*'\) float64 on host, rank 1 shape \(3, "
                                        r"'\*'\) float64 on host\n  fix: give every rank an input of the same kind: "
                                        r"the same leading \(batch\) shape, dtype and device"),
    "batch_reduce_from": ("ValueError", r"^ReduceFrom.forward: the {size} ranks disagree on what they are about to "
                                        r"do: input: {most} shape \(2, 4\) float64 on host, rank 1 shape \(3, 4\) "
                                        r"float64 on host\n  fix: give every rank an input of the same kind"),
    "batch_transpose": ("ValueError", r"^Transpose.forward: the {size} ranks disagree on what they are about to do: "
                                      r"input: {most} shape \(2, \d, '\*'\) float64 on host, rank 1 shape \(3, "),
    "batch_halo": ("ValueError", r"^HaloExchange.forward: rank \d of {size} .*cannot exchange its halo: .*"
                                 r"(not making the same call|could not complete its own exchange)"),
    "batch_sht": ("ValueError", r"^DistributedRealSHT.forward: the {size} ranks disagree on what they are about to "
                                r"do: input: {most} shape \(2, '\*', '\*'\) float64 on host, rank 1 shape \(3, "
                                r"'\*', '\*'\) float64 on host\n  fix: .*\n  {most} ha(s|ve): DistributedRealSHT\(.*"
                                r"machine\(\.\.\.\)\) forward"),
    "dtype_gather_from": ("ValueError", r"^GatherFrom.forward: the {size} ranks disagree on what they are about to "
                                        r"do: input: {most} shape \(2, '\*'\) float64 on host, rank 1 shape \(2, "
                                        r"'\*'\) float32 on host\n"),
    "dtype_copy_to_adjoint": ("ValueError", r"^CopyTo.adjoint: the {size} ranks disagree on what they are about to "
                                            r"do: input: {most} shape \(2, 3\) float64 on host, rank 1 shape \(2, 3\) "
                                            r"float32 on host\n"),
    "out_shape": ("ValueError", r"^ReduceFrom.forward: rank 1 of {size}: out has shape \(2, 5\) float64, expected "
                                r"\(2, 4\) float64"),
    "out_dtype": ("ValueError", r"^ReduceFrom.forward: rank 1 of {size}: out has shape \(2, 4\) float32"),
    "out_read_only": ("ValueError", r"^ReduceFrom.forward: rank 1 of {size}: out is read-only"),
    "other_operator": ("ValueError", r"^(GatherFrom.forward|GatherFromCopyTo.adjoint): the {size} ranks are in "
                                     r"different calls: {most} in GatherFrom.forward, rank 1 in "
                                     r"GatherFromCopyTo.adjoint\n  fix: make the same mpisphere calls in the same "
                                     r"order on every rank: a call made inside 'if rank == \.\.\.' .*\n.*\n  rank 1 "
                                     r"has: GatherFromCopyTo\(.*\) adjoint"),
    "other_extent": ("ValueError", r"^GatherFrom.forward: the {size} ranks disagree on what they are about to do: "
                                   r"extent: {most} (6|12), rank 1 (7|13)\n  fix: build GatherFrom with the same "
                                   r"extent "
                                   r"on every rank .*\n.*\n  rank 1 has: GatherFrom\(comm=grid.cart \({size} "
                                   r"ranks\), axis=-1, extent=\d+\)"),
    "sht_lmax": ("ValueError", r"^DistributedRealSHT.forward: the {size} ranks disagree on what they are about to do: "
                               r"lmax: {most} None, rank 1 5\n  fix: build DistributedRealSHT with the same lmax on "
                               r"every rank .*\n.*\n  rank 1 has: DistributedRealSHT\(grid=ProcessGrid\(.*\), "
                               r"nlat=13, nlon=10, lmax=5"),
    "halo_wider_than_neighbour": ("ValueError", r"^HaloExchange.forward: rank \d of {size} .*cannot exchange its halo"),
    "halo_tile_widths": ("ValueError", r"^HaloExchange.forward: rank \d of {size} .*cannot exchange its halo: "
                                       r".*(tiles of (widths|heights) \d+ and \d+ in one (column|row) of the grid|"
                                       r"could not complete its own exchange)"),
    "grid_dims": ("ValueError", r"^ProcessGrid: ranks asked for different grids: rank 0 npolar=1, .* rank 1 "
                                r"npolar={size}"),
    "grid_invalid_dims": ("ValueError", r"^rank 1: ProcessGrid: npolar must be positive, got npolar=0"),
    "debug_on_one_rank": ("ValueError", r"^GatherFrom.forward: the {size} ranks disagree on what they are about to "
                                        r"do: switches: {most} none, rank 1 debug\n  fix: set MPISPHERE_DEBUG and "
                                        r"MPISPHERE_FORCE_STAGING .* alike on every rank\n.*\n  rank 1 has: .*; "
                                        r"debug$"),
    "two_threads_on_one_grid": ("RuntimeError", r"^ReduceFrom.forward: refused: another thread was running an "
                                                r"mpisphere operation on the same grid .*grid\.dup\(\)"),
    # issue 24, class 1: the halo's agreement
    "halo_rows_zero_on_one_rank": ("ValueError", r"^HaloExchange: the {size} ranks built it from different arguments: "
                                                 r"rows: {most} 1, rank 1 0\n  fix: build HaloExchange with the same "
                                                 r"rows on every rank .*\n.*\n  rank 1 has: HaloExchange\(grid="
                                                 r"ProcessGrid\({size} x 1, azimuth-fastest\), rows=0, cols=1"),
    "halo_cols_zero_in_the_call": ("ValueError", r"^HaloExchange.forward: rank \d of {size} .*cannot exchange its "
                                                 r"halo: .*(not making the same call|could not complete its own)"),
    "halo_poles_across_on_one_rank": ("ValueError", r"^HaloExchange: the {size} ranks built it from different "
                                                    r"arguments: poles: {most} 'zero', rank 1 'across'; quadrature: "
                                                    r"{most} None, rank 1 'legendre-gauss'\n  fix: build HaloExchange "
                                                    r"with the same poles, quadrature on every rank"),
    "halo_update_against_accumulate": ("ValueError", r"^HaloExchange.(update|accumulate): rank \d of {size} .*cannot "
                                                     r"exchange its halo: .*(not making the same call|could not "
                                                     r"complete its own)"),
    # class 2: parameters that decide the result are compared by value, from every constructor argument
    "laplacian_radius": ("ValueError", r"^DegreeDiagonal: the {size} ranks built it from different arguments: "
                                       r"factors_by_degree: {most} array\(\(6,\), float64, [0-9a-f]{{16}}\), rank 1 "
                                       r"array\(\(6,\), float64, [0-9a-f]{{16}}\)\n.*\n.*\n  rank 1 has: "
                                       r"DegreeDiagonal\(transform=DistributedRealSHT\(.*\), "
                                       r"factors_by_degree=array\(\(\d+,\), float64, [0-9a-f]{{16}}\)\)"),
    "gradient_radius": ("ValueError", r"^gradient: the {size} ranks built it from different arguments: scale: {most} "
                                      r"1\.0, rank 1 1\.569\d+e-07\n.*\n.*\n  rank 1 has: _IntoComponent\(.*"
                                      r"scale=1\.569"),
    "hyperdiffusion_dt": ("ValueError", r"^DegreeDiagonal: the {size} ranks built it from different arguments: "
                                        r"factors_by_degree: "),
    "solver_dt": ("ValueError", r"^ShallowWaterSolver: the {size} ranks built it from different arguments: dt: "
                                r"{most} 600\.0, rank 1 900\.0\n  fix: build ShallowWaterSolver with the same dt on "
                                r"every rank .*\n.*\n  rank 1 has: ShallowWaterSolver\(grid=.*dt=900\.0"),
    # class 3: collectives outside the operators
    "scatter_root": ("ValueError", r"^ProcessGrid.scatter: the {size} ranks disagree on what they are about to do: "
                                   r"root: {most} 0, rank 1 1\n  fix: pass the same root on every rank\n.*\n  rank 1 "
                                   r"has: \{{\"root\":1\}}$"),
    "gather_root": ("ValueError", r"^ProcessGrid.gather: the {size} ranks disagree on what they are about to do: "
                                  r"root: {most} 0, rank 1 1\n  fix: pass the same root on every rank\n.*\n  rank 1 "
                                  r"has: \{{\"root\":1\}}$"),
    "integrate_grid_batch": ("ValueError", r"^ReduceFrom.forward: the {size} ranks disagree on what they are about to "
                                           r"do: input: {most} shape \(2,\) float64 on host, rank 1 shape \(3,\) "
                                           r"float64 on host\n.*\n.*\n  rank 1 has: ReduceFrom\(comm=grid.cart \("
                                           r"{size} ranks\)\) forward: shape \(3,\)"),
    "interpolation_same_weighted_sum": ("ValueError", r"^PointInterpolation: the {size} ranks built it from "
                                                      r"different arguments: lats: {most} \[0\.1, 0\.2, 0\.3\], "
                                                      r"rank 1 \[0\.3, 0\.1, 0\.3\]\n"),
    "interpolation_nan_point": ("ValueError", r"^PointInterpolation: 1 of 2 points are not finite \(first: point 1"),
    "interpolation_last_rank": ("ValueError", r"^PointInterpolation: the {size} ranks built it from different "
                                              r"arguments: lats: {first} \[0\.1, 0\.2\], rank {last} \[0\.1, 1\.2\]"
                                              r"\n  fix: build PointInterpolation with the same lats on every rank"
                                              r".*\n.*\n  rank {last} has: .*lats=\[0\.1, 1\.2\]"),
    # class 4: a composition and its parts meet in the same agreement (over their one communicator)
    "composition_against_parts": ("ValueError", r"^(GatherFrom @ ScatterTo|ScatterTo).forward: the {size} ranks "
                                                r"are in different calls: {most} in ScatterTo.forward, rank 1 in "
                                                r"GatherFrom @ ScatterTo.forward\n  fix: make the same mpisphere calls "
                                                r".*\n.*\n  rank 1 has: GatherFrom\(comm=grid.polar .* @ ScatterTo"),
    # class 5: threads; the thread is not part of what is compared, a refused call is refused on every rank
    "threads_taking_turns": ("RuntimeError", r"^ReduceFrom.forward: (rank 0 of {size}: )?refused: another thread "
                                             r"was running"),
    "run_in_worker_threads_named_differently": ("returned", None),
    "main_thread_against_worker": ("returned", None),
    # class 6: a failed allocation is part of the agreement
    "allocation_fails_on_one_rank": ("MemoryError", r"^GatherFrom.forward: rank 1 of {size}: allocating the buffers "
                                                    r"of this call .* failed: MemoryError"),
    # class 7: one verdict for every rank
    "dottest_rtol": ("ValueError", r"^dottest\(GatherFrom\): the {size} ranks disagree on what they are about to "
                                   r"do: rtol: {most} 1e-12, rank 1 1e-30\n  fix: pass the same rtol on every rank\n"
                                   r".*\n  rank 1 has: dottest\(GatherFrom\): rtol=1e-30"),
    "gather_coefficients_short": ("ValueError", r"^DistributedRealSHT.gather_coefficients: rank 1 of {size}: "
                                                r"expected this rank's coefficient block"),
    # issue 39: the entry points outside the operators, each mistake on the last rank only
    "checkpoint_fails_on_the_last_rank_before_writing": ("RuntimeError", r"^(KeyError: 'a bug on the last rank'|"
                                                         r"RuntimeError: FieldStore.write_tiles\('t'\): rank {last} of "
                                                         r"{size}: the checkpoint was not completed: KeyError)"),
    "checkpoint_keep_on_the_last_rank": ("ValueError", r"^checkpoint\(.*\): the {size} ranks disagree on what they "
                                                       r"are about to do: keep: {first} 2, rank {last} 3\n  fix: pass "
                                                       r"the same keep on every rank\n.*\n  rank {last} has: "
                                                       r"\{{\"keep\":3,"),
    "store_mode_on_the_last_rank": ("ValueError", r"^FieldStore\(.*\): rank {last} of {size}: FieldStore: mode must be "
                                                  r"one of 'r', 'r\+', 'w', 'a', got 'rw'$"),
    # a memory limit on the last rank: the first allocation that fails there (a buffer, or a thread of zarr's)
    "store_write_allocation_fails_on_the_last_rank": (("MemoryError", "ValueError"), r"^FieldStore.write_tiles\('big'\)"
                                                      r": rank {last} of {size}: cannot write 'big' to .*"
                                                      r"(MemoryError|can't start new thread)"),
    "store_read_allocation_fails_on_the_last_rank": (("MemoryError", "ValueError"), r"^FieldStore.read_tiles\('big'\): "
                                                     r"rank {last} of {size}: cannot read 'big' from .*"
                                                     r"(MemoryError|can't start new thread)"),
    "coefficients_orders_on_the_last_rank": ("ValueError", r"^FieldStore.write_coefficients\('c'\): the {size} ranks "
                                                           r"disagree on what they are about to do: layout: {first} "
                                                           r"\"orders=contiguous\", rank {last} \"orders=balanced\"\n"
                                                           r".*\n.*\n  rank {last} has: .*\"layout\":"
                                                           r"\"orders=balanced\""),
    "set_attrs_values_on_the_last_rank": ("ValueError", r"^FieldStore.set_attrs: the {size} ranks disagree on what "
                                                        r"they are about to do: attrs.a: {first} 1, rank {last} 2\n"
                                                        r"  fix: pass the same attrs.a on every rank\n.*\n  rank "
                                                        r"{last} "
                                                        r"has: \{{\"attrs\":\{{\"a\":2\}}\}}$"),
    "set_attrs_in_another_key_order_on_the_last_rank": ("returned", None),
    "write_attrs_in_another_key_order_on_the_last_rank": ("returned", None),
    "leapfrog_history_ahead_on_the_last_rank": ("ValueError", r"^ShallowWaterSolver.timestep: the {size} ranks "
                                                              r"disagree on what they are about to do: history.step: "
                                                              r"{first} 1, rank {last} 3\n.*\n.*\n  rank {last} has: "
                                                              r".*\"step\":3"),
    "history_malformed_on_the_last_rank": ("ValueError", r"^ShallowWaterSolver.timestep: rank {last} of {size}: "
                                                         r"history.tendencies must hold steps \[1, 2\] at step 3"),
    "state_not_finite_on_the_last_rank": ("FloatingPointError", r"^ShallowWaterSolver.timestep: rank {last} of {size}: "
                                                                r"the state is not finite at step 0 \(geopotential\)"),
    "save_not_finite_on_the_last_rank": ("FloatingPointError", r"^ShallowWaterSolver.save\(.*\): rank {last} of "
                                                               r"{size}: the state \(or its history\) is not finite"),
    # the ranks next to the mistake raise in the call, the others at the end of their next call, naming it
    "halo_far_ranks_on_the_last_rank": ("TypeError", r"^HaloExchange.update: rank \d of {size}.*(cannot exchange its "
                                        r"halo|failed on rank \d \(the mistake at rank {last}\) in an earlier call)"),
    "halo_far_ranks_on_rank_0": ("TypeError", r"^HaloExchange.update: rank \d of {size}.*(cannot exchange its halo|"
                                 r"failed on rank \d \(the mistake at rank 0\) in an earlier call)"),
    # the same next to ranks that replay a planned call (issue 48): they hand it over to the full round
    "halo_replay_next_to_a_dtype_on_the_last_rank": ("TypeError", r"^HaloExchange.update: rank \d of {size}.*(cannot "
                                                     r"exchange its halo|failed on rank \d \(the mistake at rank "
                                                     r"{last}\) in an earlier call)"),
    "halo_replay_refused_in_a_thread_on_rank_0": ("RuntimeError", r"^HaloExchange.update: ((rank 0 of {size}: )?"
                                                  r"refused: another thread|rank \d of {size}.*(cannot exchange its "
                                                  r"halo|failed on rank \d \(the mistake at rank 0\) in an earlier "
                                                  r"call))"),
    "save_allow_nonfinite_on_the_last_rank": ("ValueError", r"^ShallowWaterSolver.save\(.*\): the {size} ranks "
                                                            r"disagree on what they are about to do: allow_nonfinite: "
                                                            r"{first} false, rank {last} true\n  fix: pass the same "
                                                            r"allow_nonfinite on every rank"),
    "save_allow_nonfinite_on_rank_0_not_finite": ("FloatingPointError", r"^ShallowWaterSolver.save\(.*\): {others} of "
                                                                        r"{size}: the state \(or its history\) is not "
                                                                        r"finite: refused.*allow_nonfinite=True"),
    "laplacian_radius_zero_on_the_last_rank": ("ValueError", r"^laplacian: rank {last} of {size}: radius must be a "
                                                             r"finite number > 0, got 0.0$"),
    "laplacian_radius_huge_on_the_last_rank": ("ValueError", r"^inverse_laplacian: rank {last} of {size}: "
                                                             r"radius=1e\+300: the factors are not finite"),
    "hyperdiffusion_negative_dt_on_the_last_rank": ("ValueError", r"^hyperdiffusion: rank {last} of {size}: dt must be "
                                                                  r"a finite number >= 0, got -600.0$"),
    # issue 40: tiles in memory shared on the node (on a polar grid every rank is the last one's neighbour's
    # neighbour at 2 and 4 ranks, so every rank raises)
    "shared_lead_on_the_last_rank": ("ValueError", r"^HaloExchange.zeros: the {size} ranks disagree on what they are "
                                                   r"about to do: lead: {first} \[2\], rank {last} \[3\]\n  fix: pass "
                                                   r"the same lead on every rank\n.*\n  rank {last} has: "
                                                   r"\{{\"dtype\":\"<f8\",\"lead\":\[3\]\}}$"),
    "shared_without_extents_on_the_last_rank": ("TypeError", r"^HaloExchange.zeros: rank {last} of {size}: a halo "
                                                             r"without extents does not know this rank's tile"),
    "shared_update_against_accumulate": ("ValueError", r"^HaloExchange.(update|accumulate): rank \d of {size} .*cannot "
                                                       r"exchange its halo: .*(not making the same call|could not "
                                                       r"complete its own)"),
    "shared_plain_batch_on_the_last_rank": ("ValueError", r"^HaloExchange.update: rank \d of {size} .*cannot exchange "
                                                          r"its halo: .*(not making the same call|could not complete "
                                                          r"its own)"),
    # issue 41: reduced grids
    "ring_gather_not_an_array_on_the_last_rank": ("TypeError", r"^RingTiles.gather: rank {last} of {size}: expected "
                                                               r"this rank's points \(\.\.\., \d+\) of O4, got list$"),
    "ring_scatter_points_on_the_last_rank": ("ValueError", r"^RingTiles.scatter: rank {last} of {size}: root {last}'s "
                                                           r"field has 209 points in its last axis, O4 has 208$"),
    "ring_points_on_the_last_rank": ("ValueError", r"^DistributedReducedRealSHT.forward: rank {last} of {size}: "
                                                   r"the input's last 1 axes are not this rank's set of points"
                                                   r"\n  fix: .*"
                                                   r"\n  rank {last} \(.*\): expected \(\d+,\) in the last 1 axes"),
    "ring_interpolation_whole_field_on_the_last_rank": ("ValueError", r"^PointInterpolation.forward: rank {last} "
                                                                      r"of {size}: expected this rank's points "
                                                                      r"\(\.\.\., \d+\) of O4, got shape \(208,\)$"),
    # issue 46: calls made on some ranks only name the call each rank is in, grid.free() included
    "free_while_the_last_rank_transforms": ("ValueError", r"^(ProcessGrid.free|DistributedRealSHT.forward): the {size} "
                                                          r"ranks are in different calls: {first} in ProcessGrid.free, "
                                                          r"rank {last} in DistributedRealSHT.forward\n  fix: make the "
                                                          r"same mpisphere calls in the same order on every rank"),
    "free_while_rank_0_transforms": ("ValueError", r"^(ProcessGrid.free|DistributedRealSHT.forward): the {size} ranks "
                                                   r"are in different calls: ({others} in ProcessGrid.free, rank 0 in "
                                                   r"DistributedRealSHT.forward|rank 0 in DistributedRealSHT.forward, "
                                                   r"{others} in ProcessGrid.free)\n  fix: make the same mpisphere "
                                                   r"calls "
                                                   r"in the same order on every rank: a call made inside 'if rank == "
                                                   r"\.\.\.'"),
    "a_call_ahead_on_rank_0": ("ValueError", r"^Distributed(Inverse)?RealSHT.forward: the {size} ranks are in "
                                             r"different "
                                             r"calls: ({others} in DistributedInverseRealSHT.forward, rank 0 in "
                                             r"DistributedRealSHT.forward|rank 0 in DistributedRealSHT.forward, "
                                             r"{others} in DistributedInverseRealSHT.forward)\n  fix: make the same "
                                             r"mpisphere calls in the "
                                             r"same order on every rank: a call made inside 'if rank == \.\.\.' .*"
                                             r"leaves those ranks a call ahead or behind"),
    # issue 56: a free refused on the last rank left it deaf to the halo failures of other ranks
    "refused_free_then_a_halo_mistake_on_rank_0": ("TypeError", r"^HaloExchange.update: rank \d of {size}.*(cannot "
                                                               r"exchange its halo|failed on rank \d \(the mistake "
                                                               r"at rank 0\) in an earlier call)"),
    # issue 56: a rank that frees the grid while the others replay a halo call: it answers them; its neighbours
    # raise in the call, it in free(), the ranks farther away in their free() (the grid's agreement told them)
    "free_between_halo_replays_on_the_last_rank": (
        "ValueError", r"^(ProcessGrid.free: rank \d of {size}: (north|south) neighbour rank \d was in "
                      r"HaloExchange.update on this grid|ProcessGrid.free: rank \d of {size}: HaloExchange.update "
                      r"failed on rank \d .* in an earlier call|HaloExchange.update: rank \d of {size} .*cannot "
                      r"exchange its halo)"),
    "free_between_halo_replays_on_rank_0": (
        "ValueError", r"^(ProcessGrid.free: rank 0 of {size}: south neighbour rank 1 was in HaloExchange.update on "
                      r"this grid|ProcessGrid.free: rank \d of {size}: HaloExchange.update failed on rank \d .* in an "
                      r"earlier call|HaloExchange.update: rank \d of {size} .*cannot exchange its halo)"),
    # issue 56: tilings that differ between ranks, refused by name before any data moves (a larger part returned
    # uninitialised memory, a smaller one a raw MPI error on one rank)
    "tiling_extents_on_the_last_rank": ("ValueError", r"^RegularTiling.scatter: the {size} ranks hold different "
                                                      r"tilings: tiling.name: {first} \"the 13 x 10 field\", rank "
                                                      r"{last} \"the 14 x 10 field\"; tiling.whole: {first} "
                                                      r"\[13,10\], rank {last} \[14,10\]\n  fix: pass the same "
                                                      r"tiling.name, tiling.whole on every rank"),
    "ring_tiles_rings_on_the_last_rank": ("ValueError", r"^RingTiles.gather: the {size} ranks hold different tilings: "
                                                        r"tiling.layout: .*tiling.name: {first} \"O4\", rank {last} "
                                                        r"\"O5\"; tiling.rings: {first} 8, rank {last} 10; "
                                                        r"tiling.whole: {first} \[208\], rank {last} \[280\]"),
    # issue 56: a missing value in a DISCO convolution's input (the FFT spread it over its ring), named
    "disco_nan_on_the_last_rank": ("ValueError", r"^DiscoConvS2.forward: rank {last} of {size}: input: a non-finite "
                                                 r"value \(nan\) at index \(0, 1\), latitude \d+, longitude \d+ "
                                                 r"of the 13 x 20 grid .*\n  fix: fill the missing values"),
    # issue 56: the drop-in modules' own checks are agreed before anything else (they raised on one rank only)
    "dropin_groups_on_the_last_rank": ("ValueError", r"^DistributedDiscreteContinuousConvS2.__init__: rank {last} of "
                                                     r"{size}: DistributedDiscreteContinuousConvS2: in_channels=2 and "
                                                     r"out_channels=2 must be multiples of groups=3$"),
    "dropin_basis_type_on_the_last_rank": ("ValueError", r"^DistributedDiscreteContinuousConvS2.__init__: rank {last} "
                                                         r"of {size}: filter_basis: basis_type must be one of .*got "
                                                         r"'piecewise-linear'"),
    "dropin_polar_mode_on_the_last_rank": ("ValueError", r"^DistributedDiscreteContinuousConvS2.__init__: rank {last} "
                                                         r"of {size}: .*polar_mode='reduce-scatter'"),
    "dropin_in_shape_on_the_last_rank": ("ValueError", r"^DistributedDiscreteContinuousConvS2.__init__: rank {last} "
                                                       r"of {size}: in_shape must be \(nlat, nlon\), two positive "
                                                       r"integers, got 13$"),
    "dropin_spectral_groups_on_rank_0": ("ValueError", r"^DistributedSpectralConvS2.__init__: rank 0 of {size}: "
                                                       r"DistributedSpectralConvS2: .*num_groups=3$"),
}

# the cases that need PyTorch (the torch extra; .ci/torch and .ci/system-mpi install it, and there
# MPISPHERE_REQUIRE_TORCH=1 makes a missing torch a failure)
TORCH_CASES = {case for case in EXPECTED if case.startswith("dropin_")}

# the cases that need mpisphere.io (the io extra: Zarr, Python 3.11 and newer)
IO_CASES = {"checkpoint_fails_on_the_last_rank_before_writing", "checkpoint_keep_on_the_last_rank",
            "store_mode_on_the_last_rank", "store_write_allocation_fails_on_the_last_rank",
            "store_read_allocation_fails_on_the_last_rank", "coefficients_orders_on_the_last_rank",
            "set_attrs_values_on_the_last_rank", "set_attrs_in_another_key_order_on_the_last_rank",
            "write_attrs_in_another_key_order_on_the_last_rank", "save_not_finite_on_the_last_rank"}

SIZES = [2, 4]


@functools.lru_cache(maxsize=None)
def _launch(size, debug):
    """Run every case under ``mpiexec -n size``: ``({case: [record per rank]}, output)``."""
    launcher = mpiexec_command()
    if launcher is None:
        pytest.fail("no mpiexec found: install an MPI runtime (pip install '.[mpich]' in the mpisphere clone)")
    folder = tempfile.mkdtemp(prefix="mpisphere-misuse-")
    cmd = [*launcher, "-n", str(size), sys.executable, str(HERE / "misuse_cases.py"), "--out", folder] + \
        (["--debug"] if debug else [])
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT, env=env,
                              start_new_session=True)
        output = done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace")
    records = {}
    for path in sorted(Path(folder).glob("rank*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            records.setdefault(record["case"], []).append(record)
        path.unlink()
    os.rmdir(folder)
    return records, output


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("case", list(EXPECTED))
def test_mistake_on_one_rank_raises_on_every_rank(case, size, debug):
    if case in IO_CASES:
        pytest.importorskip("zarr")  # the io extra (Python 3.11 and newer)
    if case in TORCH_CASES and os.environ.get("MPISPHERE_REQUIRE_TORCH") != "1":
        pytest.importorskip("torch")  # the torch extra
    records, output = _launch(size, debug)
    seen = records.get(case, [])
    if len(seen) != size:
        started = re.findall(r"START (\w+)", output)
        pytest.fail(f"{case}: {len(seen)} of {size} ranks finished the case (a hang or a crash; the launch was in "
                    f"{started[-1] if started else 'no case'} when it ended)\n--- output ---\n{output[-4000:]}")
    kind, pattern = EXPECTED[case]
    if kind == "returned":  # a legal program: it runs on every rank
        for record in sorted(seen, key=lambda r: r["rank"]):
            assert record["outcome"] == "returned", \
                f"{case}: rank {record['rank']} raised {record.get('type')}: {record.get('message')}"
        return
    # {most}: the largest group of ranks when rank 1 differs; {first}: the ranks before the last one
    most = "rank 0" if size == 2 else "ranks 0, " + ", ".join(map(str, range(2, size)))
    first = "rank 0" if size == 2 else f"ranks 0-{size - 2}" if size > 3 else "ranks 0, 1"
    others = "rank 1" if size == 2 else f"ranks 1-{size - 1}" if size > 3 else "ranks 1, 2"
    pattern = pattern.format(size=size, last=size - 1, most=re.escape(most), first=re.escape(first),
                             others=re.escape(others))
    for record in sorted(seen, key=lambda r: r["rank"]):
        assert record["outcome"] == "raised", f"{case}: rank {record['rank']} returned a result"
        assert record["type"] in ((kind,) if isinstance(kind, str) else kind), \
            f"{case}: rank {record['rank']} raised {record['type']}: {record['message']}"
        assert re.search(pattern, record["message"]), \
            f"{case}: rank {record['rank']}'s message does not match {pattern!r}:\n{record['message']}"
    # an error raised by an agreement is printed once: in full by one rank, in one line naming it by the others
    # (a rank that raised its own error, such as a refused call, names none: it printed its own in full)
    reporters = {record["reporter"] for record in seen} - {None}
    if reporters:
        assert len(reporters) == 1, f"{case}: the ranks name different reporters {reporters}"
        reporter = reporters.pop()
        for record in seen:
            if record["rank"] == reporter:
                assert record["printed"] == record["message"], f"{case}: the reporter {reporter} shortened its message"
            else:
                assert "\n" not in record["printed"] and len(record["printed"]) < 260 and \
                    f"the whole message: rank {reporter}'s error" in record["printed"], \
                    f"{case}: rank {record['rank']} printed more than one line naming rank {reporter}: " \
                    f"{record['printed']}"
