package natsjs_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/natsjs"
)

type codeErr struct{ code string }

func (e codeErr) Error() string     { return "failed with " + e.code }
func (e codeErr) ErrorCode() string { return e.code }

// TestTransportOutcomes: each way a delivery ends, over JetStream. Attempt
// numbers are the server's delivery count; the broker's decision reaches the
// server (Ack, NakWithDelay, Term): the message leaves the consumer and,
// with interest retention, the stream; a dead letter lands in the stream
// store under the delivery's stable ID.
func TestTransportOutcomes(t *testing.T) {
	conn := embedded(t, "")
	dlIDRe := regexp.MustCompile(`^BRK_T_[a-z0-9_-]+\.[0-9]+\.[0-9]+\.s$`)
	tests := []struct {
		name     string
		handler  func(broker.Message) error
		attempts []int
		code     string // of the dead letter; "" for none
		reason   string
	}{
		{"delivered", func(broker.Message) error { return nil }, []int{1}, "", ""},
		{"retried then delivered", func(m broker.Message) error {
			if m.Attempt < 3 {
				return errors.New("flaky")
			}
			return nil
		}, []int{1, 2, 3}, "", ""},
		{"exhausted", func(broker.Message) error { return codeErr{"db"} }, []int{1, 2, 3}, "db", broker.ReasonExhausted},
		{"permanent", func(broker.Message) error { return broker.Permanent(errors.New("bad input")) }, []int{1}, broker.CodePermanent, broker.ReasonPermanent},
		{"panic", func(broker.Message) error { panic("boom") }, []int{1, 2, 3}, broker.CodePanic, broker.ReasonExhausted}, // retried like any error
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, conn, false, nil)
			topic := fmt.Sprintf("outcomes-%d", i)
			c := &calls{}
			r.subscribe(t, topic, "s", c.handler("", func(_ context.Context, m broker.Message) error { return tt.handler(m) }))
			w := watchT(t, watch(r.tr, topic, "s"))
			r.publish(t, broker.Message{ID: "m", Topic: topic, Key: "k", Payload: []byte("p"), Headers: map[string]string{"h": "v"}})

			want := uint64(1)
			waitFor(t, "the message to end", func() bool {
				ss := subStats(r.b, topic, "s")
				return ss.Delivered+ss.DeadLettered == want
			})
			if got := c.attempts("m"); !slices.Equal(got, tt.attempts) {
				t.Errorf("attempts = %v, want %v", got, tt.attempts)
			}
			for _, cl := range c.of("m") {
				if cl.msg.Key != "k" || string(cl.msg.Payload) != "p" || cl.msg.Headers["h"] != "v" || cl.msg.PublishedAt.IsZero() {
					t.Errorf("handler got %+v", cl.msg)
				}
			}
			waitFor(t, "the consumer and the stream to let the message go", func() bool {
				pending, ack := r.backlog(t, topic, "s")
				return pending == 0 && ack == 0 && r.streamMsgs(t, topic) == 0
			})
			w.halt()
			ss := subStats(r.b, topic, "s")
			if s := conserved(ss); s != "" {
				t.Error(s)
			}
			if ss.Routed != 1 || ss.Attempts != uint64(len(tt.attempts)) || ss.Retries != uint64(len(tt.attempts)-1) {
				t.Errorf("stats %+v: want Routed 1, Attempts %d, Retries %d", ss, len(tt.attempts), len(tt.attempts)-1)
			}
			dls, err := r.dlq.List(t.Context(), broker.DeadLetterFilter{Topic: topic})
			if err != nil {
				t.Fatalf("List: %v", err)
			}
			if tt.code == "" {
				if len(dls) != 0 || ss.Delivered != 1 {
					t.Errorf("dead letters %+v, Delivered %d; want none and 1", dls, ss.Delivered)
				}
				return
			}
			if len(dls) != 1 {
				t.Fatalf("dead letters = %+v, want 1", dls)
			}
			dl := dls[0]
			if dl.ErrorCode != tt.code || dl.Reason != tt.reason || dl.Attempts != len(tt.attempts) || dl.Message.Attempt != len(tt.attempts) ||
				dl.Subscriber != "s" || dl.Message.Headers["h"] != "v" {
				t.Errorf("dead letter %+v: want code %q, reason %q, %d attempts", dl, tt.code, tt.reason, len(tt.attempts))
			}
			if !dlIDRe.MatchString(dl.ID) || !strings.HasPrefix(dl.ID, r.tr.StreamName(topic)+".") {
				t.Errorf("dead letter ID %q: want <stream %s>.<sequence>.<stored at>.s", dl.ID, r.tr.StreamName(topic))
			}
		})
	}
}

// TestTransportPerCodeDelays: the delay the policy gives a code is the
// delay the server waits before delivering again (NakWithDelay), and the
// partition holds meanwhile: a later message of the same Key waits.
func TestTransportPerCodeDelays(t *testing.T) {
	conn := embedded(t, "")
	const slow = 400 * time.Millisecond
	r := newRig(t, conn, false, nil, broker.WithRetryPolicy(broker.RetryPolicy{
		MaxRetries: 1,
		ByCode: map[string]broker.RetryRule{
			"slow": {MaxRetries: 1, Backoff: broker.ConstantBackoff(slow)},
			"fast": {MaxRetries: 1, Backoff: broker.ConstantBackoff(0)},
		},
	}))
	c := &calls{}
	r.subscribe(t, "delays", "s", c.handler("", func(_ context.Context, m broker.Message) error {
		if m.Attempt == 1 && m.ID != "after" {
			return codeErr{m.ID}
		}
		return nil
	}))
	watchT(t, watch(r.tr, "delays", "s"))
	for _, id := range []string{"fast", "slow", "after"} {
		r.publish(t, broker.Message{ID: id, Topic: "delays", Key: "same"})
	}
	waitFor(t, "three deliveries", func() bool { return subStats(r.b, "delays", "s").Delivered == 3 })
	for _, id := range []string{"fast", "slow"} {
		if got := c.attempts(id); !slices.Equal(got, []int{1, 2}) {
			t.Errorf("%s: attempts %v, want [1 2]", id, got)
		}
	}
	s := c.of("slow")
	if gap := s[1].at.Sub(s[0].end); gap < slow {
		t.Errorf("the retry of code slow came %v after the failure; its rule says %v", gap, slow)
	}
	if after := c.of("after"); len(after) != 1 || after[0].at.Before(s[1].end) {
		t.Errorf("a later message of the Key ran before the delayed retry ended (%+v)", after)
	}
}

// TestTransportDedup: the two dedup scopes. The server drops a copy of an
// ID published within its window (per topic, at publish: the handler runs
// once and nothing counts as deduplicated); without that window the KV
// store catches it per subscriber, after a success; with neither, the
// handler runs twice.
func TestTransportDedup(t *testing.T) {
	conn := embedded(t, "")
	tests := []struct {
		name         string
		window       time.Duration
		noKV         bool
		runs         int
		deduplicated uint64
	}{
		{"publish-side window", natsjs.DefaultPublishDedupWindow, false, 1, 0},
		{"KV store only", 0, false, 1, 1},
		{"neither", 0, true, 2, 0},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, conn, tt.noKV, []natsjs.TransportOption{natsjs.WithPublishDedupWindow(tt.window)})
			topic := fmt.Sprintf("dedup-%d", i)
			c := &calls{}
			r.subscribe(t, topic, "s", c.handler("", nil))
			r.publish(t, broker.Message{ID: "m", Topic: topic})
			waitFor(t, "the first copy", func() bool { return len(c.of("m")) == 1 })
			r.publish(t, broker.Message{ID: "m", Topic: topic})
			r.publish(t, broker.Message{ID: "barrier", Topic: topic}) // one partition: ends after the copy
			// The barrier's handler ran; its delivery ends (InFlight 0) just after.
			waitFor(t, "the barrier", func() bool { return len(c.of("barrier")) == 1 && subStats(r.b, topic, "s").InFlight == 0 })
			ss := subStats(r.b, topic, "s")
			if n := len(c.of("m")); n != tt.runs || ss.Deduplicated != tt.deduplicated {
				t.Errorf("handler ran %d times, Deduplicated %d; want %d and %d", n, ss.Deduplicated, tt.runs, tt.deduplicated)
			}
			if st := r.b.Stats().Topics[topic]; st.Published != 3 {
				t.Errorf("Published = %d, want 3 (a copy dropped by the server is accepted)", st.Published)
			}
			if s := conserved(ss); s != "" {
				t.Error(s)
			}
		})
	}
}

// TestTransportRedrive: a dead letter redriven goes back to the one
// subscriber that failed it, from attempt 1 (the dedup record does not
// stop it), even while no process is subscribed: the durable consumer
// keeps it. A subscriber without a consumer cannot be redriven to.
func TestTransportRedrive(t *testing.T) {
	conn := embedded(t, "")
	r := newRig(t, conn, false, nil)
	c := &calls{}
	fail := true
	h := c.handler("", func(_ context.Context, m broker.Message) error {
		if fail && m.ID == "bad" {
			return broker.Permanent(errors.New("declined"))
		}
		return nil
	})
	sub := r.subscribe(t, "redrive", "billing", h)
	other := &calls{}
	r.subscribe(t, "redrive", "audit", other.handler("", nil))
	r.publish(t, broker.Message{ID: "bad", Topic: "redrive", Key: "k", Headers: map[string]string{"h": "v"}})
	waitFor(t, "the dead letter", func() bool { return subStats(r.b, "redrive", "billing").DeadLettered == 1 })
	dls, err := r.dlq.List(t.Context(), broker.DeadLetterFilter{Topic: "redrive"})
	if err != nil || len(dls) != 1 {
		t.Fatalf("List = %v, %v; want one dead letter", dls, err)
	}

	if err := sub.Unsubscribe(t.Context()); err != nil {
		t.Fatalf("Unsubscribe: %v", err)
	}
	fail = false // read by the handler only after the next Subscribe
	if n, err := r.b.Redrive(t.Context(), dls[0].ID); n != 1 || err != nil {
		t.Fatalf("Redrive with no process subscribed = %d, %v; want 1, nil (the durable consumer keeps it)", n, err)
	}
	r.subscribe(t, "redrive", "billing", h)
	waitFor(t, "the redriven message", func() bool { return len(c.of("bad")) == 2 })
	got := c.of("bad")[1].msg
	if got.Attempt != 1 || got.Headers["h"] != "v" || got.Key != "k" {
		t.Errorf("redriven delivery %+v: want attempt 1 with the headers and key", got)
	}
	waitFor(t, "the delivery", func() bool { return subStats(r.b, "redrive", "billing").Delivered == 1 })
	if n := len(other.of("bad")); n != 1 {
		t.Errorf("subscriber audit ran bad %d times; want 1 (a redrive is for billing only)", n)
	}
	if n, err := r.dlq.Len(t.Context()); n != 0 || err != nil {
		t.Errorf("dead letters left = %d, %v; want 0", n, err)
	}

	ghost := broker.DeadLetter{ID: "ghost-1", Message: broker.Message{ID: "x", Topic: "redrive"}, Subscriber: "ghost", Reason: broker.ReasonPermanent}
	if err := r.dlq.Put(t.Context(), ghost); err != nil {
		t.Fatal(err)
	}
	if _, err := r.b.Redrive(t.Context(), ghost.ID); !errors.Is(err, broker.ErrSubscriberNotFound) {
		t.Errorf("Redrive to a subscriber without a consumer: %v; want ErrSubscriberNotFound", err)
	}
	if _, err := r.b.Redrive(t.Context(), "nope"); !errors.Is(err, broker.ErrDeadLetterNotFound) {
		t.Errorf("Redrive(unknown): %v; want ErrDeadLetterNotFound", err)
	}
}

// TestSubscriberKeepsMessagesWhileAway: unlike the in-memory broker, a
// subscriber that unsubscribed keeps its durable consumer: what is published
// meanwhile waits for it (and counts against the queue size) until it
// subscribes again or is removed; a topic with no consumer stores nothing
// (and Unrouted stays 0: the server drops it unseen).
func TestSubscriberKeepsMessagesWhileAway(t *testing.T) {
	conn := embedded(t, "")
	r := newRig(t, conn, false, nil)
	r.publish(t, broker.Message{ID: "before", Topic: "away"})
	if n := r.streamMsgs(t, "away"); n != 0 {
		t.Errorf("a message with no consumer: stream holds %d, want 0", n)
	}
	c := &calls{}
	sub := r.subscribe(t, "away", "s", c.handler("", nil))
	if err := sub.Unsubscribe(t.Context()); err != nil {
		t.Fatal(err)
	}
	r.publish(t, broker.Message{ID: "meanwhile", Topic: "away"})
	if n := r.streamMsgs(t, "away"); n != 1 {
		t.Errorf("stream holds %d while the subscriber is away, want 1", n)
	}
	r.subscribe(t, "away", "s", c.handler("", nil))
	waitFor(t, "the message published while away", func() bool { return len(c.of("meanwhile")) == 1 })
	if n := len(c.of("before")); n != 0 {
		t.Errorf("a message published before the subscriber existed was delivered %d times", n)
	}
	if st := r.b.Stats().Topics["away"]; st.Unrouted != 0 || st.Published != 2 {
		t.Errorf("topic stats %+v: want Published 2, Unrouted 0", st)
	}
	if err := r.tr.RemoveSubscriber(t.Context(), "away", "s"); err != nil {
		t.Fatalf("RemoveSubscriber: %v", err)
	}
	if _, err := r.tr.ConsumerInfo(t.Context(), "away", "s"); err == nil {
		t.Errorf("ConsumerInfo after RemoveSubscriber: no error; want the consumers gone")
	}
}

// TestStatsPerProcess: at a quiet moment every subscriber keeps the
// conservation law over a mix of outcomes, with four partitions and
// concurrency.
func TestStatsPerProcess(t *testing.T) {
	conn := embedded(t, "")
	r := newRig(t, conn, false, []natsjs.TransportOption{natsjs.WithPartitions(4)})
	c := &calls{}
	h := c.handler("", func(_ context.Context, m broker.Message) error {
		switch {
		case strings.HasPrefix(m.ID, "flaky") && m.Attempt == 1:
			return errors.New("once")
		case strings.HasPrefix(m.ID, "poison"):
			return errors.New("always")
		case strings.HasPrefix(m.ID, "bad"):
			return broker.Permanent(errors.New("no"))
		}
		return nil
	})
	r.subscribe(t, "mix", "a", h, broker.Concurrency(4))
	r.subscribe(t, "mix", "b", h, broker.Concurrency(2))
	watchT(t, watch(r.tr, "mix", "a"), watch(r.tr, "mix", "b"))
	n := 0
	for i := range 10 {
		for _, kind := range []string{"ok", "flaky", "poison", "bad"} {
			r.publish(t, broker.Message{ID: fmt.Sprintf("%s-%d", kind, i), Topic: "mix", Key: fmt.Sprintf("k%d", i%3)})
			n++
		}
	}
	for _, sub := range []string{"a", "b"} {
		waitFor(t, "every message to end at "+sub, func() bool {
			ss := subStats(r.b, "mix", sub)
			return ss.Delivered+ss.DeadLettered == uint64(n)
		})
		ss := subStats(r.b, "mix", sub)
		if s := conserved(ss); s != "" {
			t.Errorf("%s: %s", sub, s)
		}
		// ok 1 attempt, flaky 2, poison 3, bad 1.
		if ss.Delivered != 20 || ss.DeadLettered != 20 || ss.Attempts != 70 || ss.Retries != 30 || ss.Routed != 40 {
			t.Errorf("%s: %+v; want Delivered 20, DeadLettered 20, Attempts 70, Retries 30, Routed 40", sub, ss)
		}
	}
}

// TestTopicAndSubscriberNames: any topic or subscriber name works, each in
// a stream and consumers of its own (names differing only in case or by a
// dot included), without cross-talk.
func TestTopicAndSubscriberNames(t *testing.T) {
	conn := embedded(t, "")
	r := newRig(t, conn, false, nil)
	names := []string{"orders", "Orders", "orders.eu", "orders_eu", "a b*>", "ünïcødé", "dlq", "_x", "-y", strings.Repeat("long", 80)}
	c := &calls{}
	for _, topic := range names {
		for _, sub := range []string{"s", "S", topic} {
			r.subscribe(t, topic, sub, c.handler(topic+"|"+sub, nil))
		}
	}
	for _, topic := range names {
		r.publish(t, broker.Message{ID: "to " + topic, Topic: topic})
	}
	waitFor(t, "every delivery", func() bool { return len(c.snapshot()) == 3*len(names) })
	for _, cl := range c.snapshot() {
		topic, _, _ := strings.Cut(cl.who, "|")
		if cl.msg.ID != "to "+topic || cl.msg.Topic != topic {
			t.Errorf("%s got %q on topic %q", cl.who, cl.msg.ID, cl.msg.Topic)
		}
	}
	streams := map[string]bool{}
	for _, topic := range names {
		streams[r.tr.StreamName(topic)] = true
	}
	if len(streams) != len(names) {
		t.Errorf("%d topics share %d streams", len(names), len(streams))
	}
}

// TestSubscribeRefuses: the in-memory lane's options are refused; Ordered
// is accepted whatever the partitions (keyless messages have a consumer of
// their own).
func TestSubscribeRefuses(t *testing.T) {
	conn := embedded(t, "")
	one := newRig(t, conn, false, nil)
	four := newRig(t, conn, false, []natsjs.TransportOption{natsjs.WithPartitions(4)})
	tests := []struct {
		name string
		r    *rig
		opt  broker.SubscribeOption
		ok   bool
	}{
		{"LaneSize", one, broker.LaneSize(8), false},
		{"WhenLaneFull", one, broker.WhenLaneFull(broker.DeadLetterNewest), false},
		{"CircuitBreaker", one, broker.CircuitBreaker(broker.BreakerPolicy{}), false},
		{"RateLimit", one, broker.RateLimit(10, 1), false},
		{"Ordered, four partitions", four, broker.Ordered(), true},
		{"Ordered, one partition", one, broker.Ordered(), true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.r.b.Subscribe(fmt.Sprintf("refuse-%d", i), "s", func(context.Context, broker.Message) error { return nil }, tt.opt)
			if tt.ok && err != nil {
				t.Errorf("Subscribe: %v", err)
			}
			if !tt.ok && !errors.Is(err, broker.ErrInvalidOption) {
				t.Errorf("Subscribe: %v; want ErrInvalidOption", err)
			}
		})
	}
}

// TestPartitionsAreFixed: the partition count is the stream's, set when it
// is created: a transport without WithPartitions uses it, one asking for
// another count is refused.
func TestPartitionsAreFixed(t *testing.T) {
	conn := embedded(t, "")
	four := newRig(t, conn, false, []natsjs.TransportOption{natsjs.WithPartitions(4)})
	four.publish(t, broker.Message{ID: "m", Topic: "fixed"})

	plain, err := natsjs.NewTransport(conn.JetStream())
	if err != nil {
		t.Fatal(err)
	}
	names, err := plain.ConsumerNames(t.Context(), "fixed", "s")
	if err != nil || len(names) != 5 {
		t.Errorf("ConsumerNames with the default option = %v, %v; want 5 (the stream's 4 partitions, then keyless messages)", names, err)
	}
	two, err := natsjs.NewTransport(conn.JetStream(), natsjs.WithPartitions(2))
	if err != nil {
		t.Fatal(err)
	}
	err = two.Publish(t.Context(), broker.Message{ID: "n", Topic: "fixed", PublishedAt: time.Now()})
	if !errors.Is(err, natsjs.ErrInvalidOption) || !strings.Contains(err.Error(), "4 partitions") {
		t.Errorf("Publish with WithPartitions(2) on a 4-partition topic: %v; want ErrInvalidOption naming 4", err)
	}
	for _, tr := range []*natsjs.Transport{plain, two} {
		if err := tr.Close(t.Context()); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
}

func TestTransportOptionsRefused(t *testing.T) {
	conn := embedded(t, "")
	bad := map[string]natsjs.TransportOption{
		"partitions 0":        natsjs.WithPartitions(0),
		"partitions too many": natsjs.WithPartitions(natsjs.MaxPartitions + 1),
		"queue size 0":        natsjs.WithQueueSize(0),
		"ack wait short":      natsjs.WithAckWait(time.Millisecond),
		"dedup window < 0":    natsjs.WithPublishDedupWindow(-time.Second),
		"storage":             natsjs.WithStreamStorage(7),
		"replicas 0":          natsjs.WithStreamReplicas(0),
		"pull expiry short":   natsjs.WithPullExpiry(time.Millisecond),
		"nil logger":          natsjs.WithLogger(nil),
		"nil dead letters":    natsjs.WithDeadLetterCheck(nil),
		"stream prefix dot":   natsjs.WithPrefixes("A.B", "a"),
		"subject wildcard":    natsjs.WithPrefixes("A", "a.*"),
	}
	for name, opt := range bad {
		t.Run(name, func(t *testing.T) {
			if _, err := natsjs.NewTransport(conn.JetStream(), opt); !errors.Is(err, natsjs.ErrInvalidOption) {
				t.Errorf("NewTransport: %v; want ErrInvalidOption", err)
			}
		})
	}
	if _, err := natsjs.NewTransport(nil); !errors.Is(err, natsjs.ErrInvalidOption) {
		t.Errorf("NewTransport(nil): %v; want ErrInvalidOption", err)
	}
	if _, err := natsjs.New(t.Context(), nil, natsjs.Config{}); !errors.Is(err, natsjs.ErrInvalidOption) {
		t.Errorf("New(nil): %v; want ErrInvalidOption", err)
	}
	if _, err := natsjs.New(t.Context(), conn.JetStream(), natsjs.Config{}, broker.WithQueueSize(-1)); !errors.Is(err, broker.ErrInvalidOption) {
		t.Errorf("New with a bad broker option: %v; want broker.ErrInvalidOption", err)
	}
}

// TestKeepAliveHoldsALongHandler: a handler running for several AckWaits
// is reported alive (InProgress), so the server does not hand its message
// to the other process subscribed under the name.
func TestKeepAliveHoldsALongHandler(t *testing.T) {
	conn := embedded(t, "")
	const ackWait = 300 * time.Millisecond
	topts := []natsjs.TransportOption{natsjs.WithAckWait(ackWait)}
	a := newRig(t, conn, false, topts)
	b := newRig(t, conn, false, topts)
	c := &calls{}
	release := make(chan struct{})
	h := func(who string) broker.Handler {
		return c.handler(who, func(ctx context.Context, m broker.Message) error {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		})
	}
	a.subscribe(t, "long", "s", h("a"))
	b.subscribe(t, "long", "s", h("b"))
	a.publish(t, broker.Message{ID: "m", Topic: "long"})
	waitFor(t, "the handler to start", func() bool { return len(c.of("m")) == 1 })
	// The server's AckWait is real time: let five pass.
	time.Sleep(5 * ackWait)
	close(release)
	waitFor(t, "the delivery", func() bool {
		return subStats(a.b, "long", "s").Delivered+subStats(b.b, "long", "s").Delivered == 1
	})
	if got := c.of("m"); len(got) != 1 {
		t.Errorf("the message ran %d times (%v); want once: the keep-alive holds it", len(got), c.attempts("m"))
	}
}

// TestCloseLeavesMessagesDurable: Close whose context ends while a handler
// runs hands the message back to the server instead of dead-lettering it
// (reason "shutdown" is never produced); a broker opened on the same
// directory gets it, at the server's next attempt number.
func TestCloseLeavesMessagesDurable(t *testing.T) {
	dir := t.TempDir()
	cfg := natsjs.Config{Logger: discardLogger}
	b1, err := natsjs.Open(dir, cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	started := make(chan struct{}, 1)
	if _, err := b1.Subscribe("jobs", "w", func(ctx context.Context, m broker.Message) error {
		started <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	}); err != nil {
		t.Fatal(err)
	}
	if err := b1.Publish(t.Context(), broker.Message{ID: "job-1", Topic: "jobs"}); err != nil {
		t.Fatal(err)
	}
	<-started
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if err := b1.Close(ctx); err != nil {
		t.Errorf("Close: %v; want nil (nothing is dead-lettered with a transport)", err)
	}
	if n, err := b1.DeadLetters().Len(t.Context()); err == nil || n != 0 {
		// The store's connection is closed with the broker: an error is
		// expected; a count would mean it is still open.
		t.Errorf("dead-letter store after Close = %d, %v; want an error (closed)", n, err)
	}

	b2, err := natsjs.Open(dir, cfg)
	if err != nil {
		t.Fatalf("Open again: %v", err)
	}
	defer closeBroker(t, b2)
	got := make(chan broker.Message, 1)
	if _, err := b2.Subscribe("jobs", "w", func(_ context.Context, m broker.Message) error {
		got <- m
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	m := receive(t, got, "the message left unfinished")
	if m.ID != "job-1" || m.Attempt != 2 {
		t.Errorf("got %q at attempt %d; want job-1 at attempt 2 (the server's count)", m.ID, m.Attempt)
	}
	if n, err := b2.DeadLetters().Len(t.Context()); n != 0 || err != nil {
		t.Errorf("dead letters = %d, %v; want 0", n, err)
	}
}

// TestWaitingForAHandlerKeepsAlive: with fewer handlers than partitions, a
// message taken from one partition while the handlers are busy is reported
// alive while it waits, so the server does not give it to another process
// subscribed under the name.
func TestWaitingForAHandlerKeepsAlive(t *testing.T) {
	conn := embedded(t, "")
	const ackWait = 300 * time.Millisecond
	topts := []natsjs.TransportOption{natsjs.WithAckWait(ackWait), natsjs.WithPartitions(2)}
	a := newRig(t, conn, true, topts)
	c := &calls{}
	release := make(chan struct{})
	a.subscribe(t, "wait", "s", c.handler("a", func(ctx context.Context, m broker.Message) error {
		if m.ID == "first" {
			<-release
		}
		return nil
	}), broker.Concurrency(1))
	keys := map[int]string{}
	for i := 0; len(keys) < 2; i++ {
		k := fmt.Sprintf("k%d", i)
		keys[natsjs.Partition(k, "", 2)] = k
	}
	a.publish(t, broker.Message{ID: "first", Topic: "wait", Key: keys[0]})
	waitFor(t, "first to run", func() bool { return len(c.of("first")) == 1 })
	a.publish(t, broker.Message{ID: "second", Topic: "wait", Key: keys[1]}) // taken, waits for the one handler
	waitFor(t, "second to be taken", func() bool { _, ack := a.backlog(t, "wait", "s"); return ack == 2 })
	b := newRig(t, conn, true, topts)
	b.subscribe(t, "wait", "s", c.handler("b", nil))
	time.Sleep(5 * ackWait) // the server's AckWait is real time
	close(release)
	waitFor(t, "both delivered", func() bool { return subStats(a.b, "wait", "s").Delivered == 2 })
	if got := c.of("second"); len(got) != 1 || got[0].who != "a" || got[0].msg.Attempt != 1 {
		t.Errorf("second ran %d times (%+v); want once, by a, at attempt 1", len(got), got)
	}
}

// TestConsumerDeletedWhileSubscribed: a consumer deleted under a running
// subscription (by an operator, say) is created again, delivering what is
// published from then on; also when the transport's logger panics on the
// warning it logs then (the loop goes on: a logger is user code).
func TestConsumerDeletedWhileSubscribed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		logger *slog.Logger
	}{
		{"quiet logger", discardLogger},
		{"panicking logger", slog.New(panickingHandler{})},
	} {
		t.Run(tc.name, func(t *testing.T) { testConsumerDeleted(t, tc.logger) })
	}
}

// panickingHandler is a slog.Handler whose every record panics.
type panickingHandler struct{}

func (panickingHandler) Enabled(context.Context, slog.Level) bool  { return true }
func (panickingHandler) Handle(context.Context, slog.Record) error { panic("log bug") }
func (h panickingHandler) WithAttrs([]slog.Attr) slog.Handler      { return h }
func (h panickingHandler) WithGroup(string) slog.Handler           { return h }

func testConsumerDeleted(t *testing.T, logger *slog.Logger) {
	conn := embedded(t, "")
	r := newRig(t, conn, false, []natsjs.TransportOption{natsjs.WithLogger(logger)})
	c := &calls{}
	r.subscribe(t, "deleted", "s", c.handler("", nil))
	names, err := r.tr.ConsumerNames(t.Context(), "deleted", "s")
	if err != nil {
		t.Fatal(err)
	}
	// The messages below are keyless: the last consumer's.
	if err := conn.JetStream().DeleteConsumer(t.Context(), r.tr.StreamName("deleted"), names[len(names)-1]); err != nil {
		t.Fatalf("DeleteConsumer: %v", err)
	}
	// Published before the consumer is back, a message is not kept for
	// it: publish until one gets through.
	i := 0
	waitFor(t, "a delivery after the consumer was deleted", func() bool {
		if len(c.snapshot()) > 0 {
			return true
		}
		i++
		r.publish(t, broker.Message{ID: fmt.Sprintf("m-%d", i), Topic: "deleted"})
		return false
	})
	if _, err := r.tr.ConsumerInfo(t.Context(), "deleted", "s"); err != nil {
		t.Errorf("ConsumerInfo after the consumer came back: %v", err)
	}
}

// panickingGet is a dead-letter store whose Get panics (the other methods
// are not called by the transport).
type panickingGet struct{ broker.DeadLetterStore }

func (panickingGet) Get(context.Context, string) (broker.DeadLetter, bool, error) {
	panic("store bug")
}

// TestDeadLetterCheckSurvivesAPanickingStore: a dead-letter store whose Get
// panics, looked up before a redelivery, counts as not knowing the dead
// letter: the message runs and is delivered, and the process goes on.
func TestDeadLetterCheckSurvivesAPanickingStore(t *testing.T) {
	conn := embedded(t, "")
	r := newRig(t, conn, true, []natsjs.TransportOption{natsjs.WithDeadLetterCheck(panickingGet{})})
	c := &calls{}
	r.subscribe(t, "panicky", "s", c.handler("", func(_ context.Context, m broker.Message) error {
		if m.Attempt == 1 {
			return errors.New("once")
		}
		return nil
	}))
	r.publish(t, broker.Message{ID: "m", Topic: "panicky"})
	waitFor(t, "the redelivery", func() bool { return subStats(r.b, "panicky", "s").Delivered == 1 })
	if got := c.attempts("m"); !slices.Equal(got, []int{1, 2}) {
		t.Errorf("attempts = %v, want [1 2]", got)
	}
}

// TestPublishAfterTheStreamIsDeleted: a topic's stream deleted under the
// transport is created again by the next Publish, with its partitions,
// while several publishers find it gone at once.
func TestPublishAfterTheStreamIsDeleted(t *testing.T) {
	conn := embedded(t, "")
	r := newRig(t, conn, true, []natsjs.TransportOption{natsjs.WithPartitions(4)})
	r.publish(t, broker.Message{ID: "first", Topic: "gone"})
	if err := conn.JetStream().DeleteStream(t.Context(), r.tr.StreamName("gone")); err != nil {
		t.Fatalf("DeleteStream: %v", err)
	}
	var wg sync.WaitGroup
	for p := range 4 {
		wg.Go(func() {
			m := broker.Message{ID: fmt.Sprintf("m-%d", p), Topic: "gone", Key: strconv.Itoa(p)}
			deadline := time.Now().Add(10 * time.Second)
			for r.b.Publish(context.Background(), m) != nil {
				if time.Now().After(deadline) {
					t.Errorf("Publish(%s) still failing 10s after the stream was deleted", m.ID)
					return
				}
			}
		})
	}
	wg.Wait()
	names, err := r.tr.ConsumerNames(t.Context(), "gone", "s")
	if err != nil || len(names) != 5 {
		t.Errorf("ConsumerNames = %v, %v; want 5 (the stream is back with its 4 partitions)", names, err)
	}
}

// TestTransportOf: a broker New built hands out its Transport, whose
// ConsumerInfo tells the subscriber's backlog across processes; an
// in-memory broker has none.
func TestTransportOf(t *testing.T) {
	conn := embedded(t, "")
	b, err := natsjs.New(t.Context(), conn.JetStream(), natsjs.Config{NoDedup: true, Logger: discardLogger})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { closeBroker(t, b) })
	tr, ok := natsjs.TransportOf(b)
	if !ok {
		t.Fatal("TransportOf(New(...)) = false")
	}
	sub, err := b.Subscribe("backlog", "s", func(context.Context, broker.Message) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Unsubscribe(t.Context()); err != nil { // the consumers stay and keep what comes
		t.Fatal(err)
	}
	for i := range 3 {
		if err := b.Publish(t.Context(), broker.Message{ID: fmt.Sprintf("m-%d", i), Topic: "backlog"}); err != nil {
			t.Fatal(err)
		}
	}
	// The server counts a stored message for its consumers a moment later.
	waitFor(t, "NumPending 3 over the consumers", func() bool {
		infos, err := tr.ConsumerInfo(t.Context(), "backlog", "s")
		if err != nil {
			t.Fatalf("ConsumerInfo: %v", err)
		}
		var pending uint64
		for _, in := range infos {
			pending += in.NumPending
		}
		return pending == 3
	})
	mem, err := broker.New(quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeBroker(t, mem) })
	if _, ok := natsjs.TransportOf(mem); ok || mem.Transport() != nil {
		t.Error("an in-memory broker has a transport")
	}
	if _, ok := natsjs.TransportOf(nil); ok {
		t.Error("TransportOf(nil) = true")
	}
}
