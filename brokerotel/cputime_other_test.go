//go:build !unix

package brokerotel_test

import "time"

// cpuTime is not measured here: the benchmark reports cpu-ns/msg as 0.
func cpuTime() time.Duration { return 0 }
