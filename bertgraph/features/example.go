package features

// InputExample is one example before tokenization (run_classifier.py's InputExample).
type InputExample struct {
	// GUID names the example in errors and predictions: "path:line".
	GUID string
	// TextA is the first sequence; TextB the optional second one of a pair task.
	TextA, TextB string
	// Label is the label's text; "" for unlabelled (predict) examples, whose label id is 0.
	Label string
}

// InputFeatures is one converted example (run_classifier.py's InputFeatures); the slices have
// the converter's MaxSeqLength entries.
type InputFeatures struct {
	InputIDs, InputMask, SegmentIDs []int32
	LabelID                         int32
	// IsRealExample is false for the padding examples that fill the last eval/predict batch.
	IsRealExample bool
}
