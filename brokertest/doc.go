// Package brokertest holds conformance suites for what a user of package
// broker can plug in: broker.DeadLetterStore, broker.IdempotencyStore, and a
// broker.Transport (through the broker built over it). Anyone writing a
// store (over a database, Redis, NATS JetStream, ...) runs the suite from one
// of their own tests:
//
//	func TestMyDeadLetterStore(t *testing.T) {
//		brokertest.TestDeadLetterStore(t, func(t *testing.T) broker.DeadLetterStore {
//			return mystore.New(t.TempDir())
//		})
//	}
//
// and anyone writing a transport runs the broker suite against brokers built
// over it, which checks the contract of package broker end to end (delivery,
// retries, dead letters, dedup, redrive, per-key order, Stats, middleware,
// Unsubscribe and Close) through the transport:
//
//	func TestMyTransport(t *testing.T) {
//		srv := mytransport.StartServer(t) // shared by the subtests; stopped with t.Cleanup
//		brokertest.TestBroker(t, func(t *testing.T, opts ...broker.Option) *broker.Broker {
//			b, err := broker.New(append(opts, broker.WithTransport(mytransport.New(srv)))...)
//			if err != nil {
//				t.Fatal(err)
//			}
//			return b // the suite closes it
//		})
//	}
//
// Each suite runs subtests (t.Run) that check the documented contract, one
// property each, so a failure names what is broken: RoundTrip, PutReplaces,
// ListFilter/topic orders, Retry/RetryAfter, KeyOrder, and so on. The suites
// use only the standard library, so importing brokertest from a test brings
// in nothing else.
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
// it ignores contexts passes IgnoresContext. The broker relies on it: a
// dead-letter Put waiting for its backend when Close's or Unsubscribe's
// context ends gets a context that ends soon after (see
// broker.DeadLetterStore), and must return then, or the stop waits for it.
//
// # The broker suite
//
// TestBroker calls its factory once per subtest with the suite's broker
// options; the factory appends what its transport needs and returns a
// running broker, which the suite closes when the subtest ends. Each subtest
// has a topic of its own (letters, digits and '-'), so brokers may share a
// server and stores. The suite works in real time: it waits for what it
// expects by polling, up to WaitTimeout (10 s by default), uses retry
// backoffs of 10 ms, and asserts no upper bound on any duration. A run
// against the in-memory transport takes well under a second.
//
// The suite assumes what the broker promises for every transport: a
// subscriber gets what is published after Subscribe returned, messages of
// one Key run one at a time in publish order (also with Concurrency(4) and
// through retries), Unsubscribe and Close wait for running handlers, and
// dedup suppresses an ID delivered before (WithoutDedup when the broker has
// no idempotency store). It does not test what the broker.WithTransport
// documentation lets a transport do differently: what Close and Unsubscribe
// do with unfinished messages, Ordered, and the options of the in-memory
// lane.
package brokertest
