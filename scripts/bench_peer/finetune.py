"""`make bench-peer`'s fine-tuning rows: gorovod's finetune against Horovod, same model and records.

    python3 finetune.py --finetune BIN --bench BIN --mpirun CMD --peer_python PY \
        --saved_model DIR --init_checkpoint CKPT --data_dir DIR --work DIR [--steps N] [--repeats R]

In one run, interleaved --repeats times (each configuration keeps its best rate, the run least
disturbed by other jobs on the machine):
1. gorovod's finetune, 1 rank and 2 ranks, 1 intra-op + 1 inter-op thread per rank, batch B per
   rank (scripts/bench_finetune.py's runs: examples/s after the first step), with
   --sparse_as_dense: the word embeddings' gradient in the allreduce, as the Horovod side's
   DistributedGradientTape(sparse_as_dense=True) has it;
2. scripts/bench_peer/horovod_finetune.py under the peer virtualenv on the train.tf_record shards
   those runs wrote (the same examples on the same ranks), 1 rank, 2 ranks at Horovod's defaults,
   and 2 ranks with `--mca mpi_yield_when_idle 1`;
3. the initial broadcast of the model's variables: gorovod's fused BroadcastVariables of MiniLM's
   shapes (horovod/internal/bench -peer-variables, with raw MPI's one MPI_Bcast of the same bytes)
   against Horovod's broadcast_variables, timed by the 2-rank Horovod runs.
Prints examples/s, gorovod / Horovod, and the distributed overhead per step: the 2-rank step time
minus the 1-rank step time (each rank computes a batch of B in both).
"""
import argparse
import json
import pathlib
import shlex
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench_finetune import finetune  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent


def run_json(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        sys.exit(f"bench_peer/finetune.py: {' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-4000:]}{p.stdout[-2000:]}")
    return json.loads(lines[-1])


def horovod(a, records, mpirun_args=()):
    return run_json(shlex.split(a.mpirun) + list(mpirun_args) + [
        "-x", "TF_CPP_MIN_LOG_LEVEL=2", "-x", "CUDA_VISIBLE_DEVICES=", "-np", str(len(records)),
        a.peer_python, str(HERE / "horovod_finetune.py"), "--saved_model", a.saved_model,
        "--init_checkpoint", a.init_checkpoint, "--records", *map(str, records),
        "--batch_size", str(a.batch_size), "--steps", str(a.steps)])


def gorovod_broadcast(a):
    p = subprocess.run(shlex.split(a.mpirun) + ["-np", "2", a.bench, "-peer-variables"], capture_output=True, text=True)
    secs = {}
    for line in p.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) == 4 and parts[1] == "broadcast_variables":
            secs[parts[0]] = float(parts[3])
    if p.returncode != 0 or len(secs) != 2:
        sys.exit(f"bench_peer/finetune.py: {a.bench} -peer-variables: exit {p.returncode}\n{p.stderr[-4000:]}")
    return secs


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("--finetune", "--bench", "--mpirun", "--peer_python", "--saved_model", "--init_checkpoint",
                 "--data_dir", "--work"):
        p.add_argument(flag, required=True)
    p.add_argument("--batch_size", type=int, default=16, help="per rank (the default task's)")
    p.add_argument("--steps", type=int, default=4, help="timed steps after the first")
    p.add_argument("--repeats", type=int, default=1)
    a = p.parse_args()
    work = pathlib.Path(a.work)
    # (key, what, ranks, the 1-rank run its overhead is measured from)
    runs = (("gorovod_1", "gorovod 1 rank", 1, None), ("gorovod_2", "gorovod 2 ranks", 2, "gorovod_1"),
            ("horovod_1", "Horovod 1 rank", 1, None), ("horovod_2", "Horovod 2 ranks, defaults", 2, "horovod_1"),
            ("horovod_2_yield", "Horovod 2 ranks, mpi_yield_when_idle 1", 2, "horovod_1"))
    rates = {k: [] for k, *_ in runs}
    bcast = {"mpi": [], "gorovod": [], "horovod": []}
    for _ in range(a.repeats):
        rates["gorovod_1"].append(finetune(a, 1, work / "one", "--sparse_as_dense"))
        rates["gorovod_2"].append(finetune(a, 2, work / "two", "--sparse_as_dense"))
        rates["horovod_1"].append(horovod(a, [work / "one/train.tf_record"])["examples_per_sec"])
        two = [work / "two/train.tf_record", work / "two/1/train.tf_record"]
        for key, args in (("horovod_2", ()), ("horovod_2_yield", ("--mca", "mpi_yield_when_idle", "1"))):
            r = horovod(a, two, args)
            rates[key].append(r["examples_per_sec"])
            bcast["horovod"].append(r["broadcast_variables_sec"])
            variables, nbytes = r["variables"], r["variable_bytes"]
        for impl, secs in gorovod_broadcast(a).items():
            bcast[impl].append(secs)
    print(f"rates of the {a.repeats} interleaved runs: " + json.dumps({k: [round(r, 2) for r in v] for k, v in rates.items()}))
    best = {k: max(v) for k, v in rates.items()}
    step = {k: a.batch_size * ranks / best[k] for k, _, ranks, _ in runs}
    print(f"fine-tuning MiniLM, batch {a.batch_size} per rank, 1+1 threads per rank, {a.steps} timed steps, best of {a.repeats}:")
    print(f"  {'':<40}{'examples/s':>11}{'s/step':>8}{'overhead/step':>15}{'gorovod/this':>14}")
    for k, what, ranks, one in runs:
        overhead = f"{step[k] - step[one]:.2f} s" if one else "-"
        print(f"  {what:<40}{best[k]:>11.2f}{step[k]:>8.2f}{overhead:>15}{best[f'gorovod_{ranks}'] / best[k]:>14.2f}")
    b = {k: min(v) for k, v in bcast.items()}
    print(f"initial broadcast of the model's {variables} variables ({nbytes / 2**20:.1f} MiB), 2 ranks, best:")
    print(f"  raw MPI one MPI_Bcast {b['mpi'] * 1e3:.1f} ms, gorovod BroadcastVariables {b['gorovod'] * 1e3:.1f} ms, "
          f"Horovod broadcast_variables {b['horovod'] * 1e3:.1f} ms: Horovod / gorovod {b['horovod'] / b['gorovod']:.2f}")


if __name__ == "__main__":
    main()
