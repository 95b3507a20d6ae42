"""Output directories the exporter and the converter replace as a whole."""
import pathlib
import shutil


def check(out_dir, marker, what):
    """Refuses an ``out_dir`` that must not be replaced: one holding files but no ``marker`` (the
    file that says it is ``what``, a previous output), the current directory or one above it, a
    symbolic link, or a path with the characters TensorFlow reads as a glob pattern (its
    checkpoint reader, and so the SavedModel loader, would not find the files)."""
    out_dir = pathlib.Path(out_dir)
    if any(c in str(out_dir) for c in "*?[\\"):
        raise ValueError(f"--out {out_dir}: TensorFlow reads checkpoint paths as glob patterns, and "
                         "*, ?, [ and \\ are pattern characters")
    if out_dir.is_symlink():
        raise ValueError(f"--out {out_dir} is a symbolic link: give the directory itself")
    resolved, cwd = out_dir.resolve(), pathlib.Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents:
        raise ValueError(f"--out {out_dir} is the current directory or holds it: its contents "
                         "would be replaced")
    if out_dir.exists():
        if not out_dir.is_dir():
            raise ValueError(f"--out {out_dir} is a file")
        if any(out_dir.iterdir()) and not (out_dir / marker).is_file():
            raise ValueError(f"--out {out_dir} holds files and is not {what} (no {marker}): its "
                             "contents would be replaced, so give a new or empty directory")


def replace(staging, out_dir):
    """Puts the complete ``staging`` directory in ``out_dir``'s place (checked by ``check``)."""
    out_dir = pathlib.Path(out_dir)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    pathlib.Path(staging).rename(out_dir)
