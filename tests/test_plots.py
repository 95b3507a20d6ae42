"""scripts/plots/plot_benchmarks.py (make plots): charts from the benchmark data files in docs/bench,
and a clear error, naming the file and line, for a data file it cannot chart."""
import importlib.util
import pathlib
import shutil
import struct
import subprocess
import sys
import zlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts/plots/plot_benchmarks.py"
DATA = ROOT / "docs/bench"
CHARTS = ("scaling.png", "throughput.png", "allreduce.png")


def plot(data, out):
    """The script as make plots runs it, in a process of its own."""
    return subprocess.run([sys.executable, str(SCRIPT), "--data", str(data), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def plotter():
    """The script's module, for the cases that need no fresh process (importing matplotlib once)."""
    spec = importlib.util.spec_from_file_location("plot_benchmarks", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def png_size(path):
    """Width and height of a PNG whose chunks are all intact (each CRC checked), ending in IEND."""
    blob = path.read_bytes()
    assert blob[:8] == b"\x89PNG\r\n\x1a\n", path
    at, chunks = 8, []
    while at < len(blob):
        length, kind = struct.unpack(">I4s", blob[at:at + 8])
        body = blob[at + 8:at + 8 + length]
        (crc,) = struct.unpack(">I", blob[at + 8 + length:at + 12 + length])
        assert zlib.crc32(kind + body) == crc, (path, kind)
        chunks.append(kind)
        at += 12 + length
    assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND" and b"IDAT" in chunks, (path, chunks)
    return struct.unpack(">II", blob[16:24])


def test_the_repository_data_draws_every_chart(tmp_path):
    p = plot(DATA, tmp_path)
    assert p.returncode == 0, p.stderr
    for name in CHARTS:
        width, height = png_size(tmp_path / name)
        assert width >= 600 and height >= 400, (name, width, height)
    assert sorted(f.name for f in tmp_path.iterdir()) == sorted(CHARTS)


def test_the_charts_follow_the_data(tmp_path, plotter):
    # Another figure in the data file must give another chart: the script draws from the file.
    data = tmp_path / "data"
    shutil.copytree(DATA, data)
    assert plotter.main(["--data", str(data), "--out", str(tmp_path / "before")]) == 0
    path = data / "finetune_throughput.tsv"
    text = path.read_text()
    assert "\t27.62\n" in text
    path.write_text(text.replace("\t27.62\n", "\t20.00\n"))
    assert plotter.main(["--data", str(data), "--out", str(tmp_path / "after")]) == 0
    for name, changed in (("scaling.png", True), ("throughput.png", True), ("allreduce.png", False)):
        same = (tmp_path / "before" / name).read_bytes() == (tmp_path / "after" / name).read_bytes()
        assert same != changed, name


@pytest.mark.parametrize("file, line, replace, message", [
    ("finetune_throughput.tsv", 10, ("gorovod\t2\tfp32\t27.62", "gorovod\t2\tfp32"), "3 tab-separated fields, expected 4"),
    ("finetune_throughput.tsv", 10, ("\t27.62", "\tfast"), "column examples_per_sec: 'fast'"),
    ("finetune_throughput.tsv", 11, ("\tfp16\t", "\tbf16\t"), "column allreduce: 'bf16': not one of fp32, fp16"),
    ("finetune_throughput.tsv", 8, ("examples_per_sec", "rate"), "header 'system ranks allreduce rate'"),
    ("allreduce.tsv", 9, ("\t3\t9\t", "\t-\t9\t"), "column raw_mpi_us: '-'"),
    ("allreduce.tsv", 11, ("\t34492\t", "\t-34492\t"), "column raw_mpi_us: '-34492': not a positive number"),
])
def test_a_malformed_data_file_is_named_with_its_line(tmp_path, capsys, plotter, file, line, replace, message):
    data = tmp_path / "data"
    shutil.copytree(DATA, data)
    path = data / file
    text = path.read_text()
    old, new = replace
    assert text.splitlines()[line - 1].count(old) == 1, "the case no longer matches the data file"
    lines = text.splitlines(keepends=True)
    lines[line - 1] = lines[line - 1].replace(old, new)
    path.write_text("".join(lines))
    out = tmp_path / "img"
    assert plotter.main(["--data", str(data), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:{line}: " in err and message in err and "hint:" in err, err
    assert not out.exists(), "no chart may be drawn from bad data"


def test_a_data_file_must_name_its_command_and_machine(tmp_path, capsys, plotter):
    data = tmp_path / "data"
    shutil.copytree(DATA, data)
    path = data / "allreduce.tsv"
    path.write_text("".join(l for l in path.read_text().splitlines(keepends=True) if not l.startswith("# machine:")))
    assert plotter.main(["--data", str(data), "--out", str(tmp_path / "img")]) == 2
    err = capsys.readouterr().err
    assert f"{path}: no '# machine: ...' line" in err, err


def test_the_committed_charts_are_those_of_the_committed_data(tmp_path, plotter):
    # make plots was run after the data last changed: docs/img shows what docs/bench holds.
    # Byte for byte: the pinned matplotlib wheel brings its own FreeType and fonts, Agg rasterises in
    # software, and the script writes no version or date into the PNG.
    assert plotter.main(["--data", str(DATA), "--out", str(tmp_path)]) == 0
    for name in CHARTS:
        assert (tmp_path / name).read_bytes() == (ROOT / "docs/img" / name).read_bytes(), (
            f"docs/img/{name} is not drawn from docs/bench: run make plots")


def test_horovod_figures_are_drawn_where_the_data_has_them(tmp_path, plotter):
    data = tmp_path / "data"
    shutil.copytree(DATA, data)
    path = data / "allreduce.tsv"
    text = path.read_text()
    assert "\t35317\t22517\t-\n" in text
    path.write_text(text.replace("\t35317\t22517\t-\n", "\t35317\t22517\t33000\n"))
    assert plotter.main(["--data", str(data), "--out", str(tmp_path / "img")]) == 0
    png_size(tmp_path / "img/allreduce.png")
    assert (tmp_path / "img/allreduce.png").read_bytes() != (ROOT / "docs/img/allreduce.png").read_bytes()
