package brokertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inproc/broker"
)

// trFaults are the bugs a fakeTransport can be told to have. The zero value
// is a correct transport: a second one besides the built-in in-memory one
// (and the way the core drives any other), so that the broker suite is shown
// to accept what the Transport contract allows.
type trFaults struct {
	loseRetries   bool // Retry drops the message
	retryAtOnce   bool // Retry ignores its delay
	ignoreKeys    bool // keys are not held: any worker takes any message, a retry goes to the back
	maxDeliveries int  // a delivery beyond this count is dropped (a server-side MaxDeliver); 0: none
	firstSubOnly  bool // Publish reaches only the topic's first subscriber
	twice         bool // Publish delivers every message twice
	redriveAsCopy bool // Redrive delivers without Redriven, continuing the attempt count
	redriveToAll  bool // Redrive delivers to every subscriber of the topic
	stopNoWait    bool // Stop returns without waiting for running deliveries
	closeFails    bool // Close returns an error
}

// fakeTransport is a broker.Transport in memory: per subscription a queue
// taken by Concurrency workers, any idle worker taking the oldest message
// whose Key is free; a Key is held from the moment a message of it is taken
// until it is acknowledged or terminated, through a Retry's delay.
type fakeTransport struct {
	f trFaults

	mu     sync.Mutex // guards the fields below
	subs   map[string][]*fakeSub
	all    []*fakeSub // every subscription made: Close waits for their workers
	closed bool
}

var _ broker.Transport = (*fakeTransport)(nil)

type fakeSub struct {
	tr  *fakeTransport
	sub broker.TransportSubscriber

	mu      sync.Mutex // guards the fields below; cond waits on it
	cond    *sync.Cond
	queue   []*fakeDelivery
	held    map[string]bool // keys taken or waiting for a retry
	stopped bool

	workers sync.WaitGroup // the Concurrency workers
	timers  sync.WaitGroup // retries waiting for their delay
}

type fakeDelivery struct {
	s        *fakeSub
	msg      broker.Message
	redriven bool
	done     atomic.Bool
}

func newFakeTransport(f trFaults) *fakeTransport {
	return &fakeTransport{f: f, subs: map[string][]*fakeSub{}}
}

func (tr *fakeTransport) Publish(ctx context.Context, msg broker.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.closed {
		return errors.New("fake: closed")
	}
	subs := tr.subs[msg.Topic]
	if tr.f.firstSubOnly && len(subs) > 1 {
		subs = subs[:1]
	}
	msg.Attempt = 1
	for _, s := range subs {
		s.push(&fakeDelivery{s: s, msg: msg})
		if tr.f.twice {
			s.push(&fakeDelivery{s: s, msg: msg})
		}
	}
	return nil
}

func (tr *fakeTransport) Subscribe(sub broker.TransportSubscriber) (broker.TransportSubscription, error) {
	if sub.Ordered {
		return nil, fmt.Errorf("%w: fake: no Ordered", broker.ErrInvalidOption)
	}
	s := &fakeSub{tr: tr, sub: sub, held: map[string]bool{}}
	s.cond = sync.NewCond(&s.mu)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.closed {
		return nil, errors.New("fake: closed")
	}
	for range sub.Concurrency {
		s.workers.Go(s.work)
	}
	tr.subs[sub.Topic] = append(tr.subs[sub.Topic], s)
	tr.all = append(tr.all, s)
	return s, nil
}

func (tr *fakeTransport) Redrive(_ context.Context, dl broker.DeadLetter) error {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	found := false
	for _, s := range tr.subs[dl.Message.Topic] {
		if s.sub.Name != dl.Subscriber && !tr.f.redriveToAll {
			continue
		}
		found = true
		d := &fakeDelivery{s: s, msg: dl.Message, redriven: true}
		d.msg.Attempt = 1
		if tr.f.redriveAsCopy {
			d.redriven, d.msg.Attempt = false, dl.Attempts+1
		}
		s.push(d)
	}
	if !found {
		return fmt.Errorf("fake: no subscriber %q on %q", dl.Subscriber, dl.Message.Topic)
	}
	return nil
}

func (tr *fakeTransport) Close(ctx context.Context) error {
	tr.mu.Lock()
	tr.closed = true
	all := slices.Clone(tr.all)
	tr.mu.Unlock()
	for _, s := range all { // with stopNoWait, workers may still run
		if err := s.wait(ctx); err != nil {
			return err
		}
	}
	if tr.f.closeFails {
		return errors.New("fake: close failed")
	}
	return nil
}

func (s *fakeSub) push(d *fakeDelivery) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.stopped {
		s.queue = append(s.queue, d)
		s.cond.Signal()
	}
}

// work is one worker: it takes deliveries until the subscription stops.
func (s *fakeSub) work() {
	for {
		s.mu.Lock()
		d := s.takeLocked()
		for d == nil && !s.stopped {
			s.cond.Wait()
			d = s.takeLocked()
		}
		s.mu.Unlock()
		if d == nil {
			return
		}
		s.sub.Deliver(d)
		if !d.done.Load() {
			panic("fake: the broker returned from Deliver without Ack, Retry or Terminate")
		}
	}
}

// takeLocked removes and returns the oldest delivery whose Key is free, and
// holds its Key; nil if none.
func (s *fakeSub) takeLocked() *fakeDelivery {
	if s.stopped {
		return nil
	}
	for i, d := range s.queue {
		if k := d.msg.Key; k != "" && !s.tr.f.ignoreKeys {
			if s.held[k] {
				continue
			}
			s.held[k] = true
		}
		s.queue = slices.Delete(s.queue, i, i+1)
		return d
	}
	return nil
}

// release frees key and wakes the workers.
func (s *fakeSub) release(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.held, key)
	s.cond.Broadcast()
}

func (s *fakeSub) Stop(ctx context.Context) error {
	s.tr.mu.Lock()
	s.tr.subs[s.sub.Topic] = slices.DeleteFunc(s.tr.subs[s.sub.Topic], func(x *fakeSub) bool { return x == s })
	s.tr.mu.Unlock()
	s.mu.Lock()
	s.stopped = true
	s.queue = nil // unacknowledged messages are dropped (a durable transport keeps them)
	s.cond.Broadcast()
	s.mu.Unlock()
	if s.tr.f.stopNoWait {
		return nil
	}
	return s.wait(ctx)
}

// wait waits for the workers and the retry timers, or for ctx to end.
func (s *fakeSub) wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() { // ends when the workers and timers have
		defer close(done)
		s.workers.Wait()
		s.timers.Wait()
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (d *fakeDelivery) Message() broker.Message { return d.msg }
func (d *fakeDelivery) Redriven() bool          { return d.redriven }

func (d *fakeDelivery) end() {
	if d.done.Swap(true) {
		panic("fake: a delivery was settled twice")
	}
}

func (d *fakeDelivery) Ack() error {
	d.end()
	d.s.release(d.msg.Key)
	return nil
}

func (d *fakeDelivery) Terminate(string) error {
	d.end()
	d.s.release(d.msg.Key)
	return nil
}

func (d *fakeDelivery) Retry(delay time.Duration) error {
	d.end()
	s, f := d.s, d.s.tr.f
	next := &fakeDelivery{s: s, msg: d.msg}
	next.msg.Attempt++
	if f.loseRetries || (f.maxDeliveries > 0 && next.msg.Attempt > f.maxDeliveries) {
		s.release(d.msg.Key)
		return nil
	}
	if f.retryAtOnce {
		delay = 0
	}
	s.timers.Add(1)
	time.AfterFunc(delay, func() {
		defer s.timers.Done()
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.stopped {
			return
		}
		if f.ignoreKeys {
			s.queue = append(s.queue, next)
		} else { // first in line, and its Key free for it
			s.queue = slices.Insert(s.queue, 0, next)
			delete(s.held, next.msg.Key)
		}
		s.cond.Broadcast()
	})
	return nil
}

func (d *fakeDelivery) KeepAliveEvery() time.Duration { return 0 }
func (d *fakeDelivery) KeepAlive() error              { return nil }
