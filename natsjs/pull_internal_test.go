package natsjs

import (
	"testing"
	"time"
)

// TestPullSize: the keyless loop asks for as many messages as its handlers
// start within half the AckWait at their average time, between 1 and its
// batch; a partition's loop always for one.
func TestPullSize(t *testing.T) {
	tests := []struct {
		name        string
		batch, conc int
		avg         time.Duration
		want        int
	}{
		{"no average yet", keylessBatch, 1, 0, keylessBatch},
		{"fast handlers", keylessBatch, 1, time.Millisecond, keylessBatch},
		{"1 s handlers, one at a time", keylessBatch, 1, time.Second, 15},
		{"1 s handlers, two at a time", keylessBatch, 2, time.Second, 30},
		{"slower than half the AckWait", keylessBatch, 1, time.Minute, 1},
		{"a partition", 1, 4, time.Millisecond, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := &partitionLoop{
				s:     &subscription{t: &Transport{cfg: transportConfig{ackWait: 30 * time.Second}}, slots: make(chan struct{}, tc.conc)},
				batch: tc.batch,
			}
			l.took.Store(int64(tc.avg))
			if got := l.pullSize(); got != tc.want {
				t.Errorf("pullSize = %d; want %d", got, tc.want)
			}
		})
	}
}
