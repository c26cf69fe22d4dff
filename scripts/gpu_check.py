"""Every check mpisphere's GPU paths need, in one command, on a GPU machine without MPI wheels or a package index.

    python3 scripts/gpu_check.py fetch                  # here, with pip's index: wheels into .whl/ (~16 MB)
    python3 scripts/gpu_check.py run --out DIR          # there (the device tool: carry [".whl"]): everything
    python3 scripts/gpu_check.py run --dry-run --out DIR   # any machine: the same plumbing on the CPU (CI runs it)

``run`` uses the machine's own ``python3`` and its packages (CuPy, PyTorch,
NumPy, pytest, mpi4py linked to the machine's MPI): a virtual environment
would hide them. The carried wheels (pytest-mpi, ducc0, torch-harmonics
0.9.3) go into a folder of their own on ``PYTHONPATH`` (``pip install
--target``). torch-harmonics' compiled helpers are replaced by pure-Python
stand-ins that say its optimised kernels are not there (its wheel's
extensions are built against another PyTorch; its SHT classes are plain
PyTorch), and its attention and convolution imports are made optional. With
Open MPI the launcher gets ``--oversubscribe`` and, as root, the two
``OMPI_ALLOW_RUN_AS_ROOT`` variables.

Steps, each under its own timeout (about 4 minutes in all on one H200):
``diagnose`` (the MPI, the CUDA-aware decision); the GPU tests at 1, 2 and 4
ranks on the staging path (the stream stress test among them), and on the
CUDA-aware path where diagnose finds one; the SHT against torch-harmonics
(``scripts/bench_gpu.py``: times, oracle errors, peak memory, the Legendre
step against its bandwidth bound); the communication operators on device
buffers at 2 and 4 ranks (``scripts/bench_primitives.py --device gpu``:
the staging copies against the pinned copy bandwidth). It writes at most
eight files into ``DIR`` and ends with one summary table; it exits non-zero
when a step fails (a GPU test skipped on a GPU machine is a failure).

``--dry-run`` runs every step on the CPU instead: the wheels from pip's
index into the same kind of folder, the same stand-ins, the GPU tests (all
skipped without a GPU, which is what a dry run expects), the benchmarks on
NumPy arrays at a tiny size (torch-harmonics on the CPU when PyTorch is
installed), the same files and the same table.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ["pytest-mpi==0.6", "ducc0==0.42.0", "torch-harmonics==0.9.3"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64"]
FILES = ("check.log", "summary.json", "diagnose.txt", "tests.txt", "sht-gpu.json", "primitives-2.json",
         "primitives-4.json")
STAND_IN = '''"""A stand-in for torch-harmonics' compiled {name} (written by mpisphere's scripts/gpu_check.py).

The wheel's extension is built against another PyTorch and does not import;
torch-harmonics' SHT classes need none of it.
"""


def optimized_kernels_is_available():
    return False


def cuda_kernels_is_available():
    return False


def __getattr__(name):
    raise ImportError(f"{{name}} needs torch-harmonics' compiled {name}, replaced by a stand-in")
'''


class Check:
    """One run: its output folder, its log, the steps' outcomes, the summary."""

    def __init__(self, out, dry_run, python):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.dry_run = dry_run
        self.python = python
        self.log = open(self.out / "check.log", "w")
        self.steps = []
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                        MKL_NUM_THREADS="1")

    def say(self, text):
        print(text, flush=True)
        self.log.write(text + "\n")
        self.log.flush()

    def step(self, name, seconds, command, output=None):
        """Run ``command`` with a timeout; its output goes to the log (and to ``output``); returns (ok, text)."""
        self.say(f"== {name} (timeout {seconds} s): {' '.join(map(str, command))}")
        start = time.monotonic()
        try:
            done = subprocess.run([str(c) for c in command], cwd=ROOT, env=self.env, capture_output=True, text=True,
                                  timeout=seconds)
            text, code = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired as exc:
            text = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
            text, code = text + f"\n(timed out after {seconds} s)", 124
        text = text.replace("\x00", "")  # Open MPI's library version ends in a NUL: keep the log greppable
        self.log.write(text)
        if output is not None:
            (self.out / output).write_text(text)
        took = time.monotonic() - start
        self.say(f"== {name}: exit {code} in {took:.0f} s")
        self.steps.append({"step": name, "exit": code, "seconds": round(took, 1)})
        return code == 0, text

    def close(self):
        self.log.close()


# --- the environment ------------------------------------------------------------------------------------------

def fetch(directory, python_version="3.12"):
    """Download the wheels the GPU machine lacks (for its Python) into ``directory``."""
    directory.mkdir(exist_ok=True)
    exclude = ROOT / ".git" / "info" / "exclude"
    if exclude.parent.exists() and "/.whl/" not in (exclude.read_text() if exclude.exists() else ""):
        with open(exclude, "a") as f:
            f.write("/.whl/\n")
    platforms = [flag for p in PLATFORMS for flag in ("--platform", p)]
    for wheel in WHEELS:
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                   "--python-version", python_version, "--implementation", "cp", *platforms, "-d", str(directory),
                   wheel]
        if subprocess.run(command).returncode:
            print(f"gpu_check: could not fetch {wheel}", file=sys.stderr)
            return 1
    print("\n".join(sorted(p.name for p in directory.glob("*.whl"))))
    return 0


def install(check, target):
    """The wheels into ``target`` (from .whl/, or pip's index in a dry run) and torch-harmonics' stand-ins."""
    if target.exists():
        shutil.rmtree(target)
    source = ROOT / ".whl"
    if check.dry_run:
        origin = []  # pip's index: the wheels for this interpreter
    elif sorted(source.glob("*.whl")):
        origin = ["--no-index", "--find-links", str(source)]
    else:
        check.say("gpu_check: no wheels in .whl/: run 'python3 scripts/gpu_check.py fetch' here and carry .whl")
        return False
    ok, _ = check.step("install", 180, [check.python, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                                        "--target", target, *origin, *WHEELS])
    if not ok:
        return False
    for name in ("attention_helpers", "disco_helpers"):
        for compiled in target.glob(f"{name}*.so"):
            compiled.unlink()
        (target / f"{name}.py").write_text(STAND_IN.format(name=name))
    init = target / "torch_harmonics" / "__init__.py"
    text = init.read_text()
    for module in ("attention", "disco"):
        text = re.sub(rf"^from \.{module} import (.+)$", rf"try:\n    from .{module} import \1\n"
                      rf"except ImportError:  # mpisphere's gpu_check: its compiled kernels are stand-ins\n    pass",
                      text, flags=re.M)
    init.write_text(text)
    check.say(f"installed into {target}: {', '.join(WHEELS)}; torch-harmonics' helpers replaced by stand-ins")
    return True


def launcher(check):
    """The mpiexec to use, with Open MPI's flags (and its root permission as root)."""
    mpiexec = shutil.which("mpiexec", path=str(Path(check.python).parent) + os.pathsep + os.environ.get("PATH", ""))
    if mpiexec is None:
        return None
    version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True).stdout
    command = [mpiexec]
    if "Open MPI" in version or "OpenRTE" in version:
        command.append("--oversubscribe")
        if os.geteuid() == 0:
            check.env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return command


# --- the summary ---------------------------------------------------------------------------------------------

def tests_by_ranks(text):
    """``{ranks: "12 passed, 2 skipped ..."}`` from the plugin's table of MPI launches."""
    return {int(n): summary.split(" in ")[0] for n, summary in re.findall(r"^(\d+) rank\(s\): (.+?)(?: \(wall|$)",
                                                                          text, flags=re.M)}


def sht_table(path):
    """Markdown rows of the SHT benchmark: each case, torch-harmonics beside each strategy."""
    if not path.exists():
        return ["(no SHT results)"]
    found = json.loads(path.read_text())
    lines = ["| case | torch-harmonics fwd / inv ms | strategy | mpisphere fwd / inv ms | ratio | oracle fwd / inv "
             "| Legendre ms (bound) | peak MB |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    rows = found["rows"]
    keys = sorted({(r["kind"], r["nlat"], r["nlon"], r["batch"], r["dtype"]) for r in rows})
    for key in keys:
        group = [r for r in rows if (r["kind"], r["nlat"], r["nlon"], r["batch"], r["dtype"]) == key]
        th = next((r for r in group if r["library"] == "torch-harmonics"), None)
        case = f"{key[0]} {key[1]} x {key[2]} x {key[3]} {key[4]}"
        reference = f"{th['forward_ms']:.2f} / {th['inverse_ms']:.2f}" if th else "not run"
        for r in (r for r in group if r["library"] == "mpisphere"):
            ratio = (f"{r['forward_ms'] / th['forward_ms']:.2f} / {r['inverse_ms'] / th['inverse_ms']:.2f}"
                     if th else "")
            oracle = f"{r['oracle_forward']:.1e} / {r['oracle_inverse']:.1e}" if "oracle_forward" in r else ""
            lines.append(f"| {case} | {reference} | {r['asked']} ({r['strategy']}) | {r['forward_ms']:.2f} / "
                         f"{r['inverse_ms']:.2f} | {ratio} | {oracle} | {r['legendre_ms']:.2f} "
                         f"({r['legendre_bound_ms']:.2f}) | {r['pair_peak_mb']:.0f} |")
    copies = found.get("copies", {})
    lines.append(f"copies: device-to-device {copies.get('d2d_gbs', 0):.0f} GB/s" +
                 (f", pinned host-to-device {copies['h2d_gbs']:.1f} GB/s, device-to-host {copies['d2h_gbs']:.1f} GB/s"
                  if "h2d_gbs" in copies else ""))
    return lines


def staging_lines(out):
    lines = []
    for ranks in (2, 4):
        path = out / f"primitives-{ranks}.json"
        if not path.exists():
            continue
        for row in json.loads(path.read_text())["rows"]:
            if row["operator"].startswith("staging copy"):
                share = row["raw_median_ms"] / row["median_ms"]
                rate = row["bytes"] / row["median_ms"] / 1e6
                lines.append(f"{ranks} ranks, {row['grid']}: {row['operator']}: {rate:.1f} GB/s, {share:.0%} of the "
                             f"pinned copy ({row['raw_call']})")
    return lines or ["(no staging copy results)"]


def summarize(check, found_tests, ok):
    lines = ["", "== summary" + (" (dry run: CPU stand-ins, nothing here was measured on a GPU)" if check.dry_run
                                 else ""),
             "| step | exit | seconds |", "| --- | --- | --- |"]
    lines += [f"| {s['step']} | {s['exit']} | {s['seconds']} |" for s in check.steps]
    lines += ["", "GPU tests by rank count: " + ("; ".join(f"{n}: {t}" for n, t in sorted(found_tests.items()))
                                                  or "none ran")]
    lines += [""] + sht_table(check.out / "sht-gpu.json") + [""] + staging_lines(check.out)
    lines += ["", f"gpu_check: {'OK' if ok else 'FAILED (see check.log)'}; files in {check.out}: "
                  f"{', '.join(sorted(p.name for p in check.out.iterdir()))}"]
    for line in lines:
        check.say(line)
    (check.out / "summary.json").write_text(json.dumps({"ok": ok, "dry_run": check.dry_run, "steps": check.steps,
                                                       "tests": found_tests}, indent=1))


# --- run ------------------------------------------------------------------------------------------------------

def run(args):
    check = Check(args.out, args.dry_run, args.python)
    target = Path(args.deps)
    failed = not install(check, target)
    check.env["PYTHONPATH"] = os.pathsep.join([str(target), str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    mpiexec = launcher(check)
    if mpiexec is None:
        check.say("gpu_check: no mpiexec on PATH")
        failed = True
    else:
        check.env["MPISPHERE_MPIEXEC"] = " ".join(mpiexec)
    found_tests = {}
    if not failed:
        ok, text = check.step("diagnose", 90, [*mpiexec, "-n", "2", check.python, "-m", "mpisphere", "diagnose"],
                              output="diagnose.txt")
        failed |= not ok
        aware = "CUDA-aware MPI: yes" in text
        sizes = "1,2" if check.dry_run else "1,2,4"
        paths = [("staging", "0")] + ([("cuda-aware", "1")] if aware else [])
        tests_text = ""
        for label, value in paths:
            check.env["MPISPHERE_CUDA_AWARE"] = value
            ok, text = check.step(f"tests ({label})", 200, [
                check.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", f"--mpi-sizes={sizes}",
                "--mpi-launch-timeout=180", "tests/test_gpu.py"])
            tests_text += f"== {label}\n{text}"
            found = tests_by_ranks(text)
            found_tests.update({f"{n} ({label})": t for n, t in found.items()})
            skipped_on_gpu = not check.dry_run and any("skipped" in t and "passed" not in t for t in found.values())
            failed |= not ok or skipped_on_gpu or not found
        check.env.pop("MPISPHERE_CUDA_AWARE")
        (check.out / "tests.txt").write_text(tests_text)
        module = "numpy" if check.dry_run else "cupy"
        cases = "33x64:2" if check.dry_run else "361x720:32,721x1440:32,1025x2048:8"
        ok, _ = check.step("SHT against torch-harmonics", 150, [
            check.python, "scripts/bench_gpu.py", "--array-module", module, "--cases", cases,
            "--repeats", "1" if check.dry_run else "5", "--json", check.out / "sht-gpu.json"])
        failed |= not ok
        small = ["--nlat", "33", "--nlon", "64", "--batch", "2", "--repeats", "1", "--warmup", "0"]
        for ranks in (2, 4):
            device = [] if check.dry_run else ["--device", "gpu"]
            sizes = small if check.dry_run else ["--repeats", "7", "--warmup", "2"]
            ok, _ = check.step(f"primitives at {ranks} ranks", 120, [
                *mpiexec, "-n", str(ranks), check.python, "scripts/bench_primitives.py", *device, *sizes,
                "--json", check.out / f"primitives-{ranks}.json"])
            failed |= not ok
    summarize(check, found_tests, not failed)
    check.close()
    extra = sorted(p.name for p in check.out.iterdir() if p.name not in FILES)
    if extra or len(list(check.out.iterdir())) > 8:
        print(f"gpu_check: more files than planned in {check.out}: {extra}", file=sys.stderr)
        return 1
    return 1 if failed else 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    get = sub.add_parser("fetch", help="download the wheels the GPU machine needs into .whl/")
    get.add_argument("--python-version", default="3.12", help="the GPU machine's Python")
    go = sub.add_parser("run", help="run every check (on the GPU machine, or --dry-run anywhere)")
    go.add_argument("--out", default=os.environ.get("OUT", "gpu-check-out"), help="the folder of the results")
    go.add_argument("--deps", default="/tmp/gpu-check-deps", help="where the carried wheels are installed")
    go.add_argument("--python", default=sys.executable, help="the interpreter with CuPy, PyTorch and mpi4py")
    go.add_argument("--dry-run", action="store_true", help="the same plumbing on the CPU: nothing measured")
    args = parser.parse_args(argv)
    if args.command == "fetch":
        return fetch(ROOT / ".whl", args.python_version)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
