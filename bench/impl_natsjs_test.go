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
// subscriber gets every message, and with one partition (every workload
// but W4's Concurrency 8) in publish order and once, retries included (a
// retry holds its partition). natsjs-file, which differs only in where the
// server keeps the streams, runs W1, W5 and W7; natsjs-mem-p8 runs W1.
func TestNatsJSCells(t *testing.T) {
	n := 200
	if testing.Short() {
		n = 100
	}
	only := map[string][]string{"natsjs-file": {"W1", "W5", "W7"}, "natsjs-mem-p8": {"W1"}}
	for _, name := range []string{"natsjs-mem", "natsjs-file", "natsjs-mem-p8"} {
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
				if w.Concurrency == 1 && name != "natsjs-mem-p8" && r.OutOfOrder != 0 {
					t.Errorf("%d deliveries out of order on one partition", r.OutOfOrder)
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
// server holds: one message handed to the blocked handler, the rest
// pending.
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
	want := "t0/s0/0: ack pending 1, redelivered 0, pending 4"
	got := inst.(Diagnoser).Diagnose()
	if !strings.HasPrefix(got, want) {
		t.Fatalf("Diagnose() = %q, want it to start with %q", got, want)
	}
}
