package broker

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// This file is PublishBatch: many messages published at once, for a
// transport that stores them remotely (each Publish waits for its own
// acknowledgement; a batch waits for all of them together).

// BatchTransport is an optional interface of a Transport that stores many
// messages faster together than one by one, such as one that sends them
// all before it waits for the acknowledgements. Broker.PublishBatch uses
// it; without it, PublishBatch calls Publish for each message.
type BatchTransport interface {
	Transport
	// PublishBatch stores msgs (each validated, PublishedAt set) and
	// returns one error per message, nil for each one stored, as Publish
	// would for it: an error wrapping ErrQueueFull when its topic had no
	// room for wait (at once when wait is 0), or ctx's error. It returns
	// once every message was stored or refused.
	PublishBatch(ctx context.Context, msgs []Message, wait time.Duration) []error
}

// BatchError is PublishBatch's error when some messages were not
// published: Errs[i] is message i's error, nil for each one published. It
// unwraps to the errors of the messages refused, so errors.Is(err,
// ErrQueueFull) says whether a full queue refused any.
type BatchError struct {
	Errs []error
}

// Error says how many were refused, and the first reason.
func (e *BatchError) Error() string {
	refused, first := e.Unwrap(), error(nil)
	if len(refused) > 0 {
		first = refused[0]
	}
	return fmt.Sprintf("broker: publish batch: %d of %d messages refused; first: %v", len(refused), len(e.Errs), first)
}

// Unwrap returns the errors of the messages refused.
func (e *BatchError) Unwrap() []error {
	var errs []error
	for _, err := range e.Errs {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// PublishBatch publishes msgs as Publish publishes each (validation,
// publish hooks, PublishedAt, the publish timeout for room, Stats, the
// Observer), and returns once each one was accepted or refused: nil when
// every one was accepted, else a *BatchError saying which were not. One
// refused message does not stop the others. Accepted messages are queued
// in the order of msgs, but for one a transport stored only after trying
// again (its stream was full), which lands after those sent behind it.
//
// With the in-memory transport it is Publish in a loop. A transport that
// stores messages remotely (BatchTransport, such as natsjs) sends them all
// before it waits for the acknowledgements, which is where a batch is
// faster than Publish from one goroutine.
func (b *Broker) PublishBatch(ctx context.Context, msgs []Message) error {
	errs := make([]error, len(msgs))
	var bt BatchTransport
	if b.remote != nil {
		bt, _ = b.remote.t.(BatchTransport)
	}
	if bt != nil {
		b.publishRemoteBatch(ctx, bt, msgs, errs)
	} else {
		for i := range msgs {
			errs[i] = b.Publish(ctx, msgs[i])
		}
	}
	if slices.ContainsFunc(errs, func(err error) bool { return err != nil }) {
		return &BatchError{Errs: errs}
	}
	return nil
}

// publishRemoteBatch is PublishBatch over a BatchTransport: each message is
// made ready as Publish makes it (those that fail there are not sent), the
// rest go to the transport together, and each outcome is recorded as
// Publish records it, in errs.
func (b *Broker) publishRemoteBatch(ctx context.Context, bt BatchTransport, msgs []Message, errs []error) {
	ready := make([]Message, 0, len(msgs))
	at := make([]int, 0, len(msgs)) // ready[k] is msgs[at[k]]
	for i, msg := range msgs {
		var err error
		if msg, err = b.prepare(ctx, msg); err == nil && b.closed.Load() {
			err = ErrClosed
		}
		if err != nil {
			errs[i] = err
			continue
		}
		ready, at = append(ready, msg), append(at, i)
	}
	if len(ready) == 0 {
		return
	}
	pctx := ctx
	if pctx == nil {
		pctx = context.Background()
	}
	out, perr := guarded(b.guard, "Transport", "PublishBatch", func() ([]error, error) {
		return bt.PublishBatch(pctx, ready, b.cfg.publishTimeout), nil
	})
	if perr == nil && len(out) != len(ready) {
		perr = fmt.Errorf("broker: publish batch: the transport answered %d of %d messages", len(out), len(ready))
	}
	for k, msg := range ready {
		err := perr // every message gets the batch's error
		if err == nil {
			err = out[k]
		}
		errs[at[k]] = b.remoteOutcome(ctx, msg, err)
	}
}
