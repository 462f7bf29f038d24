// Command durable is one binary whose messages survive it: a NATS server
// runs inside the process with its files in a directory (natsjs.Open). It
// publishes -n messages, handles them, and prints what happened. Kill it
// while it works (Ctrl-C, kill -9, or -crash-after k to exit abruptly
// after k messages) and start it again on the same directory: the messages
// left over are delivered then, before the new ones.
//
//	go run ./examples/durable                            # a temporary directory, removed at the end
//	go run ./examples/durable -dir ./data -crash-after 30
//	go run ./examples/durable -dir ./data -n 0           # the rest of the first run
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/natsjs"
)

func main() {
	dir := flag.String("dir", "", "directory of the embedded server's files (default: a temporary one, removed at the end)")
	n := flag.Int("n", 100, "messages to publish in this run")
	crashAfter := flag.Int("crash-after", 0, "exit abruptly (no Close) after handling this many messages (0: never)")
	idle := flag.Duration("idle", 1500*time.Millisecond, "with -dir: once this run's messages are handled, wait this long after the last delivery for leftovers\n(a message in flight when a run was killed comes back after the AckWait, 1 s here)")
	flag.Parse()
	if err := run(*dir, *n, *crashAfter, *idle); err != nil {
		fmt.Fprintln(os.Stderr, "durable:", err)
		os.Exit(1)
	}
}

func run(dir string, n, crashAfter int, idle time.Duration) error {
	if dir == "" { // a new directory: nothing left over to wait for
		tmp, err := os.MkdirTemp("", "durable-example")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir, idle = tmp, 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	quiet := slog.New(slog.DiscardHandler)
	b, err := natsjs.Open(dir, natsjs.Config{
		Logger: quiet,
		// A message in flight when a run is killed comes back after this.
		Transport: []natsjs.TransportOption{natsjs.WithAckWait(time.Second)},
	}, broker.WithRetryPolicy(broker.RetryPolicy{
		MaxRetries: 2, Backoff: broker.ConstantBackoff(20 * time.Millisecond),
	}))
	if err != nil {
		return err
	}
	runID := time.Now().Format("150405.000")
	var (
		mu       sync.Mutex
		mine     int // of this run
		earlier  int // left over by an earlier run
		handled  atomic.Int64
		lastSeen atomic.Int64 // unix nanoseconds of the last delivery
	)
	_, err = b.Subscribe("jobs", "worker", func(_ context.Context, m broker.Message) error {
		if strings.HasSuffix(m.ID, "-7") && m.Attempt == 1 {
			return errors.New("flaky: fails its first attempt") // retried after 20 ms
		}
		mu.Lock()
		if strings.HasPrefix(m.ID, runID+"-") {
			mine++
		} else {
			earlier++
			fmt.Printf("left over by an earlier run: %s (attempt %d)\n", m.ID, m.Attempt)
		}
		mu.Unlock()
		lastSeen.Store(time.Now().UnixNano())
		if k := handled.Add(1); crashAfter > 0 && k == int64(crashAfter) {
			fmt.Printf("exiting abruptly after %d messages; run again with -dir %s -n 0 for the rest\n", k, dir)
			os.Exit(3)
		}
		return nil
	}, broker.Concurrency(4))
	if err != nil {
		return errors.Join(err, b.Close(context.Background()))
	}

	for i := range n {
		m := broker.Message{ID: fmt.Sprintf("%s-%d", runID, i), Topic: "jobs", Payload: []byte(fmt.Sprintf("job %d", i))}
		if err := b.Publish(ctx, m); err != nil {
			return errors.Join(fmt.Errorf("publish %s: %w", m.ID, err), b.Close(context.Background()))
		}
	}
	fmt.Printf("published %d messages into %s\n", n, dir)

	// Wait for this run's messages, then for the leftovers to stop coming.
	lastSeen.Store(time.Now().UnixNano())
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(time.Minute)
wait:
	for {
		select {
		case <-ctx.Done():
			fmt.Println("interrupted: unfinished messages stay in", dir)
			break wait
		case <-deadline:
			fmt.Println("gave up waiting after a minute")
			break wait
		case <-tick.C:
			mu.Lock()
			all := mine == n
			mu.Unlock()
			if all && time.Since(time.Unix(0, lastSeen.Load())) >= idle {
				break wait
			}
		}
	}
	st := b.Stats().Topics["jobs"].Subscribers["worker"]
	mu.Lock()
	fmt.Printf("handled %d of this run's %d messages and %d left over by an earlier run; %d attempts, %d retries, %d dead letters\n",
		mine, n, earlier, st.Attempts, st.Retries, st.DeadLettered)
	mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return b.Close(ctx) // shuts the embedded server down; what is unfinished stays in dir
}
