package natsjs

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestPullSize: a partition's loop pulls one message at a time; the
// keyless loop tops its queue up to its limit once the queue is down to
// half, and does not pull before; the limit is what its handlers start
// within keylessQueueFor at their average time (keylessAhead per handler
// before one is known), between 1 and keylessBatch.
func TestPullSize(t *testing.T) {
	tests := []struct {
		name            string
		batch, handlers int
		avg             time.Duration
		queued, want    int
	}{
		{"a partition", 1, 4, time.Millisecond, 0, 1},
		{"no average yet, empty", keylessBatch, 1, 0, 0, keylessAhead},
		{"no average yet, down to half", keylessBatch, 1, 0, keylessAhead / 2, keylessAhead / 2},
		{"no average yet, more than half", keylessBatch, 1, 0, keylessAhead/2 + 1, 0},
		{"no average yet, two handlers", keylessBatch, 2, 0, 0, 2 * keylessAhead},
		{"fast handlers", keylessBatch, 1, time.Millisecond, 0, keylessBatch},
		{"fast handlers, more than half", keylessBatch, 1, time.Millisecond, keylessBatch/2 + 1, 0},
		{"500 ms handlers, two of them", keylessBatch, 2, 500 * time.Millisecond, 0, 4},
		{"500 ms handlers, two, down to half", keylessBatch, 2, 500 * time.Millisecond, 2, 2},
		{"600 ms handlers, eight of them", keylessBatch, 8, 600 * time.Millisecond, 0, 13}, // 8 × 1 s / 600 ms, not 8 × (1 s / 600 ms)
		{"slower than the queue's second", keylessBatch, 1, 5 * time.Second, 0, 1},
		{"slower than the queue's second, one queued", keylessBatch, 1, 5 * time.Second, 1, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := &partitionLoop{
				s:     &subscription{slots: make(chan struct{}, tc.handlers)},
				batch: tc.batch, queue: make([]*delivery, tc.queued),
			}
			l.took.Store(int64(tc.avg))
			if got := l.pullSize(); got != tc.want {
				t.Errorf("pullSize = %d; want %d", got, tc.want)
			}
		})
	}
}

// TestPullRequest: the pull request is the JSON the server reads, as fmt
// would write it.
func TestPullRequest(t *testing.T) {
	for _, tc := range []struct {
		n   int
		exp time.Duration
	}{{1, 5 * time.Second}, {64, 30 * time.Second}, {7, time.Millisecond}} {
		want := fmt.Sprintf(`{"batch":%d,"expires":%d,"idle_heartbeat":%d}`, tc.n, tc.exp, tc.exp/2)
		assert.Equal(t, want, string(pullRequest([]byte("stale"), tc.n, tc.exp)[len("stale"):]))
	}
}
