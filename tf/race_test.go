//go:build race

package tf

const raceEnabled = true
