package broker

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRedrivenContext: a handler (and the middleware around it) can tell a
// redriven dead letter's attempts from a first delivery's by Redriven(ctx).
func TestRedrivenContext(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: NoRetries}))
		var mu sync.Mutex
		var seen []bool
		fail := true
		_, err := b.Subscribe("t", "s", func(ctx context.Context, _ Message) error {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, Redriven(ctx))
			if fail {
				fail = false
				return Permanent(assert.AnError)
			}
			return nil
		})
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
		settle(t, b)
		dls := deadLetters(t, b)
		require.Len(t, dls, 1)
		n, err := b.Redrive(context.Background(), dls[0].ID)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		settle(t, b)
		mu.Lock()
		defer mu.Unlock()
		assert.Equal(t, []bool{false, true}, seen)
		assert.False(t, Redriven(context.Background()))
	})
}

// headerObserver keeps the Headers of every AttemptEvent.
type headerObserver struct {
	NopObserver
	mu  sync.Mutex
	evs []AttemptEvent
}

func (o *headerObserver) Attempted(e AttemptEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.evs = append(o.evs, e)
}

// TestAttemptEventHeaders: every attempt event, a deduplicated message's
// included, carries the message's headers as published, so that a tracer
// can put the event into the message's trace.
func TestAttemptEventHeaders(t *testing.T) {
	bubble(t, func(t *testing.T) {
		obs := &headerObserver{}
		b := newTestBroker(t, WithObserver(obs))
		_, err := b.Subscribe("t", "s", func(_ context.Context, m Message) error {
			m.Headers["written"] = "by the handler" // its own copy
			return nil
		})
		require.NoError(t, err)
		h := map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
		for range 2 {
			require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t", Headers: h}))
			settle(t, b)
		}
		obs.mu.Lock()
		defer obs.mu.Unlock()
		require.Len(t, obs.evs, 2)
		assert.Equal(t, OutcomeDelivered, obs.evs[0].Outcome)
		assert.Equal(t, OutcomeDeduplicated, obs.evs[1].Outcome)
		for _, e := range obs.evs {
			assert.Equal(t, h, e.Headers)
		}
	})
}
