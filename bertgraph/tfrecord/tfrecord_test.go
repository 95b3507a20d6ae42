package tfrecord

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/bertgraph/datatests"
	"github.com/gorovod/gorovod/bertgraph/features"
	records "github.com/gorovod/gorovod/tf/tfrecord"
	"google.golang.org/protobuf/encoding/protowire"
)

func TestExampleRoundTrip(t *testing.T) {
	in := map[string][]int64{"a": {1, -1, 1 << 40, 0}, "b": {}, "c": {-9223372036854775808}}
	b := EncodeExample(in)
	if !bytes.Equal(b, EncodeExample(in)) {
		t.Fatal("encoding is not deterministic")
	}
	out, err := DecodeExample(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 3 || !slices.Equal(out["a"], in["a"]) || len(out["b"]) != 0 || !slices.Equal(out["c"], in["c"]) {
		t.Fatalf("decoded %v", out)
	}
	if _, err := DecodeExample(b[:len(b)-1]); err == nil {
		t.Error("truncated Example decoded")
	}
	// A float_list feature: Example{features{feature{key: "f" value{float_list{value: [1.0]}}}}}.
	msg := func(num protowire.Number, payload []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), payload)
	}
	floatList := msg(1, []byte{0, 0, 0x80, 0x3f})
	entry := append(msg(1, []byte("f")), msg(2, msg(2, floatList))...)
	floatEx := msg(1, msg(1, entry))
	if _, err := DecodeExample(floatEx); err == nil || !strings.Contains(err.Error(), `feature "f" is a float_list`) {
		t.Errorf("float feature: %v", err)
	}
}

func randomFeatures(rng *rand.Rand, seq int) features.InputFeatures {
	f := features.InputFeatures{InputIDs: make([]int32, seq), InputMask: make([]int32, seq), SegmentIDs: make([]int32, seq),
		LabelID: int32(rng.IntN(3)), IsRealExample: rng.IntN(2) == 1}
	used := 2 + rng.IntN(seq-1)
	for i := range used {
		f.InputIDs[i] = int32(rng.IntN(30522))
		f.InputMask[i] = 1
		f.SegmentIDs[i] = int32(i * 2 / used)
	}
	return f
}

func sameFeatures(a, b features.InputFeatures) bool {
	return slices.Equal(a.InputIDs, b.InputIDs) && slices.Equal(a.InputMask, b.InputMask) &&
		slices.Equal(a.SegmentIDs, b.SegmentIDs) && a.LabelID == b.LabelID && a.IsRealExample == b.IsRealExample
}

func TestFeaturesRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	f := randomFeatures(rng, 16)
	got, err := DecodeFeatures(EncodeFeatures(f), 16)
	if err != nil || !sameFeatures(got, f) {
		t.Fatalf("%+v %v, want %+v", got, err, f)
	}
	if _, err := DecodeFeatures(EncodeFeatures(f), 17); err == nil || !strings.Contains(err.Error(), `"input_ids" has 16 values, want max_seq_length 17`) {
		t.Errorf("wrong length: %v", err)
	}
	if _, err := DecodeFeatures(EncodeExample(map[string][]int64{"input_ids": make([]int64, 4)}), 4); err == nil || !strings.Contains(err.Error(), "input_mask") {
		t.Errorf("missing feature: %v", err)
	}
	// Each rule of parse_single_example, against DecodeExample's map (the fuzz test draws more).
	ok := map[string][]int64{KeyInputIDs: {5, 6}, KeyInputMask: {1, 1}, KeySegmentIDs: {0, 0}, KeyLabelIDs: {2}}
	for name, change := range map[string]func(map[string][]int64){
		"fits":                    func(map[string][]int64) {},
		"is_real_example 0":       func(m map[string][]int64) { m[KeyIsRealExample] = []int64{0} },
		"is_real_example 1":       func(m map[string][]int64) { m[KeyIsRealExample] = []int64{1} },
		"two labels":              func(m map[string][]int64) { m[KeyLabelIDs] = []int64{1, 2} },
		"no label value":          func(m map[string][]int64) { m[KeyLabelIDs] = []int64{} },
		"no label":                func(m map[string][]int64) { delete(m, KeyLabelIDs) },
		"label overflows":         func(m map[string][]int64) { m[KeyLabelIDs] = []int64{1 << 40} },
		"id overflows":            func(m map[string][]int64) { m[KeyInputIDs] = []int64{1, -1 << 33} },
		"long mask":               func(m map[string][]int64) { m[KeyInputMask] = []int64{1, 1, 1} },
		"unknown feature":         func(m map[string][]int64) { m["extra"] = []int64{1 << 62, -1} },
		"two is_real_example":     func(m map[string][]int64) { m[KeyIsRealExample] = []int64{1, 1} },
		"negative in-range value": func(m map[string][]int64) { m[KeySegmentIDs] = []int64{-3, 0} },
	} {
		t.Run(name, func(t *testing.T) {
			m := maps.Clone(ok)
			change(m)
			checkDecodeFeatures(t, EncodeExample(m), 2)
		})
	}
	// A key twice in one record: the later entry holds, as for any protobuf map.
	twice := append(EncodeExample(ok), EncodeExample(map[string][]int64{KeyInputIDs: {7, 8}})...)
	if f, err := DecodeFeatures(twice, 2); err != nil || !slices.Equal(f.InputIDs, []int32{7, 8}) {
		t.Errorf("repeated key: %v %v", f.InputIDs, err)
	}
	checkDecodeFeatures(t, append(EncodeExample(ok), EncodeExample(map[string][]int64{KeyInputIDs: {7}})...), 2)
}

// ReadBatch into one reused batch gives what NextBatch gives in new ones, the last partial
// batch's padding rows cleared of the previous batch's records.
func TestReadBatchReusesItsBatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	var buf bytes.Buffer
	w := records.NewWriter(&buf)
	for range 11 {
		w.Write(EncodeFeatures(randomFeatures(rng, 8)))
	}
	path := filepath.Join(t.TempDir(), "train.tf_record")
	os.WriteFile(path, buf.Bytes(), 0o644)
	for _, opts := range []DatasetOptions{{}, {ShuffleBuffer: 4, Seed: 3}} {
		fresh, _ := OpenDataset([]string{path}, opts)
		reused, _ := OpenDataset([]string{path}, opts)
		b := features.NewBatch(4, 8)
		for i := 0; ; i++ {
			want, werr := fresh.NextBatch(4, 8, false)
			err := reused.ReadBatch(b, false)
			if werr == io.EOF && err == io.EOF {
				break
			}
			if werr != nil || err != nil {
				t.Fatalf("batch %d: %v, %v", i, werr, err)
			}
			if !slices.Equal(b.InputIDs, want.InputIDs) || !slices.Equal(b.InputMask, want.InputMask) || !slices.Equal(b.SegmentIDs, want.SegmentIDs) ||
				!slices.Equal(b.LabelIDs, want.LabelIDs) || !slices.Equal(b.IsRealExample, want.IsRealExample) || len(b.GUIDs) != 0 {
				t.Fatalf("shuffle %d, batch %d: ReadBatch %+v, NextBatch %+v", opts.ShuffleBuffer, i, b, want)
			}
		}
		fresh.Close()
		reused.Close()
	}
}

// pyRecord is a record as tfrecord_ref.py prints it.
type pyRecord struct {
	InputIDs      []int32 `json:"input_ids"`
	InputMask     []int32 `json:"input_mask"`
	SegmentIDs    []int32 `json:"segment_ids"`
	LabelIDs      int32   `json:"label_ids"`
	IsRealExample int32   `json:"is_real_example"`
}

func (p pyRecord) features() features.InputFeatures {
	return features.InputFeatures{InputIDs: p.InputIDs, InputMask: p.InputMask, SegmentIDs: p.SegmentIDs, LabelID: p.LabelIDs, IsRealExample: p.IsRealExample == 1}
}

// Both directions in one TensorFlow process: tf.data + tf.io.parse_single_example read the
// records we write, and we read the records tf.io.TFRecordWriter writes; values equal.
func TestTFRecordsAgainstTensorFlow(t *testing.T) {
	const seq, n = 32, 300
	const pySeq, pyN = 24, 200
	dir := t.TempDir()
	ours, theirs := filepath.Join(dir, "train.tf_record"), filepath.Join(dir, "py.tf_record")
	rng := rand.New(rand.NewPCG(3, 4))
	var buf bytes.Buffer
	w := records.NewWriter(&buf)
	var wrote []features.InputFeatures
	for range n {
		f := randomFeatures(rng, seq)
		wrote = append(wrote, f)
		if err := w.Write(EncodeFeatures(f)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(ours, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	var py struct{ Read, Wrote []pyRecord }
	out := datatests.RunPython(t, nil, "tfrecord_ref.py", ours, fmt.Sprint(seq), theirs, fmt.Sprint(pySeq), fmt.Sprint(pyN))
	if err := json.Unmarshal(out, &py); err != nil {
		t.Fatal(err)
	}

	t.Run("tf.data reads ours", func(t *testing.T) {
		if len(py.Read) != n {
			t.Fatalf("tf.data read %d records, we wrote %d", len(py.Read), n)
		}
		for i := range py.Read {
			if !sameFeatures(py.Read[i].features(), wrote[i]) {
				t.Fatalf("record %d: tf.data read %+v, we wrote %+v", i, py.Read[i], wrote[i])
			}
		}
	})
	t.Run("we read TensorFlow's", func(t *testing.T) {
		if len(py.Wrote) != pyN {
			t.Fatalf("TensorFlow reports %d records", len(py.Wrote))
		}
		d, err := OpenDataset([]string{theirs}, DatasetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		for i := range pyN {
			rec, err := d.Next()
			if err != nil {
				t.Fatalf("record %d: %v", i, err)
			}
			f, err := DecodeFeatures(rec.Data, pySeq)
			if err != nil || !sameFeatures(f, py.Wrote[i].features()) {
				t.Fatalf("record %d: %+v %v, TensorFlow wrote %+v", i, f, err, py.Wrote[i])
			}
		}
		if _, err := d.Next(); err != io.EOF {
			t.Fatalf("after %d records: %v", pyN, err)
		}
	})
}

func writeIndexed(t *testing.T, dir string, files, perFile int) []string {
	t.Helper()
	var paths []string
	k := 0
	for f := range files {
		var buf bytes.Buffer
		w := records.NewWriter(&buf)
		for range perFile {
			if err := w.Write([]byte(fmt.Sprint(k))); err != nil {
				t.Fatal(err)
			}
			k++
		}
		p := filepath.Join(dir, fmt.Sprintf("part-%d.tf_record", f))
		if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	return paths
}

func take(t *testing.T, d *Dataset, n int) []int {
	t.Helper()
	var out []int
	for range n {
		rec, err := d.Next()
		if err != nil {
			t.Fatal(err)
		}
		var k int
		fmt.Sscan(string(rec.Data), &k)
		out = append(out, k)
	}
	return out
}

func TestDatasetShardShuffleRepeat(t *testing.T) {
	paths := writeIndexed(t, t.TempDir(), 3, 34) // records 0..101 over three files
	const total = 102
	if _, err := OpenDataset(paths, DatasetOptions{Rank: 3, Size: 3}); err == nil || err.Error() != "tfrecord: rank 3 of size 3 is not a valid shard" {
		t.Errorf("rank 3 of size 3: %v", err)
	}
	// Sharding: rank r gets records r, r+size, ... across file boundaries.
	seen := map[int]bool{}
	for rank := range 3 {
		d, err := OpenDataset(paths, DatasetOptions{Rank: rank, Size: 3})
		if err != nil {
			t.Fatal(err)
		}
		got := take(t, d, total/3)
		for i, k := range got {
			if k != rank+3*i {
				t.Fatalf("rank %d record %d = %d, want %d", rank, i, k, rank+3*i)
			}
			seen[k] = true
		}
		if _, err := d.Next(); err != io.EOF {
			t.Fatalf("rank %d: %v after its shard", rank, err)
		}
		d.Close()
	}
	if len(seen) != total {
		t.Fatalf("ranks saw %d distinct records of %d", len(seen), total)
	}
	// Shuffle + repeat: each epoch is a permutation of the shard, differs between epochs, is the
	// same for the same seed, and an element leaves the buffer no earlier than its index allows.
	const buffer = 8
	opts := DatasetOptions{Rank: 1, Size: 2, ShuffleBuffer: buffer, Seed: 42, Repeat: true}
	d, _ := OpenDataset(paths, opts)
	defer d.Close()
	shard := total / 2
	e0, e1 := take(t, d, shard), take(t, d, shard)
	if d.Epoch() != 1 {
		t.Errorf("epoch %d after two passes' worth", d.Epoch())
	}
	for _, e := range [][]int{e0, e1} {
		s := slices.Sorted(slices.Values(e))
		for i, k := range s {
			if k != 1+2*i {
				t.Fatalf("an epoch is not a permutation of the shard: %v", s)
			}
		}
		for pos, k := range e {
			if idx := (k - 1) / 2; pos < idx-(buffer-1) {
				t.Fatalf("record index %d emitted at %d, before it can enter a buffer of %d", idx, pos, buffer)
			}
		}
	}
	if slices.Equal(e0, e1) || slices.IsSorted(e0) {
		t.Errorf("epochs not reshuffled: %v / %v", e0, e1)
	}
	again, _ := OpenDataset(paths, opts)
	defer again.Close()
	if !slices.Equal(take(t, again, shard), e0) {
		t.Error("same seed, different order")
	}
	opts.Seed = 43
	other, _ := OpenDataset(paths, opts)
	defer other.Close()
	if slices.Equal(take(t, other, shard), e0) {
		t.Error("different seed, same order")
	}
	// Repeating an empty shard is an error, not a hang.
	empty := writeIndexed(t, t.TempDir(), 1, 1)
	d2, _ := OpenDataset(empty, DatasetOptions{Rank: 1, Size: 2, Repeat: true})
	defer d2.Close()
	if _, err := d2.Next(); err == nil || !strings.Contains(err.Error(), "empty shard") {
		t.Errorf("empty shard: %v", err)
	}
}

// Skip leaves a repeating dataset where as many calls of Next would, at every offset of the
// first epochs (passing over whole epochs once the first has ended), and skips 2^62 records,
// a resume's skip from a damaged input position, without reading them.
func TestDatasetSkip(t *testing.T) {
	paths := writeIndexed(t, t.TempDir(), 2, 7)                                       // records 0..13
	opts := DatasetOptions{Rank: 1, Size: 3, ShuffleBuffer: 3, Seed: 7, Repeat: true} // 5 records an epoch
	const epoch, after = 5, 7
	open := func() *Dataset {
		d, err := OpenDataset(paths, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	for n := range 6 * epoch {
		read, skipped := open(), open()
		want := take(t, read, n+after)[n:]
		if err := skipped.Skip(int64(n)); err != nil {
			t.Fatal(err)
		}
		if got := take(t, skipped, after); !slices.Equal(got, want) || skipped.Epoch() != read.Epoch() {
			t.Fatalf("after skipping %d: %v in epoch %d, reading gives %v in epoch %d", n, got, skipped.Epoch(), want, read.Epoch())
		}
	}
	const huge = int64(1) << 62
	d := open()
	if err := d.Skip(huge); err != nil {
		t.Fatal(err)
	}
	// Reading m >= 1 records ends in epoch (m-1)/epoch: the next one starts as Next reads on.
	if want := uint64((huge - 1) / epoch); d.Epoch() != want {
		t.Errorf("epoch %d after skipping %d records of %d an epoch, want %d", d.Epoch(), huge, epoch, want)
	}
}

func TestDatasetBatches(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	var buf bytes.Buffer
	w := records.NewWriter(&buf)
	var want []features.InputFeatures
	for range 7 {
		f := randomFeatures(rng, 8)
		f.IsRealExample = true
		want = append(want, f)
		w.Write(EncodeFeatures(f))
	}
	path := filepath.Join(t.TempDir(), "eval.tf_record")
	os.WriteFile(path, buf.Bytes(), 0o644)
	for _, drop := range []bool{false, true} {
		d, _ := OpenDataset([]string{path}, DatasetOptions{})
		var batches []*features.Batch
		for {
			b, err := d.NextBatch(3, 8, drop)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			batches = append(batches, b)
		}
		d.Close()
		if n := map[bool]int{false: 3, true: 2}[drop]; len(batches) != n {
			t.Fatalf("drop=%v: %d batches, want %d", drop, len(batches), n)
		}
		for i, b := range batches {
			for j := range 3 {
				if k := 3*i + j; k < len(want) {
					if !sameFeatures(b.Row(j), want[k]) {
						t.Fatalf("batch %d row %d differs", i, j)
					}
				} else if b.IsRealExample[j] != 0 || b.InputMask[j*8] != 0 {
					t.Fatalf("batch %d row %d should be padding", i, j)
				}
			}
		}
		if !drop && (batches[2].NumReal() != 1 || len(batches[2].GUIDs) != 1) {
			t.Errorf("last batch: %d real, guids %v", batches[2].NumReal(), batches[2].GUIDs)
		}
	}
	bad := filepath.Join(t.TempDir(), "short.tf_record")
	os.WriteFile(bad, buf.Bytes()[:len(buf.Bytes())-3], 0o644)
	d, _ := OpenDataset([]string{bad}, DatasetOptions{})
	defer d.Close()
	var err error
	for err == nil {
		_, err = d.NextBatch(2, 8, false)
	}
	if !strings.Contains(err.Error(), bad+": record at byte offset") {
		t.Errorf("truncated file: %v", err)
	}
}
