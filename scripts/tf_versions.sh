#!/usr/bin/env bash
# TensorFlow's version as a speed choice: MiniLM's training step (train_step + apply_gradients,
# batch BATCH x 128, 1 rank x 1 thread, from Go: bertgraph/internal/stepbench) on the C library of
# several tensorflow-cpu wheels, in float32 and in bfloat16 (--amp's train step), versions
# alternating run by run so that a busy machine slows them alike. Prints the median step time
# and examples/s per version and precision, against the pinned version.
#
#   scripts/tf_versions.sh [VERSION...]     (make bench-tf-versions; default: 2.13.1 2.16.2 2.18.1 and the pinned one)
#
# Environment: ROUNDS (3), STEPS timed per run after a warm-up step (2), BATCH (16), PRECISIONS
# ("float32 bfloat16"), PY (the project virtualenv's python), GO (go).
#
# The wheels' libtensorflow_cc.so.2 and libtensorflow_framework.so.2 go to .cache/tfversions/<v>/
# (pip download, unzip: nothing is installed); one stepbench binary, built against the pinned
# headers, runs on each through LD_LIBRARY_PATH, which its RUNPATH yields to. The training
# SavedModel is exported once by the pinned TensorFlow's Python into .cache/tfversions/model; a
# version whose C library cannot load it is reported as such, with TensorFlow's message.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=$root/.cache/tfversions
py=${PY:-$root/.venv/bin/python}
go=${GO:-go}
rounds=${ROUNDS:-3} steps=${STEPS:-2} batch=${BATCH:-16} precisions=${PRECISIONS:-float32 bfloat16}
pinned=$(cat "$root/third_party/tensorflow/VERSION")
if [ $# -gt 0 ]; then versions=("$@"); else versions=(2.13.1 2.16.2 2.18.1 "$pinned"); fi
export TF_CPP_MIN_LOG_LEVEL=2
mkdir -p "$cache/wheels"

libdir() { if [ "$1" = "$pinned" ]; then echo "$root/third_party/tensorflow/lib"; else echo "$cache/$1"; fi; }

command -v unzip >/dev/null || { echo "tf_versions: unzip is needed to take the C library out of the wheels (apt-get install unzip)" >&2; exit 1; }
libs=(libtensorflow_cc.so.2 libtensorflow_framework.so.2)
for v in "${versions[@]}"; do
	# A version's directory appears only with both libraries in it: an extraction cut short
	# (Ctrl-C) is done again, rather than one library of it mixed with the pinned version's other.
	[ "$v" = "$pinned" ] || [ -d "$cache/$v" ] && continue
	echo "tf_versions: fetching tensorflow-cpu $v" >&2
	"$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$cache/wheels" "tensorflow-cpu==$v"
	rm -rf "$cache/$v.tmp" && mkdir -p "$cache/$v.tmp"
	unzip -oqj "$cache"/wheels/tensorflow_cpu-"$v"-*.whl "${libs[@]/#/tensorflow/}" -d "$cache/$v.tmp" || {
		status=$?
		echo "tf_versions: unzip of the tensorflow-cpu $v wheel failed (status $status): a wheel without the C library (tensorflow/${libs[0]}) gives 11" >&2
		exit 1
	}
	for l in "${libs[@]}"; do
		[ -f "$cache/$v.tmp/$l" ] || { echo "tf_versions: the tensorflow-cpu $v wheel has no tensorflow/$l" >&2; exit 1; }
	done
	mv "$cache/$v.tmp" "$cache/$v"
done

model=$cache/model/imdb_minilm
exporter=(config.py checkpoint.py model.py optimizer.py contract.py export.py)
if [ ! -f "$model/.stamp" ] || [ -n "$(cd "$root/bertgraph/exporter" && find "${exporter[@]}" -newer "$model/.stamp")" ]; then
	echo "tf_versions: exporting MiniLM's training SavedModel with TensorFlow $pinned's Python" >&2
	mkdir -p "$cache/model"
	minilm=$root/.cache/model/minilm
	(cd "$root" && "$py" -m bertgraph.exporter.export --bert_config "$minilm/bert_config.json" --vocab "$minilm/vocab.txt" \
		--init_checkpoint "$minilm/bert_model.ckpt" --num_labels 2 --max_seq_length 128 --out "$model") 2>"$cache/model/export.log" ||
		{ cat "$cache/model/export.log"; exit 1; }
	touch "$model/.stamp"
fi

(cd "$root" && "$go" build -o "$cache/stepbench" ./bertgraph/internal/stepbench)
out=$cache/steps.tsv
: >"$out"
declare -A broken
for r in $(seq "$rounds"); do
	for v in "${versions[@]}"; do
		[ -z "${broken[$v]:-}" ] || continue
		for p in $precisions; do
			echo "tf_versions: round $r/$rounds, TensorFlow $v, $p" >&2
			if ! LD_LIBRARY_PATH=$(libdir "$v") "$cache/stepbench" -model "$model" -precision "$p" -batch "$batch" -steps "$steps" \
				>>"$out" 2>"$cache/stepbench.err"; then
				broken[$v]=$(tail -1 "$cache/stepbench.err")
				break
			fi
		done
	done
done

"$py" - "$out" "$batch" "$pinned" "${versions[@]}" <<'PY'
import statistics, sys
path, batch, pinned, versions = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
steps = {}
for line in open(path):
    v, p, _, s = line.split("\t")
    steps.setdefault((v, p), []).append(float(s))
print(f"MiniLM train step + apply, batch {batch} x 128, 1 rank x 1 thread, from Go; median over runs alternating versions")
print(f"| TensorFlow | precision | steps | median s/step | examples/s | speed vs {pinned} |")
print("| --- | --- | --- | --- | --- | --- |")
for p in sorted({p for _, p in steps}, key=lambda p: p != "float32"):
    ref = steps.get((pinned, p))
    for v in versions:
        if (v, p) not in steps:
            continue
        m = statistics.median(steps[(v, p)])
        rel = f"{statistics.median(ref) / m:.2f}x" if ref else "-"
        print(f"| {v} | {p} | {len(steps[(v, p)])} | {m:.2f} | {batch / m:.2f} | {rel} |")
PY
for v in "${!broken[@]}"; do echo "TensorFlow $v: did not run: ${broken[$v]}"; done
