// Package tfrecord frames records as TensorFlow's TFRecord files do (tf.io.TFRecordWriter,
// tf.data.TFRecordDataset): a file is a sequence of records, each
//
//	uint64 length (little-endian) | uint32 masked CRC32C of the length | data | uint32 masked CRC32C of data
//
// with mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8. Writer and Reader do the framing alone,
// so any payload can use them: tf.train.Example records (bertgraph/tfrecord), Event protos
// (tf/summary). Corrupt input (a bad checksum, a truncated record) is an error naming the file
// and the byte offset of the record.
package tfrecord
