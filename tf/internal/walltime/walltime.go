// Package walltime converts times to the float seconds since the Unix epoch that TensorFlow
// writes (Python's time.time()): the wall_time of an event, the timestamps of the checkpoint
// state file.
package walltime

import "time"

// Seconds returns t as seconds since the Unix epoch. The whole seconds convert exactly and the
// fraction is added to them, so the result is within an ulp of the exact value for every time
// (t.UnixNano, by contrast, overflows past the year 2262 and rounds before it divides).
func Seconds(t time.Time) float64 {
	return float64(t.Unix()) + float64(t.Nanosecond())/1e9
}
