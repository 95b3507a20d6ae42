"""TensorBoard (make tensorboard) reads the event files finetune writes: a tiny fine-tuning run's
events through TensorBoard's own reader, checked against the run's schedule and batches."""
import math
import os
import pathlib
import subprocess

import numpy as np
from tensorboard.backend.event_processing import event_accumulator

ROOT = pathlib.Path(__file__).resolve().parent.parent
TINY_MODEL = ROOT / ".cache/model/tiny"
TAGS = {"loss", "learning_rate", "global_norm", "examples_per_sec", "train_accuracy"}


def test_tensorboard_reads_the_scalars_finetune_writes(tmp_path):
    assert (TINY_MODEL / "saved_model.pb").is_file(), f"no {TINY_MODEL}: run make setup (make model) first"
    finetune = tmp_path / "finetune"
    subprocess.run(["go", "build", "-o", str(finetune), "./cmd/finetune"], cwd=ROOT, check=True, timeout=900)
    data = tmp_path / "data"
    data.mkdir()
    lines = "".join(f"{i % 2}\tmovie number {i} was {'good' if i % 2 else 'bad'}\n" for i in range(8))
    (data / "train.tsv").write_text(lines)
    (data / "dev.tsv").write_text(lines)
    out = tmp_path / "out"
    batch, steps, peak = 4, 4, 5e-5  # 8 examples x 2 epochs / batch 4 on one rank
    run = subprocess.run(
        [str(finetune), "--do_train", "--do_eval", f"--saved_model={TINY_MODEL}", f"--data_dir={data}",
         f"--output_dir={out}", f"--train_batch_size={batch}", "--num_train_epochs=2",
         f"--learning_rate={peak}", "--warmup_proportion=0", "--export_dir=none"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert len(list(out.glob("events.out.tfevents.*"))) == 1, sorted(p.name for p in out.iterdir())

    events = event_accumulator.EventAccumulator(str(out), size_guidance={event_accumulator.SCALARS: 0})
    events.Reload()
    assert set(events.Tags()["scalars"]) == TAGS
    scalars = {tag: events.Scalars(tag) for tag in TAGS}
    for tag, points in scalars.items():
        assert [p.step for p in points] == list(range(1, steps + 1)), tag
        assert all(math.isfinite(p.value) for p in points), (tag, points)
    # BERT's schedule without warmup: step s applied the rate of global step s-1, decaying
    # linearly from the peak to 0 over the run (stored as float32, as tf.summary stores it).
    want = [np.float32(peak * (1 - s / steps)) for s in range(steps)]
    assert [np.float32(p.value) for p in scalars["learning_rate"]] == want
    # A batch of 4 examples on one rank is right for 0 to 4 of them.
    assert all(p.value * batch in (0, 1, 2, 3, 4) for p in scalars["train_accuracy"]), scalars["train_accuracy"]
    assert all(p.value > 0 for tag in ("loss", "global_norm", "examples_per_sec") for p in scalars[tag])
    walls = [p.wall_time for p in scalars["loss"]]
    assert walls == sorted(walls) and walls[0] > 1.5e9, walls

    # The evaluation, as Estimator's evaluate writes it for run_classifier: a run "eval" of its own
    # with eval_results.txt's metrics at the trained global step.
    results = dict(line.split(" = ") for line in (out / "eval_results.txt").read_text().splitlines())
    evals = event_accumulator.EventAccumulator(str(out / "eval"), size_guidance={event_accumulator.SCALARS: 0})
    evals.Reload()
    assert set(evals.Tags()["scalars"]) == {"eval_accuracy", "eval_loss", "loss"}
    for tag in ("eval_accuracy", "eval_loss", "loss"):
        (point,) = evals.Scalars(tag)
        assert point.step == steps and np.float32(point.value) == np.float32(results[tag]), (tag, point, results)
