// Command classify serves the SavedModel finetune exports: it reads texts one per line and
// writes, per line and in input order, the predicted label and the probability of every label
// as tab-separated values.
//
//	classify --model DIR [--batch_size N] [--threads N] [--header] [FILE|-]...
//
// DIR is a serving export (output_dir/export/<step>, written by bertgraph's ExportServing) or
// the export/ directory above it, in which case the highest numeric version is served, as
// TensorFlow Serving's default version policy does. The export's assets.extra/ supplies the
// vocabulary, casing and label names training used.
//
// Inputs are the FILE arguments in order, "-" being standard input; no argument reads standard
// input. Every input line (without its "\n" or "\r\n") is one text, an empty line included, so
// output line i answers input line i. A tab is whitespace inside the text: sentence pairs are
// not supported, because bertgraph.Classifier classifies single sequences only.
//
// Output: `label<TAB>prob_1<TAB>...<TAB>prob_n`, probabilities in label-id order and printed
// with the shortest decimal that reads back as the same float32. --header prefixes the rows with
// `label<TAB>prob_<name1>...`; empty input writes nothing, header included, and exits 0.
package main

import "os"

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
