"""Reference examples and features of run_classifier's tasks, for finetune's --task_name tests.

usage: glue_ref.py TASK DATA_DIR --vocab VOCAB --max-seq-length N [--cased] > examples.json
       glue_ref.py flags > flags.json
       glue_ref.py parse ARGS... > values.json

Reads DATA_DIR's train, dev and test files with Google's processor of TASK (bert-tensorflow's
run_classifier.py: cola, mrpc, mnli, xnli; sst-2 as GLUE's baseline and HF transformers read it, in
the processors' manner) and converts every example with run_classifier's
convert_single_example over tokenization.py's FullTokenizer. stdout: a JSON object mapping
"train", "dev", "test" to lists of {guid, text_a, text_b, label, input_ids, input_mask,
segment_ids, label_id} (null for a split the processor lacks), and "labels" to the processor's
label list.

`flags` prints the command-line flags that run_classifier.py (and the tokenization.py it
imports) defines, as a JSON object mapping each name to {"type": absl's flag type, "default":
its default, null for None}. `parse` parses ARGS with absl as run_classifier.py's command line
(--flagfile, --noNAME and all) and prints the values of those flags, name to value.
"""
import argparse
import json
import os
import sys

from ref_tokenize import import_bert


def sst2_processor(run_classifier):
    class Sst2Processor(run_classifier.DataProcessor):
        """GLUE SST-2: `sentence<TAB>label` (test: `index<TAB>sentence`), a header line in each."""

        def get_train_examples(self, data_dir):
            return self._create(self._read_tsv(os.path.join(data_dir, "train.tsv")), "train")

        def get_dev_examples(self, data_dir):
            return self._create(self._read_tsv(os.path.join(data_dir, "dev.tsv")), "dev")

        def get_test_examples(self, data_dir):
            return self._create(self._read_tsv(os.path.join(data_dir, "test.tsv")), "test")

        def get_labels(self):
            return ["0", "1"]

        def _create(self, lines, set_type):
            text_index = 1 if set_type == "test" else 0
            return [
                run_classifier.InputExample(guid="%s-%d" % (set_type, i), text_a=line[text_index], text_b=None,
                                            label="0" if set_type == "test" else line[1])
                for i, line in enumerate(lines) if i > 0
            ]

    return Sst2Processor


def print_flags() -> None:
    import_bert()
    from absl import flags

    by_module = flags.FLAGS.flags_by_module_dict()
    out = {f.name: {"type": f.flag_type(), "default": f.default}
           for module in ("bert.run_classifier", "bert.tokenization") for f in by_module[module]}
    json.dump(out, sys.stdout)


def parse_flags(argv) -> None:
    import_bert()
    import absl.app  # defines --flagfile, as in run_classifier.py, which runs under absl.app
    from absl import flags

    flags.FLAGS(["run_classifier.py"] + argv)
    by_module = flags.FLAGS.flags_by_module_dict()
    json.dump({f.name: f.value for module in ("bert.run_classifier", "bert.tokenization") for f in by_module[module]},
              sys.stdout)


def main() -> None:
    if sys.argv[1:] == ["flags"]:
        print_flags()
        return
    if sys.argv[1:2] == ["parse"]:
        parse_flags(sys.argv[2:])
        return
    p = argparse.ArgumentParser()
    p.add_argument("task")
    p.add_argument("data_dir")
    p.add_argument("--vocab", required=True)
    p.add_argument("--max-seq-length", type=int, required=True)
    p.add_argument("--cased", action="store_true")
    args = p.parse_args()
    tokenization, run_classifier = import_bert()
    processors = {
        "cola": run_classifier.ColaProcessor,
        "mnli": run_classifier.MnliProcessor,
        "mrpc": run_classifier.MrpcProcessor,
        "xnli": run_classifier.XnliProcessor,
        "sst-2": sst2_processor(run_classifier),
    }
    processor = processors[args.task]()
    labels = processor.get_labels()
    tok = tokenization.FullTokenizer(args.vocab, do_lower_case=not args.cased)
    out = {"labels": labels}
    for split, get in (("train", processor.get_train_examples), ("dev", processor.get_dev_examples),
                       ("test", processor.get_test_examples)):
        try:
            examples = get(args.data_dir)
        except NotImplementedError:  # XnliProcessor has no test split
            out[split] = None
            continue
        rows = []
        for ex in examples:
            # ex_index 5: past the first examples that convert_single_example logs.
            f = run_classifier.convert_single_example(5, ex, labels, args.max_seq_length, tok)
            rows.append({"guid": ex.guid, "text_a": ex.text_a, "text_b": ex.text_b or "", "label": ex.label,
                         "input_ids": f.input_ids, "input_mask": f.input_mask, "segment_ids": f.segment_ids,
                         "label_id": f.label_id})
        out[split] = rows
    json.dump(out, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
