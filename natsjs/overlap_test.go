package natsjs_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/natsjs"
	"github.com/nats-io/nats.go"
)

// gateDialer dials like net.Dialer, or refuses while blocked: the test
// keeps a client away from a restarted server for as long as it wants.
type gateDialer struct {
	blocked atomic.Bool
	d       net.Dialer
}

func (g *gateDialer) Dial(network, address string) (net.Conn, error) {
	if g.blocked.Load() {
		return nil, errors.New("test: dialing blocked")
	}
	return g.d.Dial(network, address)
}

// gatedPut is a dead-letter store whose Put says when it starts (entered),
// waits until release is closed, and says when it is done.
type gatedPut struct {
	broker.DeadLetterStore
	entered, release, done chan struct{}
	once                   sync.Once
}

func (g *gatedPut) Put(ctx context.Context, dl broker.DeadLetter) error {
	g.once.Do(func() { close(g.entered) })
	<-g.release
	err := g.DeadLetterStore.Put(ctx, dl)
	select {
	case g.done <- struct{}{}:
	default:
	}
	return err
}

// watchedGets is a dead-letter store that reports each Get on gets.
type watchedGets struct {
	broker.DeadLetterStore
	gets chan string
}

func (w *watchedGets) Get(ctx context.Context, id string) (broker.DeadLetter, bool, error) {
	dl, ok, err := w.DeadLetterStore.Get(ctx, id)
	select {
	case w.gets <- id:
	default:
	}
	return dl, ok, err
}

// within waits for ch, failing the test after d.
func within[T any](t *testing.T, what string, d time.Duration, ch <-chan T) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("timed out after %v waiting for %s", d, what)
	}
}

// TestOneEndStateWhenDeliveriesOverlap: broker A runs a message's last
// allowed attempt when the server restarts; A stays disconnected (its
// dialer blocked), so its keep-alives stop, and the restarted server
// delivers the message again to broker B, subscribed under the same name,
// which dead-letters it (delivered more often than the policy allows, or
// failed: B's handler fails permanently). A then reconnects and its
// handler succeeds. The message must end in one state at the subscriber:
// delivered, its dead letter gone from the store, whichever of A's success
// and B's dead letter is stored first (the test orders them with hooks: B's
// Put held until A's success is recorded and A looked the dead letter up,
// or A's handler held until B's Put is done).
func TestOneEndStateWhenDeliveriesOverlap(t *testing.T) {
	for _, deadLetterFirst := range []bool{true, false} {
		name := "success recorded first"
		if deadLetterFirst {
			name = "dead letter stored first"
		}
		t.Run(name, func(t *testing.T) {
			srv := newRestartable(t)
			dial := &gateDialer{}
			connA := srv.client(t, nats.SetCustomDialer(dial))
			connB := srv.client(t)
			topts := []natsjs.TransportOption{natsjs.WithPartitions(1), natsjs.WithAckWait(time.Second)}
			policy := broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: 1, Backoff: broker.ConstantBackoff(10 * time.Millisecond)})

			dlqA, _ := stores(t, connA)
			checkA := &watchedGets{DeadLetterStore: dlqA, gets: make(chan string, 16)}
			rA := newRig(t, connA, false, append(topts, natsjs.WithDeadLetterCheck(checkA)), policy)
			dlqB, _ := stores(t, connB)
			putB := &gatedPut{DeadLetterStore: dlqB, entered: make(chan struct{}), release: make(chan struct{}), done: make(chan struct{}, 4)}
			if deadLetterFirst {
				close(putB.release)
			}
			rB := newRig(t, connB, false, topts, policy, broker.WithDeadLetterStore(putB))

			const topic = "overlap"
			aRunning, releaseA := make(chan struct{}), make(chan struct{})
			var runningOnce, releaseOnce sync.Once
			release := func() { releaseOnce.Do(func() { close(releaseA) }) }
			defer release()
			var aDelivered, bRan atomic.Int64
			rA.subscribe(t, topic, "s", func(_ context.Context, m broker.Message) error {
				if m.Attempt == 1 {
					return errors.New("the first attempt fails")
				}
				runningOnce.Do(func() { close(aRunning) })
				<-releaseA
				aDelivered.Add(1)
				return nil
			})
			rA.publish(t, broker.Message{ID: "m", Topic: topic, Key: "k"})
			within(t, "A to run attempt 2", 10*time.Second, aRunning)
			rB.subscribe(t, topic, "s", func(context.Context, broker.Message) error {
				bRan.Add(1)
				return broker.Permanent(errors.New("B fails"))
			})

			// The fault: the server restarts while A holds the delivery,
			// and A stays away.
			dial.blocked.Store(true)
			srv.stop(t)
			srv.start(t)
			within(t, "B to dead-letter the message the server delivered again", 30*time.Second, putB.entered)

			reconnectA := func() {
				dial.blocked.Store(false)
				waitFor(t, "A to reconnect", connA.NATS().IsConnected)
			}
			drain := func() {
				for {
					select {
					case <-checkA.gets:
					default:
						return
					}
				}
			}
			if deadLetterFirst {
				within(t, "B's dead letter stored", 10*time.Second, putB.done)
				reconnectA()
				release()
			} else {
				reconnectA()
				drain()
				release()
				waitFor(t, "A's success recorded", func() bool {
					seen, err := rA.dedup.Seen(t.Context(), broker.DeliveryKey{Topic: topic, Subscriber: "s", MessageID: "m"})
					return err == nil && seen
				})
				within(t, "A to look the dead letter up after its success", 10*time.Second, checkA.gets)
				close(putB.release)
				within(t, "B's dead letter stored", 10*time.Second, putB.done)
			}

			waitFor(t, "the message to leave the stream", func() bool { return rA.streamMsgs(t, topic) == 0 })
			waitFor(t, "no dead letter of the delivered message", func() bool {
				dls, err := rA.dlq.List(t.Context(), broker.DeadLetterFilter{Topic: topic})
				return err == nil && len(dls) == 0
			})
			if n := aDelivered.Load(); n != 1 {
				t.Errorf("A delivered it %d times, want 1", n)
			}
			t.Logf("B's handler ran %d times (0: B dead-lettered it unrun, delivered more often than the policy allows)", bRan.Load())
		})
	}
}

// TestCloseDuringAnOutage: a handler that succeeds while the connection is
// down makes its delivery look its dead letter up (it may have overlapped
// another), which cannot be answered until the server is back. A Close
// whose deadline passes meanwhile cancels that lookup: the delivery ends
// (InFlight 0) within the grace, not after the lookup's 10 s timeout.
func TestCloseDuringAnOutage(t *testing.T) {
	srv := newRestartable(t)
	conn := srv.client(t)
	dlq, _ := stores(t, conn)
	tr, err := natsjs.NewTransport(conn.JetStream(), natsjs.WithLogger(discardLogger), natsjs.WithDeadLetterCheck(dlq), natsjs.WithPartitions(1))
	if err != nil {
		t.Fatal(err)
	}
	b, err := broker.New(broker.WithTransport(tr), broker.WithDeadLetterStore(dlq), broker.WithIdempotencyStore(nil), quiet)
	if err != nil {
		t.Fatal(err)
	}
	const topic = "outage"
	running, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	if _, err := b.Subscribe(topic, "s", func(context.Context, broker.Message) error {
		once.Do(func() { close(running) })
		<-release
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(t.Context(), broker.Message{ID: "m", Topic: topic, Key: "k"}); err != nil {
		t.Fatal(err)
	}
	within(t, "the handler to run", 10*time.Second, running)
	srv.stop(t)
	waitFor(t, "the client to notice", func() bool { return !conn.NATS().IsConnected() })
	close(release)

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_ = b.Close(ctx) // past its deadline: the message stays with the server, which is away
	most := time.Now().Add(broker.ShutdownGrace + time.Second)
	for subStats(b, topic, "s").InFlight != 0 {
		if time.Now().After(most) {
			t.Fatalf("the delivery still runs %v after Close returned", broker.ShutdownGrace+time.Second)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
