// Package tfrecord reads and writes the tf.train.Example records of BERT's run_classifier.py
// in TFRecord files (train.tf_record, eval.tf_record, predict.tf_record).
//
// The TFRecord framing itself is package tf/tfrecord's; this package reads and writes what the
// records hold.
//
// EncodeExample and DecodeExample handle tf.train.Example records of int64 features;
// EncodeFeatures and DecodeFeatures map run_classifier's five features (input_ids, input_mask,
// segment_ids, label_ids, is_real_example) to and from features.InputFeatures. Dataset reads
// files as run_classifier's file-based input with Horovod: shard (size, rank), shuffle with a
// seeded buffer, repeat for training.
package tfrecord
