package natsjs_test

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/natsjs"
	"github.com/nats-io/nats.go"
)

// TestServerRestart: the NATS server (embedded, with a port) is shut down
// while messages are being published and handled, then started again on
// the same directory and port. The broker's connection reconnects, its
// consumers pull again, and every message whose Publish returned nil is
// handled; nothing is lost. Publishes refused during the outage are tried
// again by the test (same ID: the server drops a copy it already has);
// the publisher keeps a few dozen messages ahead of the handler, so both
// are mid-flight when the server goes.
func TestServerRestart(t *testing.T) {
	dir := t.TempDir()
	srv1, err := natsjs.Embedded(dir, natsjs.Listen("127.0.0.1", 0))
	if err != nil {
		t.Fatalf("Embedded: %v", err)
	}
	u, err := url.Parse(srv1.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	client, err := natsjs.Connect(srv1.ClientURL(), nats.ReconnectWait(20*time.Millisecond), nats.ReconnectJitter(0, 0))
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(func() { closeConn(t, client) })
	r := newRig(t, client, false, []natsjs.TransportOption{natsjs.WithPartitions(2), natsjs.WithAckWait(2 * time.Second)})

	var mu sync.Mutex
	handled := map[string]int{}
	r.subscribe(t, "restart", "s", func(_ context.Context, m broker.Message) error {
		mu.Lock()
		handled[m.ID]++
		mu.Unlock()
		return nil
	}, broker.Concurrency(2))
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(handled)
	}
	w := watchT(t, watch(r.tr, "restart", "s"))

	const n, window = 300, 30
	want := ids("m", n)
	accepted := make(chan string, n)
	stop := make(chan struct{})
	var pub sync.WaitGroup
	// refused counts the publishes that failed (the server away) and
	// were tried again.
	var refused atomic.Int64
	pub.Go(func() { // ends when every message is accepted, or at stop
		defer close(accepted)
		for i, id := range want {
			for count() < i-window { // keep publishing alongside the handling
				select {
				case <-stop:
					return
				case <-time.After(2 * time.Millisecond):
				}
			}
			for {
				err := r.b.Publish(context.Background(), broker.Message{ID: id, Topic: "restart", Key: fmt.Sprintf("k%d", len(id)%5)})
				if err == nil {
					accepted <- id
					break
				}
				refused.Add(1)
				select { // the server is away: try again soon
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		}
	})
	defer pub.Wait()
	defer close(stop)

	waitFor(t, "a third of the messages handled", func() bool { return count() >= n/3 })
	closeConn(t, srv1) // the server goes away mid-flight
	waitFor(t, "the client to notice", func() bool { return !client.NATS().IsConnected() })
	atOutage := count()
	embedded(t, dir, natsjs.Listen("127.0.0.1", port))
	waitFor(t, "the client to reconnect", client.NATS().IsConnected)

	var got []string
	deadline := time.After(30 * time.Second)
collect:
	for {
		select {
		case id, ok := <-accepted:
			if !ok {
				break collect
			}
			got = append(got, id)
		case <-deadline:
			t.Fatalf("publishing took over 30s (%d of %d accepted)", len(got), n)
		}
	}
	if len(got) != n {
		t.Fatalf("%d of %d publishes accepted", len(got), n)
	}
	waitFor(t, "every accepted message handled", func() bool { return count() == n })
	w.halt()
	mu.Lock()
	defer mu.Unlock()
	if m := missing(want, handled); len(m) > 0 {
		t.Errorf("accepted but never handled: %v", m)
	}
	again := 0
	for _, c := range handled {
		again += c - 1
	}
	t.Logf("%d messages, %d handled before the outage, %d publishes refused during it and tried again, %d handled again (redelivered across the restart)",
		n, atOutage, refused.Load(), again)
}
