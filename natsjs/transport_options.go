package natsjs

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/inproc/broker"
	"github.com/nats-io/nats.go/jetstream"
)

// Defaults of the transport.
const (
	// DefaultStreamPrefix starts the name of each topic's stream:
	// "BRK_T_orders" for topic "orders".
	DefaultStreamPrefix = "BRK_T"
	// DefaultSubjectPrefix starts each topic's subjects:
	// "brk.t.orders.m.0" for topic "orders", partition 0.
	DefaultSubjectPrefix = "brk.t"
	// DefaultPartitions is how many partitions a topic's stream gets when
	// the transport creates it: one, the cheapest on the server. Keyed
	// messages are handed out one at a time per partition (for key order),
	// so a subscriber runs at most as many keyed handlers at once as the
	// topic has partitions: pick more with WithPartitions before the
	// topic's stream is first created. Keyless messages have a consumer of
	// their own and run up to Concurrency at once whatever the partitions.
	DefaultPartitions = 1
	// MaxPartitions is the most partitions a topic may have.
	MaxPartitions = 256
	// DefaultQueueSize is how many messages a topic's stream holds at most
	// (published and not yet acknowledged by every subscriber) before
	// Publish gets broker.ErrQueueFull.
	DefaultQueueSize = 100_000
	// DefaultAckWait is how long the server waits for a delivery's outcome
	// before it delivers the message again; a running handler is reported
	// alive every third of it, so it only ends the delivery of a process
	// that died. It is also how long such a message waits: after a crash,
	// a message that was in flight is delivered again 20 to 30 s later
	// (the AckWait less the time since its last keep-alive), and with
	// one partition (DefaultPartitions) every keyed message of the topic
	// waits behind it. For fast recovery set WithAckWait(time.Second) and
	// WithPartitions(4), as the examples do.
	DefaultAckWait = 30 * time.Second
	// MinAckWait is the shortest AckWait accepted.
	MinAckWait = 100 * time.Millisecond
	// DefaultPublishDedupWindow is how long the server remembers a message
	// ID (Nats-Msg-Id) to drop a copy published again within it.
	DefaultPublishDedupWindow = 2 * time.Minute
	// DefaultPullExpiry is how long each pull request waits on the server.
	// The client expects a heartbeat every half of it and pulls again when
	// two are missed, which recovers from a pull consumer that stopped
	// receiving messages within about this time (see the README).
	DefaultPullExpiry = 5 * time.Second
	// MinPullExpiry is the shortest pull expiry accepted.
	MinPullExpiry = time.Second
)

// TransportOption configures NewTransport. A bad value makes NewTransport
// return an error wrapping ErrInvalidOption.
type TransportOption func(*transportConfig) error

type transportConfig struct {
	streamPrefix  string
	subjectPrefix string
	partitions    int
	partitionsSet bool // WithPartitions was given: an existing stream must agree
	queueSize     int64
	ackWait       time.Duration
	dedupWindow   time.Duration
	storage       jetstream.StorageType
	replicas      int
	pullExpiry    time.Duration
	logger        *slog.Logger
	deadLetters   broker.DeadLetterStore  // checked before redelivering a message; nil: not checked
	dedup         broker.IdempotencyStore // checked before terminating a redelivered message; nil: not checked
}

func newTransportConfig(opts []TransportOption) (transportConfig, error) {
	c := transportConfig{
		streamPrefix: DefaultStreamPrefix, subjectPrefix: DefaultSubjectPrefix,
		partitions: DefaultPartitions, queueSize: DefaultQueueSize, ackWait: DefaultAckWait,
		dedupWindow: DefaultPublishDedupWindow, storage: jetstream.FileStorage, replicas: 1,
		pullExpiry: DefaultPullExpiry, logger: slog.Default(),
	}
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt(&c); err != nil {
			return c, err
		}
	}
	return c, nil
}

// WithPrefixes sets how the transport names the streams (stream + "_" +
// topic; DefaultStreamPrefix if not given) and the subjects (subject + "." +
// topic + ...; DefaultSubjectPrefix) of its topics. Two transports with
// different prefixes on one NATS do not see each other's topics. The subject
// prefix must not overlap the subjects of another stream (the dead-letter
// store takes "brk.dlq.>" by default).
func WithPrefixes(stream, subject string) TransportOption {
	return func(c *transportConfig) error {
		if err := validName("stream prefix", stream); err != nil {
			return err
		}
		if len(stream) > 32 {
			return fmt.Errorf("%w: stream prefix %q: at most 32 characters", ErrInvalidOption, stream)
		}
		if err := validSubjectPrefix(subject); err != nil {
			return err
		}
		c.streamPrefix, c.subjectPrefix = stream, subject
		return nil
	}
}

// WithPartitions sets how many partitions the stream of a topic gets when
// this transport creates it (DefaultPartitions if not given; 1 to
// MaxPartitions). A message with a Key goes to partition hash(Key) mod n,
// and each partition delivers one message at a time to each subscriber, so
// messages with one Key are handled in publish order, one at a time, across
// every process; a subscriber runs at most min(Concurrency, n) keyed
// handlers at once. Keyless messages do not go to a partition.
//
// The count is written into the stream when it is created and can never
// change, as publishers and subscribers must agree on it: for a topic whose
// stream exists, a transport without WithPartitions uses the stream's count,
// and one with a different count gets ErrInvalidOption when it first
// publishes or subscribes to the topic.
func WithPartitions(n int) TransportOption {
	return func(c *transportConfig) error {
		if n < 1 || n > MaxPartitions {
			return fmt.Errorf("%w: partitions %d: want 1 to %d", ErrInvalidOption, n, MaxPartitions)
		}
		c.partitions, c.partitionsSet = n, true
		return nil
	}
}

// WithQueueSize sets how many messages a topic's stream holds at most
// (DefaultQueueSize if not given): a message stays in the stream until
// every subscriber has acknowledged or dead-lettered it, and a Publish that
// finds the stream full waits for room until its deadline (the broker's
// publish timeout), then returns an error wrapping broker.ErrQueueFull.
// The stream is updated to this size when the transport first uses it.
func WithQueueSize(n int64) TransportOption {
	return func(c *transportConfig) error {
		if n < 1 {
			return fmt.Errorf("%w: queue size %d < 1", ErrInvalidOption, n)
		}
		c.queueSize = n
		return nil
	}
}

// WithAckWait sets how long the server waits for a delivery's outcome
// before delivering the message again (DefaultAckWait if not given; at
// least MinAckWait). The broker reports a running handler alive every third
// of it, so it only bounds how soon the messages of a process that died are
// delivered again.
func WithAckWait(d time.Duration) TransportOption {
	return func(c *transportConfig) error {
		if d < MinAckWait {
			return fmt.Errorf("%w: ack wait %v shorter than %v", ErrInvalidOption, d, MinAckWait)
		}
		c.ackWait = d
		return nil
	}
}

// WithPublishDedupWindow sets how long the server remembers a published
// message ID to drop a copy of it published again (the stream's duplicate
// window; DefaultPublishDedupWindow if not given). 0 turns this off: every
// Publish is stored, and only the broker's idempotency store (per
// subscriber, on success) catches copies.
func WithPublishDedupWindow(d time.Duration) TransportOption {
	return func(c *transportConfig) error {
		if d < 0 {
			return fmt.Errorf("%w: publish dedup window %v < 0", ErrInvalidOption, d)
		}
		c.dedupWindow = d
		return nil
	}
}

// WithStreamStorage picks file (the default: survives restarts) or memory
// storage for the topics' streams the transport creates.
//
// A memory stream lives only as long as its server: a restart of a single
// server (an embedded one included) loses the stream, every message not yet
// acknowledged by every subscriber, and the subscribers' consumers. The
// transport creates the stream again at the next Publish (that Publish
// fails) and each subscribed process its consumers when its pull goes
// unanswered, delivering from then on: a message published before the
// consumers are back is not kept (interest retention), and sequences start
// again at 1 (dead-letter IDs stay unique; see delivery IDs in the
// README). On a cluster, a memory stream with replicas survives the
// restart of one of its servers. The dead-letter and dedup stores keep
// their own storage (WithStorage, file by default).
func WithStreamStorage(st jetstream.StorageType) TransportOption {
	return func(c *transportConfig) error {
		if err := validStorage(st); err != nil {
			return err
		}
		c.storage = st
		return nil
	}
}

// WithStreamReplicas sets how many servers of a cluster keep each topic's
// stream (1 if not given; at most 5).
func WithStreamReplicas(n int) TransportOption {
	return func(c *transportConfig) error {
		if err := validReplicas(n); err != nil {
			return err
		}
		c.replicas = n
		return nil
	}
}

// WithPullExpiry sets how long each pull request waits on the server
// (DefaultPullExpiry if not given; at least MinPullExpiry). The server
// sends a heartbeat every half of it; after two missed heartbeats the
// client logs a warning and pulls again.
func WithPullExpiry(d time.Duration) TransportOption {
	return func(c *transportConfig) error {
		if d < MinPullExpiry {
			return fmt.Errorf("%w: pull expiry %v shorter than %v", ErrInvalidOption, d, MinPullExpiry)
		}
		c.pullExpiry = d
		return nil
	}
}

// WithLogger sets where the transport logs what the broker cannot see
// (a missed heartbeat and the pull after it, a consumer recreated, a
// message it could not decode): slog.Default() if not given.
func WithLogger(l *slog.Logger) TransportOption {
	return func(c *transportConfig) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidOption)
		}
		c.logger = l
		return nil
	}
}

// WithDeadLetterCheck makes the transport look up, before it hands the
// broker a message delivered before (NumDelivered > 1) or stored before the
// transport was made, whether the message's dead letter (see
// Delivery.DeadLetterID) is in s already: it then terminates the message
// without running the handler. That closes the window where a process dies
// after storing a dead letter and before the server heard of the outcome.
// For a message stored before the transport was made it also looks up the
// ID earlier versions gave ("<stream>.<sequence>.<subscriber>"), trusting
// a dead letter there only when it is of the same message (ID, topic and
// publish time). New and Open set it to the broker's dead-letter store.
func WithDeadLetterCheck(s broker.DeadLetterStore) TransportOption {
	return func(c *transportConfig) error {
		if s == nil {
			return fmt.Errorf("%w: nil dead-letter store", ErrInvalidOption)
		}
		c.deadLetters = s
		return nil
	}
}

// WithDedupCheck makes the transport ask s, the broker's idempotency store,
// before it terminates a message delivered more than once whose dead
// letter the broker has just stored, whether the message was delivered
// meanwhile: after a server restart or a reconnection the server can
// deliver a message again while another process still runs its earlier
// delivery, and one delivery may then succeed while the other is
// dead-lettered. When s has it delivered, the dead letter is deleted and
// the message ends delivered only. (The other half: a delivery that ran
// across a reconnection, or for longer than the AckWait, deletes a dead
// letter of its message it finds after succeeding; see
// WithDeadLetterCheck.) New and Open set it to the broker's idempotency
// store, unless Config.NoDedup.
func WithDedupCheck(s broker.IdempotencyStore) TransportOption {
	return func(c *transportConfig) error {
		if s == nil {
			return fmt.Errorf("%w: nil idempotency store", ErrInvalidOption)
		}
		c.dedup = s
		return nil
	}
}
