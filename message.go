package broker

import (
	"context"
	"fmt"
	"time"
)

// Message is the unit the broker carries. Who owns what: Publish copies the
// struct and nothing else, so do not modify Payload or Headers after
// Publish. Each handler call gets its own Headers map, never nil (it may
// add trace context to it); Payload is shared by every subscriber and
// must be treated as read-only.
type Message struct {
	// ID identifies the message and is its idempotency key: a subscriber that
	// has delivered an ID is not handed a copy published within the dedup
	// window of the delivered one (with the default store). Required.
	ID string
	// Topic routes the message. Required.
	Topic string
	// Key is an optional ordering key: at each subscriber, messages with
	// the same Key run one at a time, in publish order, and a retry holds
	// only its Key (later messages of the Key wait behind it; other keys go
	// on). Without a Key a message is ordered only by dispatch, unless the
	// subscriber is Ordered.
	Key string
	// Payload is the body, passed through untouched and shared by every
	// subscriber: read-only.
	Payload []byte
	// Headers carry metadata such as W3C trace context; each handler call
	// (and the middleware around it) gets its own copy, never nil — an
	// empty map when the message was published without headers — which it
	// may write to and keep; other subscribers and later attempts never
	// see the writes. A dead letter keeps the headers as published. A
	// publish hook always gets a map.
	Headers map[string]string
	// Attempt is set by the broker on each delivery: 1 for the first.
	Attempt int
	// PublishedAt is set by Publish to the time the message was accepted
	// (time.Now, with its monotonic clock reading, which is what ages and
	// latencies use).
	PublishedAt time.Time
}

// Handler processes one delivery of a message. It reports failure only by
// returning an error (see the package doc for how errors are classified);
// a panic is recovered and treated as a *PanicError. Delivery is at least
// once, so a handler must be idempotent. It should return promptly when ctx
// is cancelled.
type Handler func(ctx context.Context, msg Message) error

// validate reports why msg cannot be published, wrapping ErrInvalidMessage.
func (m *Message) validate() error {
	switch {
	case m.ID == "":
		return fmt.Errorf("%w: empty ID (topic %q)", ErrInvalidMessage, m.Topic)
	case m.Topic == "":
		return fmt.Errorf("%w: empty Topic (id %q)", ErrInvalidMessage, m.ID)
	}
	return nil
}
