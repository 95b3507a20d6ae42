package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/bertgraph/datatests"
	"github.com/gorovod/gorovod/bertgraph/features"
	"github.com/gorovod/gorovod/bertgraph/tokenizer"
)

// glueFiles are a few lines of each task's real layout (GLUE's files), with quotes that are not
// CSV quoting, non-ASCII text, an empty text_b and pairs long enough to be truncated.
var glueFiles = map[string]map[string]string{
	"cola": {
		"train.tsv": "gj04\t1\t\tOur friends won't buy this analysis, let alone the next one we propose.\n" +
			"gj04\t0\t*\tThe \"more\" we study verbs, the crazier they get.\n" +
			"cj99\t1\t\tCafé au lait costs €3 — 中文也可以 😀, isn't it?\n",
		"dev.tsv": "gj04\t1\t\t\"Unbalanced quote at the start.\n" +
			"bc01\t0\t*\tHe left the room ''quietly'' and the door — slammed.\n",
		"test.tsv": "index\tsentence\n0\tBill whistled past the house.\n1\tThe car honked its way down the \"road\".\n",
	},
	"mrpc": {
		// train.tsv's header as GLUE's download script writes it: with Microsoft's byte order mark.
		"train.tsv": "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n" +
			"1\t702876\t702977\tAmrozi accused his brother , whom he called \" the witness \" , of deliberately distorting his evidence .\tReferring to him as only \" the witness \" , Amrozi accused his brother of deliberately distorting his evidence .\n" +
			"0\t2108705\t2108831\tYucaipa owned Dominick 's before selling the chain to Safeway in 1998 for $ 2.5 billion .\t\n" +
			"1\t1330381\t1330521\tNaïve café owners in Zürich said \"no\" .\tLes propriétaires ont dit « non » .\n",
		"dev.tsv": "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n" +
			"1\t1355540\t1355592\tHe said the foodservice pie business doesn 't fit the company 's long-term growth strategy .\t\" The foodservice pie business does not fit our long-term growth strategy .\n",
		"test.tsv": "index\t#1 ID\t#2 ID\t#1 String\t#2 String\n" +
			"0\t1089874\t1089925\tPCCW 's chief operating officer , Mike Butcher , and Alex Arena , the chief financial officer , will report directly to Mr So .\tCurrent Chief Operating Officer Mike Butcher and Group Chief Financial Officer Alex Arena will report to So .\n",
	},
	"mnli": {
		"train.tsv": "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label\n" +
			"0\t31193\t31193n\tgovernment\t( ( Conceptually cream ) )\t( Product ( and geography ) )\t(ROOT (S))\t(ROOT (S))\tConceptually cream skimming has two basic dimensions - product and geography.\tProduct and geography are what make cream skimming work. \tneutral\tneutral\n" +
			"1\t101457\t101457e\ttelephone\t( you ( know ) )\t( You ( lose ) )\t(ROOT (S))\t(ROOT (S))\tyou know during the season and i guess at at your level uh you lose them to the next level if \"if\" they decide to recall the the parent team\tYou lose the things to the following level if the people recall.\tentailment\tentailment\n",
		"dev_matched.tsv": "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label\n" +
			"0\t63735\t63735n\tslate\t( ( The ( new rights ) ) )\t( Everyone ( really ) )\t(ROOT (S))\t(ROOT (S))\tThe new rights are nice enough\tEveryone really likes the newest benefits \tneutral\tentailment\tneutral\tneutral\tneutral\tneutral\n" +
			"1\t91383\t91383c\tslate\t( This ( site ) )\t( The ( Government ) )\t(ROOT (S))\t(ROOT (S))\tThis site includes a list of all award winners — “Grand Prix” included.\tThe Government Executive articles housed on the website are not able to be searched.\tcontradiction\tcontradiction\tcontradiction\tcontradiction\tcontradiction\tcontradiction\n",
		"test_matched.tsv": "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\tsentence2_parse\tsentence1\tsentence2\n" +
			"0\t31493\t31493\ttravel\t( ( Hierbas ) )\t( ( Hierbas ) )\t(ROOT (S))\t(ROOT (S))\tHierbas, ans seco, ans dulce, and frigola are just a few names worth keeping a look-out for.\tHierbas is a name worth looking out for.\n",
	},
	"xnli": {
		"multinli/multinli.train.zh.tsv": "premise\thypo\tlabel\n" +
			"从 概念 上 看 , 奶油 收入 有 两 个 基本 方面 产品 和 地理 .\t产品 和 地理 是 什么 使 奶油 抹 霜 工作 .\tneutral\n" +
			"你 知道 在 这个 季节 , \"我\" 猜 .\t你 失去 了 东西 .\tentailment\n" +
			"我们 的 一个 号码 会 仔细 执行 你 的 指示 .\t我 团队 的 一个 成员 将 执行 你 的 命令 .\tcontradictory\n",
		"xnli.dev.tsv": "language\tgold_label\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\tsentence2_parse\tsentence1\tsentence2\tpromptID\tpairID\tgenre\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tsentence1_tokenized\tsentence2_tokenized\tmatch\n" +
			"en\tneutral\t\t\t\t\tAnd he said, Mama, I'm home.\tHe called his mom.\t1\t1\tfacetoface\tneutral\tcontradiction\tneutral\tneutral\tneutral\tAnd he said\tHe called\tTrue\n" +
			"zh\tcontradiction\t\t\t\t\t他说，妈妈，我回来了。\t校车把他放下后，他立即给他妈妈打了电话。\t1\t1\tfacetoface\tneutral\tcontradiction\tneutral\tneutral\tneutral\t他 说\t校车\tTrue\n" +
			"zh\tentailment\t\t\t\t\t他说，“妈妈，我回来了。”\t他说他回家了。\t1\t2\tfacetoface\tentailment\tentailment\tneutral\tentailment\tentailment\t他 说\t他 说\tTrue\n" +
			"de\tentailment\t\t\t\t\tUnd er sagte: Mama, ich bin zu Hause.\tEr sagte, er sei zu Hause.\t1\t2\tfacetoface\tentailment\tentailment\tneutral\tentailment\tentailment\tUnd er\tEr sagte\tTrue\n",
	},
	"sst-2": {
		"train.tsv": "sentence\tlabel\nhide new secretions from the parental units \t0\nthe greatest musicians ' \"finest\" work — très bien \t1\n",
		"dev.tsv":   "sentence\tlabel\nit 's a charming and often affecting journey . \t1\n",
		"test.tsv":  "index\tsentence\n0\tuneasy mishmash of styles and genres .\n1\tthis film 's relationship to actual tension is the same as what christmas-tree flocking in a spray can is to actual snow .\n",
	},
}

// refExample is one of glue_ref.py's rows.
type refExample struct {
	GUID, TextA, TextB, Label       string
	InputIDs, InputMask, SegmentIDs []int32
	LabelID                         int32
}

func (r *refExample) UnmarshalJSON(b []byte) error {
	var raw struct {
		GUID       string  `json:"guid"`
		TextA      string  `json:"text_a"`
		TextB      string  `json:"text_b"`
		Label      string  `json:"label"`
		InputIDs   []int32 `json:"input_ids"`
		InputMask  []int32 `json:"input_mask"`
		SegmentIDs []int32 `json:"segment_ids"`
		LabelID    int32   `json:"label_id"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	*r = refExample{raw.GUID, raw.TextA, raw.TextB, raw.Label, raw.InputIDs, raw.InputMask, raw.SegmentIDs, raw.LabelID}
	return nil
}

// googleGUID is the guid run_classifier's processor gives the example on line (1-based) of a
// file: set-i with i the 0-based line index, MNLI's set-<index column>.
func googleGUID(task, set string, line int, content string) string {
	if task == "mnli" {
		return set + "-" + strings.SplitN(strings.Split(content, "\n")[line-1], "\t", 2)[0]
	}
	return set + "-" + strconv.Itoa(line-1)
}

// Every --task_name reads its files into the examples of Google's processor (guid, text_a,
// text_b, label; the test split's dummy label being our unlabelled example's id 0) and converts
// them, through finetune's own eval/predict streams for dev and test, into the features of
// run_classifier's convert_single_example (tokenization.py's FullTokenizer, MiniLM's vocabulary).
func TestTasksReadAndConvertLikeRunClassifier(t *testing.T) {
	vocab := filepath.Join(datatests.MiniLMDir(t), "vocab.txt")
	v, err := tokenizer.LoadVocab(vocab)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.New(v, tokenizer.Options{DoLowerCase: true})
	if err != nil {
		t.Fatal(err)
	}
	const seq = 24 // short enough to truncate the long pairs
	for name, files := range glueFiles {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for f, content := range files {
				os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755)
				if err := os.WriteFile(filepath.Join(dir, f), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			var ref struct {
				Labels           []string
				Train, Dev, Test []refExample
			}
			out := datatests.RunPython(t, nil, "glue_ref.py", name, dir, "--vocab", vocab, "--max-seq-length", strconv.Itoa(seq))
			if err := json.Unmarshal(out, &ref); err != nil {
				t.Fatal(err)
			}
			c := &Config{TaskName: strings.ToUpper(name), SkipBadLines: false}
			task := c.task()
			if !slices.Equal(task.labels, ref.Labels) {
				t.Fatalf("labels %q, run_classifier's %q", task.labels, ref.Labels)
			}
			labels, err := features.NewLabels(task.labels)
			if err != nil {
				t.Fatal(err)
			}
			conv, err := features.NewConverter(tok, seq, labels)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range []struct {
				set      string
				split    split
				want     []refExample
				labelled bool
			}{
				{"train", task.train, ref.Train, true},
				{map[bool]string{true: "dev_matched", false: "dev"}[name == "mnli"], task.dev, ref.Dev, true},
				{"test", task.test, ref.Test, false},
			} {
				if s.split.file == "" {
					if s.want != nil {
						t.Errorf("no %s split, run_classifier has %d examples", s.set, len(s.want))
					}
					continue
				}
				path := filepath.Join(dir, s.split.file)
				exs := readExamples(t, path, s.split.read)
				if len(exs) != len(s.want) || len(exs) == 0 {
					t.Fatalf("%s: %d examples, run_classifier %d", s.set, len(exs), len(s.want))
				}
				var feats []features.InputFeatures
				var guids []string
				if s.set == "train" {
					for _, ex := range exs {
						f, err := conv.Convert(ex)
						if err != nil {
							t.Fatal(err)
						}
						feats, guids = append(feats, f), append(guids, ex.GUID)
					}
				} else {
					feats, guids = streamFeatures(t, c, path, conv, s.labelled)
				}
				for i, ex := range exs {
					w := s.want[i]
					line, _ := strconv.Atoi(ex.GUID[strings.LastIndexByte(ex.GUID, ':')+1:])
					label := ex.Label
					if !s.labelled && label == "" {
						label = task.labels[0] // run_classifier's dummy test label
					}
					if got := googleGUID(name, s.set, line, files[s.split.file]); got != w.GUID || ex.TextA != w.TextA || ex.TextB != w.TextB || label != w.Label {
						t.Errorf("%s %d: ours %s %+v, run_classifier %+v", s.set, i, got, ex, w)
					}
					f := feats[i]
					if guids[i] != ex.GUID || !slices.Equal(f.InputIDs, w.InputIDs) || !slices.Equal(f.InputMask, w.InputMask) ||
						!slices.Equal(f.SegmentIDs, w.SegmentIDs) || f.LabelID != w.LabelID {
						t.Errorf("%s %s: features\n ours %v %v %v %d\n want %v %v %v %d", s.set, guids[i],
							f.InputIDs, f.InputMask, f.SegmentIDs, f.LabelID, w.InputIDs, w.InputMask, w.SegmentIDs, w.LabelID)
					}
				}
			}
		})
	}
}

func readExamples(t *testing.T, path string, opts features.ReadOptions) []features.InputExample {
	t.Helper()
	r, err := features.Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var exs []features.InputExample
	for {
		ex, err := r.Next()
		if errors.Is(err, io.EOF) {
			return exs
		}
		if err != nil {
			t.Fatal(err)
		}
		exs = append(exs, ex)
	}
}

// streamFeatures reads a dev (labelled) or test file through evalStream, as evaluate and
// predict do, and returns its real examples' features and GUIDs.
func streamFeatures(t *testing.T, c *Config, path string, conv *features.Converter, labelled bool) ([]features.InputFeatures, []string) {
	t.Helper()
	stream, _, err := evalStream(c, path, conv, 3, 0, labelled)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	var feats []features.InputFeatures
	var guids []string
	for {
		b, err := stream.Next()
		if errors.Is(err, io.EOF) {
			return feats, guids
		}
		if err != nil {
			t.Fatal(err)
		}
		for i := range b.NumReal() {
			feats = append(feats, b.Row(i))
		}
		guids = append(guids, b.GUIDs...)
	}
}

// The seed task's test.tsv may leave the labels out: the texts convert as with them.
func TestSeedTestFileWithOrWithoutLabels(t *testing.T) {
	dir := t.TempDir()
	conv, _ := binaryConverter(t, dir, 20, 8)
	labelled := filepath.Join(dir, "labelled.tsv")
	bare := filepath.Join(dir, "bare.tsv")
	os.WriteFile(labelled, []byte("1\tw5 w6\n0\tw7\tw8\n"), 0o644)
	os.WriteFile(bare, []byte("w5 w6\nw7\tw8\n"), 0o644)
	c := &Config{}
	want, _ := streamFeatures(t, c, labelled, conv, false)
	got, _ := streamFeatures(t, c, bare, conv, false)
	if len(want) != 2 || len(got) != 2 {
		t.Fatalf("%d and %d examples, want 2", len(want), len(got))
	}
	for i := range want {
		if !slices.Equal(got[i].InputIDs, want[i].InputIDs) || got[i].LabelID != 0 || want[i].LabelID != 0 {
			t.Errorf("example %d: without labels %v, with %v", i, got[i], want[i])
		}
	}
	// A tab in an unlabelled text is part of it: "w7\tw8" tokenizes as two words.
	if n := slices.Index(got[1].InputMask, 0); n != 4 {
		t.Errorf("unlabelled w7<TAB>w8: %d tokens with [CLS] and [SEP], want 4", n)
	}
}

// A run_classifier command line for CoLA (header-less train and dev, a header on test), without
// --max_seq_length or --do_lower_case: finetune trains, evaluates and predicts on its files.
func TestCoLACommandLineTrainsEvaluatesPredicts(t *testing.T) {
	model := tinyModel(t, true)
	data := t.TempDir()
	plain := t.TempDir()
	writeData(t, plain, 24, 8, 5)
	for _, f := range []string{"train.tsv", "dev.tsv", "test.tsv"} {
		b, err := os.ReadFile(filepath.Join(plain, f))
		if err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		if f == "test.tsv" {
			out.WriteString("index\tsentence\n")
		}
		for i, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
			label, text, _ := strings.Cut(line, "\t")
			if f == "test.tsv" {
				fmt.Fprintf(&out, "%d\t%s\n", i, text)
			} else {
				fmt.Fprintf(&out, "gj04\t%s\t\t%s\n", label, text)
			}
		}
		os.WriteFile(filepath.Join(data, f), []byte(out.String()), 0o644)
	}
	outDir := filepath.Join(t.TempDir(), "out")
	cmd := exec.Command(finetuneBinary(t), "--task_name=CoLA", "--do_train=true", "--do_eval=true", "--do_predict=true",
		"--data_dir="+data, "--saved_model="+model, "--output_dir="+outDir, "--train_batch_size=4", "--num_train_epochs=1",
		"--iterations_per_loop=1000", "--use_tpu=false", "--threads=1", "--inter_op_threads=1", "--export_dir=none")
	cmd.Env = append(os.Environ(), "TF_CPP_MIN_LOG_LEVEL=2", "CUDA_VISIBLE_DEVICES=")
	mustSucceed(t, cmd)
	eval, err := os.ReadFile(filepath.Join(outDir, "eval_results.txt"))
	if err != nil || !strings.Contains(string(eval), "eval_accuracy = ") || !strings.Contains(string(eval), "global_step = 6\n") {
		t.Errorf("eval_results.txt: %q, %v", eval, err)
	}
	if rows := readTestResults(t, filepath.Join(outDir, "test_results.tsv")); len(rows) != 5 {
		t.Errorf("test_results.tsv has %d rows for 5 test lines", len(rows))
	}
}
