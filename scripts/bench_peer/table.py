"""Prints `make bench-peer`'s side-by-side table from the tab-separated figures of both sides.

    python3 table.py RANKS FILE...

Each FILE holds lines `implementation<TAB>collective<TAB>bytes<TAB>seconds` (gorovod's bench with
-peer prints raw MPI's and gorovod's, horovod_collectives.py Horovod's). gorovod's figures are for a
new result per call, as Horovod's ops return, left to the garbage collector ("new") or given back
with `Release` ("released", as dropping a TensorFlow tensor gives Horovod's output back to TF's
allocator), and ("reused") into a buffer the caller reuses (allreduce's and reducescatter's
`Output`, `AllgatherInto`, `AlltoallInto`) or in place (broadcast: `BroadcastVariables`); a grouped
reducescatter has no such call, and no reused figure ("-"). Ratios are Horovod's time over gorovod's (above 1: gorovod faster) and
gorovod's over raw MPI's (1: at the MPI limit), each for new, released, reused.
"""

import sys


def size_name(n):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def dur(s):
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    ranks = sys.argv[1]
    figures = {}
    order = []
    for path in sys.argv[2:]:
        with open(path) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) != 4:
                    continue
                impl, what, size, secs = parts[0], parts[1], int(parts[2]), float(parts[3])
                if (what, size) not in order:
                    order.append((what, size))
                figures[impl, what, size] = secs
    print(f"{ranks} ranks, float32, time per call (slowest rank's best batch)")
    print(f"  {'collective':<27}{'size':>9}{'raw MPI':>11}{'Horovod':>11}{'new':>11}{'released':>11}"
          f"{'reused':>11}{'Horovod/gorovod':>24}{'gorovod/MPI':>24}")

    def ratio(a, b):
        return f"{a / b:.2f}" if a and b else "-"

    for what, size in sorted(order, key=lambda k: (k[1], order.index(k))):
        raw, hv, *ours = (figures.get((impl, what, size))
                          for impl in ("mpi", "horovod", "gorovod", "gorovod_released", "gorovod_reused"))
        vs_horovod = ", ".join(ratio(hv, g) for g in ours)
        vs_mpi = ", ".join(ratio(g, raw) for g in ours)
        print(f"  {what:<27}{size_name(size):>9}{dur(raw):>11}{dur(hv):>11}"
              f"{''.join(f'{dur(g):>11}' for g in ours)}{vs_horovod:>24}{vs_mpi:>24}")


if __name__ == "__main__":
    main()
