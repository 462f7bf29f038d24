package brokertest

import (
	"slices"
	"time"

	"github.com/inproc/broker"
)

// listNewest checks broker.ListNewest over the store: through the store's
// own ListNewest when it is a broker.DeadLetterLister, else through the
// fallback over List. The fixture is filterFixture, f<i> failing i minutes
// after newestBase, put in that order.
func (s dlSuite) listNewest(t tb) {
	st := s.store(t)
	for i, f := range filterFixture {
		dl := deadLetter(f.id, f.topic, f.subscriber, f.code)
		dl.Reason = f.reason
		dl.FailedAt = newestBase.Add(time.Duration(i) * time.Minute)
		mustPut(t, st, dl)
	}
	if _, ok := st.(broker.DeadLetterLister); !ok {
		t.Logf("the store is no broker.DeadLetterLister: ListNewest falls back to List")
	}
	at := func(min int) time.Time { return newestBase.Add(time.Duration(min) * time.Minute) }
	for _, c := range []struct {
		name string
		q    broker.DeadLetterQuery
		want []string
	}{
		{"everything", broker.DeadLetterQuery{}, []string{"f6", "f5", "f4", "f3", "f2", "f1", "f0"}},
		{"limit", broker.DeadLetterQuery{DeadLetterFilter: broker.DeadLetterFilter{Limit: 2}}, []string{"f6", "f5"}},
		{"filter", broker.DeadLetterQuery{DeadLetterFilter: broker.DeadLetterFilter{Topic: "orders"}}, []string{"f6", "f4", "f2", "f0"}},
		{"reason and limit", broker.DeadLetterQuery{DeadLetterFilter: broker.DeadLetterFilter{Reason: broker.ReasonOverflow, Limit: 2}}, []string{"f6", "f3"}},
		{"message ID", broker.DeadLetterQuery{MessageID: "msg-f3"}, []string{"f3"}},
		{"message ID prefix", broker.DeadLetterQuery{MessageID: "msg-f"}, nil},
		{"since", broker.DeadLetterQuery{Since: at(4)}, []string{"f6", "f5", "f4"}},
		{"until", broker.DeadLetterQuery{Until: at(2)}, []string{"f1", "f0"}},
		{"since and until", broker.DeadLetterQuery{Since: at(2), Until: at(5)}, []string{"f4", "f3", "f2"}},
		{"time range and limit", broker.DeadLetterQuery{Since: at(1), Until: at(6), DeadLetterFilter: broker.DeadLetterFilter{Limit: 2}}, []string{"f5", "f4"}},
	} {
		t.run(c.name, func(t tb) {
			got, err := broker.ListNewest(t.Context(), st, c.q)
			if err != nil {
				t.Fatalf("ListNewest(%+v): %v", c.q, err)
			}
			if !slices.Equal(ids(got), c.want) {
				t.Errorf("ListNewest(%+v) = %q, want %q (newest first)", c.q, ids(got), c.want)
			}
		})
	}
	// The store's own ListNewest must refuse a malformed query (the
	// fallback checks it before calling List).
	lister, ok := st.(broker.DeadLetterLister)
	if !ok {
		return
	}
	t.run("malformed", func(t tb) {
		for _, q := range []broker.DeadLetterQuery{
			{DeadLetterFilter: broker.DeadLetterFilter{Limit: -1}},
			{Since: at(3), Until: at(3)},
		} {
			if got, err := lister.ListNewest(t.Context(), q); err == nil {
				t.Errorf("ListNewest(%+v) = %q and no error, want an error", q, ids(got))
			}
		}
	})
}

// newestBase is when the listNewest fixture's first dead letter failed.
var newestBase = time.Date(2030, 1, 2, 3, 0, 0, 0, time.UTC)
