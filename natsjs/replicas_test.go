package natsjs_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/natsjs"
)

// TestReplicasShareTheWork: two brokers on two connections to one server,
// each subscribed as "workers" (four partitions, Concurrency 4), split the
// messages between them: each message is handled by one of them (a second
// handling only as a redelivery, at a later attempt), both get some, the
// messages of one Key never run at once and run in publish order across the
// two, and each broker's Stats count its own share.
func TestReplicasShareTheWork(t *testing.T) {
	srv := embedded(t, "", natsjs.Listen("127.0.0.1", 0))
	topts := []natsjs.TransportOption{natsjs.WithPartitions(4)}
	var rigs []*rig
	for range 2 {
		conn, err := natsjs.Connect(srv.ClientURL())
		if err != nil {
			t.Fatalf("Connect: %v", err)
		}
		t.Cleanup(func() { closeConn(t, conn) })
		rigs = append(rigs, newRig(t, conn, false, topts))
	}

	const n, keys = 400, 8
	var mu sync.Mutex
	running := map[string]string{} // Key → ID of the message running now
	var order []string             // "key/seq/attempt", in start order
	var overlaps []string
	c := &calls{}
	h := func(who string) broker.Handler {
		return c.handler(who, func(ctx context.Context, m broker.Message) error {
			mu.Lock()
			if other, busy := running[m.Key]; busy {
				overlaps = append(overlaps, fmt.Sprintf("%s ran while %s (same Key) ran", m.ID, other))
			}
			running[m.Key] = m.ID
			order = append(order, m.Key+"/"+m.Headers["seq"]+"/"+strconv.Itoa(m.Attempt))
			mu.Unlock()
			time.Sleep(200 * time.Microsecond) // work, so that both brokers are needed
			mu.Lock()
			delete(running, m.Key)
			mu.Unlock()
			return nil
		})
	}
	for i, r := range rigs {
		r.subscribe(t, "jobs", "workers", h(strconv.Itoa(i)), broker.Concurrency(4))
	}
	w := watchT(t, watch(rigs[0].tr, "jobs", "workers"))

	want := ids("job", n)
	for i, id := range want {
		key := fmt.Sprintf("key-%d", i%keys)
		rigs[i%2].publish(t, broker.Message{ID: id, Topic: "jobs", Key: key, Headers: map[string]string{"seq": strconv.Itoa(i / keys)}})
	}
	handledBy := func() (map[string]int, [2]int) {
		byID := map[string]int{}
		var per [2]int
		for _, cl := range c.snapshot() {
			byID[cl.msg.ID]++
			i, _ := strconv.Atoi(cl.who)
			per[i]++
		}
		return byID, per
	}
	waitFor(t, "every message handled", func() bool { m, _ := handledBy(); return len(m) == n })
	// A handler is recorded when it starts; its broker counts the outcome
	// after it returns. Wait for the last outcomes before reading Stats.
	waitFor(t, "every attempt counted", func() bool {
		var delivered uint64
		for _, r := range rigs {
			ss := subStats(r.b, "jobs", "workers")
			if ss.InFlight != 0 {
				return false
			}
			delivered += ss.Delivered
		}
		return delivered >= n
	})
	w.halt()

	byID, per := handledBy()
	if m := missing(want, byID); len(m) > 0 {
		t.Errorf("never handled: %v", m)
	}
	for id, k := range byID {
		if k > 1 {
			if at := c.attempts(id); at[len(at)-1] < 2 {
				t.Errorf("%s handled %d times, attempts %v: a second handling that is not a redelivery", id, k, at)
			}
		}
	}
	if per[0] == 0 || per[1] == 0 {
		t.Errorf("handled %d and %d: one broker did all the work", per[0], per[1])
	}
	mu.Lock()
	defer mu.Unlock()
	for _, o := range overlaps {
		t.Error(o)
	}
	last := map[string]int{}
	for _, o := range order {
		f := strings.Split(o, "/")
		seq, _ := strconv.Atoi(f[1])
		if prev, ok := last[f[0]]; ok && (seq < prev || seq == prev && f[2] == "1") {
			t.Errorf("%s seq %d started after seq %d of its Key", f[0], seq, prev)
		}
		last[f[0]] = seq
	}
	var routed, delivered uint64
	for i, r := range rigs {
		ss := subStats(r.b, "jobs", "workers")
		if s := conserved(ss); s != "" {
			t.Errorf("broker %d: %s", i, s)
		}
		if int(ss.Delivered) != per[i] {
			t.Errorf("broker %d: Delivered %d, its handler ran %d times", i, ss.Delivered, per[i])
		}
		routed += ss.Routed
		delivered += ss.Delivered
	}
	if delivered < n || routed < n {
		t.Errorf("the brokers routed %d and delivered %d in all; want at least %d each", routed, delivered, n)
	}
	t.Logf("broker 0 handled %d, broker 1 handled %d", per[0], per[1])
}
