"""Checks of docker/gpu.Dockerfile against the repository, for machines without a Docker engine.

hadolint (make lint-gpu) checks the Dockerfile as a Dockerfile; these tests check that it fits
this repository: what it copies exists, the TensorFlow version comes from the one place it is
pinned and reaches pip as the GPU build, the Go image matches go.mod, and the build context
leaves out this machine's virtualenv and links.
"""

import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "gpu.Dockerfile"
TEXT = DOCKERFILE.read_text()


def instructions():
    """(instruction, arguments) pairs, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(l for l in TEXT.splitlines() if not l.lstrip().startswith("#")))
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            yield word.upper(), rest.strip()


def test_copied_paths_exist():
    copies = [args.split() for word, args in instructions() if word == "COPY" and not args.startswith("--from")]
    assert copies, "no COPY from the build context"
    for parts in copies:
        for src in parts[:-1]:
            if src != ".":
                assert (ROOT / src).exists(), f"COPY {src}: no such path in the repository"


def tensorflow_layout_dry_run():
    """What the image's `make ... venv tflib TF_PACKAGE=...` would run (a dry run, forced so the
    stamp does not hide it: it prints the recipe of every target make would run)."""
    m = re.search(r"RUN make ((?:-o \S+ )*)venv tflib TF_PACKAGE='([^']+)'", TEXT)
    assert m, "the image must lay TensorFlow out with the Makefile's venv and tflib targets"
    return subprocess.run(["make", "-n", "-B", "-C", str(ROOT), *m.group(1).split(), "venv", "tflib", f"TF_PACKAGE={m.group(2)}"],
                          capture_output=True, text=True, check=True).stdout


def test_tensorflow_version_comes_from_VERSION_and_is_the_gpu_build():
    version = (ROOT / "third_party" / "tensorflow" / "VERSION").read_text().strip()
    assert version not in TEXT, "the TensorFlow version must be read from third_party/tensorflow/VERSION, not written here"
    out = tensorflow_layout_dry_run()
    assert f"'tensorflow[and-cuda]=={version}'" in out, out


def test_tensorflow_layout_installs_no_debian_packages():
    # The image's apt-get step installs what it needs; make's debs would add Node.js and npm (for
    # `make data`, which the image does not run: .cache is mounted) in a layer that also keeps
    # apt's lists.
    out = tensorflow_layout_dry_run()
    assert "apt-get" not in out, out


def test_go_image_matches_go_mod():
    go_mod = re.search(r"^go (\d+\.\d+)", (ROOT / "go.mod").read_text(), re.M).group(1)
    image = re.search(r"ARG GO_IMAGE=golang:(\d+\.\d+)", TEXT)
    assert image and image.group(1) == go_mod, f"golang image {image and image.group(1)} vs go.mod {go_mod}"


def test_base_image_is_cuda_12_like_the_tensorflow_wheels():
    # tensorflow[and-cuda] pins the nvidia-*-cu12 wheels; package nccl looks for libcudart.so.12 first.
    assert re.search(r"ARG CUDA_IMAGE=nvidia/cuda:12\.\d+\.\d+-base-ubuntu\d\d\.\d\d$", TEXT, re.M)
    assert "libcudart.so.12" in (ROOT / "nccl" / "discovery.go").read_text()


def test_nvidia_wheels_are_registered_with_the_dynamic_linker():
    assert "/etc/ld.so.conf.d/" in TEXT and "ldconfig" in TEXT
    for lib in ("libnccl.so.2", "libcudart.so.12", "libcudnn.so.9"):
        assert f"grep -q '{lib} '" in TEXT, f"the build does not check that {lib} is found"


def dockerignore_patterns():
    """The patterns of docker/gpu.Dockerfile.dockerignore, comments and blank lines dropped."""
    lines = (ROOT / "docker" / "gpu.Dockerfile.dockerignore").read_text().splitlines()
    return {l.strip() for l in lines if l.strip() and not l.lstrip().startswith("#")}


def test_build_context_leaves_out_machine_specific_paths():
    ignore = dockerignore_patterns()
    for path in (".git", ".venv", ".cache", "build", "third_party/tensorflow/include", "third_party/tensorflow/lib"):
        assert path in ignore, f"{path} must not enter the build context"


def test_build_context_leaves_out_git_ignored_build_outputs():
    # Every top-level directory git ignores (build outputs, caches) stays out of the image too.
    ignore = dockerignore_patterns()
    gitignored = [l.strip().strip("/") for l in (ROOT / ".gitignore").read_text().splitlines()
                  if re.fullmatch(r"/[\w.-]+/", l.strip())]
    assert "build" in gitignored, "make gpu-check-bundle writes build/, which git must ignore"
    for path in gitignored:
        assert path in ignore, f"{path}/ is git-ignored but would enter the build context"


def test_binaries_are_built_and_gpu_packages_tested_in_the_image():
    runs = " ".join(args for word, args in instructions() if word == "RUN")
    assert "go build -o /usr/local/bin/ ./cmd/..." in runs
    assert "go test -count=1 ./nccl/ ./horovod/ncclbackend/" in runs
    env = " ".join(args for word, args in instructions() if word == "ENV")
    assert "OMPI_ALLOW_RUN_AS_ROOT=1" in env and "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" in env


def test_cgo_build_tools_are_installed():
    runs = " ".join(args for word, args in instructions() if word == "RUN")
    uses_pkg_config = any("#cgo pkg-config:" in p.read_text() for p in ROOT.rglob("*.go") if ".venv" not in p.parts)
    assert not uses_pkg_config or " pkg-config " in runs, "a cgo package uses pkg-config: install it in the image"
    for tool in (" gcc ", " make ", " libopenmpi-dev ", " openmpi-bin "):
        assert tool in runs, f"{tool.strip()} is not installed in the image"


def test_no_quiet_grep_at_the_end_of_a_pipe_under_pipefail():
    # `producer | grep -q` under pipefail fails now and then though grep matched: grep exits at
    # its match, the producer's next write gets SIGPIPE (exit 141), and pipefail reports that
    # (measured: 1-3% of runs of ldconfig -p | grep -q, and of ldd | grep -q). In the image that
    # fails the build; in gpu-check.sh it left a bundle's lib/ off LD_LIBRARY_PATH.
    shell = next(args for word, args in instructions() if word == "SHELL")
    runs = [args for word, args in instructions() if word == "RUN"]
    script = (ROOT / "scripts" / "gpu-check.sh").read_text()
    assert "pipefail" in shell and "pipefail" in script
    quiet_grep_in_pipe = re.compile(r"\|\s*grep\s+-\w*q")
    for text in runs + script.splitlines():
        assert not quiet_grep_in_pipe.search(text), text
