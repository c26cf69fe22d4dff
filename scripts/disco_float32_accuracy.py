"""How far the DISCO convolutions in float32 are from a float64 run, mpisphere's against torch-harmonics'.

    python scripts/disco_float32_accuracy.py            # one rank; torch and torch-harmonics needed

The issue's cases: the convolution 128 x 256 -> 64 x 128 and its transpose 64 x 128 -> 128 x 256, 4 -> 4 channels,
batch 2, the piecewise linear basis (3,) and the morlet basis (3, 3). Both libraries get the same float32 input and
weights; the reference is mpisphere's float64 run on them (torch-harmonics' float64 run agrees with it to 1e-12).
Prints the largest absolute error of each and their ratio.
"""

import torch
import torch_harmonics as th
from mpi4py import MPI

import mpisphere
import mpisphere.torch_harmonics as thd


def main():
    grid = mpisphere.ProcessGrid(MPI.COMM_SELF, 1, 1)
    print("DISCO float32 against float64: largest absolute error (ours, torch-harmonics 0.9.3, ratio)")
    for transposed in (False, True):
        for basis, kernel in (("piecewise linear", (3,)), ("morlet", (3, 3))):
            torch.manual_seed(0)
            serial_type = th.DiscreteContinuousConvTransposeS2 if transposed else th.DiscreteContinuousConvS2
            ours_type = thd.DistributedDiscreteContinuousConvTransposeS2 if transposed else \
                thd.DistributedDiscreteContinuousConvS2
            shape_in, shape_out = ((64, 128), (128, 256)) if transposed else ((128, 256), (64, 128))
            serial = serial_type(4, 4, shape_in, shape_out, kernel, basis_type=basis)
            ours = ours_type(4, 4, shape_in, shape_out, kernel, basis_type=basis, process_grid=grid)
            ours.load_state_dict(serial.state_dict())
            x = torch.randn(2, 4, *shape_in)
            with torch.no_grad():
                reference = ours.double()(x.double())
                ours.float()
                mine = float((ours(x).double() - reference).abs().max())
                theirs = float((serial(x).double() - reference).abs().max())
            name = ("transposed " if transposed else "forward    ") + f"{basis:16s}"
            print(f"  {name}: {mine:.3g}  {theirs:.3g}  {mine / theirs:.2f}  (largest value "
                  f"{float(reference.abs().max()):.3g})")
    grid.free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
