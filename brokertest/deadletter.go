package brokertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inproc/broker"
)

// TestDeadLetterStore runs the conformance suite for broker.DeadLetterStore
// against stores made by newStore, which is called once per subtest with
// that subtest's t and must return an empty store (release it with
// t.Cleanup).
//
// The subtests check: Put then Get (and List) return every field intact
// (RoundTrip), Get of an unknown ID, Put without an ID is an error, Put of an
// existing ID replaces it, List is oldest first, filters by Topic,
// Subscriber, ErrorCode and Reason (exact matches, names with dots and spaces
// included), honours Limit and rejects a negative one, Delete removes and
// ignores unknown IDs, Len counts, concurrent Put, Get, List and Len are safe
// and lose nothing, and a done context is an error (unless IgnoresContext).
func TestDeadLetterStore(t *testing.T, newStore func(t *testing.T) broker.DeadLetterStore, opts ...Option) {
	t.Helper()
	if newStore == nil {
		t.Fatal("brokertest: TestDeadLetterStore: nil newStore")
	}
	deadLetterSuite(stdT{t}, func(t tb) broker.DeadLetterStore { return newStore(testingT(t)) }, buildOptions(opts))
}

type dlSuite struct {
	newStore func(tb) broker.DeadLetterStore
	o        options
}

func deadLetterSuite(t tb, newStore func(tb) broker.DeadLetterStore, o options) {
	t.Helper()
	if len(o.invalid) > 0 {
		t.Fatalf("brokertest: invalid options: %s", strings.Join(o.invalid, "; "))
	}
	s := dlSuite{newStore: newStore, o: o}
	t.run("RoundTrip", s.roundTrip)
	t.run("GetUnknown", s.getUnknown)
	t.run("PutWithoutID", s.putWithoutID)
	t.run("PutReplaces", s.putReplaces)
	t.run("ListEmpty", s.listEmpty)
	t.run("ListOldestFirst", s.listOldestFirst)
	t.run("ListFilter", s.listFilter)
	t.run("ListLimit", s.listLimit)
	t.run("ListNegativeLimit", s.listNegativeLimit)
	t.run("ListNewest", s.listNewest)
	t.run("Delete", s.delete)
	t.run("Len", s.len)
	t.run("Concurrent", s.concurrent)
	if !o.ignoresContext {
		t.run("Context", s.context)
	}
}

func (s dlSuite) store(t tb) broker.DeadLetterStore {
	t.Helper()
	st := s.newStore(t)
	if st == nil {
		t.Fatalf("newStore returned nil")
	}
	return st
}

// roundTripCases are dead letters whose every field must survive Put and
// come back from Get and List.
func roundTripCases() []struct {
	name string
	dl   broker.DeadLetter
} {
	payload := allBytes()
	return []struct {
		name string
		dl   broker.DeadLetter
	}{
		{"every field", broker.DeadLetter{
			ID: "dl-every-field",
			Message: broker.Message{
				ID: "msg-1", Topic: "orders", Key: "customer-42",
				Payload: payload,
				Headers: map[string]string{
					"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
					"empty":       "",
					"unicode":     "héllo, 世界",
				},
				Attempt:     3,
				PublishedAt: time.Now(), // a monotonic reading and the local zone
			},
			Subscriber: "billing", Attempts: 3, ErrorCode: "timeout",
			Error:     "handler: context deadline exceeded\nsecond line\ttabbed",
			Retryable: true, Reason: broker.ReasonExhausted,
			FailedAt: time.Date(2031, 7, 9, 23, 59, 58, 123456789, time.FixedZone("UTC+05:30", 5*3600+1800)),
		}},
		{"zero values", broker.DeadLetter{
			ID:         "dl-zero",
			Message:    broker.Message{ID: "m", Topic: "t"},
			Subscriber: "s",
		}},
		{"odd names", broker.DeadLetter{
			ID: "dl/with spaces.and*wild>cards",
			Message: broker.Message{
				ID: " msg ✓ 1 ", Topic: "orders.eu/west *>", Key: "k.*>",
				Payload:     []byte{},
				Headers:     map[string]string{"X-Odd Header": "v\r\nw", "": "empty key"},
				Attempt:     1,
				PublishedAt: time.Date(1999, 12, 31, 23, 59, 59, 1, time.UTC),
			},
			Subscriber: " billing\tsvc ✓ ", Attempts: 1, ErrorCode: "code.with.dots",
			Error: "", Retryable: false, Reason: broker.ReasonPermanent,
			FailedAt: time.Date(2000, 1, 1, 0, 0, 0, 1, time.UTC),
		}},
	}
}

func (s dlSuite) roundTrip(t tb) {
	for _, c := range roundTripCases() {
		t.run(c.name, func(t tb) {
			st := s.store(t)
			ctx := t.Context()
			mustPut(t, st, c.dl)
			got, ok, err := st.Get(ctx, c.dl.ID)
			if err != nil || !ok {
				t.Fatalf("Get(%q) = ok %v, err %v; want the dead letter just put", c.dl.ID, ok, err)
			}
			for _, d := range diffDeadLetter(c.dl, got) {
				t.Errorf("Get: %s", d)
			}
			list := mustList(t, st, broker.DeadLetterFilter{})
			if len(list) != 1 {
				t.Fatalf("List after one Put returned %d dead letters (IDs %q), want 1", len(list), ids(list))
			}
			for _, d := range diffDeadLetter(c.dl, list[0]) {
				t.Errorf("List: %s", d)
			}
		})
	}
}

func (s dlSuite) getUnknown(t tb) {
	st := s.store(t)
	mustPut(t, st, deadLetter("known", "orders", "billing", "error"))
	got, ok, err := st.Get(t.Context(), "unknown")
	if err != nil || ok {
		t.Errorf("Get(unknown ID) = %+v, ok %v, err %v; want ok false and no error", got, ok, err)
	}
}

func (s dlSuite) putWithoutID(t tb) {
	st := s.store(t)
	dl := deadLetter("", "orders", "billing", "error")
	if err := st.Put(t.Context(), dl); err == nil {
		t.Errorf("Put of a dead letter without ID returned no error")
	}
	if n := mustLen(t, st); n != 0 {
		t.Errorf("Len after a rejected Put = %d, want 0", n)
	}
}

func (s dlSuite) putReplaces(t tb) {
	st := s.store(t)
	ctx := t.Context()
	first := deadLetter("same", "orders", "billing", "timeout")
	other := deadLetter("other", "orders", "billing", "timeout")
	second := first
	second.ErrorCode, second.Error, second.Attempts, second.Reason = "permanent", "second failure", 7, broker.ReasonPermanent
	second.FailedAt = first.FailedAt.Add(time.Minute)
	mustPut(t, st, first, other, second)
	got, ok, err := st.Get(ctx, "same")
	if err != nil || !ok {
		t.Fatalf("Get(%q) = ok %v, err %v; want the replacement", "same", ok, err)
	}
	for _, d := range diffDeadLetter(second, got) {
		t.Errorf("Get after replacing Put: %s", d)
	}
	if n := mustLen(t, st); n != 2 {
		t.Errorf("Len = %d after putting an ID twice and another once, want 2", n)
	}
	list := mustList(t, st, broker.DeadLetterFilter{})
	if got := slices.Sorted(slices.Values(ids(list))); !slices.Equal(got, []string{"other", "same"}) {
		t.Fatalf("List IDs = %q, want each of \"other\" and \"same\" once", ids(list))
	}
	for _, dl := range list {
		if dl.ID == "same" {
			for _, d := range diffDeadLetter(second, dl) {
				t.Errorf("List after replacing Put: %s", d)
			}
		}
	}
	// The replaced one is no longer found by its old error code.
	if l := mustList(t, st, broker.DeadLetterFilter{ErrorCode: "timeout"}); !slices.Equal(ids(l), []string{"other"}) {
		t.Errorf("List(ErrorCode timeout) = %q, want [\"other\"] (the replaced version must be gone)", ids(l))
	}
}

func (s dlSuite) listEmpty(t tb) {
	st := s.store(t)
	for _, f := range []broker.DeadLetterFilter{{}, {Topic: "orders", Subscriber: "billing", ErrorCode: "timeout", Limit: 3}} {
		got, err := st.List(t.Context(), f)
		if err != nil || len(got) != 0 {
			t.Errorf("List(%+v) on an empty store = %q, %v; want nothing and no error", f, ids(got), err)
		}
	}
	if n := mustLen(t, st); n != 0 {
		t.Errorf("Len of a new store = %d, want 0", n)
	}
}

func (s dlSuite) listOldestFirst(t tb) {
	st := s.store(t)
	var want []string
	for i := range 6 {
		id := fmt.Sprintf("dl-%d", i)
		want = append(want, id)
		mustPut(t, st, deadLetter(id, "orders", "billing", "error"))
	}
	if got := ids(mustList(t, st, broker.DeadLetterFilter{})); !slices.Equal(got, want) {
		t.Errorf("List = %q, want %q (oldest first)", got, want)
	}
}

// filterFixture is put in this order; names share prefixes and contain
// dots and spaces, so that a store matching by prefix or splitting names
// at dots is caught.
var filterFixture = []struct{ id, topic, subscriber, code, reason string }{
	{"f0", "orders", "billing", "timeout", broker.ReasonExhausted},
	{"f1", "orders.eu", "billing", "timeout", broker.ReasonOverflow},
	{"f2", "orders", "bill", "permanent", broker.ReasonPermanent},
	{"f3", "pay ments", "billing", "error", broker.ReasonOverflow},
	{"f4", "orders", "billing", "permanent", broker.ReasonPermanent},
	{"f5", "orders.eu", "ship.ping", "timeout", broker.ReasonExhausted},
	{"f6", "orders", "ship.ping", "error", broker.ReasonOverflow},
}

func (s dlSuite) putFilterFixture(t tb) broker.DeadLetterStore {
	t.Helper()
	st := s.store(t)
	for _, f := range filterFixture {
		dl := deadLetter(f.id, f.topic, f.subscriber, f.code)
		dl.Reason = f.reason
		mustPut(t, st, dl)
	}
	return st
}

func (s dlSuite) listFilter(t tb) {
	st := s.putFilterFixture(t)
	for _, c := range []struct {
		name string
		f    broker.DeadLetterFilter
		want []string
	}{
		{"empty filter", broker.DeadLetterFilter{}, []string{"f0", "f1", "f2", "f3", "f4", "f5", "f6"}},
		{"topic orders", broker.DeadLetterFilter{Topic: "orders"}, []string{"f0", "f2", "f4", "f6"}},
		{"topic orders.eu", broker.DeadLetterFilter{Topic: "orders.eu"}, []string{"f1", "f5"}},
		{"topic with a space", broker.DeadLetterFilter{Topic: "pay ments"}, []string{"f3"}},
		{"subscriber bill", broker.DeadLetterFilter{Subscriber: "bill"}, []string{"f2"}},
		{"subscriber billing", broker.DeadLetterFilter{Subscriber: "billing"}, []string{"f0", "f1", "f3", "f4"}},
		{"subscriber ship.ping", broker.DeadLetterFilter{Subscriber: "ship.ping"}, []string{"f5", "f6"}},
		{"error code", broker.DeadLetterFilter{ErrorCode: "timeout"}, []string{"f0", "f1", "f5"}},
		{"topic and subscriber", broker.DeadLetterFilter{Topic: "orders", Subscriber: "billing"}, []string{"f0", "f4"}},
		{"topic and error code", broker.DeadLetterFilter{Topic: "orders.eu", ErrorCode: "timeout"}, []string{"f1", "f5"}},
		{"all three", broker.DeadLetterFilter{Topic: "orders", Subscriber: "billing", ErrorCode: "permanent"}, []string{"f4"}},
		{"reason", broker.DeadLetterFilter{Reason: broker.ReasonOverflow}, []string{"f1", "f3", "f6"}},
		{"reason prefix", broker.DeadLetterFilter{Reason: "over"}, nil},
		{"reason and subscriber", broker.DeadLetterFilter{Subscriber: "billing", Reason: broker.ReasonOverflow}, []string{"f1", "f3"}},
		{"no such topic", broker.DeadLetterFilter{Topic: "order"}, nil},
		{"no such combination", broker.DeadLetterFilter{Topic: "pay ments", ErrorCode: "timeout"}, nil},
	} {
		t.run(c.name, func(t tb) {
			got := mustList(t, st, c.f)
			if !slices.Equal(ids(got), c.want) {
				t.Errorf("List(%+v) = %q, want %q", c.f, ids(got), c.want)
			}
			for _, dl := range got {
				if !c.f.Match(dl) {
					t.Errorf("List(%+v) returned %q (topic %q, subscriber %q, code %q, reason %q), which does not match",
						c.f, dl.ID, dl.Message.Topic, dl.Subscriber, dl.ErrorCode, dl.Reason)
				}
			}
		})
	}
}

func (s dlSuite) listLimit(t tb) {
	st := s.putFilterFixture(t)
	for _, c := range []struct {
		name string
		f    broker.DeadLetterFilter
		want []string
	}{
		{"limit 1", broker.DeadLetterFilter{Limit: 1}, []string{"f0"}},
		{"limit 3", broker.DeadLetterFilter{Limit: 3}, []string{"f0", "f1", "f2"}},
		{"limit above count", broker.DeadLetterFilter{Limit: 100}, []string{"f0", "f1", "f2", "f3", "f4", "f5", "f6"}},
		{"limit with filter", broker.DeadLetterFilter{Topic: "orders", Limit: 2}, []string{"f0", "f2"}},
		{"limit above matches", broker.DeadLetterFilter{Subscriber: "bill", Limit: 5}, []string{"f2"}},
		{"limit with reason", broker.DeadLetterFilter{Reason: broker.ReasonOverflow, Limit: 2}, []string{"f1", "f3"}},
	} {
		t.run(c.name, func(t tb) {
			if got := ids(mustList(t, st, c.f)); !slices.Equal(got, c.want) {
				t.Errorf("List(%+v) = %q, want %q (the oldest matches)", c.f, got, c.want)
			}
		})
	}
}

func (s dlSuite) listNegativeLimit(t tb) {
	st := s.putFilterFixture(t)
	got, err := st.List(t.Context(), broker.DeadLetterFilter{Limit: -1})
	if err == nil {
		t.Errorf("List(Limit -1) = %q and no error, want an error (a malformed filter)", ids(got))
	}
}

func (s dlSuite) delete(t tb) {
	st := s.store(t)
	ctx := t.Context()
	for _, id := range []string{"a", "b", "c", "d"} {
		mustPut(t, st, deadLetter(id, "orders", "billing", "error"))
	}
	if err := st.Delete(ctx, "b", "unknown", "d"); err != nil {
		t.Fatalf("Delete(b, unknown, d) = %v, want nil (unknown IDs are ignored)", err)
	}
	for _, id := range []string{"b", "d"} {
		if _, ok, err := st.Get(ctx, id); ok || err != nil {
			t.Errorf("Get(%q) after Delete = ok %v, err %v; want not found", id, ok, err)
		}
	}
	if got := ids(mustList(t, st, broker.DeadLetterFilter{})); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("List after Delete = %q, want [a c]", got)
	}
	if n := mustLen(t, st); n != 2 {
		t.Errorf("Len after Delete = %d, want 2", n)
	}
	if err := st.Delete(ctx); err != nil {
		t.Errorf("Delete() with no IDs = %v, want nil", err)
	}
	if err := st.Delete(ctx, "b"); err != nil {
		t.Errorf("Delete of an ID already deleted = %v, want nil", err)
	}
	// A deleted ID can be put again.
	mustPut(t, st, deadLetter("b", "orders", "billing", "error"))
	if got := ids(mustList(t, st, broker.DeadLetterFilter{})); !slices.Equal(got, []string{"a", "c", "b"}) {
		t.Errorf("List after putting a deleted ID again = %q, want [a c b]", got)
	}
}

func (s dlSuite) len(t tb) {
	st := s.store(t)
	for i := range 5 {
		if n := mustLen(t, st); n != i {
			t.Fatalf("Len after %d Puts = %d", i, n)
		}
		mustPut(t, st, deadLetter(fmt.Sprintf("len-%d", i), "orders", "billing", "error"))
	}
	mustPut(t, st, deadLetter("len-0", "orders", "billing", "timeout")) // replaces
	if n := mustLen(t, st); n != 5 {
		t.Errorf("Len after 5 Puts and a replacing Put = %d, want 5", n)
	}
	if err := st.Delete(t.Context(), "len-1", "len-3"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if n := mustLen(t, st); n != 3 {
		t.Errorf("Len after deleting 2 of 5 = %d, want 3", n)
	}
}

// concurrent runs writers that each put their own IDs in order, and
// readers that List, Get and Len meanwhile. Every List must be a list of
// distinct IDs in which each writer's IDs are in its order, and nothing
// may be lost.
func (s dlSuite) concurrent(t tb) {
	const writers, perWriter, readers = 4, 25, 2
	st := s.store(t)
	ctx := t.Context()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range perWriter {
				id := fmt.Sprintf("w%d-%03d", w, i)
				if err := st.Put(ctx, deadLetter(id, fmt.Sprintf("topic-%d", w), "sub", "error")); err != nil {
					t.Errorf("concurrent Put(%q): %v", id, err)
					return
				}
			}
		})
	}
	stop := make(chan struct{})
	var rg sync.WaitGroup
	for r := range readers {
		rg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				list, err := st.List(ctx, broker.DeadLetterFilter{})
				if err != nil {
					t.Errorf("concurrent List: %v", err)
					return
				}
				if msg := checkWriterOrder(list); msg != "" {
					t.Errorf("concurrent List: %s", msg)
					return
				}
				if _, err := st.Len(ctx); err != nil {
					t.Errorf("concurrent Len: %v", err)
					return
				}
				if _, _, err := st.Get(ctx, fmt.Sprintf("w%d-000", r)); err != nil {
					t.Errorf("concurrent Get: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	rg.Wait()
	if n := mustLen(t, st); n != writers*perWriter {
		t.Errorf("Len after %d concurrent Puts of distinct IDs = %d", writers*perWriter, n)
	}
	list := mustList(t, st, broker.DeadLetterFilter{})
	if len(list) != writers*perWriter {
		t.Errorf("List after %d concurrent Puts of distinct IDs returned %d", writers*perWriter, len(list))
	}
	if msg := checkWriterOrder(list); msg != "" {
		t.Errorf("List after the concurrent Puts: %s", msg)
	}
}

// checkWriterOrder reports duplicate IDs, or IDs of one writer ("w<n>-<i>")
// out of the order it put them in.
func checkWriterOrder(list []broker.DeadLetter) string {
	seen := make(map[string]bool, len(list))
	last := make(map[string]string)
	for _, dl := range list {
		if seen[dl.ID] {
			return fmt.Sprintf("ID %q listed twice", dl.ID)
		}
		seen[dl.ID] = true
		writer, _, _ := strings.Cut(dl.ID, "-")
		if prev, ok := last[writer]; ok && prev > dl.ID {
			return fmt.Sprintf("%q listed after %q, which was put later by the same writer (not oldest first)", prev, dl.ID)
		}
		last[writer] = dl.ID
	}
	return ""
}

func (s dlSuite) context(t tb) {
	st := s.store(t)
	mustPut(t, st, deadLetter("kept", "orders", "billing", "error"))
	done, cancel := context.WithCancel(t.Context())
	cancel()
	t.run("Put", func(t tb) {
		checkCancelled(t, "Put", st.Put(done, deadLetter("new", "orders", "billing", "error")))
		if _, ok, err := st.Get(t.Context(), "new"); ok || err != nil {
			t.Errorf("Get of a dead letter put with a cancelled context = ok %v, err %v; want not stored", ok, err)
		}
	})
	t.run("Get", func(t tb) {
		_, _, err := st.Get(done, "kept")
		checkCancelled(t, "Get", err)
	})
	t.run("List", func(t tb) {
		_, err := st.List(done, broker.DeadLetterFilter{})
		checkCancelled(t, "List", err)
	})
	t.run("Delete", func(t tb) { checkCancelled(t, "Delete", st.Delete(done, "kept")) })
	t.run("Len", func(t tb) {
		_, err := st.Len(done)
		checkCancelled(t, "Len", err)
	})
}

// checkCancelled fails t unless err matches context.Canceled.
func checkCancelled(t tb, method string, err error) {
	t.Helper()
	if !errors.Is(err, context.Canceled) {
		t.Errorf("%s with a cancelled context = %v, want an error matching context.Canceled", method, err)
	}
}

// deadLetter returns a dead letter with the given ID, topic, subscriber and
// error code, every other field set.
func deadLetter(id, topic, subscriber, code string) broker.DeadLetter {
	return broker.DeadLetter{
		ID: id,
		Message: broker.Message{
			ID: "msg-" + id, Topic: topic, Key: "key", Payload: []byte("payload of " + id),
			Headers: map[string]string{"h": id}, Attempt: 2,
			PublishedAt: time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC),
		},
		Subscriber: subscriber, Attempts: 2, ErrorCode: code, Error: "failed: " + id,
		Retryable: true, Reason: broker.ReasonExhausted,
		FailedAt: time.Date(2030, 1, 2, 3, 4, 6, 7, time.UTC),
	}
}

func mustPut(t tb, st broker.DeadLetterStore, dls ...broker.DeadLetter) {
	t.Helper()
	for _, dl := range dls {
		if err := st.Put(t.Context(), dl); err != nil {
			t.Fatalf("Put(%q): %v", dl.ID, err)
		}
	}
}

func mustList(t tb, st broker.DeadLetterStore, f broker.DeadLetterFilter) []broker.DeadLetter {
	t.Helper()
	list, err := st.List(t.Context(), f)
	if err != nil {
		t.Fatalf("List(%+v): %v", f, err)
	}
	return list
}

func mustLen(t tb, st broker.DeadLetterStore) int {
	t.Helper()
	n, err := st.Len(t.Context())
	if err != nil {
		t.Fatalf("Len: %v", err)
	}
	return n
}

func ids(list []broker.DeadLetter) []string {
	out := make([]string, 0, len(list))
	for _, dl := range list {
		out = append(out, dl.ID)
	}
	return out
}

// diffDeadLetter lists the fields in which got differs from want. A nil and
// an empty Payload or Headers are the same; times are compared with Equal.
func diffDeadLetter(want, got broker.DeadLetter) []string {
	var d []string
	field := func(name string, w, g any) {
		if w != g {
			d = append(d, fmt.Sprintf("%s = %#v, want %#v", name, g, w))
		}
	}
	at := func(name string, w, g time.Time) {
		if !w.Equal(g) {
			d = append(d, fmt.Sprintf("%s = %v, want %v (compared with Equal)", name, g, w))
		}
	}
	field("ID", want.ID, got.ID)
	field("Subscriber", want.Subscriber, got.Subscriber)
	field("Attempts", want.Attempts, got.Attempts)
	field("ErrorCode", want.ErrorCode, got.ErrorCode)
	field("Error", want.Error, got.Error)
	field("Retryable", want.Retryable, got.Retryable)
	field("Reason", want.Reason, got.Reason)
	at("FailedAt", want.FailedAt, got.FailedAt)
	return append(d, diffMessage("Message.", want.Message, got.Message, true)...)
}

// diffMessage lists the fields in which got differs from want, each named
// with prefix; PublishedAt only if withTime. A nil and an empty Payload or
// Headers are the same; times are compared with Equal.
func diffMessage(prefix string, want, got broker.Message, withTime bool) []string {
	var d []string
	field := func(name string, w, g any) {
		if w != g {
			d = append(d, fmt.Sprintf("%s%s = %#v, want %#v", prefix, name, g, w))
		}
	}
	field("ID", want.ID, got.ID)
	field("Topic", want.Topic, got.Topic)
	field("Key", want.Key, got.Key)
	if !bytes.Equal(want.Payload, got.Payload) {
		d = append(d, fmt.Sprintf("%sPayload = %q, want %q", prefix, got.Payload, want.Payload))
	}
	if !maps.Equal(want.Headers, got.Headers) {
		d = append(d, fmt.Sprintf("%sHeaders = %q, want %q", prefix, got.Headers, want.Headers))
	}
	field("Attempt", want.Attempt, got.Attempt)
	if withTime && !want.PublishedAt.Equal(got.PublishedAt) {
		d = append(d, fmt.Sprintf("%sPublishedAt = %v, want %v (compared with Equal)", prefix, got.PublishedAt, want.PublishedAt))
	}
	return d
}
