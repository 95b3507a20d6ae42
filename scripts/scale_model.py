"""Predicted allreduce time, step time and scaling efficiency of a data-parallel step at scale,
from the ring allreduce cost model fitted to `make bench-network` (docs/network-and-slurm.md):

    ring over p ranks, n bytes:  T = 2 (p - 1) alpha + 2 (p - 1) / p * n / (eta * B)

alpha is the per-message latency, B the link rate, eta the fraction of it the allreduce reaches.
Nodes of g GPUs joined by NVLink reduce inside the node first (bus bandwidth B_nvlink), then
across N = p / g nodes, each GPU with a NIC of rate B of its own (one rail per GPU):

    T = 2 (g - 1) / g * n / B_nvlink + 2 (N - 1) alpha + 2 (N - 1) / N * (n / g) / (eta * B)

Efficiency is t_compute / (t_compute + T) when nothing overlaps (the lower bound) and
t_compute / max(t_compute, T) when the allreduce hides entirely behind the backward pass (the
upper bound). With one NIC shared by the g GPUs of a node instead, the nodes' rings carry n,
not n / g. `python scale_model.py --eta 0.66 --alpha 25e-6` prints the docs' tables, the last
one for the setting of Horovod's published 512-GPU benchmark (128 nodes of 4 Pascal GPUs, one
25 Gbit/s RoCE NIC each) with per-step compute times that are assumptions, not measurements."""
import argparse

MODELS = {  # float32 gradient bytes: parameters x 4
    "MiniLM": 22_713_986 * 4,
    "BERT-base": 109_483_778 * 4,
}


def ring(p, n, alpha, rate):
    return 0.0 if p == 1 else 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / rate


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--eta", type=float, required=True, help="fraction of the link rate an allreduce reaches (fitted)")
    ap.add_argument("--alpha", type=float, required=True, help="seconds per ring step (fitted)")
    ap.add_argument("--nvlink-gbytes", type=float, default=200.0, help="NVLink bus bandwidth per GPU, GB/s (assumed)")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--compute", default="MiniLM=0.012,BERT-base=0.045",
                    help="seconds of forward and backward per step per GPU, by model (assumed)")
    a = ap.parse_args()
    ranks = [8, 16, 32, 64, 128, 256]
    # The NVLink rows put g ranks on each node: whole nodes only.
    if a.gpus_per_node < 1 or any(p % a.gpus_per_node for p in ranks):
        ap.error(f"--gpus-per-node {a.gpus_per_node}: want one that divides every rank count {ranks} (1, 2, 4 or 8)")
    compute = {k: float(v) for k, v in (kv.split("=") for kv in a.compute.split(","))}
    for model, n in MODELS.items():
        tc = compute[model]
        print(f"\n{model}: {n / 1e6:.1f} MB of float32 gradients, {tc * 1e3:.0f} ms of compute per step (assumed)")
        print("| network | " + " | ".join(f"{p} ranks" for p in ranks) + " |")
        print("| --- |" + " --- |" * len(ranks))
        for gbit in (10, 25, 100):
            rate = a.eta * gbit * 1e9 / 8
            cells = []
            for p in ranks:
                t = ring(p, n, a.alpha, rate)
                cells.append(f"{t * 1e3:.0f} ms, {tc / (tc + t):.2f}-{tc / max(tc, t):.2f}")
            print(f"| 1 GPU per node, {gbit} Gbit/s | " + " | ".join(cells) + " |")
        for gbit in (100, 400):
            rate = a.eta * gbit * 1e9 / 8
            g = a.gpus_per_node
            cells = []
            for p in ranks:
                nodes = p // g
                t = 2 * (g - 1) / g * n / (a.nvlink_gbytes * 1e9) + ring(nodes, n / g, a.alpha, rate)
                cells.append(f"{t * 1e3:.0f} ms, {tc / (tc + t):.2f}-{tc / max(tc, t):.2f}")
            print(f"| {g} GPUs per node on NVLink, {gbit} Gbit/s per GPU | " + " | ".join(cells) + " |")

    # Horovod's benchmark: tf_cnn_benchmarks, batch 64 per P100; step times assumed from
    # published single-GPU throughputs of that era (about 130-140 images/s), not measured here.
    print("\nHorovod's 512-GPU setting (128 nodes x 4 GPUs, one 25 Gbit/s NIC per node, PCIe 10 GB/s inside)")
    print("| model | gradients | step compute (assumed) | allreduce | efficiency, no overlap - full overlap | published |")
    print("| --- | --- | --- | --- | --- | --- |")
    rate = a.eta * 25e9 / 8
    for model, params, tc, published in (("Inception V3", 23_851_784, 0.46, 0.90),
                                         ("ResNet-101", 44_549_160, 0.49, 0.90),
                                         ("VGG-16", 138_357_544, 0.47, 0.68)):
        n = 4 * params
        t = 2 * 3 / 4 * n / 10e9 + ring(128, n, a.alpha, rate)
        print(f"| {model} | {n / 1e6:.0f} MB | {tc:.2f} s | {t:.3f} s | {tc / (tc + t):.2f} - {tc / max(tc, t):.2f} | {published:.2f} |")


if __name__ == "__main__":
    main()
