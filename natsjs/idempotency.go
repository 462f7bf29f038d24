package natsjs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/inproc/broker"
	"github.com/nats-io/nats.go/jetstream"
)

// IdempotencyStore is a broker.IdempotencyStore over a JetStream KV bucket
// whose TTL is the dedup window: a key is remembered for the window from
// its last Record (the broker records only after a handler succeeded), so
// it survives restarts and is shared by every replica connected to the same
// NATS. Seen is one KV Get, Record one KV Put. It is safe for concurrent
// use.
//
// The key of (topic, subscriber, message ID) is three tokens, each the name
// in base64url or, for a name longer than 48 bytes, its SHA-256 (see the
// README).
//
// Unlike broker.MemoryIdempotencyStore, the window is measured from Record,
// not in publish time (DeliveryKey.PublishedAt is ignored), and it is
// bounded by the bucket's storage, not by a count of entries.
type IdempotencyStore struct {
	kv     jetstream.KeyValue
	window time.Duration
}

var _ broker.IdempotencyStore = (*IdempotencyStore)(nil)

// NewIdempotencyStore creates the dedup bucket if it does not exist
// (updating its configuration to opts if it does) and returns a store over
// it. Options: WithBucket, WithWindow, WithReplicas, WithStorage.
func NewIdempotencyStore(ctx context.Context, js jetstream.JetStream, opts ...Option) (*IdempotencyStore, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: NewIdempotencyStore: nil JetStream", ErrInvalidOption)
	}
	cfg, err := newStoreConfig(idempotencyKind, opts)
	if err != nil {
		return nil, err
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      cfg.bucket,
		Description: "inproc broker delivered message IDs (github.com/inproc/broker/natsjs)",
		History:     1,
		TTL:         cfg.window,
		Storage:     cfg.storage,
		Replicas:    cfg.replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("natsjs: dedup bucket %q: %w", cfg.bucket, err)
	}
	return &IdempotencyStore{kv: kv, window: cfg.window}, nil
}

// Window returns how long a key is remembered after Record.
func (s *IdempotencyStore) Window() time.Duration { return s.window }

// Bucket returns the name of the store's KV bucket.
func (s *IdempotencyStore) Bucket() string { return s.kv.Bucket() }

func key(k broker.DeliveryKey) string {
	return token(k.Topic) + "." + token(k.Subscriber) + "." + token(k.MessageID)
}

// Seen reports whether k was recorded less than the window ago.
func (s *IdempotencyStore) Seen(ctx context.Context, k broker.DeliveryKey) (bool, error) {
	if ctx == nil { // as the broker: nil is Background
		ctx = context.Background()
	}
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("natsjs: dedup lookup: %w", err)
	}
	_, err := s.kv.Get(ctx, key(k))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	default:
		return false, fmt.Errorf("natsjs: dedup lookup of %q at %q on %q: %w", k.MessageID, k.Subscriber, k.Topic, err)
	}
}

// Record remembers k for the window from now.
func (s *IdempotencyStore) Record(ctx context.Context, k broker.DeliveryKey) error {
	if ctx == nil { // as the broker: nil is Background
		ctx = context.Background()
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("natsjs: dedup record: %w", err)
	}
	if _, err := s.kv.Put(ctx, key(k), nil); err != nil {
		return fmt.Errorf("natsjs: dedup record of %q at %q on %q: %w", k.MessageID, k.Subscriber, k.Topic, err)
	}
	return nil
}
