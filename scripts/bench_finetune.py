"""Training throughput of cmd/finetune: scaling from 1 to 2 ranks, and against TensorFlow's
MultiWorkerMirroredStrategy, measured side by side in one run (make bench-finetune).

1. finetune on 1 rank x 1 intra-op thread, batch B, on the first N training lines;
2. finetune on 2 ranks x 1 thread each, batch B per rank, on the same N lines;
3. scripts/bench_mwms.py: 2 MultiWorkerMirroredStrategy workers x 1 thread, batch B per worker,
   reading the very train.tf_record shards that run 2 wrote for its ranks, compared with 2 run
   again with --sparse_as_dense: MWMS allreduces every gradient whole, the word embeddings'
   47 MB included, where gorovod by default allgathers the rows a batch looked up;
4. as 2, with --use_fp16 (gradients on the wire as float16), for the record;
5. with --compare_waits, as 2 with GOROVOD_MPI_WAIT=spin (a rank early in a negotiation round
   polls in MPI, as before horovod/mpi's sleeping wait), and that again with mpirun's
   --mca mpi_yield_when_idle 1 (the poll yields the core between tests).

With --amp (make bench-amp) the runs are instead float32 and --amp=bfloat16 (forced, so a CPU
without AVX512-BF16/AMX shows what bfloat16 costs it) on 1 and 2 ranks, two independent 1-rank
bfloat16 jobs started at once (what the machine's cores and memory give two processes with no
allreduce between them: the ceiling of the scaling efficiency, counted over the time both ran
past their first step), and bfloat16 on 2 ranks with the
gradients on the wire as fp16 and as bf16: the mixed-precision speed-up at 1 and 2 ranks, the
scaling efficiency with it, and whether compression pays once the step is faster.

Each rate is examples/s over all ranks after the first step (finetune's summary line; the MWMS
script skips its warmup step the same way). The three runs are repeated --repeats times,
interleaved, and each configuration keeps its best rate: on a machine shared with other jobs the
best of several runs is the one least disturbed, for all three alike. Prints the figures and two
ratios: scaling efficiency = rate(2 ranks) / (2 x rate(1 rank)) (target >= 0.9), and gorovod /
MWMS (target >= 1.0). Since a run's rate moves from run to run by about as much as the scaling
falls short of 1, the scaling is also printed per repeat (each 2-rank run against the 1-rank run
of the same repeat, minutes apart) with the median of those.
"""
import argparse
import json
import os
import pathlib
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time

STEP = re.compile(r"^step (\d+)/\d+: ")
STEADY = re.compile(r"trained steps \d+\.\.\d+ in \S+: [\d.]+ examples/sec over all ranks \(([\d.]+) after the first step\)")


def finetune(a, ranks, out, *extra, wait="sleep", mpirun_args=()):
    return finetune_together(a, ranks, [out], *extra, wait=wait, mpirun_args=mpirun_args)


def finetune_together(a, ranks, outs, *extra, wait="sleep", mpirun_args=()):
    """Runs one finetune job per output directory, all started at once, and returns the sum of
    their steady rates (several jobs: what the machine gives independent jobs side by side).

    One job's rate is its summary line's, after the first step. Several jobs' are counted over
    the time all of them were past their first step and not yet done (each job logs every step,
    timestamped here as the line arrives, the examples done interpolated between steps): their
    own windows start and end apart, and the stretches where one job runs alone, uncontended,
    would count as if both ran."""
    steps = a.steps + 1
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", GOROVOD_MPI_WAIT=wait)
    jobs = []
    for out in outs:
        shutil.rmtree(out, ignore_errors=True)
        cmd = shlex.split(a.mpirun) + list(mpirun_args) + ["-np", str(ranks), a.finetune,
            "--do_train", f"--saved_model={a.saved_model}", f"--data_dir={a.data_dir}", f"--output_dir={out}",
            f"--train_batch_size={a.batch_size}", f"--max_train_examples={steps * a.batch_size * 2}",
            f"--num_train_epochs={1 / (2 / ranks)}", "--threads=1", "--inter_op_threads=1",
            "--save_checkpoints_steps=0", "--export_dir=none",
            f"--log_step_count_steps={1 if len(outs) > 1 else steps}", *extra]
        job = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = []  # (arrival time, line)
        reader = threading.Thread(target=lambda j=job, l=lines: l.extend((time.monotonic(), x) for x in j.stdout))
        reader.start()
        jobs.append((cmd, job, reader, lines))
    steady, stamps = [], []
    for cmd, job, reader, lines in jobs:
        job.wait()
        reader.join()
        text = "".join(x for _, x in lines)
        m = STEADY.search(text)
        if job.returncode != 0 or not m:
            sys.exit(f"bench_finetune: {' '.join(cmd)}: exit {job.returncode}\n{text}")
        steady.append(float(m.group(1)))
        stamps.append([(t, int(m.group(1))) for t, x in lines if (m := STEP.search(x))])
    if len(jobs) == 1:
        return steady[0]
    return overlap_rate(stamps, ranks * a.batch_size)


def overlap_rate(stamps, examples_per_step):
    """The examples/s of jobs side by side, counted over the time all were past their first step
    and none had done its last: stamps[j] is job j's (time, step) of each step it logged."""
    for s in stamps:
        if len(s) < 3 or s[0][1] != 1:
            sys.exit(f"bench_finetune: a job logged steps {[st for _, st in s]}: want every step from 1")
    start = max(s[0][0] for s in stamps)
    end = min(s[-1][0] for s in stamps)
    if end - start < 0.5 * min(s[-1][0] - s[0][0] for s in stamps):
        sys.exit("bench_finetune: the jobs ran side by side for less than half of their steps: no rate of both at once")

    def done_by(s, t):  # steps done by time t, interpolated between the logged ones
        for (t0, n0), (t1, n1) in zip(s, s[1:]):
            if t0 <= t <= t1:
                return n0 + (n1 - n0) * (t - t0) / (t1 - t0)
        raise ValueError(t)

    return sum((done_by(s, end) - done_by(s, start)) * examples_per_step for s in stamps) / (end - start)


def print_paired_scaling(one, two, what):
    """Prints the scaling efficiency of each repeat (its 2-rank rate against the 1-rank rate of
    the same repeat) and their median: the best of each, wherever it fell, can land either side
    of a target that the runs' spread straddles."""
    paired = [t / (2 * o) for o, t in zip(one, two)]
    print(f"  scaling{' ' + what if what else ''}, each repeat's runs: {', '.join(f'{r:.3f}' for r in paired)}; "
          f"median {statistics.median(paired):.3f}")


def mwms(a, work):
    p = subprocess.run([sys.executable, str(pathlib.Path(__file__).parent / "bench_mwms.py"),
                        "--saved_model", a.saved_model, "--records", str(work / "two/train.tf_record"),
                        str(work / "two/1/train.tf_record"), "--batch_size", str(a.batch_size),
                        "--steps", str(a.steps), "--warmup", "1", "--threads", "1", "--inter_op_threads", "1"],
                       capture_output=True, text=True)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        sys.exit(f"bench_finetune: bench_mwms.py: exit {p.returncode}\n{p.stderr[-4000:]}")
    return json.loads(lines[-1])["examples_per_sec"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--finetune", required=True)
    p.add_argument("--mpirun", required=True)
    p.add_argument("--saved_model", required=True)
    p.add_argument("--data_dir", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--batch_size", type=int, default=16, help="per rank (the default task's)")
    p.add_argument("--steps", type=int, default=10, help="timed steps after the first")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--compare_waits", action="store_true",
                   help="also 2 ranks with GOROVOD_MPI_WAIT=spin, without and with mpi_yield_when_idle")
    p.add_argument("--amp", action="store_true",
                   help="float32 against --amp=bf16 on 1 and 2 ranks, two 1-rank bf16 jobs at once, and bf16 with compressed gradients and with --sparse_as_dense")
    a = p.parse_args()
    work = pathlib.Path(a.work)
    if a.amp:
        return amp(a, work)
    rates = {"one": [], "two": [], "two_dense": [], "mwms": [], "two_fp16": []}
    if a.compare_waits:
        rates |= {"two_spin": [], "two_spin_yield": []}
    for _ in range(a.repeats):
        rates["one"].append(finetune(a, 1, work / "one"))
        rates["two"].append(finetune(a, 2, work / "two"))
        rates["two_dense"].append(finetune(a, 2, work / "two-dense", "--sparse_as_dense"))
        rates["mwms"].append(mwms(a, work))
        rates["two_fp16"].append(finetune(a, 2, work / "two-fp16", "--use_fp16"))
        if a.compare_waits:
            rates["two_spin"].append(finetune(a, 2, work / "two-spin", wait="spin"))
            rates["two_spin_yield"].append(finetune(a, 2, work / "two-spin-yield", wait="spin",
                                                    mpirun_args=("--mca", "mpi_yield_when_idle", "1")))
    print(f"rates of the {a.repeats} interleaved runs: " + json.dumps({k: [round(r, 2) for r in v] for k, v in rates.items()}))
    one, two, dense, tf_rate, fp16 = (max(rates[k]) for k in ("one", "two", "two_dense", "mwms", "two_fp16"))
    print(f"finetune MiniLM seq {json.load(open(pathlib.Path(a.saved_model) / 'assets.extra/gorovod_contract.json'))['max_seq_length']}, "
          f"batch {a.batch_size} per rank, 1 intra-op thread per rank, {a.steps} timed steps:")
    print(f"best of {a.repeats}:")
    print(f"  gorovod 1 rank : {one:8.2f} examples/s")
    print(f"  gorovod 2 ranks: {two:8.2f} examples/s   scaling efficiency {two / (2 * one):.2f} (target >= 0.9)")
    print_paired_scaling(rates["one"], rates["two"], "")
    print(f"  gorovod 2 ranks, --use_fp16: {fp16:6.2f} examples/s   scaling efficiency {fp16 / (2 * one):.2f}")
    print(f"  gorovod 2 ranks, --sparse_as_dense: {dense:6.2f} examples/s   (the word embeddings' gradient allreduced whole, as MWMS does)")
    print(f"  TF MWMS 2 workers: {tf_rate:6.2f} examples/s   gorovod / MWMS = {dense / tf_rate:.2f}x with the same dense allreduce "
          f"(target >= 1.0), {two / tf_rate:.2f}x with gorovod's default (the looked-up rows allgathered)")
    if a.compare_waits:
        for k, what in (("two_spin", "GOROVOD_MPI_WAIT=spin"), ("two_spin_yield", "GOROVOD_MPI_WAIT=spin, mpi_yield_when_idle")):
            r = max(rates[k])
            print(f"  gorovod 2 ranks, {what}: {r:6.2f} examples/s   sleeping wait / this = {two / r:.2f}x")


def amp(a, work):
    runs = {  # name: (ranks, flags)
        "one": (1, ()), "one_bf16": (1, ("--amp=bf16",)),
        "two": (2, ()), "two_bf16": (2, ("--amp=bf16",)),
        "two_alone_bf16": (1, ("--amp=bf16",)),  # two 1-rank jobs at once: the machine's ceiling
        "two_bf16_fp16_wire": (2, ("--amp=bf16", "--compression=fp16")),
        "two_bf16_bf16_wire": (2, ("--amp=bf16", "--compression=bf16")),
        "two_bf16_dense": (2, ("--amp=bf16", "--sparse_as_dense")),
    }
    rates = {k: [] for k in runs}
    for _ in range(a.repeats):
        for k, (ranks, flags) in runs.items():
            outs = [work / k / "a", work / k / "b"] if k == "two_alone_bf16" else [work / k]
            rates[k].append(finetune_together(a, ranks, outs, *flags))
    print(f"rates of the {a.repeats} interleaved runs: " + json.dumps({k: [round(r, 2) for r in v] for k, v in rates.items()}))
    best = {k: max(v) for k, v in rates.items()}
    cpuinfo = open("/proc/cpuinfo").read()
    flags = set(cpuinfo.split())
    vendor = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("vendor_id")), "vendor unknown")
    print(f"finetune MiniLM, batch {a.batch_size} per rank, 1 intra-op thread per rank, {a.steps} timed steps; "
          f"CPU {vendor}: avx512_bf16 {'yes' if 'avx512_bf16' in flags else 'no'}, amx_bf16 {'yes' if 'amx_bf16' in flags else 'no'}; "
          f"best of {a.repeats}, examples/s over all ranks:")
    print(f"  1 rank : float32 {best['one']:6.2f}, bfloat16 {best['one_bf16']:6.2f}   "
          f"bfloat16 / float32 = {best['one_bf16'] / best['one']:.2f}x (target >= 1.5)")
    print(f"  2 ranks: float32 {best['two']:6.2f}, bfloat16 {best['two_bf16']:6.2f}   "
          f"bfloat16 / float32 = {best['two_bf16'] / best['two']:.2f}x")
    print(f"  scaling efficiency 1 -> 2 ranks: float32 {best['two'] / (2 * best['one']):.2f}, "
          f"bfloat16 {best['two_bf16'] / (2 * best['one_bf16']):.2f} (target >= 0.95)")
    print_paired_scaling(rates["one"], rates["two"], "float32")
    print_paired_scaling(rates["one_bf16"], rates["two_bf16"], "bfloat16")
    print(f"  two independent 1-rank bfloat16 jobs at once: {best['two_alone_bf16']:6.2f}   "
          f"2 x one alone: {best['two_alone_bf16'] / (2 * best['one_bf16']):.2f} (the ceiling of scaling on this machine, "
          f"no allreduce); 2 ranks / them: {best['two_bf16'] / best['two_alone_bf16']:.2f}")
    print(f"  2 ranks bfloat16, --sparse_as_dense (the word embeddings' 47 MB in the allreduce instead of "
          f"their looked-up rows allgathered): {best['two_bf16_dense']:6.2f}   rows / dense {best['two_bf16'] / best['two_bf16_dense']:.2f}x")
    for k, wire in (("two_bf16_fp16_wire", "fp16"), ("two_bf16_bf16_wire", "bf16")):
        print(f"  2 ranks bfloat16, --compression={wire}: {best[k]:6.2f}   against float32 on the wire "
              f"{best[k] / best['two_bf16']:.2f}x")


if __name__ == "__main__":
    main()
