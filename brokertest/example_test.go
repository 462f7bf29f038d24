package brokertest_test

import (
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/brokertest"
)

// A store's own tests run both suites. The functions below are what a
// store's _test.go file holds; here they check the core's in-memory stores.
// (An example cannot run a suite: the suites need the *testing.T of a
// running test. This package's tests run these same calls.)
func Example() {
	_ = func(t *testing.T) {
		brokertest.TestDeadLetterStore(t, func(t *testing.T) broker.DeadLetterStore {
			return broker.NewMemoryDeadLetterStore(0, nil)
		})
	}
	_ = func(t *testing.T) {
		brokertest.TestIdempotencyStore(t, func(t *testing.T, window time.Duration) broker.IdempotencyStore {
			return broker.NewMemoryIdempotencyStore(window, 0)
		},
			// The memory store measures its window in publish time and
			// never blocks, so it ignores contexts.
			brokertest.ExpiresByPublishTime(0), brokertest.IgnoresContext())
	}
}

// A transport's tests run the broker suite with a factory that builds a
// broker over the transport from the suite's options. Here it is the
// built-in in-memory transport (broker.New alone), as this package's tests
// run it; a transport appends broker.WithTransport and its stores, and
// releases what it holds with t.Cleanup. (An example cannot run the suite:
// it needs the *testing.T of a running test.)
func ExampleTestBroker() {
	_ = func(t *testing.T) {
		brokertest.TestBroker(t, func(t *testing.T, opts ...broker.Option) *broker.Broker {
			// e.g. opts = append(opts, broker.WithTransport(tr), broker.WithDeadLetterStore(dlq))
			b, err := broker.New(opts...)
			if err != nil {
				t.Fatalf("broker.New: %v", err)
			}
			return b // the suite closes it when the subtest ends
		},
			// A transport over the network may need longer than the
			// default 10 s for a delivery on a busy machine.
			brokertest.WaitTimeout(30*time.Second))
	}
}
