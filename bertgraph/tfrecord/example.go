package tfrecord

import (
	"fmt"
	"maps"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
)

// Field numbers of tensorflow/core/example/{example,feature}.proto.
const (
	exampleFeatures  = 1 // Example.features
	featuresFeature  = 1 // Features.feature (map<string, Feature>)
	mapKey, mapValue = 1, 2
	featureBytes     = 1 // Feature.bytes_list
	featureFloat     = 2 // Feature.float_list
	featureInt64     = 3 // Feature.int64_list
	int64ListValue   = 1 // Int64List.value (packed)
)

// EncodeExample returns a serialized tf.train.Example whose features are int64 lists, with the
// keys in sorted order so equal inputs give equal bytes.
func EncodeExample(features map[string][]int64) []byte {
	var feats []byte
	for _, k := range slices.Sorted(maps.Keys(features)) {
		var packed []byte
		for _, v := range features[k] {
			packed = protowire.AppendVarint(packed, uint64(v))
		}
		var list []byte
		list = protowire.AppendTag(list, int64ListValue, protowire.BytesType)
		list = protowire.AppendBytes(list, packed)
		var feature []byte
		feature = protowire.AppendTag(feature, featureInt64, protowire.BytesType)
		feature = protowire.AppendBytes(feature, list)
		var entry []byte
		entry = protowire.AppendTag(entry, mapKey, protowire.BytesType)
		entry = protowire.AppendString(entry, k)
		entry = protowire.AppendTag(entry, mapValue, protowire.BytesType)
		entry = protowire.AppendBytes(entry, feature)
		feats = protowire.AppendTag(feats, featuresFeature, protowire.BytesType)
		feats = protowire.AppendBytes(feats, entry)
	}
	var ex []byte
	ex = protowire.AppendTag(ex, exampleFeatures, protowire.BytesType)
	return protowire.AppendBytes(ex, feats)
}

// DecodeExample parses a serialized tf.train.Example of int64 features. A feature of another
// kind (bytes_list, float_list) is an error naming it; unknown fields are skipped, as protobuf
// parsers do.
func DecodeExample(b []byte) (map[string][]int64, error) {
	out := map[string][]int64{}
	err := eachFeature(b, func(key, list []byte) error {
		values := []int64{}
		if err := eachInt64(list, func(x int64) { values = append(values, x) }); err != nil {
			return err
		}
		out[string(key)] = values
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// eachFeature calls f with the key and the Int64List of each feature of a serialized
// tf.train.Example, in record order (a later entry with the same key replaces an earlier one, as
// for any protobuf map, when f stores by key); list is nil for a feature of no kind. A feature of
// another kind is an error naming it. Neither key nor list is copied.
func eachFeature(b []byte, f func(key, list []byte) error) error {
	err := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		if num != exampleFeatures || typ != protowire.BytesType {
			return nil
		}
		return eachField(v, func(num protowire.Number, typ protowire.Type, entry []byte) error {
			if num != featuresFeature || typ != protowire.BytesType {
				return nil
			}
			key, list, err := decodeEntry(entry)
			if err != nil {
				return err
			}
			return f(key, list)
		})
	})
	if err != nil {
		return fmt.Errorf("tfrecord: bad tf.train.Example: %w", err)
	}
	return nil
}

// decodeEntry splits a Features.feature map entry into its key and its Int64List.
func decodeEntry(entry []byte) (key, list []byte, err error) {
	var feature []byte
	err = eachField(entry, func(num protowire.Number, typ protowire.Type, v []byte) error {
		if typ != protowire.BytesType {
			return nil
		}
		switch num {
		case mapKey:
			key = v
		case mapValue:
			feature = v
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	err = eachField(feature, func(num protowire.Number, typ protowire.Type, v []byte) error {
		switch num {
		case featureBytes, featureFloat:
			return fmt.Errorf("feature %q is a %s, only int64_list is supported", key, map[protowire.Number]string{featureBytes: "bytes_list", featureFloat: "float_list"}[num])
		case featureInt64:
			list = v
		}
		return nil
	})
	return key, list, err
}

// eachInt64 walks Int64List.value, packed or not (parsers must accept both).
func eachInt64(list []byte, f func(int64)) error {
	return eachField(list, func(num protowire.Number, typ protowire.Type, v []byte) error {
		if num != int64ListValue {
			return nil
		}
		switch typ {
		case protowire.BytesType:
			for len(v) > 0 {
				x, n := protowire.ConsumeVarint(v)
				if n < 0 {
					return protowire.ParseError(n)
				}
				f(int64(x))
				v = v[n:]
			}
		case protowire.VarintType:
			x, _ := protowire.ConsumeVarint(v)
			f(int64(x))
		}
		return nil
	})
}

// eachField calls f for each field of a message; v is the payload of a length-delimited field
// or the encoded varint of a varint field.
func eachField(b []byte, f func(protowire.Number, protowire.Type, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v []byte
		switch typ {
		case protowire.BytesType:
			payload, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return protowire.ParseError(m)
			}
			v, n = payload, m
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			v = b[:n]
		}
		if err := f(num, typ, v); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}
