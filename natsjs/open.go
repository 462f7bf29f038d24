package natsjs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/inproc/broker"
	"github.com/nats-io/nats.go/jetstream"
)

// Config says what New and Open wire besides the broker's own options. Its
// zero value is the durable default: the transport with its defaults, dead
// letters in a DeadLetterStore and dedup records in an IdempotencyStore, on
// the same NATS.
//
// The transport's defaults favour few server resources over recovery
// time: an AckWait of 30 s and one partition per topic. After a crash, a
// message that was in flight comes back 20 to 30 s later and every keyed
// message of its topic waits behind it. For fast recovery:
//
//	natsjs.Config{Transport: []natsjs.TransportOption{
//		natsjs.WithAckWait(time.Second), natsjs.WithPartitions(4),
//	}}
type Config struct {
	// Transport are NewTransport's options (partitions, queue size, ack
	// wait, ...).
	Transport []TransportOption
	// DeadLetters is where dead letters go; nil: a DeadLetterStore made
	// with DeadLetterOptions. The transport checks it before it runs a
	// message delivered again (WithDeadLetterCheck).
	DeadLetters broker.DeadLetterStore
	// DeadLetterOptions are NewDeadLetterStore's options when DeadLetters
	// is nil.
	DeadLetterOptions []Option
	// Dedup remembers the IDs each subscriber delivered; nil: an
	// IdempotencyStore made with DedupOptions, unless NoDedup.
	Dedup broker.IdempotencyStore
	// DedupOptions are NewIdempotencyStore's options when Dedup is nil.
	DedupOptions []Option
	// NoDedup runs the broker without an idempotency store: only the
	// server's publish-side window (WithPublishDedupWindow) drops copies.
	NoDedup bool
	// Logger, when set, is the transport's logger and the broker's
	// (broker.WithLogger, which later options may override).
	Logger *slog.Logger
	// Embed are Embedded's options (Open only): no port by default.
	Embed []EmbedOption
}

// New returns a broker whose messages travel over JetStream (js), with
// dead letters and dedup records there too (see Config), configured by
// opts as broker.New is: the one change from an in-memory broker is
//
//	b, err := broker.New(opts...)
//	b, err := natsjs.New(ctx, conn.JetStream(), natsjs.Config{}, opts...)
//
// Handlers, retry policies, middleware, observers and Subscribe options
// stay as they are (the options of the in-memory lanes, LaneSize,
// WhenLaneFull, CircuitBreaker and RateLimit, are refused by Subscribe; see
// the README for what else differs). ctx bounds creating the stores. Closing
// the broker stops the transport's subscriptions but leaves js's connection
// open.
func New(ctx context.Context, js jetstream.JetStream, cfg Config, opts ...broker.Option) (*broker.Broker, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: New: nil JetStream", ErrInvalidOption)
	}
	return newBroker(ctx, js, nil, cfg, opts)
}

// Open returns a broker whose messages, dead letters and dedup records are
// kept by a NATS server embedded in the process with its files in dir
// (Embedded, no port unless cfg.Embed says so): a single binary then keeps
// what was published across restarts, with nothing else to run. Its Close
// also drains the connection and shuts the server down (when Close's
// context ends first the server is still shut down; messages not yet
// acknowledged stay in dir).
//
//	b, err := natsjs.Open("/var/lib/orders/broker", natsjs.Config{}, opts...)
func Open(dir string, cfg Config, opts ...broker.Option) (*broker.Broker, error) {
	conn, err := Embedded(dir, cfg.Embed...)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := newBroker(ctx, conn.JetStream(), conn, cfg, opts)
	if err != nil {
		return nil, errors.Join(err, conn.Close(ctx))
	}
	return b, nil
}

// TransportOf returns the Transport of a broker New or Open built (or one
// built with broker.WithTransport over a *Transport), for what it offers
// beyond the broker: ConsumerInfo (the backlog across processes),
// ConsumerNames, RemoveSubscriber, StreamName. It is false for any other
// broker.
func TransportOf(b *broker.Broker) (*Transport, bool) {
	if b == nil {
		return nil, false
	}
	t, ok := b.Transport().(*Transport)
	return t, ok && t != nil
}

func newBroker(ctx context.Context, js jetstream.JetStream, own *Conn, cfg Config, opts []broker.Option) (*broker.Broker, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	dlq := cfg.DeadLetters
	if dlq == nil {
		s, err := NewDeadLetterStore(ctx, js, cfg.DeadLetterOptions...)
		if err != nil {
			return nil, err
		}
		dlq = s
	}
	var dedup broker.IdempotencyStore
	if !cfg.NoDedup {
		dedup = cfg.Dedup
		if dedup == nil {
			s, err := NewIdempotencyStore(ctx, js, cfg.DedupOptions...)
			if err != nil {
				return nil, err
			}
			dedup = s
		}
	}
	topts := []TransportOption{WithDeadLetterCheck(dlq)}
	if dedup != nil {
		topts = append(topts, WithDedupCheck(dedup))
	}
	if cfg.Logger != nil {
		topts = append(topts, WithLogger(cfg.Logger))
	}
	t, err := NewTransport(js, append(topts, cfg.Transport...)...)
	if err != nil {
		return nil, err
	}
	t.own = own
	bopts := []broker.Option{broker.WithTransport(t), broker.WithDeadLetterStore(dlq), broker.WithIdempotencyStore(dedup)}
	if cfg.Logger != nil {
		bopts = append(bopts, broker.WithLogger(cfg.Logger))
	}
	b, err := broker.New(append(bopts, opts...)...)
	if err != nil {
		t.own = nil // the caller closes it
		return nil, err
	}
	return b, nil
}
