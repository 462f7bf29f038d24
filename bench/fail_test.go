package bench

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeInst delivers synchronously inside Publish, dropping every drop-th
// message, failing publish number failAt, or hanging in Close.
type fakeInst struct {
	env       *Env
	drop      int
	failAt    int
	hangClose chan struct{} // Close waits for it to close (the harness must give up first)
	mu        sync.Mutex
	n         int
}

func (f *fakeInst) Publish(_ context.Context, _, topic, seq int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	if f.failAt > 0 && f.n == f.failAt {
		return errors.New("refused")
	}
	if f.drop > 0 && seq%f.drop == 0 {
		return nil
	}
	for j := range f.env.Subs {
		for f.env.Handle(f.env.Sub(topic, j), seq) != nil {
		}
	}
	return nil
}

func (f *fakeInst) Close(ctx context.Context) error {
	if f.hangClose != nil {
		<-f.hangClose // outlives the harness's patience; the test ends it
	}
	return nil
}

func fake(name string, setup func(*fakeInst)) Impl {
	return Impl{Name: name, New: func(env *Env) (Instance, error) {
		f := &fakeInst{env: env}
		setup(f)
		return f, nil
	}}
}

func TestFakeCompletes(t *testing.T) {
	w, _ := WorkloadByName("W5")
	r := RunCell(fake("ok", func(*fakeInst) {}), w, 1000, Options{Timeout: 5 * time.Second})
	if r.Err != nil || r.Injected != 10 || r.OutOfOrder != 0 || r.Messages != 1000 {
		t.Fatalf("got %+v", r)
	}
}

func TestLostMessagesTimeOut(t *testing.T) {
	w, _ := WorkloadByName("W2")
	start := time.Now()
	r := RunCell(fake("lossy", func(f *fakeInst) { f.drop = 10 }), w, 1000, Options{Timeout: 500 * time.Millisecond})
	if !errors.Is(r.Err, ErrTimeout) || !strings.Contains(r.Err.Error(), "8/8 subscribers short") {
		t.Fatalf("want a timeout naming the short subscribers, got %v", r.Err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v", d)
	}
}

func TestPublishErrorFails(t *testing.T) {
	w, _ := WorkloadByName("W1")
	r := RunCell(fake("refusing", func(f *fakeInst) { f.failAt = 10 }), w, 1000, Options{Timeout: 10 * time.Second})
	if r.Err == nil || !strings.Contains(r.Err.Error(), "refused") {
		t.Fatalf("want the publish error, got %v", r.Err)
	}
}

func TestHangingCloseIsReported(t *testing.T) {
	w, _ := WorkloadByName("W1")
	start := time.Now()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	r := RunCell(fake("hanging", func(f *fakeInst) { f.hangClose = release }), w, 100, Options{Timeout: 500 * time.Millisecond})
	if !errors.Is(r.Err, ErrTimeout) || !strings.Contains(r.Err.Error(), "left running") {
		t.Fatalf("want a close timeout, got %v", r.Err)
	}
	if d := time.Since(start); d > 6*time.Second {
		t.Fatalf("took %v", d)
	}
}

func TestReportAndChart(t *testing.T) {
	w1, _ := WorkloadByName("W1")
	tb := &Table{
		Impls:     []string{"floor", "broker"},
		Workloads: []Workload{w1},
		BaseN:     1000,
		Cells: map[string]Result{
			Key("W1", "floor"):  {Impl: "floor", Workload: "W1", Messages: 1000, Deliveries: 1000, NsPerMsg: 50},
			Key("W1", "broker"): {Impl: "broker", Workload: "W1", Messages: 1000, Deliveries: 1000, NsPerMsg: 500, OutOfOrder: 10},
		},
		Queued: []QueuedResult{{Impl: "broker", Payload: 64, Queued: 1000, PerMsg: 120}, {Impl: "floor", Payload: 64, Err: ErrTimeout}},
		Sweeps: []Panel{{Title: "p", XLabel: "subscribers", Series: []Series{{Name: "broker", Points: []Point{{X: 1, Y: 1e6}, {X: 2, Err: "boom"}}}}}},
	}
	var md bytes.Buffer
	tb.Write(&md)
	for _, want := range []string{"| floor | broker |", "50.0 (×1.00)", "500 (×10.0)", "10 (1.0%)", "120 B (≈0 B)", "FAIL (F1)", "F2: broker subscribers=2: boom"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, md.String())
		}
	}
	var svg bytes.Buffer
	if err := WriteChart(&svg, "t <&>", tb.Sweeps); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(&svg)
	for {
		if _, err := dec.Token(); err != nil {
			if err.Error() != "EOF" {
				t.Fatalf("chart is not well-formed XML: %v", err)
			}
			break
		}
	}
}
