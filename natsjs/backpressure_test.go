package natsjs_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/natsjs"
)

// publishWithin publishes m and returns its error and how long it took,
// failing the test if it has not returned after 10 s (a hang).
func publishWithin(t *testing.T, b *broker.Broker, m broker.Message) (error, time.Duration) {
	t.Helper()
	return publishBefore(t, b, m, 0)
}

// publishBefore is publishWithin with a caller's deadline (0: none).
func publishBefore(t *testing.T, b *broker.Broker, m broker.Message, deadline time.Duration) (error, time.Duration) {
	t.Helper()
	type result struct {
		err  error
		took time.Duration
	}
	done := make(chan result, 1)
	go func() { // ends when Publish returns
		ctx := context.Background()
		if deadline > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, deadline)
			defer cancel()
		}
		start := time.Now()
		err := b.Publish(ctx, m)
		done <- result{err, time.Since(start)}
	}()
	select {
	case r := <-done:
		return r.err, r.took
	case <-time.After(10 * time.Second):
		t.Fatalf("Publish(%q) still blocked after 10s", m.ID)
		return nil, 0
	}
}

// TestBackpressure: a topic's stream at its limit makes Publish wait for
// room until the publish timeout and then return ErrQueueFull (at once
// with a timeout of 0, also when the caller's context has a later
// deadline), counted as rejected; once the subscriber catches up there is
// room again. It never hangs.
func TestBackpressure(t *testing.T) {
	conn := embedded(t, "")
	const timeout = 300 * time.Millisecond
	tests := []struct {
		name           string
		timeout        time.Duration
		callerDeadline time.Duration // 0: none
	}{
		{"publish timeout", timeout, 0},
		{"publish timeout, later caller deadline", timeout, 20 * time.Second},
		{"no publish timeout", 0, 0},
		{"no publish timeout, caller deadline", 0, 20 * time.Second},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, conn, false, []natsjs.TransportOption{natsjs.WithQueueSize(2)}, broker.WithPublishTimeout(tt.timeout))
			topic := fmt.Sprintf("full-%d", i)
			release := make(chan struct{})
			var once sync.Once
			free := func() { once.Do(func() { close(release) }) }
			t.Cleanup(free) // before the broker's Close
			c := &calls{}
			r.subscribe(t, topic, "slow", c.handler("", func(ctx context.Context, m broker.Message) error {
				select {
				case <-release:
				case <-ctx.Done():
				}
				return nil
			}))
			r.publish(t, broker.Message{ID: "a", Topic: topic}) // delivered, its handler blocks
			r.publish(t, broker.Message{ID: "b", Topic: topic}) // waits
			err, took := publishBefore(t, r.b, broker.Message{ID: "c", Topic: topic}, tt.callerDeadline)
			if !errors.Is(err, broker.ErrQueueFull) || !strings.Contains(err.Error(), topic) {
				t.Fatalf("Publish into a full stream: %v; want ErrQueueFull", err)
			}
			if took < tt.timeout {
				t.Errorf("Publish gave up after %v, before the publish timeout %v", took, tt.timeout)
			}
			if tt.callerDeadline > 0 && took >= tt.callerDeadline/2 {
				t.Errorf("Publish took %v: it waited for the caller's deadline (%v), not the publish timeout (%v)", took, tt.callerDeadline, tt.timeout)
			}
			if st := r.b.Stats().Topics[topic]; st.Rejected != 1 || st.Published != 2 {
				t.Errorf("topic stats %+v: want Published 2, Rejected 1", st)
			}
			free()
			waitFor(t, "room in the stream", func() bool { return r.streamMsgs(t, topic) == 0 })
			if err, _ := publishWithin(t, r.b, broker.Message{ID: "c", Topic: topic}); err != nil {
				t.Errorf("Publish once the subscriber caught up: %v", err)
			}
			waitFor(t, "c", func() bool { return len(c.of("c")) == 1 })
		})
	}
}

// TestTransportPublishWithoutDeadline: used directly, the transport tries a
// full stream once when ctx has no deadline.
func TestTransportPublishWithoutDeadline(t *testing.T) {
	conn := embedded(t, "")
	r := newRig(t, conn, false, []natsjs.TransportOption{natsjs.WithQueueSize(1)})
	release := make(chan struct{})
	t.Cleanup(func() { close(release) }) // before the broker's Close
	r.subscribe(t, "one", "s", func(ctx context.Context, m broker.Message) error {
		<-release
		return nil
	})
	r.publish(t, broker.Message{ID: "a", Topic: "one"})
	tr, err := natsjs.NewTransport(conn.JetStream(), natsjs.WithQueueSize(1))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close(context.Background())
	m := broker.Message{ID: "b", Topic: "one", PublishedAt: time.Now()}
	if err := tr.Publish(context.Background(), m); !errors.Is(err, broker.ErrQueueFull) {
		t.Errorf("Publish without a deadline: %v; want ErrQueueFull at once", err)
	}
}
