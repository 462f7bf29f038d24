// Package natsjs runs the broker over NATS JetStream: messages, dead letters
// and dedup records survive restarts of the process and are shared by every
// replica of a service, with the broker's handlers, retry policies,
// middleware, observers and Stats unchanged. A NATS server can run inside
// the process, so a single binary needs nothing else.
//
// It is its own module (github.com/inproc/broker/natsjs), so that importing
// the core broker never brings in NATS.
//
// # The durable broker
//
// Open is the one-call default: a broker whose NATS server is embedded in
// the process with its files in a directory; New does the same on any
// JetStream connection (a cluster: the scale-out path). The change from an
// in-memory broker is one line:
//
//	b, err := broker.New(opts...)
//	b, err := natsjs.Open("/var/lib/orders/broker", natsjs.Config{}, opts...)
//
// Underneath, Transport implements broker.Transport: a stream per topic,
// split into partitions by Key; a durable pull consumer per subscriber and
// partition with one unacknowledged message at a time, so a Key is handled
// in publish order across every process; Attempt is the server's delivery
// count; a retry is a Nak with the policy's delay; a dead letter is stored,
// then the message terminated; a full stream is broker.ErrQueueFull. The
// broker runs the delivery engine (dedup, attempts, classification, retry
// decisions, dead letters, Stats, Observer, logs) exactly as for its
// in-memory queues. The README lists what differs, each difference tested.
//
// # Connecting
//
// Embedded starts a nats-server in the process with JetStream file storage
// in a directory and, by default, no network port: the returned Conn talks
// to it in memory. Listen opens a port as well. Connect connects to a NATS
// URL or cluster instead. Conn.Close drains the connection and stops the
// embedded server.
//
// # Recovery
//
// A crash leaves the messages the process held with the server, which
// delivers them again after the AckWait (DefaultAckWait, 30 s; see Config
// for faster settings). A Publish that returns an error during an outage
// may still have stored the message; publishing it again with the same ID
// is safe (see Transport.Publish). While the connection is down the
// subscribers wait for it; after a planned server restart they resume
// within Connect's reconnect wait (DefaultReconnectWait), its jitter and
// about a second. Streams with memory storage lose their messages in a
// server restart (see WithStreamStorage).
//
// # Stores
//
// DeadLetterStore is a broker.DeadLetterStore over a stream (one message
// per dead letter, on a subject naming its ID, topic, subscriber and error
// code, so that the server filters List). IdempotencyStore is a
// broker.IdempotencyStore over a KV bucket whose TTL is the dedup window.
// New and Open use both; they also work with the in-memory broker:
//
//	conn, _ := natsjs.Embedded("/var/lib/myservice/nats")
//	dlq, _ := natsjs.NewDeadLetterStore(ctx, conn.JetStream())
//	dedup, _ := natsjs.NewIdempotencyStore(ctx, conn.JetStream())
//	b, _ := broker.New(broker.WithDeadLetterStore(dlq), broker.WithIdempotencyStore(dedup))
//
// Both pass the conformance suites of package brokertest, and the broker
// over the transport passes brokertest.TestBroker.
package natsjs
