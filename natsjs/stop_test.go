package natsjs_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/natsjs"
)

// slowDedup is an IdempotencyStore whose Seen takes 50 ms (a store over a
// network), counting its calls.
type slowDedup struct {
	*broker.MemoryIdempotencyStore
	seen atomic.Int64
}

func (s *slowDedup) Seen(ctx context.Context, k broker.DeliveryKey) (bool, error) {
	s.seen.Add(1)
	time.Sleep(50 * time.Millisecond)
	return s.MemoryIdempotencyStore.Seen(ctx, k)
}

// TestStopAtOnceAsksNoStore: once an Unsubscribe's deadline has passed,
// the keyless messages queued in the process are handed back unstarted
// without a dedup check each (nor, via TransportSubscriber.Stopping, the
// dead-letter lookup of a redelivered one, which this test does not reach): the Unsubscribe
// returns within its grace and nil (the one handler running honoured its
// context), and no delivery of the subscription goes on after it returned.
// (Found by a randomized black-box test: the dedup check ran first, so a
// slow store made Unsubscribe overrun the grace and report an abandoned
// handler while deliveries went on.)
func TestStopAtOnceAsksNoStore(t *testing.T) {
	dd := &slowDedup{MemoryIdempotencyStore: broker.NewMemoryIdempotencyStore(time.Minute, 1000)}
	cfg := natsjs.Config{Logger: slog.New(slog.DiscardHandler), Dedup: dd,
		Transport: []natsjs.TransportOption{natsjs.WithAckWait(time.Second)}}
	b, err := natsjs.Open(t.TempDir(), cfg, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	started := make(chan struct{}, 1000)
	sub, err := b.Subscribe("t", "s", func(ctx context.Context, m broker.Message) error {
		started <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	}, broker.Concurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	msgs := make([]broker.Message, 100)
	for i := range msgs {
		msgs[i] = broker.Message{ID: fmt.Sprint("m", i), Topic: "t"} // keyless
	}
	if err := b.PublishBatch(context.Background(), msgs); err != nil {
		t.Fatal(err)
	}
	<-started
	waitFor(t, "the keyless queue to fill", func() bool { return dd.seen.Load() >= 1 })
	time.Sleep(100 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	if err := sub.Unsubscribe(ctx); err != nil {
		t.Errorf("Unsubscribe = %v; want nil: the handler running honoured its context", err)
	}
	seenAtReturn := dd.seen.Load()
	if inFlight := b.Stats().Topics["t"].Subscribers["s"].InFlight; inFlight != 0 {
		t.Errorf("InFlight %d when Unsubscribe returned", inFlight)
	}
	time.Sleep(time.Second)
	if n := dd.seen.Load() - seenAtReturn; n != 0 {
		t.Errorf("%d dedup checks of the subscription after Unsubscribe returned", n)
	}
}
