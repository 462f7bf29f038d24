package brokerprom_test

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/brokerprom"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// codedError is a handler error with its own code.
type codedError string

func (e codedError) Error() string     { return "failed: " + string(e) }
func (e codedError) ErrorCode() string { return string(e) }

// TestDeadLettersByReason: a subscriber that sheds (overflow), one that
// fails permanently and one that exhausts its retries are told apart by
// reason and error code, and each breakdown sums to its Stats counter.
func TestDeadLettersByReason(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, b := newWatched(t, nil, broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: 2, Backoff: broker.ConstantBackoff(time.Millisecond)}))
		release := make(chan struct{})
		_, err := b.Subscribe("pay", "card", func(ctx context.Context, _ broker.Message) error {
			<-release
			return nil
		}, broker.LaneSize(1), broker.WhenLaneFull(broker.DeadLetterNewest))
		require.NoError(t, err)
		_, err = b.Subscribe("orders", "email", func(context.Context, broker.Message) error {
			return broker.Permanent(codedError("bad_address"))
		})
		require.NoError(t, err)
		_, err = b.Subscribe("orders", "stock", func(context.Context, broker.Message) error {
			return codedError("lock_timeout")
		})
		require.NoError(t, err)

		for i := range 6 {
			publish(t, b, "pay", fmt.Sprint("p", i))
			synctest.Wait()
		}
		publish(t, b, "orders", "o1", "o2", "o3")
		time.Sleep(time.Second)
		synctest.Wait()
		close(release)
		synctest.Wait()

		mfs := gather(t, c)
		const byReason = "broker_dead_lettered_by_reason_total"
		lbl := func(topic, sub, reason, code string) map[string]string {
			return map[string]string{"topic": topic, "subscriber": sub, "reason": reason, "error_code": code}
		}
		st := b.Stats()
		card := st.Topics["pay"].Subscribers["card"]
		require.NotZero(t, card.DeadLettered, "card shed nothing")
		for _, tc := range []struct {
			labels map[string]string
			want   float64
		}{
			{lbl("pay", "card", broker.ReasonOverflow, broker.CodeOverflow), float64(card.DeadLettered)},
			{lbl("orders", "email", broker.ReasonPermanent, "bad_address"), 3},
			{lbl("orders", "stock", broker.ReasonExhausted, "lock_timeout"), 3},
		} {
			v, ok := value(mfs, byReason, tc.labels)
			assert.True(t, ok, "no series %v", tc.labels)
			assert.Equal(t, tc.want, v, "%v", tc.labels)
		}
		v, _ := value(mfs, "broker_delivery_retries_by_code_total", map[string]string{"topic": "orders", "subscriber": "stock", "error_code": "lock_timeout"})
		assert.Equal(t, 6.0, v, "3 messages, 2 retries each")
		// Each breakdown sums to its Stats counter.
		for topic, ts := range st.Topics {
			for sub, ss := range ts.Subscribers {
				l := map[string]string{"topic": topic, "subscriber": sub}
				assert.Equal(t, float64(ss.DeadLettered), sum(mfs, byReason, l), "%s/%s dead letters", topic, sub)
				assert.Equal(t, float64(ss.Retries), sum(mfs, "broker_delivery_retries_by_code_total", l), "%s/%s retries", topic, sub)
			}
		}
	})
}

// TestErrorCodesBounded: past MaxCustomErrorCodes distinct codes of the
// application's, the rest are reported as _OTHER; the broker's own codes
// always are themselves.
func TestErrorCodesBounded(t *testing.T) {
	c, err := brokerprom.New()
	require.NoError(t, err)
	extra := 10
	for i := range brokerprom.MaxCustomErrorCodes + extra {
		c.DeadLettered(broker.DeadLetterEvent{DeadLetter: broker.DeadLetter{
			Subscriber: "s", Message: broker.Message{Topic: "t"}, Reason: broker.ReasonPermanent, ErrorCode: fmt.Sprint("code-", i),
		}})
	}
	c.DeadLettered(broker.DeadLetterEvent{DeadLetter: broker.DeadLetter{
		Subscriber: "s", Message: broker.Message{Topic: "t"}, Reason: broker.ReasonOverflow, ErrorCode: broker.CodeOverflow,
	}})
	mfs := gather(t, c)
	assert.Equal(t, brokerprom.MaxCustomErrorCodes+2, series(mfs, "broker_dead_lettered_by_reason_total", "t"))
	v, _ := value(mfs, "broker_dead_lettered_by_reason_total", map[string]string{"error_code": "_OTHER"})
	assert.Equal(t, float64(extra), v)
	v, _ = value(mfs, "broker_dead_lettered_by_reason_total", map[string]string{"error_code": broker.CodeOverflow})
	assert.Equal(t, 1.0, v)
}

// TestRejectionsAndPublishDuration: a publish refused after the publish
// timeout counts as queue_full and observes the timeout it waited; one
// whose context ended while waiting counts as canceled; accepted ones are
// observed under outcome published.
func TestRejectionsAndPublishDuration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, b := newWatched(t, []brokerprom.Option{brokerprom.WithPublishDuration()}, broker.WithQueueSize(1), broker.WithPublishTimeout(50*time.Millisecond))
		release := make(chan struct{})
		_, err := b.Subscribe("t", "stuck", func(context.Context, broker.Message) error {
			<-release
			return nil
		})
		require.NoError(t, err)
		accepted := 0
		var refused error
		for i := 0; refused == nil && i < 10; i++ {
			if refused = b.Publish(context.Background(), broker.Message{ID: fmt.Sprint(i), Topic: "t"}); refused == nil {
				accepted++
			}
			synctest.Wait()
		}
		require.ErrorIs(t, refused, broker.ErrQueueFull)
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			time.Sleep(10 * time.Millisecond)
			cancel()
		}()
		require.ErrorIs(t, b.Publish(ctx, broker.Message{ID: "late", Topic: "t"}), context.Canceled)
		close(release)
		synctest.Wait()

		mfs := gather(t, c)
		for reason, want := range map[string]float64{"queue_full": 1, "canceled": 1} {
			v, _ := value(mfs, "broker_rejected_by_reason_total", map[string]string{"topic": "t", "reason": reason})
			assert.Equal(t, want, v, reason)
		}
		assert.Equal(t, float64(b.Stats().Topics["t"].Rejected), sum(mfs, "broker_rejected_by_reason_total", map[string]string{"topic": "t"}))
		h := histogramOf(mfs, "broker_publish_duration_seconds", map[string]string{"topic": "t", "outcome": "rejected"})
		require.NotNil(t, h)
		assert.Equal(t, uint64(2), h.GetSampleCount())
		assert.InDelta(t, 0.06, h.GetSampleSum(), 1e-9, "50 ms waited out, 10 ms until the cancel")
		h = histogramOf(mfs, "broker_publish_duration_seconds", map[string]string{"topic": "t", "outcome": "published"})
		require.NotNil(t, h)
		assert.Equal(t, uint64(accepted), h.GetSampleCount())
	})
}

// TestDeadLetterStoreCapacity: the default store reports its capacity; a
// store without a Capacity method leaves the gauge out.
func TestDeadLetterStoreCapacity(t *testing.T) {
	c, _ := newWatched(t, nil, broker.WithDeadLetterStore(broker.NewMemoryDeadLetterStore(250, nil)))
	v, ok := value(gather(t, c), "broker_dead_letter_store_capacity", nil)
	assert.True(t, ok)
	assert.Equal(t, 250.0, v)

	c, _ = newWatched(t, nil, broker.WithDeadLetterStore(bareStore{broker.NewMemoryDeadLetterStore(0, nil)}))
	_, ok = value(gather(t, c), "broker_dead_letter_store_capacity", nil)
	assert.False(t, ok)
}

// bareStore hides the in-memory store's Capacity method.
type bareStore struct{ s *broker.MemoryDeadLetterStore }

func (b bareStore) Put(ctx context.Context, dl broker.DeadLetter) error { return b.s.Put(ctx, dl) }
func (b bareStore) List(ctx context.Context, f broker.DeadLetterFilter) ([]broker.DeadLetter, error) {
	return b.s.List(ctx, f)
}
func (b bareStore) Get(ctx context.Context, id string) (broker.DeadLetter, bool, error) {
	return b.s.Get(ctx, id)
}
func (b bareStore) Delete(ctx context.Context, ids ...string) error { return b.s.Delete(ctx, ids...) }
func (b bareStore) Len(ctx context.Context) (int, error)            { return b.s.Len(ctx) }

// histogramOf returns the histogram of family name whose labels include
// want, nil if none.
func histogramOf(mfs []*dto.MetricFamily, name string, want map[string]string) *dto.Histogram {
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hasLabels(m, want) {
				return m.GetHistogram()
			}
		}
	}
	return nil
}

// TestPublishDurationOptIn: without WithPublishDuration the Collector asks
// the broker for no publish timing, and publish_duration_seconds stays
// empty; refusals are counted by reason either way.
func TestPublishDurationOptIn(t *testing.T) {
	for _, tc := range []struct {
		opts []brokerprom.Option
		want bool
	}{{nil, false}, {[]brokerprom.Option{brokerprom.WithPublishDuration()}, true}} {
		c, err := brokerprom.New(tc.opts...)
		require.NoError(t, err)
		assert.Equal(t, tc.want, c.TimesPublish())
		c.Published(broker.PublishEvent{Topic: "t", Duration: time.Millisecond})
		c.Rejected(broker.RejectEvent{Topic: "t", Err: broker.ErrQueueFull})
		mfs := gather(t, c)
		assert.Equal(t, tc.want, histogramOf(mfs, "broker_publish_duration_seconds", map[string]string{"outcome": "published"}).GetSampleCount() == 1)
		v, _ := value(mfs, "broker_rejected_by_reason_total", map[string]string{"reason": "queue_full"})
		assert.Equal(t, 1.0, v)
	}
}
