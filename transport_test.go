package broker

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeTransport is a Transport for tests: each subscriber has a queue and
// Concurrency workers; Retry requeues after the delay with Attempt + 1. It
// records what the broker told it.
type fakeTransport struct {
	mu       sync.Mutex
	subs     map[string][]*fakeSub // by topic
	told     []string              // "op id[#attempt] arg"
	redrives []DeadLetter
	closed   bool
	full     bool          // Publish answers ErrQueueFull
	hang     bool          // Publish and Redrive wait for ctx to end and return its error
	drain    bool          // a stopping subscription still delivers what it queued (as natsjs's inbox does)
	every    time.Duration // KeepAliveEvery of its deliveries
	settling func()        // called as a delivery is settled, before it is
}

type fakeSub struct {
	tr    *fakeTransport
	sub   TransportSubscriber
	q     chan *fakeDelivery
	stop  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
	timer sync.WaitGroup
}

type fakeDelivery struct {
	s        *fakeSub
	msg      Message
	redriven bool
	done     atomic.Bool
}

func newFakeTransport() *fakeTransport { return &fakeTransport{subs: map[string][]*fakeSub{}} }

func (tr *fakeTransport) note(format string, args ...any) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.told = append(tr.told, fmt.Sprintf(format, args...))
}

func (tr *fakeTransport) log() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.told...)
}

func (tr *fakeTransport) Publish(ctx context.Context, msg Message) error {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.full {
		return waitFull(ctx)
	}
	if tr.hang {
		<-ctx.Done()
		return ctx.Err()
	}
	for _, s := range tr.subs[msg.Topic] {
		m := msg
		m.Attempt = 1
		s.q <- &fakeDelivery{s: s, msg: m}
	}
	return nil
}

func (tr *fakeTransport) Subscribe(sub TransportSubscriber) (TransportSubscription, error) {
	if sub.Ordered {
		return nil, fmt.Errorf("%w: fake: no Ordered", ErrInvalidOption)
	}
	s := &fakeSub{tr: tr, sub: sub, q: make(chan *fakeDelivery, 1024), stop: make(chan struct{})}
	tr.mu.Lock()
	drain := tr.drain
	tr.mu.Unlock()
	deliver := func(d *fakeDelivery) {
		sub.Deliver(d)
		if !d.done.Load() {
			panic("the broker returned from Deliver without Ack, Retry or Terminate")
		}
	}
	for range sub.Concurrency {
		s.wg.Go(func() {
			for {
				select {
				case <-s.stop:
					for drain {
						select {
						case d := <-s.q:
							deliver(d)
						default:
							return
						}
					}
					return
				case d := <-s.q:
					deliver(d)
				}
			}
		})
	}
	tr.mu.Lock()
	tr.subs[sub.Topic] = append(tr.subs[sub.Topic], s)
	tr.mu.Unlock()
	return s, nil
}

// waitFull is a full stream's answer: at once without a deadline (a
// publish timeout of 0), else when ctx ends.
func waitFull(ctx context.Context) error {
	if _, ok := ctx.Deadline(); ok {
		<-ctx.Done()
	}
	return fmt.Errorf("%w: fake stream full", ErrQueueFull)
}

func (tr *fakeTransport) Redrive(ctx context.Context, dl DeadLetter) error {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.full {
		return waitFull(ctx)
	}
	if tr.hang {
		<-ctx.Done()
		return ctx.Err()
	}
	tr.redrives = append(tr.redrives, dl)
	for _, s := range tr.subs[dl.Message.Topic] {
		if s.sub.Name == dl.Subscriber {
			m := dl.Message
			m.Attempt = 1
			s.q <- &fakeDelivery{s: s, msg: m, redriven: true}
			return nil
		}
	}
	return errors.New("fake: no such subscriber")
}

func (tr *fakeTransport) Close(context.Context) error {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.closed = true
	return nil
}

func (s *fakeSub) Stop(ctx context.Context) error {
	s.once.Do(func() { close(s.stop) })
	s.wg.Wait()
	s.timer.Wait()
	s.tr.mu.Lock()
	defer s.tr.mu.Unlock()
	subs := s.tr.subs[s.sub.Topic]
	for i, x := range subs {
		if x == s {
			s.tr.subs[s.sub.Topic] = append(subs[:i], subs[i+1:]...)
		}
	}
	return nil
}

func (d *fakeDelivery) Message() Message { return d.msg }
func (d *fakeDelivery) Redriven() bool   { return d.redriven }
func (d *fakeDelivery) end(op, arg string) error {
	if d.done.Swap(true) {
		panic("a delivery was acknowledged twice")
	}
	if f := d.s.tr.settling; f != nil {
		f()
	}
	d.s.tr.note("%s %s#%d%s", op, d.msg.ID, d.msg.Attempt, arg)
	return nil
}
func (d *fakeDelivery) Ack() error { return d.end("ack", "") }
func (d *fakeDelivery) Retry(delay time.Duration) error {
	_ = d.end("retry", " "+delay.String())
	next := &fakeDelivery{s: d.s, msg: d.msg, redriven: d.redriven} // a redriven copy stays one (natsjs: its header)
	next.msg.Attempt++
	d.s.timer.Add(1)
	time.AfterFunc(delay, func() {
		defer d.s.timer.Done()
		select {
		case <-d.s.stop:
		default:
			d.s.q <- next
		}
	})
	return nil
}
func (d *fakeDelivery) Terminate(reason string) error { return d.end("term", " "+reason) }
func (d *fakeDelivery) KeepAliveEvery() time.Duration { return d.s.tr.every }
func (d *fakeDelivery) KeepAlive() error {
	d.s.tr.note("alive %s#%d", d.msg.ID, d.msg.Attempt)
	return nil
}

type namedDelivery struct{ *fakeDelivery }

func (d namedDelivery) DeadLetterID() string { return "fixed-" + d.msg.ID }

func newTransportBroker(t *testing.T, tr *fakeTransport, opts ...Option) *Broker {
	t.Helper()
	base := []Option{WithLogger(discard), WithTransport(tr),
		WithRetryPolicy(RetryPolicy{MaxRetries: 2, Backoff: ConstantBackoff(10 * time.Millisecond)})}
	b, err := New(append(base, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	return b
}

func TestTransportDeliveryOutcomes(t *testing.T) {
	perm := errors.New("bad input")
	tests := []struct {
		name     string
		handler  func(Message) error
		told     []string
		dlReason string
	}{
		{"delivered", func(Message) error { return nil }, []string{"ack m#1"}, ""},
		{"retried, then delivered", func(m Message) error {
			if m.Attempt < 3 {
				return errors.New("flaky")
			}
			return nil
		}, []string{"retry m#1 10ms", "retry m#2 10ms", "ack m#3"}, ""},
		{"exhausted", func(Message) error { return codedError{"db"} },
			[]string{"retry m#1 10ms", "retry m#2 10ms", "term m#3 exhausted"}, ReasonExhausted},
		{"permanent", func(Message) error { return Permanent(perm) }, []string{"term m#1 permanent"}, ReasonPermanent},
		{"panic", func(Message) error { panic("boom") },
			[]string{"retry m#1 10ms", "retry m#2 10ms", "term m#3 exhausted"}, ReasonExhausted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				tr := newFakeTransport()
				b := newTransportBroker(t, tr)
				c := &calls{}
				_, err := b.Subscribe("t", "s", recording(c, tt.handler))
				require.NoError(t, err)
				require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t", Headers: map[string]string{"h": "v"}}))
				time.Sleep(time.Second)
				idle()
				assert.Equal(t, tt.told, tr.log())
				st := b.Stats()
				requireConserved(t, st)
				ss := st.Topics["t"].Subscribers["s"]
				assert.Equal(t, uint64(1), ss.Routed)
				assert.Equal(t, uint64(len(tt.told)), ss.Attempts)
				assert.Equal(t, uint64(1), st.Topics["t"].Published)
				dls := deadLetters(t, b)
				if tt.dlReason == "" {
					assert.Empty(t, dls)
					assert.Equal(t, uint64(1), ss.Delivered)
					return
				}
				require.Len(t, dls, 1)
				assert.Equal(t, tt.dlReason, dls[0].Reason)
				assert.Equal(t, len(tt.told), dls[0].Attempts)
				assert.Equal(t, map[string]string{"h": "v"}, dls[0].Message.Headers)
			})
		})
	}
}

func TestTransportDedupAndRedrive(t *testing.T) {
	bubble(t, func(t *testing.T) {
		tr := newFakeTransport()
		b := newTransportBroker(t, tr)
		fail := true
		c := &calls{}
		_, err := b.Subscribe("t", "s", recording(c, func(m Message) error {
			if m.ID == "bad" && fail {
				return Permanent(errors.New("no"))
			}
			return nil
		}))
		require.NoError(t, err)
		for _, id := range []string{"m", "m", "bad"} {
			require.NoError(t, b.Publish(context.Background(), Message{ID: id, Topic: "t"}))
			idle()
		}
		assert.Equal(t, []string{"ack m#1", "ack m#1", "term bad#1 permanent"}, tr.log(), "the copy is acknowledged without running")
		assert.Equal(t, []string{"m", "bad"}, c.ids())
		dls := deadLetters(t, b)
		require.Len(t, dls, 1)

		fail = false
		n, err := b.Redrive(context.Background(), dls[0].ID)
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		idle()
		assert.Equal(t, "ack bad#1", tr.log()[3], "a redriven dead letter skips dedup and starts at attempt 1")
		assert.Empty(t, deadLetters(t, b), "the redriven dead letter left the store")
		ss := subStats(t, b, "t", "s")
		assert.Equal(t, uint64(1), ss.Deduplicated)
		assert.Equal(t, uint64(2), ss.Delivered)
		requireConserved(t, b.Stats())
	})
}

// TestTransportRedrivenRetries: a redriven message that fails again is
// retried under the policy from attempt 1 (the transport's count, which
// Redriven does not reset) and dead-lettered again after MaxRetries+1
// attempts; it is routed once per redrive, so Stats add up at rest.
func TestTransportRedrivenRetries(t *testing.T) {
	for _, heals := range []bool{false, true} {
		t.Run(fmt.Sprintf("heals=%v", heals), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				tr := newFakeTransport()
				b := newTransportBroker(t, tr)
				var runs atomic.Int32
				redriven := atomic.Bool{}
				_, err := b.Subscribe("t", "s", func(_ context.Context, m Message) error {
					if redriven.Load() && heals && runs.Add(1) > 1 {
						return nil
					}
					return errors.New("down")
				})
				require.NoError(t, err)
				require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
				time.Sleep(time.Second) // the retries' backoffs (fake time)
				idle()
				dls := deadLetters(t, b)
				require.Len(t, dls, 1)
				redriven.Store(true)
				n, err := b.Redrive(context.Background(), dls[0].ID)
				require.NoError(t, err)
				require.Equal(t, 1, n)
				time.Sleep(time.Second)
				idle()
				want := []string{"retry m#1 10ms", "retry m#2 10ms", "term m#3 exhausted",
					"retry m#1 10ms", "retry m#2 10ms", "term m#3 exhausted"}
				if heals {
					want = append(want[:4], "ack m#2")
				}
				assert.Equal(t, want, tr.log())
				ss := subStats(t, b, "t", "s")
				assert.Equal(t, uint64(2), ss.Routed, "routed once per publish and once per redrive")
				if heals {
					assert.Empty(t, deadLetters(t, b))
					assert.Equal(t, uint64(1), ss.Delivered)
				} else {
					assert.Len(t, deadLetters(t, b), 1, "dead-lettered again")
					assert.Equal(t, uint64(2), ss.DeadLettered)
				}
				requireConserved(t, b.Stats())
			})
		})
	}
}

// A delivery counted past every rule's attempts ran in a process that died
// during it: it is dead-lettered without running again.
func TestTransportAttemptBeyondThePolicyIsNotRun(t *testing.T) {
	bubble(t, func(t *testing.T) {
		tr := newFakeTransport()
		b := newTransportBroker(t, tr)
		c := &calls{}
		_, err := b.Subscribe("t", "s", okHandler(c))
		require.NoError(t, err)
		tr.mu.Lock()
		s := tr.subs["t"][0]
		tr.mu.Unlock()
		s.q <- &fakeDelivery{s: s, msg: Message{ID: "poison", Topic: "t", Attempt: 4}}
		idle()
		assert.Zero(t, c.len())
		assert.Equal(t, []string{"term poison#4 exhausted"}, tr.log())
		dls := deadLetters(t, b)
		require.Len(t, dls, 1)
		assert.Contains(t, dls[0].Error, "delivered 4 times")
		// As any exhausted dead letter: the policy's attempts, retryable.
		assert.Equal(t, 3, dls[0].Attempts)
		assert.Equal(t, 3, dls[0].Message.Attempt)
		assert.True(t, dls[0].Retryable)
		assert.Equal(t, ReasonExhausted, dls[0].Reason)
		assert.Equal(t, CodeError, dls[0].ErrorCode)
		requireConserved(t, b.Stats())
	})
}

func TestTransportKeepsLongHandlersAlive(t *testing.T) {
	bubble(t, func(t *testing.T) {
		tr := newFakeTransport()
		tr.every = 10 * time.Second
		b := newTransportBroker(t, tr)
		_, err := b.Subscribe("t", "s", func(ctx context.Context, _ Message) error {
			time.Sleep(35 * time.Second)
			return nil
		})
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
		time.Sleep(time.Minute)
		idle()
		assert.Equal(t, []string{"alive m#1", "alive m#1", "alive m#1", "ack m#1"}, tr.log())
	})
}

func TestTransportDeadLetterIDFromTheDelivery(t *testing.T) {
	bubble(t, func(t *testing.T) {
		tr := newFakeTransport()
		b := newTransportBroker(t, tr)
		_, err := b.Subscribe("t", "s", func(context.Context, Message) error { return Permanent(errors.New("no")) })
		require.NoError(t, err)
		tr.mu.Lock()
		s := tr.subs["t"][0]
		tr.mu.Unlock()
		s.sub.Deliver(namedDelivery{&fakeDelivery{s: s, msg: Message{ID: "m", Topic: "t", Attempt: 1}}})
		dls := deadLetters(t, b)
		require.Len(t, dls, 1)
		assert.Equal(t, "fixed-m", dls[0].ID)
	})
}

// Close cuts a running handler off at its deadline: the handler sees
// ErrClosed, and the message stays with the transport (handed back, not
// dead-lettered); the transport is closed.
func TestTransportCloseLeavesUnfinishedMessages(t *testing.T) {
	bubble(t, func(t *testing.T) {
		tr := newFakeTransport()
		b, err := New(WithLogger(discard), WithTransport(tr))
		require.NoError(t, err)
		var cause error
		_, err = b.Subscribe("t", "s", func(ctx context.Context, _ Message) error {
			<-ctx.Done()
			cause = context.Cause(ctx)
			return ctx.Err()
		})
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
		idle()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		require.NoError(t, b.Close(ctx))
		require.ErrorIs(t, cause, ErrClosed)
		assert.Equal(t, []string{"retry m#1 0s"}, tr.log())
		assert.Empty(t, deadLetters(t, b))
		assert.True(t, tr.closed)
		ss := b.Stats().Topics["t"].Subscribers["s"]
		assert.Equal(t, uint64(1), ss.Retries)
		require.ErrorIs(t, b.Publish(context.Background(), Message{ID: "n", Topic: "t"}), ErrClosed)
		require.NoError(t, b.Close(context.Background()), "a second Close returns the first's result")
	})
}

func TestTransportUnsubscribe(t *testing.T) {
	bubble(t, func(t *testing.T) {
		tr := newFakeTransport()
		b := newTransportBroker(t, tr)
		c := &calls{}
		sub, err := b.Subscribe("t", "s", okHandler(c))
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "a", Topic: "t"}))
		idle()
		require.NoError(t, sub.Unsubscribe(context.Background()))
		require.NoError(t, b.Publish(context.Background(), Message{ID: "b", Topic: "t"}))
		idle()
		assert.Equal(t, []string{"a"}, c.ids())
		ss := b.Stats().Topics["t"].Subscribers["s"]
		assert.False(t, ss.Active)
		_, err = b.Subscribe("t", "s", okHandler(c))
		require.NoError(t, err, "the name is free again")
	})
}

func TestTransportRefusesLaneOptions(t *testing.T) {
	tests := map[string]SubscribeOption{
		"LaneSize":                  LaneSize(8),
		"WhenLaneFull":              WhenLaneFull(DeadLetterNewest),
		"Ordered (the fake cannot)": Ordered(),
	}
	for name, opt := range tests {
		t.Run(name, func(t *testing.T) {
			b := newTransportBroker(t, newFakeTransport())
			_, err := b.Subscribe("t", "s", okHandler(&calls{}), opt)
			require.ErrorIs(t, err, ErrInvalidOption)
			assert.Empty(t, b.Stats().Topics["t"].Subscribers["s"].Active)
		})
	}
	_, err := New(WithTransport(nil))
	require.ErrorIs(t, err, ErrInvalidOption)
	_, err = New(WithTransport((*fakeTransport)(nil)))
	require.ErrorIs(t, err, ErrInvalidOption)
}

// A stop at once hands the messages not finished back to the transport;
// Stats count them queued there (handed back) also once the name left, so
// they still add up; a later subscription of the name that gets them again
// takes them up without routing them twice.
func TestTransportHandedBackStayCounted(t *testing.T) {
	bubble(t, func(t *testing.T) {
		tr := newFakeTransport()
		tr.drain = true // what it queued reaches the broker while it stops: handed back
		b := newTransportBroker(t, tr)
		sub, err := b.Subscribe("t", "s", func(ctx context.Context, _ Message) error {
			<-ctx.Done()
			return nil
		})
		require.NoError(t, err)
		tr.mu.Lock()
		fs := tr.subs["t"][0]
		tr.mu.Unlock()
		for i := range 4 { // m-0 runs; the rest wait in the fake's queue
			fs.q <- &fakeDelivery{s: fs, msg: Message{ID: fmt.Sprint("m-", i), Topic: "t", Attempt: 1}}
		}
		idle()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		defer cancel()
		require.NoError(t, sub.Unsubscribe(ctx))
		ss := subStats(t, b, "t", "s")
		assert.False(t, ss.Active)
		assert.Equal(t, 3, ss.Queued, "m-1..m-3 unstarted (m-0's handler returned nil): handed back, with the transport")
		requireConserved(t, b.Stats())

		queued := ss.Queued
		_, err = b.Subscribe("t", "s", func(context.Context, Message) error { return nil })
		require.NoError(t, err)
		tr.mu.Lock()
		fs = tr.subs["t"][0]
		tr.mu.Unlock()
		for i := range queued { // delivered again: attempt 2
			fs.q <- &fakeDelivery{s: fs, msg: Message{ID: fmt.Sprint("again-", i), Topic: "t", Attempt: 2}}
		}
		idle()
		ss = subStats(t, b, "t", "s")
		assert.Zero(t, ss.Queued)
		assert.Equal(t, uint64(4), ss.Routed, "routed once each")
		requireConserved(t, b.Stats())
	})
}

// TestTransportCountsBeforeItSettles: the moment a transport hears a
// verdict (and may free the Key for the next message), the message is
// counted as what it became, not still in flight as well.
func TestTransportCountsBeforeItSettles(t *testing.T) {
	bubble(t, func(t *testing.T) {
		tr := newFakeTransport()
		b := newTransportBroker(t, tr)
		var mu sync.Mutex
		var seen []SubscriberStats
		tr.settling = func() {
			ss := b.Stats().Topics["t"].Subscribers["s"]
			mu.Lock()
			seen = append(seen, ss)
			mu.Unlock()
		}
		_, err := b.Subscribe("t", "s", func(_ context.Context, m Message) error {
			if m.ID == "fails" {
				return errors.New("down")
			}
			return nil
		})
		require.NoError(t, err)
		require.NoError(t, b.Publish(t.Context(), Message{ID: "ok", Topic: "t"}))
		require.NoError(t, b.Publish(t.Context(), Message{ID: "fails", Topic: "t"}))
		time.Sleep(time.Second)
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, seen, 1+3, "ack, retry, retry, term")
		for i, ss := range seen {
			sum := ss.Delivered + ss.Deduplicated + ss.DeadLettered + uint64(ss.Queued) + uint64(ss.InFlight)
			assert.Equal(t, ss.Routed, sum, "settle %d: %+v", i, ss)
		}
	})
}

// brokerWithDeadLetter is a broker over a fake transport, with opts, whose
// subscriber s of topic t has dead-lettered one message.
func brokerWithDeadLetter(t *testing.T, opts ...Option) (*fakeTransport, *Broker, DeadLetter) {
	t.Helper()
	tr := newFakeTransport()
	b := newTransportBroker(t, tr, opts...)
	_, err := b.Subscribe("t", "s", func(context.Context, Message) error { return Permanent(errors.New("no")) })
	require.NoError(t, err)
	require.NoError(t, b.Publish(context.Background(), Message{ID: "dl", Topic: "t"}))
	idle()
	dls := deadLetters(t, b)
	require.Len(t, dls, 1)
	return tr, b, dls[0]
}

// TestTransportFullGivesErrQueueFull: over a transport, Publish and
// Redrive wait for room for the publish timeout, whatever the caller's
// later deadline, and with a timeout of 0 fail at once (as the in-memory
// queue does); a sooner caller deadline ends the wait first.
func TestTransportFullGivesErrQueueFull(t *testing.T) {
	tests := []struct {
		timeout, callerDeadline, want time.Duration // callerDeadline 0: none
	}{
		{100 * time.Millisecond, 0, 100 * time.Millisecond},
		{100 * time.Millisecond, time.Hour, 100 * time.Millisecond},
		{100 * time.Millisecond, 30 * time.Millisecond, 30 * time.Millisecond},
		{0, 0, 0},
		{0, time.Hour, 0},
	}
	for _, tt := range tests {
		for _, op := range []string{"Publish", "Redrive"} {
			t.Run(fmt.Sprintf("%s/timeout=%v/deadline=%v", op, tt.timeout, tt.callerDeadline), func(t *testing.T) {
				bubble(t, func(t *testing.T) {
					tr, b, dl := brokerWithDeadLetter(t, WithPublishTimeout(tt.timeout))
					tr.mu.Lock()
					tr.full = true
					tr.mu.Unlock()
					var err error
					ctx := context.Background()
					if tt.callerDeadline > 0 {
						var cancel context.CancelFunc
						ctx, cancel = context.WithTimeout(ctx, tt.callerDeadline)
						defer cancel()
					}
					start := time.Now()
					if op == "Publish" {
						err = b.Publish(ctx, Message{ID: "m", Topic: "t"})
					} else {
						_, err = b.Redrive(ctx, dl.ID)
					}
					require.ErrorIs(t, err, ErrQueueFull)
					assert.Equal(t, tt.want, time.Since(start))
					if op == "Publish" {
						assert.Equal(t, uint64(1), b.Stats().Topics["t"].Rejected)
					} else {
						assert.Len(t, deadLetters(t, b), 1, "the dead letter stays in the store")
					}
				})
			})
		}
	}
}

// TestTransportTimeoutZeroHonoursCaller: with a publish timeout of 0 the
// transport's ctx has no deadline but is still the caller's: it ends when
// the caller's deadline passes, with the caller's error, for Publish and
// Redrive alike.
func TestTransportTimeoutZeroHonoursCaller(t *testing.T) {
	bubble(t, func(t *testing.T) {
		tr, b, dl := brokerWithDeadLetter(t, WithPublishTimeout(0))
		tr.mu.Lock()
		tr.hang = true
		tr.mu.Unlock()
		var err error
		for _, op := range []string{"Publish", "Redrive"} {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
			start := time.Now()
			if op == "Publish" {
				err = b.Publish(ctx, Message{ID: "m", Topic: "t"})
			} else {
				_, err = b.Redrive(ctx, dl.ID)
			}
			cancel()
			assert.ErrorIs(t, err, context.DeadlineExceeded, op)
			assert.Equal(t, 30*time.Millisecond, time.Since(start), op)
		}
	})
}

func TestTransportRunsMiddlewareAndHooks(t *testing.T) {
	bubble(t, func(t *testing.T) {
		tr := newFakeTransport()
		tc := &tracer{}
		b := newTransportBroker(t, tr, WithMiddleware(tc.layer("A")),
			WithPublishHook(func(_ context.Context, m *Message) error { m.Headers["hooked"] = "yes"; return nil }))
		c := &calls{}
		_, err := b.Subscribe("t", "s", okHandler(c))
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
		idle()
		assert.Equal(t, []string{"build A for t/s", "A> m#1", `<A m code=""`}, tc.lines())
		assert.Equal(t, "yes", c.all()[0].Headers["hooked"])
	})
}

// A handler that calls runtime.Goexit (what t.FailNow does) fails its
// attempt as a panic would; the transport's goroutine that called Deliver
// survives and delivers the next message.
func TestTransportHandlerGoexit(t *testing.T) {
	bubble(t, func(t *testing.T) {
		tr := newFakeTransport()
		b := newTransportBroker(t, tr, WithRetryPolicy(RetryPolicy{MaxRetries: NoRetries}))
		_, err := b.Subscribe("t", "s", func(_ context.Context, m Message) error {
			if m.ID == "exit" {
				runtime.Goexit()
			}
			return nil
		})
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "exit", Topic: "t"}))
		require.NoError(t, b.Publish(context.Background(), Message{ID: "ok", Topic: "t"}))
		idle()
		assert.Equal(t, []string{"term exit#1 exhausted", "ack ok#1"}, tr.log())
		dls := deadLetters(t, b)
		require.Len(t, dls, 1)
		assert.Equal(t, CodePanic, dls[0].ErrorCode)
		requireConserved(t, b.Stats())
	})
}

// TestBrokerTransport: Transport returns what WithTransport gave, nil for
// the in-memory broker.
func TestBrokerTransport(t *testing.T) {
	tr := newFakeTransport()
	assert.Same(t, tr, newTransportBroker(t, tr).Transport())
	assert.Nil(t, newTestBroker(t).Transport())
}

// panickingTransport is the fake transport whose Publish and PublishBatch
// panic.
type panickingTransport struct{ *fakeTransport }

func (panickingTransport) Publish(context.Context, Message) error { panic("transport bug") }
func (panickingTransport) PublishBatch(context.Context, []Message, time.Duration) []error {
	panic("transport bug")
}

// misbehavingTransport is the fake transport whose Subscribe, its
// subscriptions' Stop, or Close panic or call runtime.Goexit, as how says
// ("panic" or "goexit"; "" behaves), for the method named in which.
type misbehavingTransport struct {
	*fakeTransport
	which, how string
	release    chan struct{} // how "hang": the call returns once it is closed
}

func (m misbehavingTransport) misbehave(method string) {
	if method != m.which {
		return
	}
	switch m.how {
	case "panic":
		panic("transport bug")
	case "goexit":
		runtime.Goexit()
	case "hang":
		<-m.release
	}
}

func (m misbehavingTransport) Subscribe(sub TransportSubscriber) (TransportSubscription, error) {
	m.misbehave("Subscribe")
	ts, err := m.fakeTransport.Subscribe(sub)
	if err != nil {
		return nil, err
	}
	return misbehavingSub{ts, m}, nil
}

func (m misbehavingTransport) Close(ctx context.Context) error {
	m.misbehave("Close")
	return m.fakeTransport.Close(ctx)
}

type misbehavingSub struct {
	TransportSubscription
	m misbehavingTransport
}

func (s misbehavingSub) Stop(ctx context.Context) error {
	err := s.TransportSubscription.Stop(ctx) // stopped, then misbehaves
	s.m.misbehave("Stop")
	return err
}

// TestMisbehavingTransportLifecycle: a transport whose Subscribe, Stop or
// Close panics fails that call with an error, counted as a plug-in panic;
// a Stop that calls runtime.Goexit (it runs on a goroutine of the broker)
// fails the Unsubscribe instead of hanging it. Nothing crashes.
func TestMisbehavingTransportLifecycle(t *testing.T) {
	tests := []struct{ which, how, want string }{
		{"Subscribe", "panic", "panicked"},
		{"Stop", "panic", "panicked"},
		{"Stop", "goexit", "Goexit"},
		{"Close", "panic", "panicked"},
	}
	for _, tt := range tests {
		t.Run(tt.which+"/"+tt.how, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b, err := New(WithLogger(discard), WithTransport(misbehavingTransport{newFakeTransport(), tt.which, tt.how, nil}))
				require.NoError(t, err)
				sub, err := b.Subscribe("t", "s", func(context.Context, Message) error { return nil })
				if tt.which == "Subscribe" {
					assert.ErrorContains(t, err, tt.want)
				} else {
					require.NoError(t, err)
				}
				if tt.which == "Stop" {
					assert.ErrorContains(t, sub.Unsubscribe(context.Background()), tt.want)
				}
				err = b.Close(context.Background())
				if tt.which == "Close" {
					assert.ErrorContains(t, err, tt.want)
				}
				if tt.how == "panic" {
					assert.Equal(t, uint64(1), b.Stats().PluginPanics)
				}
			})
		})
	}
}

// A transport whose Stop or Close never returns (it ignores its ctx):
// Unsubscribe and Close return by their ctx plus ShutdownGrace with an
// error that says so, and the call is left running.
func TestHangingTransportStopEndsByItsDeadline(t *testing.T) {
	for _, which := range []string{"Stop", "Close"} {
		for _, viaClose := range []bool{true, false} {
			if which == "Close" && !viaClose {
				continue
			}
			t.Run(fmt.Sprintf("%s/close=%v", which, viaClose), func(t *testing.T) {
				bubble(t, func(t *testing.T) {
					release := make(chan struct{})
					b, err := New(WithLogger(discard), WithTransport(misbehavingTransport{newFakeTransport(), which, "hang", release}))
					require.NoError(t, err)
					sub, err := b.Subscribe("t", "s", func(context.Context, Message) error { return nil })
					require.NoError(t, err)
					stop := sub.Unsubscribe
					if viaClose {
						stop = b.Close
					}
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					defer cancel()
					start := time.Now()
					err = stop(ctx)
					assert.LessOrEqual(t, time.Since(start), time.Second+ShutdownGrace, "returned by the stop's deadline")
					var de *DrainError
					require.ErrorAs(t, err, &de)
					// The call it gave up on; after a Stop that used up the
					// deadline, the transport's Close may be given up on too.
					assert.GreaterOrEqual(t, de.Abandoned, 1, "the transport call it gave up on")
					assert.ErrorIs(t, err, context.DeadlineExceeded)
					close(release)
					idle()
					if !viaClose {
						require.NoError(t, b.Close(context.Background()))
					}
				})
			})
		}
	}
}

// TestPanickingTransportPublish: a transport whose Publish or PublishBatch
// panics fails that publish (an error for each message), counted as a
// plug-in panic; the caller does not crash.
func TestPanickingTransportPublish(t *testing.T) {
	b, err := New(WithLogger(discard), WithTransport(panickingTransport{newFakeTransport()}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	assert.ErrorContains(t, b.Publish(context.Background(), Message{ID: "a", Topic: "t"}), "panicked")
	err = b.PublishBatch(context.Background(), []Message{{ID: "b", Topic: "t"}, {ID: "c", Topic: "t"}})
	var be *BatchError
	require.ErrorAs(t, err, &be)
	for _, e := range be.Errs {
		assert.ErrorContains(t, e, "panicked")
	}
	assert.Equal(t, uint64(2), b.Stats().PluginPanics)
}

// A transport Stop that never returns, met by Close and an Unsubscribe:
// the call is counted abandoned once, in the DrainError of the stop that
// cut the subscription off (the one whose ctx ended first), and both
// return by their own deadline.
func TestHangingTransportStopCountedOnce(t *testing.T) {
	for _, first := range []string{"Unsubscribe", "Close"} {
		t.Run(first, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				release := make(chan struct{})
				b, err := New(WithLogger(discard), WithTransport(misbehavingTransport{newFakeTransport(), "Stop", "hang", release}))
				require.NoError(t, err)
				sub, err := b.Subscribe("t", "s", func(context.Context, Message) error { return nil })
				require.NoError(t, err)
				uTimeout, cTimeout := time.Second, 2*time.Second
				if first == "Close" {
					uTimeout, cTimeout = 2*time.Second, time.Second
				}
				uctx, ucancel := context.WithTimeout(context.Background(), uTimeout)
				defer ucancel()
				cctx, ccancel := context.WithTimeout(context.Background(), cTimeout)
				defer ccancel()
				start := time.Now()
				var uerr error
				var uTook time.Duration
				unsubbed := make(chan struct{})
				go func() {
					defer close(unsubbed)
					uerr = sub.Unsubscribe(uctx)
					uTook = time.Since(start)
				}()
				idle() // the Unsubscribe started the transport's Stop
				cerr := b.Close(cctx)
				assert.LessOrEqual(t, time.Since(start), cTimeout+ShutdownGrace, "Close by its deadline")
				<-unsubbed
				assert.LessOrEqual(t, uTook, uTimeout+ShutdownGrace, "Unsubscribe by its deadline")
				abandoned := func(err error) int {
					var de *DrainError
					if errors.As(err, &de) {
						return de.Abandoned
					}
					return 0
				}
				owner, other := uerr, cerr
				if first == "Close" {
					owner, other = cerr, uerr
				}
				assert.Equal(t, 1, abandoned(owner), "the stop that cut it off counts the Stop it abandoned: %v", owner)
				assert.Equal(t, 0, abandoned(other), "the other stop does not count it again: %v", other)
				close(release)
				idle()
			})
		})
	}
}
