// Package natsjs keeps the broker's dead letters and dedup records in NATS
// JetStream, so that they survive restarts and are shared by every replica
// of a service, and runs a NATS server inside the process when there is no
// cluster to connect to.
//
// It is its own module (github.com/inproc/broker/natsjs), so that importing
// the core broker never brings in NATS.
//
// # Connecting
//
// Embedded starts a nats-server in the process with JetStream file storage
// in a directory and, by default, no network port: the returned Conn talks
// to it in memory. A single binary then gets durable dead letters and dedup
// records without running anything else. Listen opens a port as well.
// Connect connects to a NATS URL or cluster instead: the scale-out path,
// with the same stores. Conn.Close drains the connection and stops the
// embedded server.
//
// # Stores
//
// DeadLetterStore is a broker.DeadLetterStore over a stream (one message
// per dead letter, on a subject naming its ID, topic, subscriber and error
// code, so that the server filters List). IdempotencyStore is a
// broker.IdempotencyStore over a KV bucket whose TTL is the dedup window.
// Plug them into the in-memory broker:
//
//	conn, _ := natsjs.Embedded("/var/lib/myservice/nats")
//	dlq, _ := natsjs.NewDeadLetterStore(ctx, conn.JetStream())
//	dedup, _ := natsjs.NewIdempotencyStore(ctx, conn.JetStream())
//	b, _ := broker.New(broker.WithDeadLetterStore(dlq), broker.WithIdempotencyStore(dedup))
//
// Both pass the conformance suites of package brokertest. The README says
// how they differ from the core's in-memory stores.
package natsjs
