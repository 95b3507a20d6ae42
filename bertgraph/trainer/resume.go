package trainer

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/gorovod/gorovod/horovod"
	"github.com/gorovod/gorovod/tf/checkpoint"
)

// shareChunk bounds one broadcast of checkpoint bytes (and the memory it needs).
const shareChunk = 64 << 20

// checkpointManifest describes the checkpoint rank 0 resumes from.
type checkpointManifest struct {
	Step          int64    `json:"step"`
	inputPosition          // batches each rank drew before the save, and the ranks
	Base          string   `json:"base"`  // file name prefix, e.g. model.ckpt-200
	Files         []string `json:"files"` // suffixes after Base: .index, .data-00000-of-00001
	Sizes         []int64  `json:"sizes"`
}

// resumePoint is where a rank continues: its copy of the checkpoint, the global step it holds
// and the position of the training data. Prefix is "" when there is nothing to resume.
type resumePoint struct {
	Prefix string
	Step   int64
	inputPosition
}

// shareCheckpoint gives every rank rank 0's checkpoint to resume from. Each rank applies the
// averaged gradients with its own Adam slots, so all of them must restore the same optimizer
// state, not only the model variables that a broadcast of the weights would cover; and the
// other ranks may not see rank 0's disk. Rank 0 passes its prefix ("" when it starts afresh) and
// broadcasts the files; the others write them under dir/resume and get their own prefix back.
// Every rank returns an empty Prefix when there is nothing to resume. batchSize is the run's, at
// which rank 0 reckons the examples of a position that does not count them.
func shareCheckpoint(hvd *horovod.Horovod, prefix, dir string, batchSize int) (resumePoint, error) {
	var man checkpointManifest
	if hvd.Rank() == 0 && prefix != "" {
		var err error
		if man, err = manifestOf(prefix, batchSize); err != nil {
			return resumePoint{}, err
		}
	}
	manBytes, err := broadcastBytes(hvd, "trainer/resume/manifest", func() []byte {
		b, _ := json.Marshal(man)
		return b
	})
	if err != nil {
		return resumePoint{}, err
	}
	if err := json.Unmarshal(manBytes, &man); err != nil {
		return resumePoint{}, fmt.Errorf("resume: rank 0's manifest: %w", err)
	}
	if man.Base == "" {
		return resumePoint{}, nil
	}
	if hvd.Rank() == 0 {
		for i, suffix := range man.Files {
			if err := shareFile(hvd, prefix+suffix, man.Sizes[i], i, nil); err != nil {
				return resumePoint{}, err
			}
		}
		return resumePoint{prefix, man.Step, man.inputPosition}, nil
	}
	local := filepath.Join(dir, "resume", man.Base)
	if err := receiveCheckpoint(hvd, man, local); err != nil {
		// What was received is of no use, and would stay until a later resume succeeded.
		os.RemoveAll(filepath.Dir(local))
		return resumePoint{}, err
	}
	return resumePoint{local, man.Step, man.inputPosition}, nil
}

// receiveCheckpoint writes the files of man that rank 0 broadcasts under the prefix local.
func receiveCheckpoint(hvd *horovod.Horovod, man checkpointManifest, local string) error {
	if err := os.MkdirAll(filepath.Dir(local), 0o755); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	for i, suffix := range man.Files {
		f, err := os.Create(local + suffix)
		if err != nil {
			return fmt.Errorf("resume: %w", err)
		}
		err = shareFile(hvd, "", man.Sizes[i], i, f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("resume: receiving %s: %w", local+suffix, err)
		}
	}
	return nil
}

func manifestOf(prefix string, batchSize int) (checkpointManifest, error) {
	man := checkpointManifest{Base: filepath.Base(prefix)}
	var err error
	if man.Step, err = checkpoint.StepOf(prefix); err != nil {
		return man, err
	}
	if man.inputPosition, err = readInputPosition(prefix, man.Step, batchSize); err != nil {
		return man, err
	}
	files, err := checkpoint.DataShards(prefix)
	if err != nil {
		return man, fmt.Errorf("resume: %w", err)
	}
	files = append(files, prefix+".index")
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			return man, fmt.Errorf("resume: %w", err)
		}
		man.Files = append(man.Files, strings.TrimPrefix(f, prefix))
		man.Sizes = append(man.Sizes, st.Size())
	}
	return man, nil
}

// shareFile broadcasts one file from rank 0 in chunks: rank 0 reads path, the others write to w.
func shareFile(hvd *horovod.Horovod, path string, size int64, index int, w io.Writer) error {
	var r *os.File
	if hvd.Rank() == 0 {
		var err error
		if r, err = os.Open(path); err != nil {
			return fmt.Errorf("resume: %w", err)
		}
		defer r.Close()
	}
	buf := make([]byte, min(size, shareChunk))
	for off, chunk := int64(0), 0; off < size; chunk++ {
		n := min(size-off, shareChunk)
		b := buf[:n]
		if r != nil {
			if _, err := io.ReadFull(r, b); err != nil {
				return fmt.Errorf("resume: reading %s: %w", path, err)
			}
		}
		t, err := horovod.NewTensor([]int{int(n)}, b)
		if err != nil {
			return err
		}
		name := fmt.Sprintf("trainer/resume/file%d/chunk%d", index, chunk)
		if err := hvd.BroadcastVariables([]horovod.NamedTensor{{Name: name, Tensor: t}}, 0); err != nil {
			return err
		}
		if w != nil {
			if _, err := w.Write(b); err != nil {
				return err
			}
		}
		off += n
	}
	return nil
}

// broadcastBytes sends rank 0's bytes (made by produce, called on rank 0 only) to every rank.
func broadcastBytes(hvd *horovod.Horovod, name string, produce func() []byte) ([]byte, error) {
	var data []byte
	if hvd.Rank() == 0 {
		data = produce()
	}
	n := []int64{int64(len(data))}
	lt, _ := horovod.NewTensor([]int{1}, n)
	if err := hvd.BroadcastVariables([]horovod.NamedTensor{{Name: name + "/len", Tensor: lt}}, 0); err != nil {
		return nil, err
	}
	if hvd.Rank() != 0 {
		data = make([]byte, n[0])
	}
	if n[0] == 0 {
		return data, nil
	}
	dt, _ := horovod.NewTensor([]int{len(data)}, data)
	if err := hvd.BroadcastVariables([]horovod.NamedTensor{{Name: name, Tensor: dt}}, 0); err != nil {
		return nil, err
	}
	return data, nil
}
