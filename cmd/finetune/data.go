package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"

	"github.com/gorovod/gorovod/bertgraph/features"
	"github.com/gorovod/gorovod/bertgraph/tfrecord"
	"github.com/gorovod/gorovod/tf/atomicfile"
	records "github.com/gorovod/gorovod/tf/tfrecord"
)

// withoutLabels drops the labels of a Reader's examples: prediction ignores them, as
// run_classifier's test examples.
type withoutLabels struct{ r *features.Reader }

func (s withoutLabels) Next() (features.InputExample, error) {
	ex, err := s.r.Next()
	ex.Label = ""
	return ex, err
}

// trainCacheKey is everything the content of a rank's train.tf_record depends on. The cache is
// reused only when the key of a new run equals the stored one (and the file is still the size
// it was written at).
type trainCacheKey struct {
	Version      int      `json:"version"`
	Task         string   `json:"task"`
	TrainFile    string   `json:"train_file"`
	TrainSHA256  string   `json:"train_sha256"`
	VocabSHA256  string   `json:"vocab_sha256"`
	DoLowerCase  bool     `json:"do_lower_case"`
	MaxSeqLength int      `json:"max_seq_length"`
	TailTokens   int      `json:"keep_tail_tokens"`
	Labels       []string `json:"labels"`
	Rank         int      `json:"rank"`
	Size         int      `json:"size"`
	MaxExamples  int      `json:"max_train_examples"`
	SkipBadLines bool     `json:"skip_bad_lines"`
}

// trainCache is the stored key with what the conversion found.
type trainCache struct {
	Key      trainCacheKey `json:"key"`
	Examples int           `json:"examples"` // records in this rank's file
	Skipped  int           `json:"skipped"`  // bad lines this rank skipped
	// Bytes is the file's size as written: a file cut short since (a copy that stopped
	// part-way) is converted again, as its records, repeated, would pass for all of them.
	Bytes int64 `json:"bytes"`
}

const trainCacheVersion = 3 // 2: the task, which decides the columns read; 3: keep_tail_tokens

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// trainFeatures converts this rank's share of the training file into rankDir/train.tf_record
// (run_classifier's file_based_convert_examples_to_features, with line i going to rank
// i % size), or reuses the file a previous run wrote with the same inputs and settings. It
// returns the file, its record count and whether it was reused. A signal stops the conversion
// (errInterrupted), leaving neither file nor key.
func trainFeatures(c *Config, in *inputs, conv *features.Converter, rank, size int, stop *stopper) (path string, cache trainCache, reused bool, err error) {
	path = filepath.Join(in.rankDir, "train.tf_record")
	keyPath := trainKeyPath(path)
	trainSum, err := fileSHA256(in.train)
	if err != nil {
		return "", cache, false, err
	}
	vocabSum, err := fileSHA256(in.vocabPath)
	if err != nil {
		return "", cache, false, err
	}
	abs, _ := filepath.Abs(in.train)
	key := trainCacheKey{Version: trainCacheVersion, Task: c.task().name, TrainFile: abs, TrainSHA256: trainSum, VocabSHA256: vocabSum,
		DoLowerCase: c.DoLowerCase, MaxSeqLength: c.MaxSeqLength, TailTokens: conv.TailTokens(), Labels: conv.Labels().Names(),
		Rank: rank, Size: size, MaxExamples: c.MaxTrainExamples, SkipBadLines: c.SkipBadLines}

	if b, err := os.ReadFile(keyPath); err == nil {
		var stored trainCache
		if json.Unmarshal(b, &stored) == nil && reflect.DeepEqual(stored.Key, key) {
			if st, err := os.Stat(path); err == nil && st.Size() == stored.Bytes {
				return path, stored, true, nil
			}
		}
	}
	// The key goes last: a run killed while converting leaves no key, so no stale reuse. A run
	// killed harder (kill -9, the OOM killer) also leaves its temporary files, as large as the
	// records: this rank is the one writer of its directory while the job holds --output_dir.
	os.Remove(keyPath)
	if err := errors.Join(atomicfile.RemoveStale(path), atomicfile.RemoveStale(keyPath)); err != nil {
		return "", cache, false, err
	}

	opts := c.task().train.read
	opts.Rank, opts.Size, opts.Labels, opts.SkipBad, opts.MaxLines = rank, size, conv.Labels(), c.SkipBadLines, c.MaxTrainExamples
	r, err := features.Open(in.train, opts)
	if err != nil {
		return "", cache, false, err
	}
	defer r.Close()
	out, err := atomicfile.Create(path)
	if err != nil {
		return "", cache, false, err
	}
	defer out.Abort()
	w := records.NewWriter(out)
	stream := conv.Stream(r, features.StreamOptions{BatchSize: 64})
	defer stream.Close()
	n := 0
	for {
		if sig := stop.requested(); sig != nil {
			return "", cache, false, errInterrupted{sig, "while converting the training data"}
		}
		b, err := stream.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", cache, false, err
		}
		for i := range b.NumReal() {
			if err := w.Write(tfrecord.EncodeFeatures(b.Row(i))); err != nil {
				return "", cache, false, fmt.Errorf("%s: %w", path, err)
			}
			n++
		}
	}
	if err := out.Commit(); err != nil {
		return "", cache, false, err
	}
	st, err := os.Stat(path)
	if err != nil {
		return "", cache, false, err
	}
	cache = trainCache{Key: key, Examples: n, Skipped: r.Counts().Skipped, Bytes: st.Size()}
	b, _ := json.MarshalIndent(cache, "", " ")
	if err := atomicfile.Write(keyPath, append(b, '\n')); err != nil {
		return "", cache, false, err
	}
	return path, cache, false, nil
}

// trainKeyPath is where the key of the training features in path is stored.
func trainKeyPath(path string) string { return path + ".key.json" }

// forgetDamagedCache makes the next run convert this rank's training features again when err is
// a damaged record of path, trainFeatures' cache: it is reused while its key matches and its
// size is the one written, which a bit flipped on disk or in a copy keeps, so every later run
// would fail the same way, on the same record, with nothing saying that the file is derived from
// train.tsv and may go.
func forgetDamagedCache(err error, path, train string) error {
	var corrupt *records.CorruptError
	if !errors.As(err, &corrupt) || corrupt.Path != path {
		return err
	}
	if rerr := os.Remove(trainKeyPath(path)); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		return errors.Join(err, rerr)
	}
	return fmt.Errorf("%w\n  (%s holds this rank's features of %s: its key is removed, so the next run converts them again)", err, path, train)
}

// evalStream reads a whole dev (labelled) or test (not labelled) file of the task, rank 0 only,
// into batches: no example is dropped, and the last batch holds the examples left (no padding,
// as run_classifier off TPUs). Test labels are never read, as run_classifier's dummy ones; a seed
// test file may have them or not (seedTestLabelled). --skip_bad_lines applies to dev only: a
// skipped test line would shift every later row of test_results.tsv off its line of the test
// file (a GLUE submission is matched by row), so a bad test line is always an error naming it.
func evalStream(c *Config, path string, conv *features.Converter, batchSize, limit int, labelled bool) (*features.Stream, *features.Reader, error) {
	t := c.task()
	opts := t.test.read
	if labelled {
		opts = t.dev.read
		opts.Labels = conv.Labels()
	} else if t.name == seedTaskName {
		withLabels, err := seedTestLabelled(path)
		if err != nil {
			return nil, nil, fmt.Errorf("features: %w", err)
		}
		opts.Unlabelled = !withLabels
	}
	opts.SkipBad = labelled && c.SkipBadLines
	opts.MaxLines = limit
	r, err := features.Open(path, opts)
	if err != nil {
		return nil, nil, err
	}
	var src features.Source = r
	if !labelled {
		src = withoutLabels{r}
	}
	return conv.Stream(src, features.StreamOptions{BatchSize: batchSize}), r, nil
}
