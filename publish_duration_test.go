package broker

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// publishTimer records the Duration of Published and Rejected events.
type publishTimer struct {
	NopObserver
	mu                  sync.Mutex
	published, rejected []time.Duration
}

func (o *publishTimer) TimesPublish() bool { return true }

func (o *publishTimer) Published(e PublishEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.published = append(o.published, e.Duration)
}

func (o *publishTimer) Rejected(e RejectEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.rejected = append(o.rejected, e.Duration)
}

// PublishEvent.Duration and RejectEvent.Duration are the time Publish
// spent, the wait for room included: a refused publish waited out the
// publish timeout; an accepted one into a queue with room took none. They
// are measured only for a PublishTimer.
func TestPublishEventDuration(t *testing.T) {
	t.Run("PublishTimer", func(t *testing.T) { testPublishDuration(t, &publishTimer{}, 50*time.Millisecond) })
	t.Run("other Observer", func(t *testing.T) {
		testPublishDuration(t, &untimed{pt: &publishTimer{}}, 0)
	})
}

// untimed is a publishTimer hidden behind an Observer that is not one.
type untimed struct {
	NopObserver
	pt *publishTimer
}

func (u *untimed) Published(e PublishEvent)  { u.pt.Published(e) }
func (u *untimed) Rejected(e RejectEvent)    { u.pt.Rejected(e) }
func (u *untimed) timer() *publishTimer      { return u.pt }
func (o *publishTimer) timer() *publishTimer { return o }

func testPublishDuration(t *testing.T, o interface {
	Observer
	timer() *publishTimer
}, wantRejected time.Duration) {
	synctest.Test(t, func(t *testing.T) {
		obs := o.timer()
		b := newTestBroker(t, WithObserver(o), WithQueueSize(1), WithPublishTimeout(50*time.Millisecond))
		release := make(chan struct{})
		_, err := b.Subscribe("t", "stuck", func(ctx context.Context, _ Message) error {
			<-release
			return nil
		})
		require.NoError(t, err)
		var refused error
		for i := 0; refused == nil && i < 10; i++ {
			refused = b.Publish(context.Background(), Message{ID: string(rune('a' + i)), Topic: "t"})
			synctest.Wait()
		}
		require.ErrorIs(t, refused, ErrQueueFull)
		close(release)

		obs.mu.Lock()
		defer obs.mu.Unlock()
		require.NotEmpty(t, obs.published)
		assert.Equal(t, time.Duration(0), obs.published[0], "the first publish found room at once")
		require.Len(t, obs.rejected, 1)
		assert.Equal(t, wantRejected, obs.rejected[0], "the refused publish waited out the timeout")
		assert.False(t, errors.Is(refused, context.DeadlineExceeded))
	})
}

// panickyTimer's TimesPublish panics: New goes on, without durations, and
// counts the panic.
type panickyTimer struct{ publishTimer }

func (*panickyTimer) TimesPublish() bool { panic("no") }

func TestPublishTimerPanics(t *testing.T) {
	o := &panickyTimer{}
	b := newTestBroker(t, WithObserver(o))
	require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
	assert.Equal(t, uint64(1), b.Stats().PluginPanics)
	o.mu.Lock()
	defer o.mu.Unlock()
	assert.Equal(t, []time.Duration{0}, o.published)
}
