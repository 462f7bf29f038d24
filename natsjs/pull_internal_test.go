package natsjs

import "testing"

// TestPullSize: a partition's loop pulls one message at a time; the
// keyless loop tops its queue up to its batch once the queue is down to
// half, and does not pull before.
func TestPullSize(t *testing.T) {
	tests := []struct {
		name          string
		batch, queued int
		want          int
	}{
		{"a partition", 1, 0, 1},
		{"keyless, empty queue", keylessBatch, 0, keylessBatch},
		{"keyless, down to half", keylessBatch, keylessBatch / 2, keylessBatch / 2},
		{"keyless, more than half queued", keylessBatch, keylessBatch/2 + 1, 0},
		{"keyless, full", keylessBatch, keylessBatch, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := &partitionLoop{batch: tc.batch, queue: make([]*delivery, tc.queued)}
			if got := l.pullSize(); got != tc.want {
				t.Errorf("pullSize = %d; want %d", got, tc.want)
			}
		})
	}
}
