// Command replicas runs two brokers, as two replicas of a service would,
// sharing one NATS server (embedded here, with a port; in production a NATS
// URL or cluster): both subscribe as "workers" to one topic of four
// partitions and split its messages between them. Each message is handled
// by one of them, and the messages of one Key run one at a time, in publish
// order, whichever replica takes them.
//
//	go run ./examples/replicas
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/natsjs"
)

func main() {
	if err := run(200, 8); err != nil {
		fmt.Fprintln(os.Stderr, "replicas:", err)
		os.Exit(1)
	}
}

func run(n, keys int) error {
	dir, err := os.MkdirTemp("", "replicas-example")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	server, err := natsjs.Embedded(dir, natsjs.Listen("127.0.0.1", 0))
	if err != nil {
		return err
	}
	defer server.Close(ctx)
	fmt.Println("NATS at", server.ClientURL())

	var (
		mu      sync.Mutex
		byHost  [2]int
		lastSeq = map[string]int{} // per Key, the last sequence number handled
		wrong   []string
		done    = make(chan struct{})
		total   int
	)
	quiet := slog.New(slog.DiscardHandler)
	var brokers []*broker.Broker
	for replica := range 2 {
		conn, err := natsjs.Connect(server.ClientURL()) // each replica has its own connection
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		b, err := natsjs.New(ctx, conn.JetStream(), natsjs.Config{
			Transport: []natsjs.TransportOption{natsjs.WithPartitions(4)},
			Logger:    quiet,
		})
		if err != nil {
			return err
		}
		brokers = append(brokers, b)
		defer b.Close(ctx) // on an early return; a second Close is harmless
		_, err = b.Subscribe("orders", "workers", func(_ context.Context, m broker.Message) error {
			seq, _ := strconv.Atoi(m.Headers["seq"])
			time.Sleep(time.Millisecond) // work
			mu.Lock()
			defer mu.Unlock()
			if last, ok := lastSeq[m.Key]; ok && seq <= last {
				wrong = append(wrong, fmt.Sprintf("%s: seq %d after %d", m.Key, seq, last))
			}
			lastSeq[m.Key] = seq
			byHost[replica]++
			if total++; total == n {
				close(done)
			}
			return nil
		}, broker.Concurrency(2))
		if err != nil {
			return err
		}
	}

	start := time.Now()
	for i := range n {
		key := "customer-" + strconv.Itoa(i%keys)
		m := broker.Message{ID: "order-" + strconv.Itoa(i), Topic: "orders", Key: key, Headers: map[string]string{"seq": strconv.Itoa(i / keys)}}
		if err := brokers[i%2].Publish(ctx, m); err != nil {
			return err
		}
	}
	select {
	case <-done:
	case <-time.After(time.Minute):
		return errors.New("not every message was handled within a minute")
	}
	took := time.Since(start).Round(time.Millisecond)
	for _, b := range brokers { // Stats are final once Close returned
		if err := b.Close(ctx); err != nil {
			return err
		}
	}
	mu.Lock()
	defer mu.Unlock()
	fmt.Printf("%d messages over %d keys in %v: replica 0 handled %d, replica 1 handled %d\n", n, keys, took, byHost[0], byHost[1])
	for i, b := range brokers {
		ss := b.Stats().Topics["orders"].Subscribers["workers"]
		fmt.Printf("replica %d Stats (this process's share): routed %d, delivered %d\n", i, ss.Routed, ss.Delivered)
	}
	if len(wrong) > 0 {
		return fmt.Errorf("per-key order broken: %v", wrong)
	}
	fmt.Println("per-key order held across the two replicas")
	return nil
}
