package brokertest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inproc/broker"
)

// The subtests of the broker suite (see TestBroker). Every message they
// publish has a Key, and settle publishes a barrier of that Key: per-key
// order is part of every transport's contract, so once the barrier is
// handled, what came before it has ended.

func (s *bSuite) publishFields(t tb) {
	e := s.start(t, "fields")
	e.subscribe("s", nil)
	want := broker.Message{ID: "m-1", Topic: e.topic, Key: "k", Payload: allBytes(), Headers: testHeaders()}
	before := time.Now()
	e.publish(want)
	e.settle("k", "s")
	got := e.callsOf("s", "m-1")
	if len(got) != 1 {
		t.Fatalf("the handler ran %d times for the message (attempts %v), want once", len(got), e.attempts("s", "m-1"))
	}
	want.Attempt = 1
	for _, d := range diffMessage("", want, got[0].msg, false) {
		t.Errorf("the handler got %s", d)
	}
	if pa := got[0].msg.PublishedAt; pa.IsZero() || pa.Before(before.Add(-slack)) || pa.After(got[0].at.Add(slack)) {
		t.Errorf("the handler got PublishedAt %v; want the time of Publish, between %v and %v", pa, before, got[0].at)
	}
}

func (s *bSuite) publishInvalid(t tb) {
	for _, c := range []struct {
		name     string
		msg      broker.Message
		topicSet bool // the message gets the subtest's topic
	}{
		{"no ID", broker.Message{Key: "k", Payload: []byte("no ID")}, true},
		{"no topic", broker.Message{ID: "no-topic", Key: "k"}, false},
		{"neither", broker.Message{Payload: []byte("nothing")}, false},
	} {
		t.run(c.name, func(t tb) {
			e := s.start(t, "invalid")
			e.subscribe("s", nil)
			if c.topicSet {
				c.msg.Topic = e.topic
			}
			err := e.b.Publish(t.Context(), c.msg)
			if !errors.Is(err, broker.ErrInvalidMessage) {
				t.Errorf("Publish(%+v) = %v, want an error wrapping broker.ErrInvalidMessage", c.msg, err)
			}
			e.settle("k", "s")
			if got := e.nonBarrier("s"); len(got) > 0 {
				t.Errorf("the handler got %q; want only valid messages", got)
			}
		})
	}
}

func (s *bSuite) fanOut(t tb) {
	e := s.start(t, "fanout")
	// a changes its copy of Headers; b must not see the change.
	e.subscribe("a", func(_ context.Context, m broker.Message) error {
		if m.Headers != nil {
			m.Headers["seen-by"] = "a"
		}
		return nil
	})
	e.subscribe("b", nil)
	var ids []string
	for i := range 5 {
		id := fmt.Sprintf("m-%d", i)
		ids = append(ids, id)
		e.publish(broker.Message{ID: id, Key: "k", Payload: []byte(id), Headers: map[string]string{"n": id}})
	}
	e.settle("k", "a", "b")
	for _, sub := range []string{"a", "b"} {
		if got := e.nonBarrier(sub); !slices.Equal(got, ids) {
			t.Errorf("subscriber %q got %q, want each of %q once", sub, got, ids)
		}
	}
	for _, id := range ids {
		for _, c := range e.callsOf("b", id) {
			if want := map[string]string{"n": id}; !maps.Equal(c.msg.Headers, want) {
				t.Errorf("subscriber b got Headers %q for %q, want %q (each handler gets its own copy)", c.msg.Headers, id, want)
			}
		}
	}
}

func (s *bSuite) retryAttempts(t tb) {
	e := s.start(t, "retry")
	e.subscribe("s", func(_ context.Context, m broker.Message) error {
		if m.Attempt < 3 {
			return fmt.Errorf("flaky, attempt %d", m.Attempt)
		}
		return nil
	})
	e.publish(broker.Message{ID: "m-1", Key: "k"})
	e.wait("the third attempt", func() bool { return len(e.callsOf("s", "m-1")) >= 3 })
	e.settle("k", "s")
	if got := e.attempts("s", "m-1"); !slices.Equal(got, []int{1, 2, 3}) {
		t.Errorf("attempts %v, want [1 2 3] (fails twice, then succeeds)", got)
	}
	if dls := e.deadLetters(); len(dls) > 0 {
		t.Errorf("%d dead letter(s) (reason %q) for a message delivered at its third attempt, want none", len(dls), dls[0].Reason)
	}
}

func (s *bSuite) retryByCode(t tb) {
	policy := broker.RetryPolicy{
		MaxRetries: 1,
		Backoff:    broker.ConstantBackoff(10 * time.Millisecond),
		ByCode: map[string]broker.RetryRule{
			"flaky": {MaxRetries: 3},
			"fatal": {MaxRetries: broker.NoRetries},
			"slow":  {Backoff: broker.ConstantBackoff(20 * time.Millisecond)}, // the policy's MaxRetries
		},
	}
	for _, c := range []struct {
		name, code, reason string
		attempts           int
		retryable          bool
	}{
		{"rule with more retries", "flaky", broker.ReasonExhausted, 4, true},
		{"rule without retries", "fatal", broker.ReasonPermanent, 1, false},
		{"rule that sets only the backoff", "slow", broker.ReasonExhausted, 2, true},
		{"code without a rule", "other", broker.ReasonExhausted, 2, true},
	} {
		t.run(c.name, func(t tb) {
			e := s.start(t, "bycode")
			e.subscribe("s", func(context.Context, broker.Message) error {
				return codeError{c.code, "failed with " + c.code}
			}, broker.WithSubscriberRetryPolicy(policy))
			e.publish(broker.Message{ID: "m-1", Key: "k"})
			e.awaitDeadLetters(1)
			e.settle("k", "s")
			dls := e.deadLetters()
			if len(dls) != 1 {
				t.Fatalf("%d dead letters for one message, want 1", len(dls))
			}
			want := make([]int, c.attempts)
			for i := range want {
				want[i] = i + 1
			}
			if got := e.attempts("s", "m-1"); !slices.Equal(got, want) {
				t.Errorf("code %q: attempts %v, want %v (policy MaxRetries 1, ByCode flaky 3, fatal NoRetries, slow the policy's)", c.code, got, want)
			}
			dl := dls[0]
			if dl.Attempts != c.attempts || dl.ErrorCode != c.code || dl.Reason != c.reason || dl.Retryable != c.retryable {
				t.Errorf("dead letter Attempts %d, ErrorCode %q, Reason %q, Retryable %v; want %d, %q, %q, %v",
					dl.Attempts, dl.ErrorCode, dl.Reason, dl.Retryable, c.attempts, c.code, c.reason, c.retryable)
			}
		})
	}
}

func (s *bSuite) retryAfter(t tb) {
	const d = 200 * time.Millisecond
	e := s.start(t, "retryafter")
	var mu sync.Mutex
	var failed time.Time // when the first attempt returned
	e.subscribe("s", func(_ context.Context, m broker.Message) error {
		if m.Attempt == 1 {
			mu.Lock()
			defer mu.Unlock()
			failed = time.Now()
			return broker.RetryAfter(errors.New("slow down"), d)
		}
		return nil
	})
	e.publish(broker.Message{ID: "m-1", Key: "k"})
	e.wait("the second attempt", func() bool { return len(e.callsOf("s", "m-1")) >= 2 })
	calls := e.callsOf("s", "m-1")
	mu.Lock()
	gap := calls[1].at.Sub(failed)
	mu.Unlock()
	if gap < d {
		t.Errorf("the second attempt started %v after the first returned RetryAfter(err, %v), want at least %v", gap, d, d)
	}
	if calls[1].msg.Attempt != 2 {
		t.Errorf("the second call has Attempt %d, want 2", calls[1].msg.Attempt)
	}
}

func (s *bSuite) deadLetter(t tb) {
	for _, c := range []struct {
		name      string
		fail      broker.Handler
		attempts  int
		code      string
		reason    string
		retryable bool
		text      string // in DeadLetter.Error
	}{
		{"permanent", func(context.Context, broker.Message) error {
			return broker.Permanent(errors.New("bad input"))
		}, 1, broker.CodePermanent, broker.ReasonPermanent, false, "bad input"},
		{"exhausted", func(context.Context, broker.Message) error {
			return errors.New("db down")
		}, 3, broker.CodeError, broker.ReasonExhausted, true, "db down"},
		{"panic", func(context.Context, broker.Message) error {
			panic("boom")
		}, 3, broker.CodePanic, broker.ReasonExhausted, true, "boom"}, // retried like any error
		{"error code", func(context.Context, broker.Message) error {
			return codeError{"quota", "quota exceeded"}
		}, 3, "quota", broker.ReasonExhausted, true, "quota exceeded"},
	} {
		t.run(c.name, func(t tb) {
			e := s.start(t, "deadletter")
			e.subscribe("billing", c.fail)
			msg := broker.Message{ID: "m-1", Topic: e.topic, Key: "k", Payload: allBytes(), Headers: testHeaders()}
			e.publish(msg)
			e.awaitDeadLetters(1)
			e.settle("k", "billing")
			dls := e.deadLetters()
			calls := e.callsOf("billing", "m-1")
			if len(calls) != c.attempts {
				t.Errorf("%d attempts %v, want %d", len(calls), e.attempts("billing", "m-1"), c.attempts)
			}
			if len(dls) != 1 {
				t.Fatalf("%d dead letters for one message, want 1", len(dls))
			}
			dl := dls[0]
			if dl.ID == "" {
				t.Errorf("dead letter without ID")
			}
			msg.Attempt = c.attempts
			for _, d := range diffMessage("Message.", msg, dl.Message, false) {
				t.Errorf("dead letter %s", d)
			}
			if len(calls) > 0 {
				last := calls[len(calls)-1]
				if !dl.Message.PublishedAt.Equal(last.msg.PublishedAt) {
					t.Errorf("dead letter Message.PublishedAt = %v, want %v, as the handler got it", dl.Message.PublishedAt, last.msg.PublishedAt)
				}
				if now := time.Now(); dl.FailedAt.Before(last.at.Add(-slack)) || dl.FailedAt.After(now.Add(slack)) {
					t.Errorf("dead letter FailedAt = %v, want between the last attempt (%v) and now (%v)", dl.FailedAt, last.at, now)
				}
			}
			if dl.Subscriber != "billing" || dl.Attempts != c.attempts || dl.ErrorCode != c.code ||
				dl.Retryable != c.retryable || dl.Reason != c.reason || !strings.Contains(dl.Error, c.text) {
				t.Errorf("dead letter Subscriber %q, Attempts %d, ErrorCode %q, Retryable %v, Reason %q, Error %q; want %q, %d, %q, %v, %q, an Error containing %q",
					dl.Subscriber, dl.Attempts, dl.ErrorCode, dl.Retryable, dl.Reason, dl.Error,
					"billing", c.attempts, c.code, c.retryable, c.reason, c.text)
			}
			got, ok, err := e.b.DeadLetters().Get(t.Context(), dl.ID)
			if err != nil || !ok {
				t.Fatalf("DeadLetters().Get(%q) = ok %v, err %v; want the listed dead letter", dl.ID, ok, err)
			}
			for _, d := range diffDeadLetter(dl, got) {
				t.Errorf("Get differs from List: %s", d)
			}
		})
	}
}

func (s *bSuite) dedup(t tb) {
	e := s.start(t, "dedup")
	e.subscribe("s", nil)
	msg := broker.Message{ID: "m-1", Key: "k", Payload: []byte("once")}
	e.publish(msg)
	e.wait("the first copy to be delivered (Stats Delivered 1)", func() bool { return e.subStats("s").Delivered >= 1 })
	e.publish(msg)
	e.settle("k", "s")
	if got := e.attempts("s", "m-1"); len(got) != 1 {
		t.Errorf("the handler ran %d times (attempts %v) for an ID published twice, the second time after the first was delivered; want once",
			len(got), got)
	}
}

func (s *bSuite) redrive(t tb) {
	e := s.start(t, "redrive")
	var fail atomic.Bool
	fail.Store(true)
	e.subscribe("a", func(context.Context, broker.Message) error {
		if fail.Load() {
			return broker.Permanent(errors.New("not yet"))
		}
		return nil
	})
	e.subscribe("b", nil)
	msg := broker.Message{ID: "m-1", Topic: e.topic, Key: "k", Payload: []byte("again"), Headers: map[string]string{"h": "v"}}
	e.publish(msg)
	dl := e.awaitDeadLetters(1)[0]
	e.settle("k", "a", "b")
	fail.Store(false)

	n, err := e.b.Redrive(t.Context(), dl.ID)
	if n != 1 || err != nil {
		t.Fatalf("Redrive(%q) = %d, %v; want 1, nil", dl.ID, n, err)
	}
	if _, ok, err := e.b.DeadLetters().Get(t.Context(), dl.ID); ok || err != nil {
		t.Errorf("DeadLetters().Get(%q) after Redrive returned = ok %v, err %v; want it gone from the store", dl.ID, ok, err)
	}
	e.wait("the redriven message at subscriber a", func() bool { return len(e.callsOf("a", "m-1")) >= 2 })
	e.settle("k", "a", "b")
	calls := e.callsOf("a", "m-1")
	if len(calls) != 2 {
		t.Errorf("subscriber a was called %d times (attempts %v), want twice: the failure and the redrive", len(calls), e.attempts("a", "m-1"))
	}
	msg.Attempt = 1
	for _, d := range diffMessage("", msg, calls[1].msg, false) {
		t.Errorf("the redriven delivery has %s (from attempt 1, as published)", d)
	}
	if got := e.attempts("b", "m-1"); len(got) != 1 {
		t.Errorf("subscriber b, which delivered the message, was called %d times (attempts %v), want once: a redrive goes to the failed subscriber only", len(got), got)
	}
	if dls := e.deadLetters(); len(dls) != 0 {
		t.Errorf("%d dead letter(s) left after a successful redrive, want none", len(dls))
	}
	if n, err := e.b.Redrive(t.Context(), dl.ID); n != 0 || !errors.Is(err, broker.ErrDeadLetterNotFound) {
		t.Errorf("a second Redrive(%q) = %d, %v; want 0 and an error wrapping broker.ErrDeadLetterNotFound", dl.ID, n, err)
	}
}

func (s *bSuite) redriveFailsAgain(t tb) {
	e := s.start(t, "redrive-again")
	e.subscribe("a", func(context.Context, broker.Message) error { return errors.New("still down") })
	e.publish(broker.Message{ID: "m-1", Key: "k"})
	dl := e.awaitDeadLetters(1)[0]
	e.settle("k", "a")
	if n, err := e.b.Redrive(t.Context(), dl.ID); n != 1 || err != nil {
		t.Fatalf("Redrive(%q) = %d, %v; want 1, nil", dl.ID, n, err)
	}
	e.wait("the redriven message's last attempt", func() bool { return len(e.callsOf("a", "m-1")) >= 6 })
	again := e.awaitDeadLetters(1)[0]
	e.settle("k", "a")
	if got := e.attempts("a", "m-1"); !slices.Equal(got, []int{1, 2, 3, 1, 2, 3}) {
		t.Errorf("attempts %v, want [1 2 3 1 2 3]: the redriven copy is retried from attempt 1 under the policy (MaxRetries 2)", got)
	}
	if again.ID == dl.ID || again.Reason != broker.ReasonExhausted || again.Attempts != 3 {
		t.Errorf("the second dead letter has ID %q (the first was %q), reason %q, %d attempts; want a new ID, %q, 3",
			again.ID, dl.ID, again.Reason, again.Attempts, broker.ReasonExhausted)
	}
	if dls := e.deadLetters(); len(dls) != 1 {
		t.Errorf("%d dead letters at rest, want 1 (the first left the store when redriven)", len(dls))
	}
	st := e.subStats("a") // settle's markers are routed and delivered too
	if sum := st.Delivered + st.Deduplicated + st.DeadLettered + uint64(st.Queued) + uint64(st.InFlight); st.Routed != sum ||
		st.DeadLettered != 2 || st.Queued != 0 || st.InFlight != 0 {
		t.Errorf("Stats at rest: Routed %d, Delivered %d, Deduplicated %d, DeadLettered %d, Queued %d, InFlight %d; want Routed = the sum of the rest "+
			"(routed once per publish and once per redrive), DeadLettered 2, nothing queued or in flight",
			st.Routed, st.Delivered, st.Deduplicated, st.DeadLettered, st.Queued, st.InFlight)
	}
}

func (s *bSuite) keyOrder(t tb) {
	const keys, perKey, workers = 4, 8, 4
	e := s.start(t, "order")
	gate := make(chan struct{}) // handlers wait until every message is published
	var mu sync.Mutex
	running := map[string]int{}
	starts := map[string][]int{} // per key, the sequence numbers in the order attempts started
	var overlaps []string
	var succeeded atomic.Int32
	e.subscribe("s", func(ctx context.Context, m broker.Message) error {
		var seq int
		if _, err := fmt.Sscanf(strings.TrimPrefix(m.ID, m.Key+"-"), "%d", &seq); err != nil {
			return broker.Permanent(fmt.Errorf("unexpected message %q", m.ID))
		}
		mu.Lock()
		running[m.Key]++
		if running[m.Key] > 1 {
			overlaps = append(overlaps, fmt.Sprintf("%s#%d", m.ID, m.Attempt))
		}
		starts[m.Key] = append(starts[m.Key], seq)
		mu.Unlock()
		defer func() {
			mu.Lock()
			running[m.Key]--
			mu.Unlock()
		}()
		select {
		case <-gate:
		case <-e.giveUp:
			return nil
		}
		for range 3 {
			runtime.Gosched() // let another worker run meanwhile
		}
		if m.Key == "k1" && seq == 3 && m.Attempt == 1 {
			return errors.New("fails once")
		}
		succeeded.Add(1)
		return nil
	}, broker.Concurrency(workers))
	for seq := range perKey {
		for k := range keys {
			e.publish(broker.Message{ID: fmt.Sprintf("k%d-%d", k, seq), Key: fmt.Sprintf("k%d", k)})
		}
	}
	close(gate)
	e.wait(fmt.Sprintf("%d messages to succeed", keys*perKey), func() bool { return succeeded.Load() >= keys*perKey })
	mu.Lock()
	defer mu.Unlock()
	if len(overlaps) > 0 {
		t.Errorf("attempts %q started while an earlier message of their Key ran (Concurrency %d)", overlaps, workers)
	}
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		got := starts[key]
		if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != perKey {
			t.Errorf("Key %s: attempts started in the order %v, want 0 to %d in publish order (3 twice for k1, which fails once)", key, got, perKey-1)
		}
	}
}

func (s *bSuite) stats(t tb) {
	e := s.start(t, "stats")
	e.subscribe("a", nil)
	e.subscribe("b", func(_ context.Context, m broker.Message) error {
		switch {
		case m.ID == "m-2" && m.Attempt == 1:
			return errors.New("fails once")
		case m.ID == "m-3":
			return broker.Permanent(errors.New("never"))
		}
		return nil
	})
	for i := 1; i <= 3; i++ {
		e.publish(broker.Message{ID: fmt.Sprintf("m-%d", i), Key: "k"})
	}
	e.awaitDeadLetters(1)
	e.settle("k", "a", "b") // a fourth message
	type want struct {
		delivered, deadLettered, attempts, retries uint64
	}
	wants := map[string]want{"a": {4, 0, 4, 0}, "b": {3, 1, 5, 1}}
	var st broker.TopicStats
	quiet := e.poll(func() bool {
		st = e.b.Stats().Topics[e.topic]
		for name, w := range wants {
			ss := st.Subscribers[name]
			if ss.InFlight != 0 || ss.Queued != 0 || ss.Delivered+ss.Deduplicated+ss.DeadLettered < w.delivered+w.deadLettered {
				return false
			}
		}
		return true
	})
	if !quiet {
		t.Fatalf("waited %v for a quiet moment (every message ended, nothing queued or in flight); last Stats %+v", s.o.wait, st)
	}
	if st.Published != 4 {
		t.Errorf("Published = %d after 4 publishes, want 4", st.Published)
	}
	for name, ss := range st.Subscribers {
		if sum := ss.Delivered + ss.Deduplicated + ss.DeadLettered + uint64(ss.Queued) + uint64(ss.InFlight); ss.Routed != sum {
			t.Errorf("subscriber %q: Routed %d != Delivered %d + Deduplicated %d + DeadLettered %d + Queued %d + InFlight %d",
				name, ss.Routed, ss.Delivered, ss.Deduplicated, ss.DeadLettered, ss.Queued, ss.InFlight)
		}
	}
	for name, w := range wants {
		ss, ok := st.Subscribers[name]
		if !ok {
			t.Errorf("no Stats for subscriber %q", name)
			continue
		}
		got := want{ss.Delivered, ss.DeadLettered, ss.Attempts, ss.Retries}
		if ss.Routed != 4 || got != w || ss.Deduplicated != 0 {
			t.Errorf("subscriber %q: Routed %d, Delivered %d, DeadLettered %d, Attempts %d, Retries %d, Deduplicated %d; want 4, %d, %d, %d, %d, 0",
				name, ss.Routed, ss.Delivered, ss.DeadLettered, ss.Attempts, ss.Retries, ss.Deduplicated,
				w.delivered, w.deadLettered, w.attempts, w.retries)
		}
	}
}

func (s *bSuite) middleware(t tb) {
	var mu sync.Mutex
	var seen []string
	mw := func(sub broker.SubscriberInfo, next broker.Handler) broker.Handler {
		return func(ctx context.Context, m broker.Message) error {
			err := next(ctx, m)
			if !strings.HasPrefix(m.ID, barrierPrefix) {
				mu.Lock()
				seen = append(seen, fmt.Sprintf("%s/%s %s#%d code=%q", sub.Topic, sub.Name, m.ID, m.Attempt, broker.ErrorCodeOf(err)))
				mu.Unlock()
			}
			return err
		}
	}
	e := s.start(t, "middleware", broker.WithMiddleware(mw))
	e.subscribe("s", func(_ context.Context, m broker.Message) error {
		if m.Attempt == 1 {
			return codeError{"flaky", "fails once"}
		}
		return nil
	})
	e.publish(broker.Message{ID: "m-1", Key: "k"})
	e.wait("the second attempt", func() bool { return len(e.callsOf("s", "m-1")) >= 2 })
	e.settle("k", "s")
	want := []string{
		fmt.Sprintf(`%s/s m-1#1 code="flaky"`, e.topic),
		fmt.Sprintf(`%s/s m-1#2 code=""`, e.topic),
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(seen, want) {
		t.Errorf("the middleware saw %q, want %q", seen, want)
	}
}

func (s *bSuite) publishHook(t tb) {
	errRefused := errors.New("refused by the hook")
	hook := func(_ context.Context, m *broker.Message) error {
		if m.ID == "refused" {
			return errRefused
		}
		m.Headers["x-hook"] = "hooked " + m.ID
		return nil
	}
	e := s.start(t, "hook", broker.WithPublishHook(hook))
	e.subscribe("s", nil)
	headers := map[string]string{"h": "v"}
	if err := e.b.Publish(t.Context(), broker.Message{ID: "m-1", Topic: e.topic, Key: "k", Headers: headers}); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if err := e.b.Publish(t.Context(), broker.Message{ID: "refused", Topic: e.topic, Key: "k"}); !errors.Is(err, errRefused) {
		t.Errorf("Publish of a message the hook refuses = %v, want an error wrapping the hook's", err)
	}
	e.settle("k", "s")
	if got := e.nonBarrier("s"); !slices.Equal(got, []string{"m-1"}) {
		t.Fatalf("the handler got %q, want [m-1] (the refused message is not published)", got)
	}
	want := map[string]string{"h": "v", "x-hook": "hooked m-1"}
	if got := e.callsOf("s", "m-1")[0].msg.Headers; !maps.Equal(got, want) {
		t.Errorf("the handler got Headers %q, want %q (the hook's header added)", got, want)
	}
	if want := map[string]string{"h": "v"}; !maps.Equal(headers, want) {
		t.Errorf("the caller's Headers became %q, want %q (the hook writes the message's own copy)", headers, want)
	}
}

func (s *bSuite) unsubscribe(t tb) {
	e := s.start(t, "unsub")
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	var running atomic.Int32
	var returned atomic.Bool // Unsubscribe returned
	var late atomic.Int32    // calls that started after it returned
	sub := e.subscribe("s", func(_ context.Context, m broker.Message) error {
		if returned.Load() {
			late.Add(1)
		}
		if m.ID == "m-1" {
			running.Add(1)
			defer running.Add(-1)
			select {
			case started <- struct{}{}:
			default:
			}
			select {
			case <-release:
			case <-e.giveUp:
			}
		}
		return nil
	})
	e.subscribe("w", nil) // a witness that stays
	e.publish(broker.Message{ID: "m-1", Key: "k"})
	await(e, "the handler to start", started)

	type result struct {
		err     error
		running int32 // handlers of the subscription running when it returned
	}
	done := make(chan result, 1)
	ctx, cancel := context.WithTimeout(context.Background(), s.o.wait)
	defer cancel()
	go func() { // ends when Unsubscribe returns, at ctx's end at the latest
		err := sub.Unsubscribe(ctx)
		done <- result{err, running.Load()}
	}()
	// Unsubscribe must wait for the running handler. Give one that does
	// not a moment to return early (this wait asserts nothing: a correct
	// Unsubscribe is still waiting when it ends), then let the handler go.
	var r result
	early := false
	timer := time.NewTimer(100 * time.Millisecond)
	select {
	case r = <-done:
		early = true
	case <-timer.C:
	}
	timer.Stop()
	close(release)
	if !early {
		r = await(e, "Unsubscribe to return after its handler did", done)
	}
	returned.Store(true)
	if r.err != nil {
		t.Errorf("Unsubscribe = %v, want nil (its handler returned before its context ended)", r.err)
	}
	if r.running != 0 {
		t.Errorf("Unsubscribe returned while a handler of the subscription was still running")
	}
	e.publish(broker.Message{ID: "m-2", Key: "k"})
	e.settle("k", "w")
	if n := late.Load(); n > 0 {
		t.Errorf("%d handler call(s) of the subscription started after Unsubscribe returned", n)
	}
	if got := e.attempts("s", "m-2"); len(got) > 0 {
		t.Errorf("a message published after Unsubscribe returned was handled by the subscription (attempts %v)", got)
	}
	if ss := e.subStats("s"); ss.Active {
		t.Errorf("Stats say subscriber s is still active after Unsubscribe")
	}
	if _, err := e.b.Subscribe(e.topic, "s", func(context.Context, broker.Message) error { return nil }); err != nil {
		t.Errorf("Subscribe of the name again after Unsubscribe returned: %v, want the name free", err)
	}
}

func (s *bSuite) closeReturns(t tb) {
	e := s.start(t, "close")
	e.subscribe("s", nil)
	for i := range 3 {
		e.publish(broker.Message{ID: fmt.Sprintf("m-%d", i), Key: "k"})
	}
	e.wait("the three messages to be handled", func() bool { return len(e.nonBarrier("s")) >= 3 })
	returned, err := e.close(s.o.wait)
	if !returned {
		t.Fatalf("Close did not return within %v of its context's end", 2*broker.ShutdownGrace)
	}
	if err != nil {
		t.Errorf("Close = %v, want nil: its handlers were quick and its context had %v to spare", err, s.o.wait)
	}
	ctx := t.Context()
	if err := e.b.Publish(ctx, broker.Message{ID: "late", Topic: e.topic, Key: "k"}); !errors.Is(err, broker.ErrClosed) {
		t.Errorf("Publish after Close = %v, want an error matching broker.ErrClosed", err)
	}
	if _, err := e.b.Subscribe(e.topic, "late", func(context.Context, broker.Message) error { return nil }); !errors.Is(err, broker.ErrClosed) {
		t.Errorf("Subscribe after Close = %v, want an error matching broker.ErrClosed", err)
	}
	if _, err := e.b.Redrive(ctx, "any"); !errors.Is(err, broker.ErrClosed) {
		t.Errorf("Redrive after Close = %v, want an error matching broker.ErrClosed", err)
	}
	if returned, err := e.close(s.o.wait); !returned || err != nil {
		t.Errorf("a second Close: returned %v, error %v; want the first's result (nil)", returned, err)
	}
}

func (s *bSuite) closeCancelsHandlers(t tb) {
	e := s.start(t, "closecancel")
	started := make(chan struct{}, 1)
	causes := make(chan error, 1)
	var returned atomic.Bool // Close returned
	var late atomic.Int32    // calls that started after it returned
	e.subscribe("s", func(ctx context.Context, m broker.Message) error {
		if returned.Load() {
			late.Add(1)
		}
		select {
		case started <- struct{}{}:
		default:
		}
		select {
		case <-ctx.Done():
			select {
			case causes <- context.Cause(ctx):
			default:
			}
			return ctx.Err()
		case <-e.giveUp:
			return nil
		}
	})
	e.publish(broker.Message{ID: "m-1", Key: "k"})
	await(e, "the handler to start", started)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- e.b.Close(ctx) }() // ends when Close returns
	cause := await(e, "the handler's context to be cancelled after Close's context ended", causes)
	if !errors.Is(cause, broker.ErrClosed) {
		t.Errorf("the handler's context.Cause = %v, want an error matching broker.ErrClosed", cause)
	}
	await(e, "Close to return after its context ended and its handler returned", done)
	returned.Store(true)
	if got := e.attempts("s", "m-1"); len(got) != 1 {
		t.Errorf("the message cut off by Close was attempted %d times (%v), want once", len(got), got)
	}
	if n := late.Load(); n > 0 {
		t.Errorf("%d handler call(s) started after Close returned", n)
	}
}
