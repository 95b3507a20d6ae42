// Package features turns text files into the int32 batches a BERT classifier consumes, as BERT's
// run_classifier.py does, and shards them by Horovod rank.
//
// The path of one example:
//
//	Reader (seed `label<TAB>text` or GLUE TSV; line i kept by rank i % size; bad lines error or skip)
//	  -> InputExample{GUID, TextA, TextB, Label}
//	  -> Converter ([CLS] a [SEP] (b [SEP]), longest-first truncation (a single text: its head, or
//	     head+tail with WithTailTokens), mask, segment ids, zero padding, label map)
//	  -> Batch (flattened [batch*seq] int32 slices; the last eval/predict batch holds the examples
//	     left, so no example is dropped and none is counted twice)
//
// Stream converts on every core while reading ahead a bounded number of batches, so a file far
// larger than memory converts in constant space and in file order.
//
// Typical use by a training binary:
//
//	tok, _ := tokenizer.Load(vocab, true)
//	labels, _ := features.LabelsFromFile(trainPath, features.ReadOptions{})
//	conv, _ := features.NewConverter(tok, 128, labels)
//	r, _ := features.Open(trainPath, features.ReadOptions{Rank: rank, Size: size})
//	s := conv.Stream(r, features.StreamOptions{BatchSize: 32, DropRemainder: true})
//	defer s.Close()
//	for {
//		b, err := s.Next() // io.EOF at the end
//		...
//	}
//	fmt.Println(r.Counts().Read) // examples this rank read
package features
