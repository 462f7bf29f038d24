package natsjs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/inproc/broker"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// This file is PublishBatch (broker.BatchTransport): a batch is sent with
// asynchronous publishes, a window of them in flight, where Publish waits
// for each acknowledgement before it returns.

// Batches: at most batchWindow publishes await their acknowledgement at
// once (well under the jetstream client's 4,000, past which it stalls), and
// none is waited for longer than batchAckWait (unless wait is longer).
const (
	batchWindow  = 256
	batchAckWait = 5 * time.Second
)

var _ broker.BatchTransport = (*Transport)(nil)

// sentMsg is one message of a batch on its way.
type sentMsg struct {
	i  int // in the batch
	id string
	ts *topicState
	m  *nats.Msg
	at time.Time // sent
	f  jetstream.PubAckFuture
}

// PublishBatch stores msgs as Publish stores each, without waiting for one
// acknowledgement before sending the next: up to batchWindow are in
// flight. A message the server refuses because its stream is full is then
// published alone, trying again until wait after the batch's first such
// refusal (broker.ErrQueueFull after that; at once when wait is 0), so it
// is stored after the messages sent behind it, and a batch into a full
// stream waits about wait in all, not per message. Once ctx has ended
// nothing more is sent. It returns one error per message, nil for each one
// stored; an error for a message whose acknowledgement never came (ctx
// ended, or none within batchAckWait) says it may be stored anyway.
func (t *Transport) PublishBatch(ctx context.Context, msgs []broker.Message, wait time.Duration) []error {
	errs := make([]error, len(msgs))
	full := &fullWait{wait: wait}
	var sent []sentMsg // sent[head:] await their acknowledgement, oldest first
	head := 0
	timer := stoppedTimer()
	defer timer.Stop()
	for i := range msgs {
		msg := &msgs[i]
		if err := ctx.Err(); err != nil { // as Publish: nothing is sent once ctx ended
			errs[i] = fmt.Errorf("natsjs: publish to topic %q: %w", msg.Topic, err)
			continue
		}
		ts, err := t.topic(ctx, msg.Topic, true)
		if err != nil {
			errs[i] = err
			continue
		}
		if len(sent)-head == batchWindow {
			errs[sent[head].i] = t.settle(ctx, &sent[head], full, timer)
			if head++; head == batchWindow {
				sent, head = append(sent[:0], sent[head:]...), 0
			}
		}
		m := ts.newMsg(msg)
		t.stamp(ts, m, msg.ID)
		f, err := t.js.PublishMsgAsync(m)
		if err != nil { // stalled, or no connection: alone, as Publish does (its own wait)
			errs[i] = t.publishWithin(ctx, ts, m, msg.ID, wait)
			continue
		}
		sent = append(sent, sentMsg{i: i, id: msg.ID, ts: ts, m: m, at: time.Now(), f: f})
	}
	for ; head < len(sent); head++ {
		errs[sent[head].i] = t.settle(ctx, &sent[head], full, timer)
	}
	return errs
}

// fullWait is a batch's wait for room in full streams: it starts at the
// first refusal and ends wait later, for every message refused.
type fullWait struct {
	wait  time.Duration
	until time.Time // zero until the first refusal
}

// settle waits for s's acknowledgement (for at most batchAckWait, or the
// publish timeout if longer, since it was sent; an answer already there
// wins over ctx and that deadline) and returns its outcome.
func (t *Transport) settle(ctx context.Context, s *sentMsg, full *fullWait, timer *time.Timer) error {
	select {
	case <-s.f.Ok():
		return nil
	case err := <-s.f.Err():
		return t.refused(ctx, s, full, err)
	default:
	}
	limit := max(batchAckWait, full.wait)
	timer.Reset(max(time.Until(s.at.Add(limit)), 0))
	defer timer.Stop()
	select {
	case <-s.f.Ok():
		return nil
	case err := <-s.f.Err():
		return t.refused(ctx, s, full, err)
	case <-ctx.Done():
		return fmt.Errorf("natsjs: publish to stream %s: %w (stored or not)", s.ts.stream, ctx.Err())
	case <-timer.C:
		return fmt.Errorf("natsjs: publish to stream %s: no acknowledgement within %v (stored or not)", s.ts.stream, limit)
	}
}

// refused is the outcome of s refused with err: a full stream's refusal is
// followed by publishing it alone until the batch's wait for room ends.
func (t *Transport) refused(ctx context.Context, s *sentMsg, full *fullWait, err error) error {
	if streamFull(err) {
		if full.until.IsZero() {
			full.until = time.Now().Add(full.wait)
		}
		return t.publish(ctx, s.ts, s.m, s.id, full.until) // once, if that time has passed
	}
	if errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.forget(s.ts) // deleted? the next Publish creates it again
	}
	return fmt.Errorf("natsjs: publish to stream %s: %w", s.ts.stream, err)
}

// publishWithin publishes m alone, as Publish does, trying a full stream
// again for up to wait (once when wait is 0).
func (t *Transport) publishWithin(ctx context.Context, ts *topicState, m *nats.Msg, id string, wait time.Duration) error {
	var until time.Time
	if wait > 0 {
		until = time.Now().Add(wait)
	}
	return t.publish(ctx, ts, m, id, until)
}
