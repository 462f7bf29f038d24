package brokerprom_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/brokerprom"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRetiredTopicSeriesDisappear: a topic's series stay while the
// broker's Stats keep it (after its subscriber left too), and are gone at
// the first scrape after Stats forgot it; with topics derived from data,
// the histogram series stay bounded.
func TestRetiredTopicSeriesDisappear(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, b := newWatched(t, nil)
		reg := prometheus.NewPedanticRegistry()
		require.NoError(t, reg.Register(c))
		scrape := func() []*dto.MetricFamily {
			mfs, err := reg.Gather()
			require.NoError(t, err)
			return mfs
		}
		// Each topic "dyn-i" gets a subscriber, a delivered message, and
		// loses its subscriber: it retires, its counters kept.
		cycle := func(i int) {
			topic := fmt.Sprintf("dyn-%d", i)
			sub, err := b.Subscribe(topic, "s", func(context.Context, broker.Message) error { return nil })
			require.NoError(t, err)
			publish(t, b, topic, "m")
			synctest.Wait()
			require.NoError(t, sub.Unsubscribe(context.Background()))
			synctest.Wait()
		}
		cycle(0)
		mfs := scrape()
		assert.Equal(t, 5, series(mfs, "broker_handler_duration_seconds", "dyn-0")+series(mfs, "broker_end_to_end_duration_seconds", "dyn-0"),
			"dyn-0's histogram series (3 outcomes, 2 states) while Stats keep it")
		active, _ := value(mfs, "broker_subscriber_active", map[string]string{"topic": "dyn-0"})
		assert.Zero(t, active)

		n := broker.MaxGoneTopics + 100
		for i := 1; i <= n; i++ {
			cycle(i)
			if i%256 == 0 {
				scrape()
			}
		}
		st := b.Stats()
		_, kept := st.Topics["dyn-0"]
		require.False(t, kept, "the broker still keeps dyn-0")
		require.NotZero(t, st.ForgottenTopics)

		mfs = scrape()
		assert.Zero(t, series(mfs, "broker_", "dyn-0"), "dyn-0 still has series")
		assert.Equal(t, float64(st.ForgottenTopics), sum(mfs, "broker_forgotten_topics_total", nil))
		// What is left is what Stats keep: at most MaxGoneTopics topics of
		// 5 histogram series each.
		hist := series(mfs, "broker_handler_duration_seconds", "") + series(mfs, "broker_end_to_end_duration_seconds", "")
		assert.Equal(t, 5*len(st.Topics), hist)
		assert.LessOrEqual(t, len(st.Topics), broker.MaxGoneTopics)
		_, kept = value(mfs, "broker_handler_duration_seconds", map[string]string{"topic": fmt.Sprintf("dyn-%d", n)})
		assert.True(t, kept, "the newest topic lost its series")
	})
}

// TestConcurrentScrapesAndTraffic runs publishers, subscriber churn and
// scrapers at once (for the race detector), then checks the broker's
// conservation law and the histogram counts on the exported metrics.
func TestConcurrentScrapesAndTraffic(t *testing.T) {
	c, b := newWatched(t, nil,
		broker.WithQueueSize(64),
		broker.WithPublishTimeout(10*time.Second),
		broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: 1, Backoff: broker.ConstantBackoff(0)}))
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))

	handler := func(_ context.Context, m broker.Message) error {
		var i int
		_, _ = fmt.Sscanf(m.ID[strings.LastIndexByte(m.ID, '-')+1:], "%d", &i)
		switch {
		case i%11 == 0:
			return broker.Permanent(errors.New("bad"))
		case i%7 == 0 && m.Attempt == 1:
			return errors.New("flaky")
		}
		return nil
	}
	const topics, perPublisher = 3, 400
	for i := range topics {
		_, err := b.Subscribe(fmt.Sprintf("c-%d", i), "a", handler, broker.Concurrency(2))
		require.NoError(t, err)
		_, err = b.Subscribe(fmt.Sprintf("c-%d", i), "b", handler, broker.LaneSize(4), broker.WhenLaneFull(broker.DeadLetterNewest))
		require.NoError(t, err)
	}

	var traffic, scrapers sync.WaitGroup
	var done atomic.Bool
	for p := range topics {
		traffic.Go(func() {
			for i := range perPublisher {
				// Message 10k+1 repeats the ID of 10k: a duplicate.
				j := i
				if i%10 == 1 {
					j = i - 1
				}
				id := fmt.Sprintf("p%d-%d", p, j)
				assert.NoError(t, b.Publish(context.Background(), broker.Message{ID: id, Topic: fmt.Sprintf("c-%d", p)}))
			}
		})
	}
	// Churn: subscribers come and go on one topic, more of them than the
	// broker keeps counters for, so scrapes delete series while hooks run.
	const churn = broker.MaxGoneSubscribers + 36
	traffic.Go(func() {
		for i := range churn {
			sub, err := b.Subscribe("churn", fmt.Sprintf("x-%d", i), handler)
			if !assert.NoError(t, err) {
				return
			}
			assert.NoError(t, b.Publish(context.Background(), broker.Message{ID: fmt.Sprintf("x-%d", i), Topic: "churn"}))
			assert.NoError(t, sub.Unsubscribe(context.Background()))
		}
	})
	for range 2 {
		scrapers.Go(func() {
			for !done.Load() {
				_, err := reg.Gather()
				assert.NoError(t, err)
			}
		})
	}
	traffic.Wait()
	done.Store(true)
	scrapers.Wait()

	deadline := time.Now().Add(10 * time.Second)
	for backlog(b) > 0 {
		require.True(t, time.Now().Before(deadline), "backlog of %d after 10 s", backlog(b))
		time.Sleep(time.Millisecond)
	}
	mfs, err := reg.Gather()
	require.NoError(t, err)
	assertConservation(t, mfs)
	assert.NotZero(t, sum(mfs, "broker_delivery_retries_total", nil))
	assert.NotZero(t, sum(mfs, "broker_deduplicated_messages_total", nil))
	assert.NotZero(t, sum(mfs, "broker_dead_lettered_messages_total", nil))

	kept := b.Stats().Topics["churn"]
	assert.NotZero(t, kept.ForgottenSubscribers)
	hist := series(mfs, "broker_handler_duration_seconds", "churn") + series(mfs, "broker_end_to_end_duration_seconds", "churn")
	assert.Equal(t, 5*len(kept.Subscribers), hist, "the histogram series are those of the subscribers Stats keep")
}

func backlog(b *broker.Broker) int {
	n := 0
	for _, ts := range b.Stats().Topics {
		n += ts.Backlog()
	}
	return n
}

// TestHooksDoNotAllocate pins the hooks' steady state: once a subscriber's
// series exist, observing allocates nothing.
func TestHooksDoNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	c, err := brokerprom.New(brokerprom.WithPublishDuration())
	require.NoError(t, err)
	now := time.Now()
	for _, tc := range []struct {
		name string
		hook func()
	}{
		{"Attempted delivered", func() {
			c.Attempted(broker.AttemptEvent{Topic: "t", Subscriber: "s", Attempt: 1, Duration: time.Millisecond, Outcome: broker.OutcomeDelivered, PublishedAt: now})
		}},
		{"Attempted retry", func() {
			c.Attempted(broker.AttemptEvent{Topic: "t", Subscriber: "s", Attempt: 1, Duration: time.Millisecond, ErrorCode: "error", Outcome: broker.OutcomeRetry, PublishedAt: now})
		}},
		{"Published", func() {
			c.Published(broker.PublishEvent{Topic: "t", MessageID: "m", PublishedAt: now, Duration: time.Microsecond})
		}},
		{"DeadLettered", func() {
			c.DeadLettered(broker.DeadLetterEvent{DeadLetter: broker.DeadLetter{Subscriber: "s", Message: broker.Message{Topic: "t", PublishedAt: now}, FailedAt: now.Add(time.Second), Reason: broker.ReasonExhausted, ErrorCode: "error"}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.hook() // creates the series
			assert.Zero(t, testing.AllocsPerRun(1000, tc.hook))
		})
	}
}

// TestInvalidUTF8Names: the broker takes any string as a name, label
// values must be UTF-8; the scrape still succeeds, with U+FFFD for the bad
// bytes.
func TestInvalidUTF8Names(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, b := newWatched(t, nil)
		_, err := b.Subscribe("orders\xff", "bill\xfeing", func(context.Context, broker.Message) error { return nil })
		require.NoError(t, err)
		publish(t, b, "orders\xff", "m-1")
		synctest.Wait()
		mfs := gather(t, c) // fails the test on a gather error
		want := map[string]string{"topic": "orders\uFFFD", "subscriber": "bill\uFFFDing"}
		v, ok := value(mfs, "broker_delivered_messages_total", want)
		assert.True(t, ok)
		assert.Equal(t, 1.0, v)
		want["outcome"] = "delivered"
		v, ok = value(mfs, "broker_handler_duration_seconds", want)
		assert.True(t, ok)
		assert.Equal(t, 1.0, v)
	})
}

// lenStore is a dead-letter store whose Len fails: with an error, a
// panic, runtime.Goexit or a negative count, as fails says.
type lenStore struct {
	*broker.MemoryDeadLetterStore
	fails string
}

func (s lenStore) Len(context.Context) (int, error) {
	switch s.fails {
	case "panic":
		panic("Len bug")
	case "goexit":
		runtime.Goexit()
	case "negative":
		return -3, nil
	}
	return 0, errors.New("store unavailable")
}

// TestStoreLenFailure: a dead-letter store whose Len fails, panics, calls
// runtime.Goexit or answers a negative count leaves dead_letter_store_size
// out of the scrape; the scrape still succeeds (and the next one too), with
// every other metric.
func TestStoreLenFailure(t *testing.T) {
	for _, fails := range []string{"error", "panic", "goexit", "negative"} {
		t.Run(fails, func(t *testing.T) {
			store := lenStore{broker.NewMemoryDeadLetterStore(0, discard), fails}
			c, b := newWatched(t, nil, broker.WithDeadLetterStore(store))
			publish(t, b, "nobody", "m-1")
			mfs := gather(t, c) // fails the test on a gather error
			_, ok := value(mfs, "broker_dead_letter_store_size", nil)
			assert.False(t, ok, "dead_letter_store_size reported though Len failed")
			_, ok = value(mfs, "broker_published_messages_total", map[string]string{"topic": "nobody"})
			assert.True(t, ok, "the other metrics are still reported")
			_, ok = value(gather(t, c), "broker_published_messages_total", map[string]string{"topic": "nobody"})
			assert.True(t, ok, "a second scrape works too")
		})
	}
}
