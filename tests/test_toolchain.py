"""The project virtualenv carries the pinned TensorFlow, and the C library links point into it."""
import os
import pathlib

import tensorflow as tf

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_pinned_tensorflow_version():
    pinned = (ROOT / "third_party/tensorflow/VERSION").read_text().strip()
    assert tf.__version__ == pinned


def test_c_library_links_resolve_into_the_wheel():
    lib = ROOT / "third_party/tensorflow/lib"
    wheel = pathlib.Path(tf.__file__).resolve().parent
    for name in ("libtensorflow_cc.so.2", "libtensorflow_framework.so.2"):
        target = (lib / name).resolve()
        assert target.is_file(), name
        assert target.parent == wheel, (name, target)
    assert (ROOT / "third_party/tensorflow/include/tensorflow/c/c_api.h").is_file()
    assert os.readlink(lib / "libtensorflow_cc.so") == "libtensorflow_cc.so.2"
