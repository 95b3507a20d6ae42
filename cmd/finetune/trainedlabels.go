package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gorovod/gorovod/tf/atomicfile"
)

// trainedLabelsFile, in --output_dir, names the labels its checkpoints were trained with, in
// the classifier's order: output i is the i-th. A checkpoint read under other labels (another
// --labels order, another task) would swap or misname its classes without any error, as
// evaluation, prediction and resumed training have nothing else to tell them by.
const trainedLabelsFile = "trained_labels.json"

type trainedLabels struct {
	Labels []string `json:"labels"`
}

// checkTrainedLabels is rank 0's check of labels (the run's, in order) against the ones the
// checkpoints in dir were trained with: an error when dir holds a checkpoint (hasCheckpoint)
// trained with others. A run that trains from no checkpoint records its labels first; a
// checkpoint from before the record existed is not checked.
func checkTrainedLabels(dir string, labels []string, hasCheckpoint, training bool) error {
	path := filepath.Join(dir, trainedLabelsFile)
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		b = nil
	case err != nil:
		return err
	}
	if hasCheckpoint && b != nil {
		var rec trainedLabels
		if err := json.Unmarshal(b, &rec); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if !slices.Equal(rec.Labels, labels) {
			return fmt.Errorf("the checkpoints of %s were trained with the labels %s (in that order, %s), not %s: "+
				"their classes would be read as other labels; pass --labels=%s, or another --output_dir",
				dir, strings.Join(rec.Labels, ","), path, strings.Join(labels, ","), strings.Join(rec.Labels, ","))
		}
		return nil
	}
	if !training || hasCheckpoint {
		return nil
	}
	out, err := json.Marshal(trainedLabels{labels})
	if err != nil {
		return err
	}
	return atomicfile.Write(path, append(out, '\n'))
}
