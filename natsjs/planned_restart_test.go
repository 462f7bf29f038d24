package natsjs_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/natsjs"
	"github.com/nats-io/nats.go"
)

// countingHandler counts log records by level, and keeps the messages of
// those at INFO or above.
type countingHandler struct {
	mu     sync.Mutex
	counts map[slog.Level]int
	lines  []string
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *countingHandler) WithGroup(string) slog.Handler            { return h }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.counts == nil {
		h.counts = map[slog.Level]int{}
	}
	h.counts[r.Level]++
	if r.Level >= slog.LevelInfo {
		line := r.Level.String() + " " + r.Message
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "error" || a.Key == "consumer" {
				line += " " + a.Key + "=" + a.Value.String()
			}
			return true
		})
		h.lines = append(h.lines, line)
	}
	return nil
}

func (h *countingHandler) count(l slog.Level) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.counts[l]
}

// keysByPartition returns a key for each of n partitions.
func keysByPartition(n int) []string {
	keys := make([]string, n)
	for i, found := 0, 0; found < n; i++ {
		k := fmt.Sprintf("key-%d", i)
		if p := natsjs.Partition(k, "", n); keys[p] == "" {
			keys[p] = k
			found++
		}
	}
	return keys
}

// TestPlannedServerRestart: the server is shut down gracefully (pulls
// waiting at it get 409 Server Shutdown) while every partition of a
// subscriber has a pull outstanding, then started again on the same port
// and directory. Each partition resumes within the client's reconnect wait
// plus a second of the server accepting connections again, and no ERROR is
// logged. Resume: from the restarted server being ready to the handler
// starting that partition's first message published after it (the publish
// is tried again until the client is back). With natsjs.Connect's
// reconnect wait (DefaultReconnectWait) and with nats.go's (2 s).
func TestPlannedServerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a server")
	}
	tests := []struct {
		name string
		wait time.Duration
		opts []nats.Option
	}{
		{"natsjs.Connect's default reconnect wait", natsjs.DefaultReconnectWait, nil},
		{"nats.go's default reconnect wait", nats.DefaultReconnectWait, []nats.Option{nats.ReconnectWait(nats.DefaultReconnectWait)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { plannedRestarts(t, tt.wait, tt.opts) })
	}
}

func plannedRestarts(t *testing.T, wait time.Duration, opts []nats.Option) {
	const parts, restarts = 8, 3
	srv := newRestartable(t)
	logs := &countingHandler{}
	conn, err := natsjs.Connect(srv.url(), opts...)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(func() { closeConn(t, conn) })
	r := newRig(t, conn, false, []natsjs.TransportOption{natsjs.WithPartitions(parts), natsjs.WithLogger(slog.New(logs))})
	const topic = "planned"
	keys := keysByPartition(parts)
	var mu sync.Mutex
	started := map[string]time.Time{}
	r.subscribe(t, topic, "s", func(_ context.Context, m broker.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := started[m.ID]; !ok {
			started[m.ID] = time.Now()
		}
		return nil
	}, broker.Concurrency(parts))
	handled := func(id string) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			_, ok := started[id]
			return ok
		}
	}
	// Every partition has run a message, so each has a pull waiting.
	for p, k := range keys {
		id := fmt.Sprintf("warm-%d", p)
		r.publish(t, broker.Message{ID: id, Topic: topic, Key: k})
		waitFor(t, id+" handled", handled(id))
	}

	var worst time.Duration
	var all []time.Duration
	for round := range restarts {
		waitFor(t, "a pull waiting at every partition", func() bool {
			infos, err := r.tr.ConsumerInfo(t.Context(), topic, "s")
			if err != nil {
				return false
			}
			for _, in := range infos[:parts] {
				if in.NumWaiting == 0 {
					return false
				}
			}
			return true
		})
		srv.stop(t)
		srv.start(t)
		ready := time.Now()
		var pubs sync.WaitGroup
		var refused atomic.Int64
		for p, k := range keys {
			id := fmt.Sprintf("r%d-p%d", round, p)
			pubs.Go(func() { // ends once accepted (the same ID is safe to publish again)
				for r.b.Publish(context.Background(), broker.Message{ID: id, Topic: topic, Key: k}) != nil {
					refused.Add(1)
					time.Sleep(10 * time.Millisecond)
				}
			})
		}
		pubs.Wait()
		deadline := time.Now().Add(30 * time.Second)
		for p := range keys {
			id := fmt.Sprintf("r%d-p%d", round, p)
			for !handled(id)() {
				if time.Now().After(deadline) {
					t.Fatalf("round %d: partition %d did not resume within 30 s", round, p)
				}
				time.Sleep(5 * time.Millisecond)
			}
			mu.Lock()
			d := started[id].Sub(ready)
			mu.Unlock()
			all = append(all, d)
			worst = max(worst, d)
		}
	}
	slices.Sort(all)
	t.Logf("%d planned restarts, %d partitions: resume after the server is ready: median %v, max %v; WARN %d, ERROR %d",
		restarts, parts, all[len(all)/2].Round(time.Millisecond), worst.Round(time.Millisecond), logs.count(slog.LevelWarn), logs.count(slog.LevelError))
	logs.mu.Lock()
	gone := 0
	for _, l := range logs.lines {
		if strings.Contains(l, "consumer is gone") {
			gone++
		}
		if strings.HasPrefix(l, "ERROR") {
			t.Errorf("logged %s", l)
		}
	}
	logs.mu.Unlock()
	if gone > 0 {
		t.Errorf("%d \"consumer is gone\" warnings: the consumers were never deleted", gone)
	}
	if limit := wait + nats.DefaultReconnectJitter + time.Second; worst > limit {
		t.Errorf("a partition resumed %v after the server was ready, more than the reconnect wait plus jitter plus 1 s (%v)", worst, limit)
	}
}
