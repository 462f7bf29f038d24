// Package brokertest holds conformance suites for the interfaces a user of
// package broker can implement: broker.DeadLetterStore and
// broker.IdempotencyStore. Anyone writing a store (over a database, Redis,
// NATS JetStream, ...) runs the suite from one of their own tests:
//
//	func TestMyDeadLetterStore(t *testing.T) {
//		brokertest.TestDeadLetterStore(t, func(t *testing.T) broker.DeadLetterStore {
//			return mystore.New(t.TempDir())
//		})
//	}
//
// Each suite runs subtests (t.Run) that check the documented contract of the
// interface, one property each, so a failure names what is broken:
// RoundTrip, PutReplaces, ListOldestFirst, ListFilter/topic orders, and so on.
// The suites use only the standard library, so importing brokertest from a
// test brings in nothing else.
//
// # What the suites assume
//
// The constructor is called once per subtest (or per table case) and must
// return an empty store; clean up with t.Cleanup. Strings in the dead letters
// and keys the suites use are valid UTF-8 (a topic or subscriber name may
// still contain dots, spaces, wildcards and non-ASCII letters); payloads are
// arbitrary bytes. Times are compared with time.Time.Equal, to the
// nanosecond.
//
// An idempotency store defines its own window (see broker.IdempotencyStore):
// ExpiresAfterRecord (a TTL from Record, the default) or ExpiresByPublishTime
// (the window is measured between DeliveryKey.PublishedAt values, as
// broker.MemoryIdempotencyStore does). The suite never sleeps for a long
// window: every test but the expiry one asks for LongWindow, and the expiry
// test asks for a short one and polls until the key is forgotten, with a
// deadline (ExpiryTimeout).
//
// A store method called with a context that is already done must return an
// error matching the context's error (errors.Is). A store that documents that
// it ignores contexts passes IgnoresContext.
package brokertest
