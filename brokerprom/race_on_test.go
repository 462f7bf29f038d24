//go:build race

package brokerprom_test

// raceEnabled reports that the race detector is on: it allocates, so
// allocation counts are only checked without it.
const raceEnabled = true
