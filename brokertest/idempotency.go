package brokertest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inproc/broker"
)

// TestIdempotencyStore runs the conformance suite for broker.IdempotencyStore
// against stores made by newStore, which is called with the subtest's t and
// the dedup window the store must keep (LongWindow, except in the expiry
// test), and must return an empty store (release it with t.Cleanup).
//
// The subtests check: an unrecorded key is not seen (Unseen), a recorded key
// is (RecordThenSeen), keys that differ in topic, subscriber or message ID
// by as little as a separator, a letter's case, a trailing space or the last
// of 2000 bytes do not see each other (NoCrossTalk), a key is forgotten after
// the window the store declares (Expiry; see ExpiresAfterRecord and
// ExpiresByPublishTime), concurrent Seen and Record are safe and lose nothing
// (Concurrent), and a done context is an error (unless IgnoresContext).
func TestIdempotencyStore(t *testing.T, newStore func(t *testing.T, window time.Duration) broker.IdempotencyStore, opts ...Option) {
	t.Helper()
	if newStore == nil {
		t.Fatal("brokertest: TestIdempotencyStore: nil newStore")
	}
	idempotencySuite(stdT{t}, func(t tb, window time.Duration) broker.IdempotencyStore {
		return newStore(testingT(t), window)
	}, buildOptions(opts))
}

type idemSuite struct {
	newStore func(tb, time.Duration) broker.IdempotencyStore
	o        options
}

func idempotencySuite(t tb, newStore func(tb, time.Duration) broker.IdempotencyStore, o options) {
	t.Helper()
	if len(o.invalid) > 0 {
		t.Fatalf("brokertest: invalid options: %s", strings.Join(o.invalid, "; "))
	}
	s := idemSuite{newStore: newStore, o: o}
	t.run("Unseen", s.unseen)
	t.run("RecordThenSeen", s.recordThenSeen)
	t.run("NoCrossTalk", s.noCrossTalk)
	t.run("Expiry", s.expiry)
	t.run("Concurrent", s.concurrent)
	if !o.ignoresContext {
		t.run("Context", s.context)
	}
}

func (s idemSuite) store(t tb, window time.Duration) broker.IdempotencyStore {
	t.Helper()
	st := s.newStore(t, window)
	if st == nil {
		t.Fatalf("newStore returned nil")
	}
	return st
}

// key returns a key dated now: a store measuring publish time sees it
// published inside any window that starts now.
func key(topic, subscriber, id string) broker.DeliveryKey {
	return broker.DeliveryKey{Topic: topic, Subscriber: subscriber, MessageID: id, PublishedAt: time.Now()}
}

func seen(t tb, st broker.IdempotencyStore, k broker.DeliveryKey) bool {
	t.Helper()
	ok, err := st.Seen(t.Context(), k)
	if err != nil {
		t.Fatalf("Seen(%s): %v", fmtKey(k), err)
	}
	return ok
}

func record(t tb, st broker.IdempotencyStore, k broker.DeliveryKey) {
	t.Helper()
	if err := st.Record(t.Context(), k); err != nil {
		t.Fatalf("Record(%s): %v", fmtKey(k), err)
	}
}

func fmtKey(k broker.DeliveryKey) string {
	id := k.MessageID
	if len(id) > 40 {
		id = fmt.Sprintf("%s…(%d bytes)…%s", id[:16], len(id), id[len(id)-8:])
	}
	return fmt.Sprintf("{topic %q, subscriber %q, id %q}", k.Topic, k.Subscriber, id)
}

func (s idemSuite) unseen(t tb) {
	st := s.store(t, LongWindow)
	if seen(t, st, key("orders", "billing", "m1")) {
		t.Errorf("Seen on a new store = true, want false")
	}
	record(t, st, key("orders", "billing", "m1"))
	if seen(t, st, key("orders", "billing", "m2")) {
		t.Errorf("Seen of an ID never recorded = true, want false")
	}
}

func (s idemSuite) recordThenSeen(t tb) {
	st := s.store(t, LongWindow)
	k := key("orders", "billing", "m1")
	record(t, st, k)
	if !seen(t, st, k) {
		t.Fatalf("Seen(%s) after Record = false, want true", fmtKey(k))
	}
	record(t, st, k) // recording again is fine
	if !seen(t, st, k) {
		t.Errorf("Seen(%s) after a second Record = false, want true", fmtKey(k))
	}
}

// keyPair is two keys that must not see each other.
type keyPair struct {
	name string
	a, b broker.DeliveryKey
}

// crossTalkCases are pairs of keys that must not see each other.
func crossTalkCases() []keyPair {
	long := strings.Repeat("x", 2000)
	cases := []keyPair{
		{"topic", key("orders", "billing", "m1"), key("payments", "billing", "m1")},
		{"subscriber", key("orders", "billing", "m1"), key("orders", "shipping", "m1")},
		{"message ID", key("orders", "billing", "m1"), key("orders", "billing", "m2")},
		{"topic and subscriber swapped", key("a", "b", "m"), key("b", "a", "m")},
		{"subscriber and ID swapped", key("t", "a", "b"), key("t", "b", "a")},
		{"ID prefix", key("orders", "billing", "m1"), key("orders", "billing", "m10")},
		{"topic prefix", key("orders", "billing", "m1"), key("orders.eu", "billing", "m1")},
		{"case", key("orders", "billing", "ID-1"), key("orders", "billing", "id-1")},
		{"trailing space", key("orders", "billing", "m1"), key("orders", "billing", "m1 ")},
		{"unicode normal forms", key("orders", "billing", "caf\u00e9"), key("orders", "billing", "cafe\u0301")},
		{"wildcards", key("orders.*", "billing", "*"), key("orders.>", "billing", ">")},
		{"long IDs differing at the end", key("orders", "billing", long+"1"), key("orders", "billing", long+"2")},
	}
	// Keys that collide when a store joins the three names with a
	// separator (or none) without escaping it.
	for _, sep := range []string{"", ".", ":", "|", "/", "-", "_", "\x00"} {
		cases = append(cases,
			keyPair{fmt.Sprintf("separator %q between topic and subscriber", sep), key("t"+sep+"s", "u", "m"), key("t", "s"+sep+"u", "m")},
			keyPair{fmt.Sprintf("separator %q between subscriber and ID", sep), key("t", "s"+sep+"u", "m"), key("t", "s", "u"+sep+"m")},
		)
	}
	return cases
}

func (s idemSuite) noCrossTalk(t tb) {
	for _, c := range crossTalkCases() {
		t.run(c.name, func(t tb) {
			st := s.store(t, LongWindow)
			record(t, st, c.a)
			if seen(t, st, c.b) {
				t.Fatalf("after Record(%s), Seen(%s) = true, want false", fmtKey(c.a), fmtKey(c.b))
			}
			record(t, st, c.b)
			if !seen(t, st, c.a) || !seen(t, st, c.b) {
				t.Errorf("after recording both %s and %s, not both are seen", fmtKey(c.a), fmtKey(c.b))
			}
		})
	}
}

func (s idemSuite) expiry(t tb) {
	if s.o.expiry == expiresByPublishTime {
		s.expiryByPublishTime(t)
		return
	}
	s.expiryAfterRecord(t)
}

// expiryAfterRecord records a key in a store with a short window and polls
// until it is forgotten: not before (9/10 of) the window has passed since
// Record was called, and not after the window plus the timeout.
func (s idemSuite) expiryAfterRecord(t tb) {
	window := s.o.window
	st := s.store(t, window)
	k := key("orders", "billing", "expiring")
	other := key("orders", "billing", "not-recorded")
	start := time.Now()
	record(t, st, k)
	deadline := start.Add(window + s.o.expiryTimeout)
	poll := min(max(window/20, 5*time.Millisecond), 100*time.Millisecond)
	ticker := time.NewTicker(poll)
	defer ticker.Stop()
	for {
		if !seen(t, st, k) {
			if elapsed := time.Since(start); elapsed < window*9/10 {
				t.Errorf("key forgotten %v after Record, before the window of %v", elapsed, window)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("key still seen %v after Record, with a window of %v (%s)",
				time.Since(start), window, s.o.expiry)
		}
		select {
		case <-ticker.C:
		case <-t.Context().Done():
			t.Fatalf("test context ended while waiting for expiry: %v", t.Context().Err())
		}
	}
	if seen(t, st, other) {
		t.Errorf("Seen of a key never recorded = true")
	}
}

// expiryByPublishTime records a key published at t0 and asks about copies
// published later: within the window they are seen, after it they are not.
func (s idemSuite) expiryByPublishTime(t tb) {
	window := s.o.window
	st := s.store(t, window)
	k := key("orders", "billing", "m1")
	t0 := k.PublishedAt
	record(t, st, k)
	for _, c := range []struct {
		after time.Duration
		want  bool
	}{
		{0, true},
		{window / 2, true},
		{window * 9 / 10, true},
		{window + window/10, false},
		{3 * window, false},
	} {
		later := k
		later.PublishedAt = t0.Add(c.after)
		if got := seen(t, st, later); got != c.want {
			t.Errorf("Seen of a copy published %v after the recorded one (window %v) = %v, want %v",
				c.after, window, got, c.want)
		}
	}
}

// concurrent runs goroutines that each record their own keys and check
// each right after; then every recorded key is seen and no other is.
func (s idemSuite) concurrent(t tb) {
	const workers, perWorker = 8, 40
	st := s.store(t, LongWindow)
	ctx := t.Context()
	keyOf := func(w, i int) broker.DeliveryKey {
		return key(fmt.Sprintf("topic-%d", w%2), fmt.Sprintf("sub-%d", w), fmt.Sprintf("m-%d", i))
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				k := keyOf(w, i)
				if ok, err := st.Seen(ctx, k); err != nil || ok {
					t.Errorf("concurrent Seen(%s) before Record = %v, %v; want false", fmtKey(k), ok, err)
					return
				}
				if err := st.Record(ctx, k); err != nil {
					t.Errorf("concurrent Record(%s): %v", fmtKey(k), err)
					return
				}
				if ok, err := st.Seen(ctx, k); err != nil || !ok {
					t.Errorf("concurrent Seen(%s) after Record = %v, %v; want true", fmtKey(k), ok, err)
					return
				}
			}
		})
	}
	wg.Wait()
	missing := 0
	for w := range workers {
		for i := range perWorker {
			if !seen(t, st, keyOf(w, i)) {
				missing++
			}
		}
		if seen(t, st, keyOf(w, perWorker)) {
			t.Errorf("Seen(%s), never recorded, = true", fmtKey(keyOf(w, perWorker)))
		}
	}
	if missing > 0 {
		t.Errorf("%d of %d keys recorded concurrently are not seen", missing, workers*perWorker)
	}
}

func (s idemSuite) context(t tb) {
	st := s.store(t, LongWindow)
	k := key("orders", "billing", "m1")
	done, cancel := context.WithCancel(t.Context())
	cancel()
	t.run("Seen", func(t tb) {
		_, err := st.Seen(done, k)
		checkCancelled(t, "Seen", err)
	})
	t.run("Record", func(t tb) {
		checkCancelled(t, "Record", st.Record(done, k))
	})
}
