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
