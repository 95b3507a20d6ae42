package bertgraph

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/gorovod/gorovod/bertgraph/features"
	"github.com/gorovod/gorovod/bertgraph/tokenizer"
	"github.com/gorovod/gorovod/tf"
)

// ClassifierOptions configure LoadClassifier.
type ClassifierOptions struct {
	// Session configures TensorFlow; nil leaves its defaults.
	Session *tf.SessionOptions
	// VocabPath overrides the vocabulary packaged with the model.
	VocabPath string
	// MaxBatchSize caps the examples of one session run; longer inputs run in several.
	// 0 means DefaultClassifierBatchSize.
	MaxBatchSize int
}

// DefaultClassifierBatchSize is a Classifier's session batch when ClassifierOptions leave it 0.
const DefaultClassifierBatchSize = 32

// Classifier serves a model exported by ExportServing: text in, label and probabilities out.
// It is safe for concurrent use: every call tokenizes into its own tensors and TensorFlow
// sessions run concurrently.
type Classifier struct {
	dir       string
	contract  *Contract
	sm        *tf.SavedModel
	sig       *signature
	converter *features.Converter
	maxBatch  int
}

// Prediction is one text's result.
type Prediction struct {
	LabelID       int
	Label         string    // the contract's label name for LabelID
	Probabilities []float32 // one per label, in label-id order
}

// LoadClassifier loads the serving SavedModel in dir (written by ExportServing, or the serving
// model the exporter packages under assets.extra/serving) and its vocabulary.
func LoadClassifier(dir string, opts ClassifierOptions) (*Classifier, error) {
	c, err := ReadContract(dir)
	if err != nil {
		return nil, err
	}
	if c.Kind != "serving" {
		return nil, fmt.Errorf("bertgraph: %s is a %q SavedModel; a Classifier serves a serving one (Model.ExportServing writes it)", dir, c.Kind)
	}
	vocab := opts.VocabPath
	if vocab == "" {
		vocab = filepath.Join(dir, c.VocabFile)
	}
	tok, err := tokenizer.Load(vocab, c.DoLowerCase)
	if err != nil {
		return nil, fmt.Errorf("bertgraph: classifier %s: %w", dir, err)
	}
	conv, err := features.NewConverter(tok, c.MaxSeqLength, nil)
	if err == nil {
		conv, err = conv.WithTailTokens(c.KeepTailTokens) // as training truncated
	}
	if err != nil {
		return nil, fmt.Errorf("bertgraph: classifier %s: %w", dir, err)
	}
	sm, err := tf.LoadSavedModel(dir, []string{"serve"}, opts.Session)
	if err != nil {
		return nil, fmt.Errorf("bertgraph: %w", err)
	}
	cl := &Classifier{dir: dir, contract: c, sm: sm, converter: conv, maxBatch: opts.MaxBatchSize}
	if cl.maxBatch <= 0 {
		cl.maxBatch = DefaultClassifierBatchSize
	}
	err = c.validate(sm)
	if err == nil {
		var sigs map[string]*signature
		sigs, err = resolveSignatures(sm, c.expectedSignatures())
		cl.sig = sigs[SigServingDefault]
	}
	if err != nil {
		return nil, errors.Join(err, sm.Close())
	}
	return cl, nil
}

// Close releases the session; calls in flight finish first.
func (c *Classifier) Close() error { return c.sm.Close() }

// Labels are the label names, by label id.
func (c *Classifier) Labels() []string { return append([]string(nil), c.contract.LabelNames...) }

// Predict classifies each text (run_classifier's single-sequence features: [CLS] text [SEP],
// truncated to the model's max_seq_length as training did: the head alone, or head+tail when
// the export records keep_tail_tokens).
func (c *Classifier) Predict(texts []string) ([]Prediction, error) {
	out := make([]Prediction, 0, len(texts))
	for start := 0; start < len(texts); start += c.maxBatch {
		chunk := texts[start:min(start+c.maxBatch, len(texts))]
		examples := make([]features.InputExample, len(chunk))
		for i, t := range chunk {
			examples[i] = features.InputExample{GUID: fmt.Sprintf("text %d", start+i), TextA: t}
		}
		batch, err := c.converter.ConvertBatch(examples, len(chunk))
		if err != nil {
			return nil, fmt.Errorf("bertgraph: classifier: %w", err)
		}
		p, err := c.predict(batch)
		if err != nil {
			return nil, err
		}
		for i := range chunk {
			probs := p.Row(i)
			best := 0
			for j, v := range probs {
				if v > probs[best] {
					best = j
				}
			}
			out = append(out, Prediction{LabelID: best, Label: c.contract.LabelNames[best], Probabilities: probs})
		}
	}
	return out, nil
}

// predict runs serving_default on batch with tensors of its own (concurrency-safe).
func (c *Classifier) predict(batch *features.Batch) (*Predictions, error) {
	feeds, in, err := newFeeds(batch, c.contract, c.sig, false)
	if err != nil {
		return nil, err
	}
	defer in.close()
	return runPredict(c.sm.Session, c.sig, feeds, c.contract.NumLabels, batch.BatchSize)
}
