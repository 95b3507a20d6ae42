"""Puts the repository root on sys.path so ``bertgraph.exporter`` imports as a package."""
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
