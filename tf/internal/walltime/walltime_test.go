package walltime

import (
	"math"
	"math/big"
	"testing"
	"time"
)

// TestSecondsIsWithinAnUlpOfTheExactValue compares Seconds with the exact rational value
// sec + nsec/1e9, computed with math/big, for times from 1970 to beyond time.UnixNano's range.
func TestSecondsIsWithinAnUlpOfTheExactValue(t *testing.T) {
	times := []time.Time{
		time.Unix(0, 0),
		time.Unix(0, 1),
		time.Unix(1795971186, 374776001),
		time.Unix(1795971186, 999999999),
		time.Date(2026, 11, 29, 16, 51, 42, 123456789, time.UTC),
		time.Date(2300, 1, 1, 0, 0, 0, 500000000, time.UTC), // past UnixNano's int64
		time.Unix(-1, 250000000),
	}
	for _, tm := range times {
		exact := new(big.Rat).Add(big.NewRat(tm.Unix(), 1), big.NewRat(int64(tm.Nanosecond()), 1e9))
		want, _ := exact.Float64()
		got := Seconds(tm)
		if ulp := math.Nextafter(want, math.Inf(1)) - want; math.Abs(got-want) > ulp {
			t.Errorf("Seconds(%v) = %.9f, exact %.9f", tm, got, want)
		}
	}
}
