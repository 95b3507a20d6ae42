"""Charts of the benchmark figures (make plots): PNGs drawn from the data files in docs/bench/.

Each data file is tab-separated: '#' comment lines, among them '# command: ...' (what produced the
figures) and '# machine: ...' (where), then a header row and one row per measurement. Re-run the
benchmark, put its figures in the file, and run this again to redraw the charts:

  finetune_throughput.tsv -> scaling.png (1 -> N ranks against linear scaling) and throughput.png
  allreduce.tsv           -> allreduce.png (raw MPI_Allreduce, gorovod, Horovod where measured;
                             one panel per message size)

A malformed file stops the script before any chart is drawn, naming the file and line.
"""
import argparse
import math
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (the backend is chosen first)

MISSING = "-"


class DataError(Exception):
    """A data file that cannot be charted; the message starts with the file (and line)."""


def positive_number(text):
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise ValueError("not a positive number")
    return value


def positive_int(text):
    value = int(text)
    if value <= 0:
        raise ValueError("not a positive integer")
    return value


def text(value):
    if not value:
        raise ValueError("empty")
    return value


def one_of(*allowed):
    def parse(value):
        if value not in allowed:
            raise ValueError("not one of " + ", ".join(allowed))
        return value
    return parse


class Table:
    """A data file: its comment settings (command, machine) and its typed rows."""

    def __init__(self, path, meta, rows):
        self.path, self.meta, self.rows = path, meta, rows

    def source(self):
        return f"{self.meta['command']} on {self.meta['machine']}"


def read_table(path, columns, optional=()):
    """Reads a data file whose header must be exactly the keys of columns (name -> parser).
    Columns named in optional may hold '-' (no figure), read as None."""
    path = pathlib.Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read: {e}") from None
    meta, header, rows = {}, None, []
    for number, line in enumerate(lines, 1):
        where = f"{path}:{number}"
        if line.startswith("#"):
            key, sep, value = line[1:].partition(":")
            if sep and key.strip() in ("command", "machine"):
                meta[key.strip()] = value.strip()
            continue
        if not line.strip():
            continue
        fields = line.split("\t")
        if header is None:
            header = fields
            if header != list(columns):
                raise DataError(f"{where}: header {' '.join(header)!r}, expected the tab-separated "
                                f"columns {' '.join(columns)!r}")
            continue
        if len(fields) != len(columns):
            raise DataError(f"{where}: {len(fields)} tab-separated fields, expected {len(columns)} "
                            f"({', '.join(columns)})")
        row = {}
        for (name, parse), value in zip(columns.items(), fields):
            if value == MISSING and name in optional:
                row[name] = None
                continue
            try:
                row[name] = parse(value)
            except ValueError as e:
                raise DataError(f"{where}: column {name}: {value!r}: {e}") from None
        rows.append(row)
    for key in ("command", "machine"):
        if key not in meta:
            raise DataError(f"{path}: no '# {key}: ...' line (each data file says which command "
                            "produced its figures and on which machine)")
    if not rows:
        raise DataError(f"{path}: no data rows under the header")
    return Table(path, meta, rows)


def read_throughput(path):
    table = read_table(path, {"system": text, "ranks": positive_int,
                              "allreduce": one_of("fp32", "fp16"), "examples_per_sec": positive_number})
    if not any(r["system"] == "gorovod" and r["allreduce"] == "fp32" and r["ranks"] == 1 for r in table.rows):
        raise DataError(f"{path}: no 'gorovod' row with 1 rank and fp32: scaling is measured against it")
    return table


def read_allreduce(path):
    return read_table(path, {"size_bytes": positive_int, "case": text, "raw_mpi_us": positive_number,
                             "gorovod_us": positive_number, "horovod_us": positive_number},
                      optional=("horovod_us",))


def footer(fig, table):
    fig.text(0.01, 0.01, table.source(), fontsize=7, color="0.35", ha="left", va="bottom", wrap=True)


def save(fig, out, name):
    path = out / name
    # No Software entry: the same figures give the same bytes whatever matplotlib wrote them.
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


def label(row):
    name = {"gorovod": "gorovod", "tf-mwms": "TF MultiWorkerMirrored"}.get(row["system"], row["system"])
    unit = "worker" if row["system"] == "tf-mwms" else "rank"
    s = f"{name}, {row['ranks']} {unit}{'s' if row['ranks'] > 1 else ''}"
    return s + (", fp16 allreduce" if row["allreduce"] == "fp16" else "")


def plot_scaling(table, out):
    gorovod = sorted((r for r in table.rows if r["system"] == "gorovod" and r["allreduce"] == "fp32"),
                     key=lambda r: r["ranks"])
    base = next(r["examples_per_sec"] for r in gorovod if r["ranks"] == 1)
    ranks = [r["ranks"] for r in gorovod]
    fig, ax = plt.subplots(figsize=(7, 4.6))
    ax.plot(ranks, [base * n for n in ranks], "--", color="0.6", label="linear scaling (1 rank x ranks)")
    ax.plot(ranks, [r["examples_per_sec"] for r in gorovod], "o-", color="tab:blue", label="gorovod, fp32 allreduce")
    for r in gorovod[1:]:
        eff = r["examples_per_sec"] / (base * r["ranks"])
        ax.annotate(f"{r['examples_per_sec']:.2f} examples/s\nefficiency {eff:.2f}",
                    (r["ranks"], r["examples_per_sec"]), textcoords="offset points", xytext=(-10, -34),
                    ha="right", fontsize=8)
    others = [r for r in table.rows if not (r["system"] == "gorovod" and r["allreduce"] == "fp32")]
    # Set a little to the right of their rank count, so that they do not hide gorovod's point.
    for k, (r, marker) in enumerate(zip(others, "s^Dv<>"), 1):
        ax.plot([r["ranks"] + 0.05 * k], [r["examples_per_sec"]], marker, linestyle="none", label=label(r))
    ax.set_xticks(ranks)
    ax.set_xlim(min(ranks) - 0.3, max(ranks) + 0.3)
    ax.set_ylim(0, base * max(ranks) * 1.12)
    ax.set_xlabel("ranks (one process each)")
    ax.set_ylabel("examples/s over all ranks")
    ax.set_title("Fine-tuning MiniLM: scaling from 1 rank")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.subplots_adjust(bottom=0.2)
    footer(fig, table)
    return save(fig, out, "scaling.png")


def plot_throughput(table, out):
    rows = table.rows
    fig, ax = plt.subplots(figsize=(7, 0.6 * len(rows) + 1.8))
    y = range(len(rows))
    colors = ["tab:blue" if r["system"] == "gorovod" else "tab:orange" for r in rows]
    bars = ax.barh(list(y), [r["examples_per_sec"] for r in rows], color=colors)
    ax.bar_label(bars, fmt="%.2f", padding=3, fontsize=8)
    ax.set_yticks(list(y), [label(r) for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(r["examples_per_sec"] for r in rows) * 1.15)
    ax.set_xlabel("examples/s over all ranks (higher is better)")
    ax.set_title("Fine-tuning MiniLM, batch 16 per rank: throughput")
    ax.grid(axis="x", alpha=0.3)
    fig.subplots_adjust(left=0.33, bottom=0.22)
    footer(fig, table)
    return save(fig, out, "throughput.png")


def size_name(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} bytes"


def plot_allreduce(table, out):
    sizes = sorted({r["size_bytes"] for r in table.rows})
    series = [("raw MPI_Allreduce", "raw_mpi_us", "0.55"), ("gorovod", "gorovod_us", "tab:blue")]
    if any(r["horovod_us"] is not None for r in table.rows):
        series.append(("Horovod", "horovod_us", "tab:green"))
    counts = [sum(r["size_bytes"] == s for r in table.rows) for s in sizes]
    fig, axes = plt.subplots(len(sizes), 1, figsize=(8, 1.2 + sum(0.45 * len(series) * c + 0.6 for c in counts)),
                             gridspec_kw={"height_ratios": counts}, squeeze=False)
    height = 0.8 / len(series)
    for ax, size in zip(axes[:, 0], sizes):
        rows = [r for r in table.rows if r["size_bytes"] == size]
        top = max(r[k] for r in rows for _, k, _ in series if r[k] is not None)
        unit, scale = ("ms", 1000.0) if top >= 1000 else ("µs", 1.0)
        for i, (name, key, color) in enumerate(series):
            ys = [j + (i - (len(series) - 1) / 2) * height for j in range(len(rows))]
            values = [r[key] / scale if r[key] is not None else 0 for r in rows]
            bars = ax.barh(ys, values, height=height, color=color, label=name)
            ax.bar_label(bars, labels=[f"{v:.3g}" if r[key] is not None else "not measured"
                                       for v, r in zip(values, rows)], padding=2, fontsize=7)
        ax.set_yticks(range(len(rows)), [r["case"] for r in rows], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, top / scale * 1.18)
        ax.set_xlabel(f"{unit} per allreduce (lower is better)", fontsize=8)
        ax.set_title(f"{size_name(size)} of float32", fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    handles, names = axes[0, 0].get_legend_handles_labels()
    fig.suptitle("Allreduce, 2 ranks: gorovod against raw MPI", x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    fig.legend(handles, names, fontsize=8, loc="upper right", ncols=len(series), frameon=False)
    footer(fig, table)
    return save(fig, out, "allreduce.png")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=pathlib.Path, required=True, help="folder of the data files (docs/bench)")
    parser.add_argument("--out", type=pathlib.Path, required=True, help="folder the PNGs are written to (docs/img)")
    args = parser.parse_args(argv)
    try:
        # Every file is read and checked before any chart is drawn: bad data leaves the old charts.
        throughput = read_throughput(args.data / "finetune_throughput.tsv")
        allreduce = read_allreduce(args.data / "allreduce.tsv")
    except DataError as e:
        print(f"plot_benchmarks: {e}\n  hint: fix that line, or take the figures again from the "
              "command its '# command:' line names", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for path in (plot_scaling(throughput, args.out), plot_throughput(throughput, args.out),
                 plot_allreduce(allreduce, args.out)):
        print(f"plot_benchmarks: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
