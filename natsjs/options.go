package natsjs

import (
	"fmt"
	"time"

	"github.com/inproc/broker"
	"github.com/nats-io/nats.go/jetstream"
)

// Defaults of the stores.
const (
	// DefaultDeadLetterStream is the stream NewDeadLetterStore uses.
	DefaultDeadLetterStream = "BRK_DLQ"
	// DefaultDeadLetterSubjectPrefix prefixes the dead-letter subjects.
	DefaultDeadLetterSubjectPrefix = "brk.dlq"
	// DefaultDedupBucket is the KV bucket NewIdempotencyStore uses.
	DefaultDedupBucket = "BRK_DEDUP"
	// DefaultDedupWindow is how long NewIdempotencyStore remembers a key
	// after Record: the core's default window.
	DefaultDedupWindow = broker.DefaultDedupWindow
	// MinDedupWindow is the shortest window JetStream accepts (a stream's
	// MaxAge).
	MinDedupWindow = 100 * time.Millisecond
)

// Option configures NewDeadLetterStore or NewIdempotencyStore. An option
// that does not apply to the store being made is an error (ErrInvalidOption),
// as is a bad value.
type Option func(*storeConfig) error

type storeKind int

const (
	deadLetterKind storeKind = iota + 1
	idempotencyKind
)

func (k storeKind) String() string {
	if k == deadLetterKind {
		return "NewDeadLetterStore"
	}
	return "NewIdempotencyStore"
}

// storeConfig is what the options set; kind is set by the constructor
// before they run.
type storeConfig struct {
	kind          storeKind
	stream        string
	subjectPrefix string
	maxMsgs       int64
	bucket        string
	window        time.Duration
	replicas      int
	storage       jetstream.StorageType
}

func newStoreConfig(kind storeKind, opts []Option) (storeConfig, error) {
	c := storeConfig{
		kind: kind, stream: DefaultDeadLetterStream, subjectPrefix: DefaultDeadLetterSubjectPrefix,
		maxMsgs: -1, bucket: DefaultDedupBucket, window: DefaultDedupWindow,
		replicas: 1, storage: jetstream.FileStorage,
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

func (c *storeConfig) only(kind storeKind, option string) error {
	if c.kind != kind {
		return fmt.Errorf("%w: %s applies to %s, not %s", ErrInvalidOption, option, kind, c.kind)
	}
	return nil
}

// WithStream names the dead-letter stream (DefaultDeadLetterStream if not
// given). Letters, digits, '-' and '_' only.
func WithStream(name string) Option {
	return func(c *storeConfig) error {
		if err := c.only(deadLetterKind, "WithStream"); err != nil {
			return err
		}
		if err := validName("stream", name); err != nil {
			return err
		}
		c.stream = name
		return nil
	}
}

// WithSubjectPrefix sets the prefix of the dead-letter subjects
// (DefaultDeadLetterSubjectPrefix if not given): dot-separated tokens,
// without wildcards. The stream takes every subject under it.
func WithSubjectPrefix(prefix string) Option {
	return func(c *storeConfig) error {
		if err := c.only(deadLetterKind, "WithSubjectPrefix"); err != nil {
			return err
		}
		if err := validSubjectPrefix(prefix); err != nil {
			return err
		}
		c.subjectPrefix = prefix
		return nil
	}
}

// WithMaxDeadLetters bounds the dead-letter stream to n messages; beyond it
// JetStream discards the oldest (without counting them: see the README). The
// default, and n <= 0, is no bound.
func WithMaxDeadLetters(n int64) Option {
	return func(c *storeConfig) error {
		if err := c.only(deadLetterKind, "WithMaxDeadLetters"); err != nil {
			return err
		}
		c.maxMsgs = -1
		if n > 0 {
			c.maxMsgs = n
		}
		return nil
	}
}

// WithBucket names the dedup KV bucket (DefaultDedupBucket if not given).
// Letters, digits, '-' and '_' only.
func WithBucket(name string) Option {
	return func(c *storeConfig) error {
		if err := c.only(idempotencyKind, "WithBucket"); err != nil {
			return err
		}
		if err := validName("bucket", name); err != nil {
			return err
		}
		c.bucket = name
		return nil
	}
}

// WithWindow sets how long the idempotency store remembers a key after
// Record: the bucket's TTL (DefaultDedupWindow if not given; at least
// MinDedupWindow).
func WithWindow(d time.Duration) Option {
	return func(c *storeConfig) error {
		if err := c.only(idempotencyKind, "WithWindow"); err != nil {
			return err
		}
		if d < MinDedupWindow {
			return fmt.Errorf("%w: window %v shorter than %v", ErrInvalidOption, d, MinDedupWindow)
		}
		c.window = d
		return nil
	}
}

// WithReplicas sets how many servers of a cluster keep the stream or bucket
// (1 if not given; at most 5).
func WithReplicas(n int) Option {
	return func(c *storeConfig) error {
		if err := validReplicas(n); err != nil {
			return err
		}
		c.replicas = n
		return nil
	}
}

// validReplicas reports why n cannot be a stream's replica count.
func validReplicas(n int) error {
	if n < 1 || n > 5 {
		return fmt.Errorf("%w: replicas %d: want 1 to 5", ErrInvalidOption, n)
	}
	return nil
}

// WithStorage picks file (the default: survives restarts) or memory
// storage for the stream or bucket.
func WithStorage(st jetstream.StorageType) Option {
	return func(c *storeConfig) error {
		if err := validStorage(st); err != nil {
			return err
		}
		c.storage = st
		return nil
	}
}

// validStorage reports why st is not a storage type (file or memory).
func validStorage(st jetstream.StorageType) error {
	if st != jetstream.FileStorage && st != jetstream.MemoryStorage {
		return fmt.Errorf("%w: storage type %d", ErrInvalidOption, st)
	}
	return nil
}
