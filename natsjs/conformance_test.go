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
