package bench

import (
	"testing"
	"time"
)

// BenchmarkWorkloads runs every workload, Shapes included, on every
// implementation with b.N messages per run (all topics together; W3 rounds
// b.N down to a multiple of 64, P3 to one of 16). ns/msg is the end-to-end
// time per published message, first publish to last delivery; allocs/msg
// and B/msg count every heap allocation in the process meanwhile;
// ooo/delivery is the share of deliveries that arrived after a later
// message of the same topic; attempts/msg (W7) is the failing
// subscriber's attempts per published message.
//
//	go test -run '^$' -bench 'Workloads/W2/' -benchtime 50000x
func BenchmarkWorkloads(b *testing.B) {
	for _, w := range append(Workloads[:len(Workloads):len(Workloads)], Shapes...) {
		for _, impl := range AllImpls() {
			b.Run(w.Name+"/"+impl.Name, func(b *testing.B) {
				benchCell(b, impl, w)
			})
		}
	}
}

// BenchmarkFanout and BenchmarkTopics are the chart's sweeps.
func BenchmarkFanout(b *testing.B) {
	for _, k := range SweepSubs {
		w := SubsWorkload(k)
		for _, impl := range AllImpls() {
			b.Run(w.Name+"/"+impl.Name, func(b *testing.B) { benchCell(b, impl, w) })
		}
	}
}

func BenchmarkTopics(b *testing.B) {
	for _, k := range SweepTopics {
		w := TopicsWorkload(k)
		for _, impl := range AllImpls() {
			b.Run(w.Name+"/"+impl.Name, func(b *testing.B) { benchCell(b, impl, w) })
		}
	}
}

func benchCell(b *testing.B, impl Impl, w Workload) {
	r := RunCell(impl, w, b.N, Options{Timeout: 5 * time.Minute, OnStart: b.ResetTimer, OnStop: b.StopTimer})
	if r.Err != nil {
		b.Fatal(r.Err)
	}
	b.ReportMetric(r.NsPerMsg, "ns/msg")
	b.ReportMetric(r.AllocsPerMsg, "allocs/msg")
	b.ReportMetric(r.BytesPerMsg, "B/msg")
	b.ReportMetric(float64(r.OutOfOrder)/float64(r.Deliveries), "ooo/delivery")
	if w.FailingSubs > 0 {
		// What the failing subscribers attempted: 3 per message that was
		// retried to exhaustion, 0 per message shed from a full lane. A
		// change of lane size moves this mix, and with it ns/msg.
		b.ReportMetric(float64(r.Injected)/float64(r.Messages), "attempts/msg")
	}
}
