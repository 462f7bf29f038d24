package natsjs_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/brokertest"
	"github.com/inproc/broker/natsjs"
)

// The stores pass the core's conformance suites against an embedded server;
// each subtest gets its own stream or bucket on one server.

func TestDeadLetterStoreConformance(t *testing.T) {
	conn := embedded(t, "")
	n := 0
	brokertest.TestDeadLetterStore(t, func(t *testing.T) broker.DeadLetterStore {
		n++
		s, err := natsjs.NewDeadLetterStore(t.Context(), conn.JetStream(),
			natsjs.WithStream(fmt.Sprintf("DLQ_%d", n)), natsjs.WithSubjectPrefix(fmt.Sprintf("dlq.%d", n)))
		if err != nil {
			t.Fatalf("NewDeadLetterStore: %v", err)
		}
		return s
	})
}

func TestIdempotencyStoreConformance(t *testing.T) {
	conn := embedded(t, "")
	n := 0
	brokertest.TestIdempotencyStore(t, func(t *testing.T, window time.Duration) broker.IdempotencyStore {
		n++
		s, err := natsjs.NewIdempotencyStore(t.Context(), conn.JetStream(),
			natsjs.WithBucket(fmt.Sprintf("DEDUP_%d", n)), natsjs.WithWindow(window))
		if err != nil {
			t.Fatalf("NewIdempotencyStore: %v", err)
		}
		return s
	}, brokertest.ExpiresAfterRecord(time.Second))
}

// The broker's conformance suite over the JetStream transport: every
// subtest gets a broker of its own (a Transport on one shared embedded
// server, with the stream dead-letter and KV dedup stores), once with the
// default single partition and once with four.
func TestBrokerConformance(t *testing.T) {
	for _, parts := range []int{1, 4} {
		t.Run(fmt.Sprintf("partitions=%d", parts), func(t *testing.T) {
			conn := embedded(t, "")
			dlq, dedup := stores(t, conn)
			brokertest.TestBroker(t, func(t *testing.T, opts ...broker.Option) *broker.Broker {
				b, err := natsjs.New(t.Context(), conn.JetStream(), natsjs.Config{
					Transport:   []natsjs.TransportOption{natsjs.WithPartitions(parts), natsjs.WithLogger(discardLogger)},
					DeadLetters: dlq, Dedup: dedup,
				}, opts...)
				if err != nil {
					t.Fatalf("natsjs.New: %v", err)
				}
				return b
			})
		})
	}
}
