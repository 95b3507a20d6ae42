// Package tfrecord reads and writes TensorFlow's TFRecord files and the tf.train.Example records
// of BERT's run_classifier.py (train.tf_record, eval.tf_record, predict.tf_record).
//
// A TFRecord file is a sequence of records, each framed as
//
//	uint64 length (little-endian) | uint32 masked CRC32C of the length | data | uint32 masked CRC32C of data
//
// with mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8. Writer and Reader do the framing alone,
// so any record payload can use them (the TensorBoard event writer writes Event protos with
// Writer). Corrupt input — a bad checksum, a truncated record — is an error naming the file and
// the byte offset of the record.
//
// EncodeExample and DecodeExample handle tf.train.Example records of int64 features;
// EncodeFeatures and DecodeFeatures map run_classifier's five features (input_ids, input_mask,
// segment_ids, label_ids, is_real_example) to and from features.InputFeatures. Dataset reads
// files as run_classifier's file-based input with Horovod: shard (size, rank), shuffle with a
// seeded buffer, repeat for training.
package tfrecord
