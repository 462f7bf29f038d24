//go:build !race

package brokerprom_test

const raceEnabled = false
