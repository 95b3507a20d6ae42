package peerprobe

import (
	"encoding/json"
	"slices"
	"testing"
	"time"
)

// FuzzParse: any record from a peer parses or fails, never panics; a peer that parses is
// recorded again and parses back the same (where its JSON, escaped anew, still fits a record),
// and probing it is described.
func FuzzParse(f *testing.F) {
	f.Add(Record(Peer{Host: "nodea", Addrs: []string{"10.0.0.1:4000", "[fd00::1]:4000"}}))
	f.Add(Record(Peer{Host: "nodeb"}))
	f.Add(make([]byte, RecordSize))
	f.Add([]byte(`{"host":"x","addrs":["a"]}`))
	f.Add([]byte(`{"host":5}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		rec := make([]byte, RecordSize)
		copy(rec, b)
		peers, err := Parse(rec)
		if err != nil {
			return
		}
		p := peers[0]
		back, err := Parse(Record(p))
		if err != nil {
			t.Fatalf("%+v recorded does not parse: %v", p, err)
		}
		if j, _ := json.Marshal(p); len(j) <= RecordSize && (back[0].Host != p.Host || !slices.Equal(back[0].Addrs, p.Addrs)) {
			t.Fatalf("%+v recorded and parsed back as %+v", p, back[0])
		}
		Describe(p, Probe(peers, 0, 0, func(string, time.Duration) error { return nil }))
	})
}
