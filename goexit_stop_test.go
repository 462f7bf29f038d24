package broker

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// blockingDeadLetterEvent is an Observer whose attempt event for a dead
// letter blocks until release is closed.
type blockingDeadLetterEvent struct {
	NopObserver
	release chan struct{}
}

func (o *blockingDeadLetterEvent) Attempted(e AttemptEvent) {
	if e.Outcome == OutcomeDeadLettered {
		<-o.release // outlives the stop's deadline
	}
}

// TestGoexitThenAbandonedHook: a handler that calls runtime.Goexit when a
// stop cancels it has its message dead-lettered by the worker's deferred
// recovery; when the Observer hook of that dead letter outlives the stop's
// deadline, the stop abandons the worker there, and the worker, once the
// hook returns, records nothing more and starts no replacement (before, it
// ended the message a second time and closed the subscription's done
// channel twice: a crash).
func TestGoexitThenAbandonedHook(t *testing.T) {
	bubble(t, func(t *testing.T) {
		o := &blockingDeadLetterEvent{release: make(chan struct{})}
		b := newTestBroker(t, WithObserver(o))
		_, err := b.Subscribe("t", "s", func(ctx context.Context, _ Message) error {
			<-ctx.Done()
			runtime.Goexit()
			return nil
		})
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "a", Topic: "t"}))
		idle()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		var de *DrainError
		require.ErrorAs(t, b.Close(ctx), &de)
		assert.Equal(t, 1, de.Abandoned, "the hook the stop gave up on")
		close(o.release)
		idle()
		time.Sleep(time.Second) // anything the worker still did would show now
		idle()
		st := b.Stats().Topics["t"].Subscribers["s"]
		assert.Equal(t, st.Routed, st.Delivered+st.Deduplicated+st.DeadLettered+uint64(st.Queued+st.InFlight), "conservation: %+v", st)
		assert.Equal(t, uint64(1), st.DeadLettered, "%+v", st)
	})
}
