package brokerprom_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/brokerprom"
	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkW1 is the bench suite's W1 (1 topic, 1 subscriber, no-op
// handler, 64 B payload): publish b.N messages and wait until all are
// delivered, without and with the collector as the broker's Observer. The
// ratio of their ns/op is the collector's overhead (README.md).
func BenchmarkW1(b *testing.B) {
	for _, observer := range []string{"none", "nop", "collector"} {
		b.Run("observer="+observer, func(b *testing.B) {
			opts := []broker.Option{broker.WithLogger(discard), broker.WithPublishTimeout(time.Minute)}
			switch observer {
			case "nop": // what any observer costs the broker: timing the attempt, building the events
				opts = append(opts, broker.WithObserver(broker.NopObserver{}))
			case "collector":
				c, err := brokerprom.New()
				if err != nil {
					b.Fatal(err)
				}
				opts = append(opts, broker.WithObserver(c))
			}
			br, err := broker.New(opts...)
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = br.Close(context.Background()) }()
			var handled atomic.Int64
			all := make(chan struct{})
			n := int64(b.N)
			if _, err := br.Subscribe("w1", "s", func(context.Context, broker.Message) error {
				if handled.Add(1) == n {
					close(all)
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
			payload := make([]byte, 64)
			ids := make([]string, b.N)
			for i := range ids {
				ids[i] = strconv.Itoa(i)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if err := br.Publish(context.Background(), broker.Message{ID: ids[i], Topic: "w1", Payload: payload}); err != nil {
					b.Fatal(err)
				}
			}
			<-all
		})
	}
}

// BenchmarkObserver is a delivered attempt's hook alone, from parallel
// goroutines on one (topic, subscriber): the Collector's own (a read lock
// and a map lookup per event) and the one ForSubscriber returns.
func BenchmarkObserver(b *testing.B) {
	ev, hooks := hookCases(b)
	for _, h := range hooks {
		b.Run(h.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					h.o.Attempted(ev)
				}
			})
		})
	}
}

// hookCases are a delivered attempt's event and the two hooks that take
// it: the Collector's own and the one ForSubscriber returns.
func hookCases(b *testing.B) (broker.AttemptEvent, []namedHooks) {
	c, err := brokerprom.New()
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	ev := broker.AttemptEvent{Topic: "t", Subscriber: "s", Attempt: 1, Start: now, Duration: time.Millisecond,
		Outcome: broker.OutcomeDelivered, PublishedAt: now.Add(-time.Millisecond)}
	return ev, []namedHooks{{"collector", c}, {"for-subscriber", c.ForSubscriber("t", "s")}}
}

type namedHooks struct {
	name string
	o    broker.Observer
}

// BenchmarkCollect is one scrape of a broker with 100 topics of 2
// subscribers each, all with histogram series.
func BenchmarkCollect(b *testing.B) {
	c, err := brokerprom.New()
	if err != nil {
		b.Fatal(err)
	}
	br, err := broker.New(broker.WithLogger(discard), broker.WithObserver(c))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = br.Close(context.Background()) }()
	if err := c.Watch(br); err != nil {
		b.Fatal(err)
	}
	for i := range 100 {
		topic := fmt.Sprintf("t-%d", i)
		for _, s := range []string{"a", "b"} {
			if _, err := br.Subscribe(topic, s, func(context.Context, broker.Message) error { return nil }); err != nil {
				b.Fatal(err)
			}
		}
		if err := br.Publish(context.Background(), broker.Message{ID: "m", Topic: topic}); err != nil {
			b.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := reg.Gather(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkObserverSerial is a delivered attempt's hook alone, from one
// goroutine: the Collector's own (which looks the series up) and the one
// ForSubscriber returns (which the broker uses). Most of the latter's time
// is the two histograms' Observe.
func BenchmarkObserverSerial(b *testing.B) {
	ev, hooks := hookCases(b)
	for _, h := range hooks {
		b.Run(h.name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				h.o.Attempted(ev)
			}
		})
	}
}
