package bench

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestNatsJSCells runs the natsjs columns, which are extras (so TestCells
// leaves them out), on every workload at a small message count: every
// subscriber gets every message, once, and in publish order with
// Concurrency 1 where nothing fails (the workloads' messages are keyless:
// a retry holds none of the others, so W5's retried messages arrive late).
// natsjs-file, which differs only in where the server keeps the streams,
// runs W1, W5 and W7; natsjs-mem-p8 runs W1; the -batch columns
// (PublishBatch, and the harness's Flush of each publisher's last batch)
// run W1, W3 and W5.
func TestNatsJSCells(t *testing.T) {
	n := 200
	if testing.Short() {
		n = 100
	}
	only := map[string][]string{"natsjs-file": {"W1", "W5", "W7"}, "natsjs-mem-p8": {"W1"},
		"natsjs-mem-batch": {"W1", "W3", "W5"}, "natsjs-file-batch": {"W1", "W3", "W5"}}
	for _, name := range []string{"natsjs-mem", "natsjs-file", "natsjs-mem-p8", "natsjs-mem-batch", "natsjs-file-batch"} {
		impl, ok := ImplByName(name)
		if !ok {
			t.Fatalf("%s is not registered", name)
		}
		for _, w := range Workloads {
			if ws, ok := only[name]; ok && !slices.Contains(ws, w.Name) {
				continue
			}
			t.Run(w.Name+"/"+name, func(t *testing.T) {
				m := n
				if w.Work > 0 || w.PayloadSize > 4<<10 {
					m = n / 4
				}
				r := checkCell(t, impl, w, m)
				if r.Duplicates != 0 {
					t.Errorf("%d duplicate deliveries", r.Duplicates)
				}
				if w.Concurrency == 1 && w.FailEvery == 0 && r.OutOfOrder != 0 {
					t.Errorf("%d deliveries out of order with Concurrency 1 and no failure", r.OutOfOrder)
				}
			})
		}
	}
}

// TestNatsJSQueued checks the queued-memory measurement of natsjs-mem: a
// blocked handler holds one message, the stream the rest, and every one
// arrives once the handler is released.
func TestNatsJSQueued(t *testing.T) {
	impl, ok := ImplByName("natsjs-mem")
	if !ok {
		t.Fatal("natsjs-mem is not registered")
	}
	r := RunQueued(impl, 64, 200, 30*time.Second)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	t.Logf("natsjs-mem: %.0f B per queued message, idle %.0f B", r.PerMsg, r.Idle)
}

// TestNatsJSDiagnose checks that a natsjs cell that is stuck says what the
// server holds: the keyless messages' consumer ("u") handed all five to
// the process (one with the blocked handler, the rest waiting for it).
func TestNatsJSDiagnose(t *testing.T) {
	w, _ := WorkloadByName("W1")
	env := newEnv(w, 5)
	env.payload = make([]byte, env.PayloadSize)
	gate := make(chan struct{})
	started := make(chan struct{}, env.PerTopic)
	env.handle = func(_, _ int) error {
		started <- struct{}{}
		<-gate
		return nil
	}
	env.fail = func(err error) { t.Error(err) }
	inst, err := newNatsJS(env, natsjsConfig{name: "natsjs-mem", storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		close(gate)
		if err := inst.Close(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	for seq := range env.PerTopic {
		if err := inst.Publish(t.Context(), 0, 0, seq); err != nil {
			t.Fatal(err)
		}
	}
	<-started // the first message is with the handler
	// The server hands the last messages to the waiting pull on a goroutine
	// of its own: look again until it has (or a few seconds passed).
	want := "t0/s0/u: ack pending 5, redelivered 0, pending 0"
	var got string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if got = inst.(Diagnoser).Diagnose(); strings.HasPrefix(got, want) || time.Now().After(deadline) {
			break
		}
	}
	if !strings.HasPrefix(got, want) {
		t.Fatalf("Diagnose() = %q, want it to start with %q", got, want)
	}
}
