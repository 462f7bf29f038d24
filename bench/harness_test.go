package bench

import (
	"errors"
	"testing"
	"time"
)

// TestCells runs every implementation on every workload at a small message
// count and checks that every subscriber got every message.
func TestCells(t *testing.T) {
	n := 2000
	if testing.Short() {
		n = 500
	}
	for _, w := range Workloads {
		for _, impl := range Impls() {
			t.Run(w.Name+"/"+impl.Name, func(t *testing.T) {
				m := n
				if w.Work > 0 {
					m = n / 4
				}
				if w.PayloadSize > 4<<10 {
					m = n / 4
				}
				checkCell(t, impl, w, m)
			})
		}
	}
}

// checkCell runs impl on w with m messages and fails t unless every
// subscriber got every message (a workload impl does not measure is
// skipped). It returns the result for further checks.
func checkCell(t *testing.T, impl Impl, w Workload, m int) Result {
	t.Helper()
	r := RunCell(impl, w, m, Options{Timeout: 30 * time.Second})
	if errors.Is(r.Err, ErrNotMeasured) {
		t.Skip(r.Err)
	}
	if r.Err != nil {
		t.Fatalf("%s/%s: %v", w.Name, impl.Name, r.Err)
	}
	if r.Elapsed <= 0 || r.NsPerMsg <= 0 {
		t.Fatalf("no time measured: %+v", r)
	}
	if (w.FailEvery > 0 || w.FailingSubs > 0) && r.Injected == 0 {
		t.Fatalf("no failure injected: %+v", r)
	}
	t.Logf("%s/%s: %d msgs %.0f ns/msg %.1f allocs/msg %.0f B/msg ooo=%d dups=%d injected=%d pubretries=%d",
		w.Name, impl.Name, r.Messages, r.NsPerMsg, r.AllocsPerMsg, r.BytesPerMsg, r.OutOfOrder, r.Duplicates, r.Injected, r.PublishRetries)
	return r
}

// TestQueued checks the queued-memory measurement end to end.
func TestQueued(t *testing.T) {
	for _, impl := range Impls() {
		for _, size := range []int{64, 4 << 10} {
			r := RunQueued(impl, size, 500, 30*time.Second)
			if r.Err != nil {
				t.Fatalf("%s/%d: %v", impl.Name, size, r.Err)
			}
			t.Logf("%s payload=%d: %.0f B per queued message", impl.Name, size, r.PerMsg)
		}
	}
}

// TestJetStreamSyncCells runs the extra jetstream-sync-msgid column (raw
// JetStream publishing as natsjs's Publish does) on W1–W3: every
// subscriber gets every message, once and in order.
func TestJetStreamSyncCells(t *testing.T) {
	impl, ok := ImplByName("jetstream-sync-msgid")
	if !ok {
		t.Fatal("jetstream-sync-msgid is not registered")
	}
	for _, w := range Workloads[:3] {
		t.Run(w.Name, func(t *testing.T) {
			r := checkCell(t, impl, w, 200)
			if r.Duplicates != 0 || r.OutOfOrder != 0 {
				t.Errorf("%d duplicates, %d out of order", r.Duplicates, r.OutOfOrder)
			}
		})
	}
}
