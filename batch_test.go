package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPublishBatchInMemory: each message is published as Publish would
// publish it; one refused does not stop the others; the error says which.
func TestPublishBatchInMemory(t *testing.T) {
	bubble(t, func(t *testing.T) {
		var c calls
		obs := &eventLog{}
		b := newTestBroker(t, WithObserver(obs))
		_, err := b.Subscribe("t", "s", okHandler(&c))
		require.NoError(t, err)
		require.NoError(t, b.PublishBatch(context.Background(), []Message{{ID: "a", Topic: "t"}, {ID: "b", Topic: "t"}}))
		err = b.PublishBatch(context.Background(), []Message{{ID: "c", Topic: "t"}, {Topic: "t"}, {ID: "d", Topic: "t"}})
		var be *BatchError
		require.ErrorAs(t, err, &be)
		require.Len(t, be.Errs, 3)
		assert.NoError(t, be.Errs[0])
		assert.ErrorIs(t, be.Errs[1], ErrInvalidMessage)
		assert.NoError(t, be.Errs[2])
		assert.ErrorIs(t, err, ErrInvalidMessage, "unwraps to the refusals")
		assert.Contains(t, err.Error(), "1 of 3 messages refused")
		settle(t, b)
		assert.Equal(t, []string{"a", "b", "c", "d"}, c.ids(), "in order, the refused one left out")
		assert.NoError(t, b.PublishBatch(context.Background(), nil))
		require.NoError(t, b.Close(context.Background()))
		err = b.PublishBatch(context.Background(), []Message{{ID: "e", Topic: "t"}})
		assert.ErrorIs(t, err, ErrClosed)
	})
}

// TestPublishBatchFullQueue: a full topic queue refuses the messages that
// do not fit (ErrQueueFull), counted as rejected; the others are queued.
func TestPublishBatchFullQueue(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithQueueSize(2), WithPublishTimeout(0))
		release := make(chan struct{})
		_, err := b.Subscribe("t", "s", blockUntil(release), LaneSize(1))
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m-0", Topic: "t"}))
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m-1", Topic: "t"}))
		idle() // m-0 runs, m-1 waits in the lane: the topic queue is empty
		msgs := make([]Message, 4)
		for i := range msgs {
			msgs[i] = Message{ID: fmt.Sprintf("n-%d", i), Topic: "t"}
		}
		err = b.PublishBatch(context.Background(), msgs)
		var be *BatchError
		require.ErrorAs(t, err, &be)
		assert.ErrorIs(t, err, ErrQueueFull)
		var ok, full int
		for _, e := range be.Errs {
			switch {
			case e == nil:
				ok++
			case errors.Is(e, ErrQueueFull):
				full++
			}
		}
		assert.Equal(t, 4, ok+full)
		assert.GreaterOrEqual(t, ok, 2)
		assert.Equal(t, uint64(full), b.Stats().Topics["t"].Rejected)
		close(release)
		settle(t, b)
	})
}

// batchTransport is the fake transport with PublishBatch: it records the
// batches and answers each message with answer(msg), or with errs.
type batchTransport struct {
	*fakeTransport
	mu      sync.Mutex
	batches [][]Message
	waits   []time.Duration
	answer  func(Message) error
	short   bool // answer one error fewer than messages
}

func (tr *batchTransport) PublishBatch(ctx context.Context, msgs []Message, wait time.Duration) []error {
	tr.mu.Lock()
	tr.batches = append(tr.batches, append([]Message(nil), msgs...))
	tr.waits = append(tr.waits, wait)
	tr.mu.Unlock()
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		if tr.answer != nil {
			if errs[i] = tr.answer(m); errs[i] != nil {
				continue
			}
		}
		errs[i] = tr.fakeTransport.Publish(ctx, m)
	}
	if tr.short {
		return errs[1:]
	}
	return errs
}

// TestPublishBatchOverATransport: a BatchTransport gets the messages ready
// for it in one call (hooks run, PublishedAt set, invalid ones left out)
// with the publish timeout; its answers are recorded per message as
// Publish records them; an answer of the wrong length fails every message.
func TestPublishBatchOverATransport(t *testing.T) {
	tr := &batchTransport{fakeTransport: newFakeTransport(), answer: func(m Message) error {
		if m.ID == "full" {
			return fmt.Errorf("%w: fake", ErrQueueFull)
		}
		return nil
	}}
	obs := &eventLog{}
	hook := func(_ context.Context, m *Message) error { m.Headers["hooked"] = "yes"; return nil }
	b := newTestBroker(t, WithTransport(tr), WithObserver(obs), WithPublishHook(hook), WithPublishTimeout(3*time.Second))
	var c calls
	_, err := b.Subscribe("t", "s", okHandler(&c))
	require.NoError(t, err)
	before := time.Now()
	err = b.PublishBatch(context.Background(), []Message{{ID: "a", Topic: "t"}, {ID: "", Topic: "t"}, {ID: "full", Topic: "t"}, {ID: "b", Topic: "t"}})
	var be *BatchError
	require.ErrorAs(t, err, &be)
	assert.NoError(t, be.Errs[0])
	assert.ErrorIs(t, be.Errs[1], ErrInvalidMessage)
	assert.ErrorIs(t, be.Errs[2], ErrQueueFull)
	assert.NoError(t, be.Errs[3])
	tr.mu.Lock()
	require.Len(t, tr.batches, 1, "one call")
	var ids []string
	for _, m := range tr.batches[0] {
		ids = append(ids, m.ID)
		assert.Equal(t, "yes", m.Headers["hooked"])
		assert.False(t, m.PublishedAt.Before(before))
	}
	assert.Equal(t, []string{"a", "full", "b"}, ids)
	assert.Equal(t, []time.Duration{3 * time.Second}, tr.waits)
	tr.mu.Unlock()
	require.Eventually(t, func() bool { return c.len() == 2 }, 10*time.Second, time.Millisecond)
	ts := b.Stats().Topics["t"]
	assert.Equal(t, uint64(2), ts.Published)
	assert.Equal(t, uint64(1), ts.Rejected)

	tr.short = true
	err = b.PublishBatch(context.Background(), []Message{{ID: "c", Topic: "t"}, {ID: "d", Topic: "t"}})
	require.ErrorAs(t, err, &be)
	for _, e := range be.Errs {
		assert.ErrorContains(t, e, "answered 1 of 2")
	}
}

// A closed broker over a batch transport refuses each message of a batch
// with ErrClosed and hands the transport nothing.
func TestPublishBatchClosedOverATransport(t *testing.T) {
	tr := &batchTransport{fakeTransport: newFakeTransport()}
	b := newTestBroker(t, WithTransport(tr))
	require.NoError(t, b.Close(context.Background()))
	err := b.PublishBatch(context.Background(), []Message{{ID: "a", Topic: "t"}, {ID: "b", Topic: "t"}})
	var be *BatchError
	require.ErrorAs(t, err, &be)
	require.Len(t, be.Errs, 2)
	for _, e := range be.Errs {
		assert.ErrorIs(t, e, ErrClosed)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	assert.Empty(t, tr.batches, "a closed broker sends nothing")
}
