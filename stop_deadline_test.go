package broker

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// This file tests the stop's one deadline: whatever plugged-in code does,
// Close and Unsubscribe return by their ctx plus ShutdownGrace (most of it
// for the handlers, the rest for the dead letters of what the stop
// abandoned), with what they gave up on counted once in the *DrainError.

// stuckStore is a dead-letter store whose Put never returns until release
// is closed, whatever its ctx says.
type stuckStore struct {
	*MemoryDeadLetterStore
	release <-chan struct{}
}

func (s stuckStore) Put(context.Context, DeadLetter) error {
	<-s.release
	return errBoom
}

// stuckDedup is an idempotency store whose Seen never returns until
// release is closed.
type stuckDedup struct{ release <-chan struct{} }

func (d stuckDedup) Seen(context.Context, DeliveryKey) (bool, error) {
	<-d.release
	return false, nil
}

func (d stuckDedup) Record(context.Context, DeliveryKey) error { return nil }

// stuckObserver's Attempted never returns until release is closed.
type stuckObserver struct {
	NopObserver
	release <-chan struct{}
}

func (o stuckObserver) Attempted(AttemptEvent) { <-o.release }

// Each plugged-in call below never returns (it ignores its ctx) while the
// broker runs: one message is stuck in it, two more wait behind it. The
// stop returns by its deadline, counts the stuck call as abandoned, and
// accounts for all three messages; once the call returns, nothing is
// counted twice.
func TestStopEndsByItsDeadlineWhateverPluginsDo(t *testing.T) {
	plugs := []struct {
		name    string
		opts    func(release chan struct{}) []Option
		sub     func(release chan struct{}) []SubscribeOption
		handler Handler
		// The DrainError's counts: calls given up on (the stuck one at the
		// grace; at the deadline, the stop's two calls to end m-1 and m-2,
		// then m-0, stuck in the same store), dead letters with the stop's
		// reason, and those no store took.
		abandoned, dead, lost int
	}{
		{"dead-letter store Put", func(r chan struct{}) []Option {
			return []Option{WithDeadLetterStore(stuckStore{NewMemoryDeadLetterStore(0, nil), r})}
		}, nil, func(context.Context, Message) error { return Permanent(errBoom) }, 3, 3, 3},
		{"idempotency store Seen", func(r chan struct{}) []Option {
			return []Option{WithIdempotencyStore(stuckDedup{r})}
		}, nil, func(context.Context, Message) error { return nil }, 3, 3, 3},
		// m-0 was delivered: its worker is stuck in the event after.
		{"observer hook", func(r chan struct{}) []Option {
			return []Option{WithObserver(stuckObserver{release: r})}
		}, nil, func(context.Context, Message) error { return nil }, 1, 2, 0},
		{"middleware", nil, func(r chan struct{}) []SubscribeOption {
			return []SubscribeOption{WithSubscriberMiddleware(func(_ SubscriberInfo, next Handler) Handler {
				return func(ctx context.Context, m Message) error {
					<-r
					return next(ctx, m)
				}
			})}
		}, func(context.Context, Message) error { return nil }, 1, 3, 0},
	}
	for _, p := range plugs {
		for _, viaClose := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/close=%v", p.name, viaClose), func(t *testing.T) {
				bubble(t, func(t *testing.T) {
					release := make(chan struct{})
					var opts []Option
					if p.opts != nil {
						opts = p.opts(release)
					}
					var subOpts []SubscribeOption
					if p.sub != nil {
						subOpts = p.sub(release)
					}
					var lines logLines
					b := newTestBroker(t, append(opts, WithLogger(slog.New(&lines)))...)
					sub, err := b.Subscribe("t", "s", p.handler, subOpts...)
					require.NoError(t, err)
					publishN(t, b, "t", "m", 1)
					idle()
					for _, id := range []string{"m-1", "m-2"} { // in the lane, behind m-0
						require.NoError(t, b.Publish(context.Background(), Message{ID: id, Topic: "t"}))
					}
					time.Sleep(time.Hour) // the call is stuck while the broker runs
					idle()

					stop := sub.Unsubscribe
					if viaClose {
						stop = b.Close
					}
					start := time.Now()
					de := stopWithin(t, time.Second, stop)
					assert.LessOrEqual(t, time.Since(start), time.Second+ShutdownGrace, "returned by the stop's deadline")
					assert.Equal(t, p.abandoned, de.Abandoned, "each call given up on, once")
					assert.Equal(t, p.dead, de.DeadLettered, "every message not delivered ended at the stop")
					assert.Equal(t, p.lost, de.Lost)
					assert.Len(t, lines.matching("WARN", "had not returned in the handlers' part of ShutdownGrace", "subscriber=s", "message_id=m-0"), 1, "the grace's abandonment, logged")
					if p.lost > 0 {
						assert.NotEmpty(t, lines.matching("ERROR", "deadline passed", "subscriber=s"), "the deadline's, logged")
					}
					st := subStats(t, b, "t", "s")
					assert.Equal(t, uint64(3), st.Delivered+st.DeadLettered+st.Deduplicated, "each message ended once: %+v", st)

					close(release) // the abandoned call returns: it is ignored
					idle()
					st = subStats(t, b, "t", "s")
					assert.Equal(t, uint64(3), st.Delivered+st.DeadLettered+st.Deduplicated, "nothing counted twice: %+v", st)
					requireConserved(t, b.Stats())
					if !viaClose {
						require.NoError(t, b.Close(context.Background()))
					}
				})
			})
		}
	}
}
