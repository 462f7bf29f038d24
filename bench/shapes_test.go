package bench

import "testing"

// TestShapes runs the hot-path shapes P1–P3 on every implementation of the
// table and on broker-nodedup at a small message count: every subscriber
// gets every message, once and (one publisher per topic) in order for all
// but Watermill, whose GoChannel reorders.
func TestShapes(t *testing.T) {
	impls := Impls()
	if nd, ok := ImplByName("broker-nodedup"); ok {
		impls = append(impls, nd)
	} else {
		t.Fatal("broker-nodedup is not registered")
	}
	for _, shape := range []struct {
		name                     string
		topics, subs, publishers int
	}{{"P1", 1, 1, 1}, {"P2", 1, 4, 1}, {"P3", 16, 1, 4}} {
		w, ok := WorkloadByName(shape.name)
		if !ok {
			t.Fatalf("workload %s is not defined", shape.name)
		}
		if w.Topics != shape.topics || w.Subs != shape.subs || w.Publishers != shape.publishers || w.Concurrency != 1 || w.Work != 0 {
			t.Fatalf("%s is %+v, want %d topics × %d subscribers, %d publishers, no-op handlers", w.Name, w, shape.topics, shape.subs, shape.publishers)
		}
		for _, impl := range impls {
			t.Run(w.Name+"/"+impl.Name, func(t *testing.T) {
				r := checkCell(t, impl, w, 400)
				if r.Duplicates != 0 || r.OutOfOrder != 0 && impl.Name != "watermill" {
					t.Errorf("%d duplicates, %d out of order", r.Duplicates, r.OutOfOrder)
				}
				if r.Deliveries != r.Messages*w.Subs {
					t.Errorf("%d deliveries for %d messages × %d subscribers", r.Deliveries, r.Messages, w.Subs)
				}
			})
		}
	}
}
