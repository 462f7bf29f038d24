package brokerotel

import (
	"context"
	"errors"
	"fmt"

	"github.com/inproc/broker"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// Names of the asynchronous instruments ObserveStats reports.
const (
	MetricTopicQueueSize          = "inproc.broker.topic.queue.size"
	MetricTopicQueueCapacity      = "inproc.broker.topic.queue.capacity"
	MetricTopicQueueOldestAge     = "inproc.broker.topic.queue.oldest_message.age"
	MetricSubscriberQueueSize     = "inproc.broker.subscriber.queue.size"
	MetricSubscriberQueueCapacity = "inproc.broker.subscriber.queue.capacity"
	MetricSubscriberQueueOldest   = "inproc.broker.subscriber.queue.oldest_message.age"
	MetricSubscriberInflight      = "inproc.broker.subscriber.inflight"
	MetricDeadLetterStoreSize     = "inproc.broker.dead_letter.store.size"
	MetricDeadLetterEvictions     = "inproc.broker.dead_letter.evictions"
)

// statsInstruments are read from Broker.Stats by ObserveStats' callback.
type statsInstruments struct {
	topicSize, topicCap, subSize, subCap, subInflight, dlqSize metric.Int64ObservableUpDownCounter
	topicAge, subAge                                           metric.Float64ObservableGauge
	dlqEvicted                                                 metric.Int64ObservableCounter
}

func (s *statsInstruments) init(m metric.Meter) error {
	upDown := func(dst *metric.Int64ObservableUpDownCounter, name, desc string) error {
		var err error
		*dst, err = m.Int64ObservableUpDownCounter(name, metric.WithUnit("{message}"), metric.WithDescription(desc))
		return err
	}
	age := func(dst *metric.Float64ObservableGauge, name, desc string) error {
		var err error
		*dst, err = m.Float64ObservableGauge(name, metric.WithUnit("s"), metric.WithDescription(desc))
		return err
	}
	var err error
	s.dlqEvicted, err = m.Int64ObservableCounter(MetricDeadLetterEvictions, metric.WithUnit("{message}"),
		metric.WithDescription("Dead letters the store evicted to make room."))
	return errors.Join(err,
		upDown(&s.topicSize, MetricTopicQueueSize, "Messages waiting in the topic queue."),
		upDown(&s.topicCap, MetricTopicQueueCapacity, "Capacity of the topic queue."),
		upDown(&s.subSize, MetricSubscriberQueueSize, "Messages in the subscriber's lane that no worker runs (queued, held, parked)."),
		upDown(&s.subCap, MetricSubscriberQueueCapacity, "Capacity of the subscriber's lane."),
		upDown(&s.subInflight, MetricSubscriberInflight, "Messages the subscriber's workers run now."),
		upDown(&s.dlqSize, MetricDeadLetterStoreSize, "Dead letters in the store."),
		age(&s.topicAge, MetricTopicQueueOldestAge, "Age of the oldest message in the topic queue; 0 when empty."),
		age(&s.subAge, MetricSubscriberQueueOldest, "Age of the oldest message waiting in the subscriber's lane; 0 when empty."),
	)
}

// ObserveStats reports b's queues from b.Stats() whenever the MeterProvider
// collects: per topic inproc.broker.topic.queue.size, .capacity and
// .oldest_message.age; per active subscriber
// inproc.broker.subscriber.queue.size, .capacity, .oldest_message.age and
// inproc.broker.subscriber.inflight; and inproc.broker.dead_letter.store.size
// and .evictions. The caller owns the returned registration: Unregister it
// before or after closing b (Stats works after Close) to stop reporting.
//
// The attributes do not name the broker: observe one broker per Telemetry,
// or several with disjoint topic names.
func (t *Telemetry) ObserveStats(b *broker.Broker) (metric.Registration, error) {
	if b == nil {
		return nil, fmt.Errorf("%w: ObserveStats of a nil broker", ErrInvalidArgument)
	}
	s := &t.inst.stats
	reg, err := t.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		observeStats(ctx, o, s, b)
		return nil
	}, s.topicSize, s.topicCap, s.topicAge, s.subSize, s.subCap, s.subAge, s.subInflight, s.dlqSize, s.dlqEvicted)
	if err != nil {
		return nil, fmt.Errorf("brokerotel: register the Stats callback: %w", err)
	}
	return reg, nil
}

// observeStats reports one snapshot of b.
func observeStats(ctx context.Context, o metric.Observer, s *statsInstruments, b *broker.Broker) {
	st := b.Stats()
	for topic, ts := range st.Topics {
		dest := semconv.MessagingDestinationName(topic)
		set := metric.WithAttributeSet(attribute.NewSet(systemAttr, dest))
		o.ObserveInt64(s.topicSize, int64(ts.Queued), set)
		o.ObserveInt64(s.topicCap, int64(ts.Capacity), set)
		o.ObserveFloat64(s.topicAge, ts.OldestAge.Seconds(), set)
		for name, ss := range ts.Subscribers {
			if !ss.Active {
				continue
			}
			set := metric.WithAttributeSet(attribute.NewSet(systemAttr, dest,
				semconv.MessagingDestinationSubscriptionName(name)))
			o.ObserveInt64(s.subSize, int64(ss.Queued), set)
			o.ObserveInt64(s.subCap, int64(ss.Capacity), set)
			o.ObserveFloat64(s.subAge, ss.OldestAge.Seconds(), set)
			o.ObserveInt64(s.subInflight, int64(ss.InFlight), set)
		}
	}
	sys := metric.WithAttributeSet(attribute.NewSet(systemAttr))
	o.ObserveInt64(s.dlqEvicted, int64(st.DeadLetterEvicted), sys)
	if n, ok := deadLetterLen(ctx, b.DeadLetters()); ok {
		o.ObserveInt64(s.dlqSize, int64(n), sys)
	}
}

// deadLetterLen asks the store its size; a store is plugged-in code, so an
// error, a panic, a negative count or runtime.Goexit only loses the
// measurement. Len runs on a goroutine of its own, which deadLetterLen
// waits for: a Goexit there would otherwise end the SDK's collecting
// goroutine.
func deadLetterLen(ctx context.Context, s broker.DeadLetterStore) (n int, ok bool) {
	done := make(chan struct{})
	go func() {
		defer close(done) // also after a panic or a Goexit
		defer func() { _ = recover() }()
		if v, err := s.Len(ctx); err == nil && v >= 0 {
			n, ok = v, true
		}
	}()
	<-done
	return n, ok
}
