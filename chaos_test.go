package broker

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// Chaos property tests: randomised runs of the whole broker — several
// topics, subscribers with random concurrency, lanes, timeouts, retry
// policies and protections (Ordered, full-lane policies, circuit breakers,
// retry budgets, rate limits), keyed and keyless messages, handlers that
// succeed, fail, panic, time out or block,
// publishers that send duplicates and hit full queues, Unsubscribe and
// re-Subscribe, Redrive and Close at random moments — checked against what
// the handlers themselves recorded.
//
// Each run prints its seed; rerun one with
//
//	go test -run TestChaos -chaos.seed=N
//
// The default mode runs a fixed number of seeds (fast enough for CI); a soak
// runs random seeds for a while:
//
//	go test -run TestChaos -chaos.duration=5m    (or BROKER_CHAOS_DURATION=5m)
//
// Runs use a synctest bubble: time is fake, so backoffs, handler timeouts
// and Close deadlines cost nothing, and every run's timing is exact.
var (
	chaosSeed     = flag.Uint64("chaos.seed", 0, "run only this chaos seed")
	chaosRuns     = flag.Int("chaos.runs", 150, "chaos runs in the default mode")
	chaosDuration = flag.Duration("chaos.duration", 0, "run random chaos seeds for this long (soak)")
)

func TestChaos(t *testing.T) {
	switch {
	case *chaosSeed != 0:
		runChaos(t, *chaosSeed)
	case *chaosDuration > 0 || os.Getenv("BROKER_CHAOS_DURATION") != "":
		d := *chaosDuration
		if d == 0 {
			var err error
			if d, err = time.ParseDuration(os.Getenv("BROKER_CHAOS_DURATION")); err != nil {
				t.Fatalf("BROKER_CHAOS_DURATION: %v", err)
			}
		}
		var total chaosTotals
		for end := time.Now().Add(d); time.Now().Before(end); {
			seed := rand.Uint64()
			if !runChaos(t, seed, &total) {
				return
			}
		}
		t.Logf("soak: %s", total)
	default:
		var total chaosTotals
		for i := range *chaosRuns {
			if !runChaos(t, uint64(i+1), &total) {
				return
			}
		}
		t.Logf("%s", total)
	}
}

type chaosTotals struct{ runs, published, calls, deadLetters int }

func (c chaosTotals) String() string {
	return fmt.Sprintf("%d runs, %d messages accepted, %d handler calls, %d dead letters", c.runs, c.published, c.calls, c.deadLetters)
}

// runChaos runs one seed in its own subtest and reports whether it passed.
func runChaos(t *testing.T, seed uint64, total ...*chaosTotals) bool {
	return t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newChaosRun(t, seed)
			r.run()
			r.verify()
			for _, tot := range total {
				tot.runs++
				tot.published += r.acceptedCount()
				tot.calls += len(r.calls)
				tot.deadLetters += len(r.dls)
			}
		})
	})
}

// chaosSub is one subscriber name on a topic and how it behaves.
type chaosSub struct {
	topic, name string
	anchor      bool // never unsubscribed: must see every accepted message
	redrivable  bool // its dead letters may be redriven (so order is not checked)
	concurrency int
	opts        []SubscribeOption
	maxAttempts int // most attempts one dispatch may take under its policy
	policy      RetryPolicy
	timeout     time.Duration
	ordered     bool           // Ordered(): keyless messages are FIFO through retries
	whenFull    FullLanePolicy // overflow dead letters only under a dead-letter policy
	budget      bool           // budget dead letters only with a retry budget

	mu   sync.Mutex // guards sub
	sub  *Subscription
	gens int // subscriptions so far
}

// chaosCall is one handler call as the handler recorded it.
type chaosCall struct {
	topic, name string
	gen         int
	id, key     string
	pseq        int // publish sequence of this dispatch's message (from its header)
	attempt     int
	returnedNil bool
	behaviour   string
}

type chaosRun struct {
	t    *testing.T
	seed uint64
	rng  *rand.Rand // used only by the goroutine that runs run()
	b    *Broker

	topics      []string
	subs        []*chaosSub
	pubTimeout  time.Duration
	closeReturn atomic.Bool
	lateCalls   atomic.Int32

	mu        sync.Mutex
	calls     []chaosCall
	dedups    map[string]int         // "topic/name/id" → deduplicated events
	accepted  map[string]int         // "topic/id" → accepted publishes
	published []string               // "topic/id" of each accepted publish, in order
	slowPubs  []string               // publishes that blocked past their bound
	redriven  map[string]int         // "topic/name" → dead letters redriven (and so removed from the store)
	unsubDLs  map[string]int         // "topic/name" → dead letters its Unsubscribe calls reported
	redrivenU map[string]int         // "topic/name" → redriven dead letters of reason "unsubscribed"
	unsubbed  map[*Subscription]bool // subscriptions Unsubscribe was called on (by the chaos goroutine only)
	dls       []DeadLetter
}

func newChaosRun(t *testing.T, seed uint64) *chaosRun {
	r := &chaosRun{
		t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)),
		dedups: map[string]int{}, accepted: map[string]int{}, redriven: map[string]int{},
		unsubDLs: map[string]int{}, redrivenU: map[string]int{}, unsubbed: map[*Subscription]bool{},
	}
	rng := r.rng
	r.pubTimeout = []time.Duration{0, time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond}[rng.IntN(4)]
	brokerPolicy := r.randomPolicy()
	opts := []Option{
		WithLogger(discard),
		WithQueueSize(1 + rng.IntN(32)),
		WithPublishTimeout(r.pubTimeout),
		WithRetryPolicy(brokerPolicy),
		WithDeadLetterStore(NewMemoryDeadLetterStore(1_000_000, discard)),
		WithObserver(r),
	}
	if rng.IntN(4) == 0 {
		opts = append(opts, WithIdempotencyStore(nil))
	}
	b, err := New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	r.b = b
	for i := range 1 + rng.IntN(3) {
		topic := "t" + strconv.Itoa(i)
		r.topics = append(r.topics, topic)
		for j := range 1 + rng.IntN(3) {
			s := &chaosSub{topic: topic, name: "s" + strconv.Itoa(j), anchor: j == 0,
				redrivable: rng.IntN(2) == 0, concurrency: 1 + rng.IntN(4), policy: brokerPolicy.normalized()}
			s.opts = []SubscribeOption{Concurrency(s.concurrency), LaneSize(1 + rng.IntN(16))}
			if rng.IntN(2) == 0 {
				s.timeout = time.Duration(1+rng.IntN(10)) * time.Millisecond
				s.opts = append(s.opts, HandlerTimeout(s.timeout))
			}
			if rng.IntN(3) == 0 {
				own := r.randomPolicy()
				s.opts = append(s.opts, WithSubscriberRetryPolicy(own))
				s.policy = own.over(brokerPolicy).normalized() // what it refines to
			}
			if rng.IntN(4) == 0 {
				s.ordered = true
				s.opts = append(s.opts, Ordered())
			}
			if rng.IntN(3) == 0 {
				s.whenFull = FullLanePolicy(1 + rng.IntN(2))
				s.opts = append(s.opts, WhenLaneFull(s.whenFull))
			}
			if rng.IntN(4) == 0 {
				s.opts = append(s.opts, CircuitBreaker(BreakerPolicy{
					Failures: 1 + rng.IntN(4), OpenFor: time.Duration(1+rng.IntN(5)) * time.Millisecond,
					MaxOpenFor: 20 * time.Millisecond,
				}))
			}
			if rng.IntN(4) == 0 {
				s.budget = true
				s.opts = append(s.opts, RetryBudget(RetryBudgetPolicy{
					Ratio: rng.Float64() / 2, Window: 50 * time.Millisecond, MinPerSecond: float64(rng.IntN(100)),
				}))
			}
			if rng.IntN(5) == 0 {
				s.opts = append(s.opts, RateLimit(float64(500+rng.IntN(5000)), 1+rng.IntN(8)))
			}
			s.maxAttempts = s.policy.maxAttempts()
			r.subs = append(r.subs, s)
		}
	}
	return r
}

func (r *chaosRun) randomPolicy() RetryPolicy {
	rng := r.rng
	p := RetryPolicy{MaxRetries: noneIfZero(rng.IntN(4))}
	switch rng.IntN(3) {
	case 0:
		p.Backoff = ConstantBackoff(0)
	case 1:
		p.Backoff = ConstantBackoff(time.Duration(rng.IntN(5)) * time.Millisecond)
	default:
		p.Backoff = ExponentialBackoff(time.Millisecond, 8*time.Millisecond)
	}
	if rng.IntN(2) == 0 {
		p.ByCode = map[string]RetryRule{}
		for _, code := range []string{CodeTimeout, CodeThrottled, CodePanic, "c1"} {
			if rng.IntN(2) == 0 {
				p.ByCode[code] = RetryRule{MaxRetries: noneIfZero(rng.IntN(4))}
			}
		}
	}
	return p
}

// subscribe (re)subscribes s with a fresh handler generation.
func (r *chaosRun) subscribe(s *chaosSub) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gens++
	gen := s.gens
	sub, err := r.b.Subscribe(s.topic, s.name, r.handler(s, gen), s.opts...)
	if err != nil {
		if errors.Is(err, ErrClosed) {
			return
		}
		r.t.Errorf("subscribe %s/%s: %v", s.topic, s.name, err)
		return
	}
	s.sub = sub
}

// handler returns a handler whose behaviour for (message, attempt) is a
// pure function of the seed, so a seed replays the same failures.
func (r *chaosRun) handler(s *chaosSub, gen int) Handler {
	return func(ctx context.Context, m Message) error {
		if r.closeReturn.Load() {
			r.lateCalls.Add(1)
		}
		h := fnv.New64a()
		fmt.Fprintf(h, "%d/%s/%s/%s/%d", r.seed, s.topic, s.name, m.ID, m.Attempt)
		rng := rand.New(rand.NewPCG(h.Sum64(), r.seed))
		pseq, _ := strconv.Atoi(m.Headers["pseq"])
		call := chaosCall{topic: s.topic, name: s.name, gen: gen, id: m.ID, key: m.Key, pseq: pseq, attempt: m.Attempt}
		var err error
		switch p := rng.IntN(100); {
		case p < 50:
			call.behaviour = "ok"
		case p < 58:
			call.behaviour = "sleep-ok"
			time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
		case p < 70:
			call.behaviour, err = "error", errBoom
		case p < 75:
			call.behaviour, err = "coded", codedError{"c1"}
		case p < 80:
			call.behaviour, err = "permanent", Permanent(errBoom)
		case p < 85:
			call.behaviour, err = "retry-after", RetryAfter(errBoom, time.Duration(rng.IntN(5))*time.Millisecond)
		case p < 86:
			call.behaviour = "panic"
			defer func() { r.record(call) }() // recorded even though it panics
			panic("chaos")
		case p < 87:
			call.behaviour = "panic" // a typed nil error ends like a panic
			var e *nilErr
			err = e
		case p < 88:
			call.behaviour = "panic" // so does runtime.Goexit (t.FailNow)
			defer func() { r.record(call) }()
			runtime.Goexit()
		case p < 95:
			call.behaviour = "slow"
			time.Sleep(s.timeout + time.Millisecond)
			if rng.IntN(2) == 0 {
				err = errBoom
			}
		default:
			call.behaviour = "block"
			if s.timeout == 0 {
				time.Sleep(5 * time.Millisecond) // no deadline: don't block forever
			} else {
				<-ctx.Done()
				err = ctx.Err()
			}
		}
		call.returnedNil = err == nil
		r.record(call)
		return err
	}
}

func (r *chaosRun) record(c chaosCall) {
	r.mu.Lock()
	r.calls = append(r.calls, c)
	r.mu.Unlock()
}

// Observer: only deduplicated events are needed (a handler cannot see them).
func (r *chaosRun) Published(PublishEvent)       {}
func (r *chaosRun) Rejected(RejectEvent)         {}
func (r *chaosRun) Unrouted(UnroutedEvent)       {}
func (r *chaosRun) DeadLettered(DeadLetterEvent) {}
func (r *chaosRun) Attempted(e AttemptEvent) {
	if e.Outcome == OutcomeDeduplicated {
		r.mu.Lock()
		r.dedups[e.Topic+"/"+e.Subscriber+"/"+e.MessageID]++
		r.mu.Unlock()
	}
}

func (r *chaosRun) run() {
	rng := r.rng
	for _, s := range r.subs {
		r.subscribe(s)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	// One publisher per topic, so publish order per topic is defined.
	for _, topic := range r.topics {
		n := 50 + rng.IntN(250)
		prng := rand.New(rand.NewPCG(r.seed, uint64(len(topic))+rng.Uint64()))
		wg.Go(func() { r.publish(topic, n, prng) })
	}
	// Chaos: unsubscribe and resubscribe non-anchors, redrive dead letters.
	crng := rand.New(rand.NewPCG(r.seed, rng.Uint64()))
	wg.Go(func() { r.chaos(crng, stop) })
	// Close at a random moment with a random, sometimes tiny, deadline.
	time.Sleep(time.Duration(rng.IntN(400)) * time.Millisecond)
	deadline := []time.Duration{0, time.Microsecond, time.Millisecond, 20 * time.Millisecond, time.Second}[rng.IntN(5)]
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	err := r.b.Close(ctx)
	r.closeReturn.Store(true)
	cancel()
	close(stop)
	var de *DrainError
	if err != nil && !errors.As(err, &de) {
		r.t.Errorf("Close: unexpected error %v", err)
	}
	wg.Wait()
	dls, lerr := r.b.DeadLetters().List(context.Background(), DeadLetterFilter{})
	if lerr != nil {
		r.t.Fatal(lerr)
	}
	r.dls = dls
	if de != nil {
		shutdown := 0
		for _, dl := range dls {
			if dl.Reason == ReasonShutdown {
				shutdown++
			}
		}
		if de.DeadLettered != shutdown {
			r.t.Errorf("Close reported %d shutdown dead letters, the store holds %d", de.DeadLettered, shutdown)
		}
	}
}

func (r *chaosRun) publish(topic string, n int, rng *rand.Rand) {
	var sent []Message
	for i := range n {
		msg := Message{ID: topic + "-" + strconv.Itoa(i), Topic: topic}
		if k := rng.IntN(7); k < 5 {
			msg.Key = "k" + strconv.Itoa(k)
		}
		if len(sent) > 0 && rng.IntN(10) == 0 {
			msg = sent[rng.IntN(len(sent))] // a duplicate: same ID, same key
		}
		msg.Headers = map[string]string{"pseq": strconv.Itoa(i)}
		ctx, bound := context.Background(), r.pubTimeout
		var cancel context.CancelFunc = func() {}
		if rng.IntN(5) == 0 {
			d := time.Duration(rng.IntN(3)) * time.Millisecond
			ctx, cancel = context.WithTimeout(ctx, d)
			bound = min(bound, d)
		}
		start := time.Now()
		err := r.b.Publish(ctx, msg)
		took := time.Since(start)
		cancel()
		if took > bound {
			r.mu.Lock()
			r.slowPubs = append(r.slowPubs, fmt.Sprintf("%s took %v, bound %v", msg.ID, took, bound))
			r.mu.Unlock()
		}
		switch {
		case err == nil:
			sent = append(sent, msg)
			r.mu.Lock()
			r.accepted[topic+"/"+msg.ID]++
			r.published = append(r.published, topic+"/"+msg.ID)
			r.mu.Unlock()
		case errors.Is(err, ErrClosed):
			return
		case errors.Is(err, ErrQueueFull), errors.Is(err, context.DeadlineExceeded):
		default:
			r.t.Errorf("publish %s: unexpected error %v", msg.ID, err)
		}
		time.Sleep(time.Duration(rng.IntN(1500)) * time.Microsecond)
	}
}

func (r *chaosRun) chaos(rng *rand.Rand, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(1+rng.IntN(30)) * time.Millisecond):
		}
		switch rng.IntN(3) {
		case 0, 1: // unsubscribe a non-anchor, then subscribe it again
			s := r.subs[rng.IntN(len(r.subs))]
			if s.anchor {
				continue
			}
			s.mu.Lock()
			sub := s.sub
			s.mu.Unlock()
			if sub == nil {
				continue
			}
			d := []time.Duration{0, time.Microsecond, time.Millisecond, 50 * time.Millisecond}[rng.IntN(4)]
			ctx, cancel := context.WithTimeout(context.Background(), d)
			err := sub.Unsubscribe(ctx)
			cancel()
			var de *DrainError
			if err != nil && !errors.As(err, &de) && !errors.Is(err, context.DeadlineExceeded) {
				r.t.Errorf("unsubscribe %s/%s: %v", s.topic, s.name, err)
			}
			if de != nil && !r.unsubbed[sub] { // a repeated call returns the first's result
				r.mu.Lock()
				r.unsubDLs[s.topic+"/"+s.name] += de.DeadLettered
				r.mu.Unlock()
			}
			r.unsubbed[sub] = true
			time.Sleep(time.Duration(rng.IntN(10)) * time.Millisecond)
			r.subscribe(s)
		case 2: // redrive some dead letters of redrivable subscribers
			dls, err := r.b.DeadLetters().List(context.Background(), DeadLetterFilter{})
			if err != nil {
				r.t.Error(err)
				return
			}
			var ids []string
			owner := map[string]DeadLetter{}
			for _, dl := range dls {
				if r.sub(dl.Message.Topic, dl.Subscriber).redrivable && rng.IntN(2) == 0 {
					ids = append(ids, dl.ID)
					owner[dl.ID] = dl
				}
			}
			n, err := r.b.Redrive(context.Background(), ids...)
			for _, e := range unjoin(err) {
				if !errors.Is(e, ErrSubscriberNotFound) && !errors.Is(e, ErrQueueFull) && !errors.Is(e, ErrClosed) {
					r.t.Errorf("redrive: unexpected error %v", e)
				}
			}
			gone := 0
			for _, id := range ids { // an accepted dead letter left the store
				if _, ok, _ := r.b.DeadLetters().Get(context.Background(), id); !ok {
					dl := owner[id]
					k := dl.Message.Topic + "/" + dl.Subscriber
					r.mu.Lock()
					r.redriven[k]++
					if dl.Reason == ReasonUnsubscribed {
						r.redrivenU[k]++
					}
					r.mu.Unlock()
					gone++
				}
			}
			if gone != n {
				r.t.Errorf("Redrive reported %d accepted, %d left the store", n, gone)
			}
		}
	}
}

func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func (r *chaosRun) sub(topic, name string) *chaosSub {
	for _, s := range r.subs {
		if s.topic == topic && s.name == name {
			return s
		}
	}
	r.t.Fatalf("no subscriber %s/%s", topic, name)
	return nil
}

func (r *chaosRun) acceptedCount() int { return len(r.published) }

// verify checks the run against what the handlers recorded.
func (r *chaosRun) verify() {
	t := r.t
	if t.Failed() {
		t.Logf("seed %d failed during the run; rerun with -chaos.seed=%d", r.seed, r.seed)
		return
	}
	defer func() {
		if t.Failed() {
			t.Logf("rerun with: go test -race -run 'TestChaos' -chaos.seed=%d", r.seed)
		}
	}()
	for _, p := range r.slowPubs {
		t.Errorf("publish blocked past its bound: %s", p)
	}
	if n := r.lateCalls.Load(); n > 0 {
		t.Errorf("%d handler calls after Close returned", n)
	}
	st := r.b.Stats()
	type key struct{ topic, name, id string }
	delivered := map[key]int{}
	calls := map[string]int{} // topic/name → handler calls
	for _, c := range r.calls {
		if c.returnedNil {
			delivered[key{c.topic, c.name, c.id}]++
		}
		calls[c.topic+"/"+c.name]++
	}
	dead := map[key]int{}
	deadBySub := map[string]int{}
	unsubBySub := map[string]int{}
	for _, dl := range r.dls {
		dead[key{dl.Message.Topic, dl.Subscriber, dl.Message.ID}]++
		deadBySub[dl.Message.Topic+"/"+dl.Subscriber]++
		if dl.Reason == ReasonUnsubscribed {
			unsubBySub[dl.Message.Topic+"/"+dl.Subscriber]++
		}
		sub := r.sub(dl.Message.Topic, dl.Subscriber)
		switch dl.Reason {
		case ReasonExhausted: // every allowed attempt was made for the last code
			if want := max(maxRetriesFor(sub.policy, dl.ErrorCode), 0) + 1; dl.Attempts < want || !dl.Retryable {
				t.Errorf("dead letter %s/%s %s: exhausted after %d attempts with code %q (retryable %v), policy allows %d",
					dl.Message.Topic, dl.Subscriber, dl.Message.ID, dl.Attempts, dl.ErrorCode, dl.Retryable, want)
			}
		case ReasonPermanent: // the last failure was not retryable
			if dl.Retryable || (dl.ErrorCode != CodePermanent && !(hasRule(sub.policy, dl.ErrorCode) && maxRetriesFor(sub.policy, dl.ErrorCode) < 0)) {
				t.Errorf("dead letter %s/%s %s: permanent with code %q (retryable %v)",
					dl.Message.Topic, dl.Subscriber, dl.Message.ID, dl.ErrorCode, dl.Retryable)
			}
		case ReasonShutdown, ReasonUnsubscribed:
		case ReasonOverflow:
			if sub.whenFull == Block {
				t.Errorf("dead letter %s/%s %s: overflow under Block", dl.Message.Topic, dl.Subscriber, dl.Message.ID)
			}
		case ReasonBudget:
			if !sub.budget || !dl.Retryable {
				t.Errorf("dead letter %s/%s %s: budget without a budget, or not retryable", dl.Message.Topic, dl.Subscriber, dl.Message.ID)
			}
		default:
			t.Errorf("dead letter %s has reason %q", dl.ID, dl.Reason)
		}
	}
	for _, s := range r.subs {
		ss, ok := st.Topics[s.topic].Subscribers[s.name]
		if !ok {
			t.Errorf("%s/%s missing from Stats", s.topic, s.name)
			continue
		}
		// Nothing lost: every dispatch to this subscriber ended exactly once.
		ended := 0
		for k, n := range delivered {
			if k.topic == s.topic && k.name == s.name {
				ended += n
			}
		}
		dedup := 0
		for k, n := range r.dedups {
			if k[:len(s.topic)+len(s.name)+2] == s.topic+"/"+s.name+"/" {
				dedup += n
			}
		}
		deadTotal := deadBySub[s.topic+"/"+s.name] + r.redriven[s.topic+"/"+s.name]
		ended += dedup + deadTotal
		if uint64(ended) != ss.Routed {
			t.Errorf("%s/%s: routed %d, but %d ended (delivered+deduplicated+dead-lettered)", s.topic, s.name, ss.Routed, ended)
		}
		// Unsubscribe reported every dead letter it made, owed messages
		// still behind another subscriber's full lane at its deadline
		// included (TestOwedMessagesBehindABlockedDispatcher).
		if k := s.topic + "/" + s.name; unsubBySub[k]+r.redrivenU[k] != r.unsubDLs[k] {
			t.Errorf("%s/%s: Unsubscribe calls reported %d dead letters, %d have reason unsubscribed (%d of them redriven)",
				s.topic, s.name, r.unsubDLs[k], unsubBySub[k]+r.redrivenU[k], r.redrivenU[k])
		}
		if ss.Queued != 0 || ss.InFlight != 0 {
			t.Errorf("%s/%s: %d queued and %d in flight after Close", s.topic, s.name, ss.Queued, ss.InFlight)
		}
		// Stats equal the recorded truth.
		if got := uint64(calls[s.topic+"/"+s.name]); ss.Attempts != got {
			t.Errorf("%s/%s: Stats.Attempts %d, handlers recorded %d calls", s.topic, s.name, ss.Attempts, got)
		}
		if got := uint64(ended - dedup - deadTotal); ss.Delivered != got {
			t.Errorf("%s/%s: Stats.Delivered %d, handlers returned nil %d times", s.topic, s.name, ss.Delivered, got)
		}
		if ss.DeadLettered != uint64(deadTotal) {
			t.Errorf("%s/%s: Stats.DeadLettered %d, but the store holds %d and %d were redriven",
				s.topic, s.name, ss.DeadLettered, deadBySub[s.topic+"/"+s.name], r.redriven[s.topic+"/"+s.name])
		}
		if ss.Deduplicated != uint64(dedup) {
			t.Errorf("%s/%s: Stats.Deduplicated %d, observer saw %d", s.topic, s.name, ss.Deduplicated, dedup)
		}
		// Anchors were subscribed throughout: each accepted publish of an ID
		// ended there exactly once (a redrive replaces a dead letter by a
		// new dispatch, so it does not change the count).
		if s.anchor {
			for tk, n := range r.accepted {
				if tk[:len(s.topic)+1] != s.topic+"/" {
					continue
				}
				k := key{s.topic, s.name, tk[len(s.topic)+1:]}
				got := delivered[k] + r.dedups[s.topic+"/"+s.name+"/"+k.id] + dead[k]
				if got != n {
					t.Errorf("anchor %s/%s: message %s accepted %d times, ended %d times (delivered %d, deduplicated %d, dead-lettered %d)",
						s.topic, s.name, k.id, n, got, delivered[k], r.dedups[s.topic+"/"+s.name+"/"+k.id], dead[k])
				}
			}
		}
	}
	for _, topic := range r.topics {
		if ts := st.Topics[topic]; ts.Published != uint64(r.acceptedOn(topic)) || ts.Queued != 0 {
			t.Errorf("topic %s: Stats.Published %d queued %d, publishers saw %d accepted", topic, ts.Published, ts.Queued, r.acceptedOn(topic))
		}
		// Its anchor was subscribed before the first publish and never
		// left: every message was routed to someone.
		if ts := st.Topics[topic]; ts.Unrouted != 0 {
			t.Errorf("topic %s: Unrouted %d; its anchor had every message", topic, ts.Unrouted)
		}
	}
	r.verifyAttempts()
	r.verifyOrder()
}

func (r *chaosRun) acceptedOn(topic string) int {
	n := 0
	for _, p := range r.published {
		if p[:len(topic)+1] == topic+"/" {
			n++
		}
	}
	return n
}

// verifyAttempts checks that the attempts of each (subscriber, message) go
// 1, 2, … in runs (one per dispatch), never past the policy's bound: an
// attempt n > 1 continues a run whose attempt n-1 failed with an error the
// policy retries (not after a success, a permanent error or an unretried
// panic). Two copies of one ID (a duplicate publish) may interleave their
// runs while one waits for its retry, so runs are counted, not ordered.
func (r *chaosRun) verifyAttempts() {
	type key struct{ topic, name, id string }
	open := map[key]map[int]int{} // runs whose last attempt n failed and may be retried
	for _, c := range r.calls {
		k := key{c.topic, c.name, c.id}
		s := r.sub(c.topic, c.name)
		if c.attempt < 1 || c.attempt > s.maxAttempts {
			r.t.Errorf("%s/%s %s: attempt %d outside 1..%d", c.topic, c.name, c.id, c.attempt, s.maxAttempts)
		}
		if open[k] == nil {
			open[k] = map[int]int{}
		}
		if c.attempt > 1 {
			if open[k][c.attempt-1] == 0 {
				r.t.Errorf("%s/%s %s: attempt %d continues no run that failed its attempt %d with a retried error",
					c.topic, c.name, c.id, c.attempt, c.attempt-1)
			} else {
				open[k][c.attempt-1]--
			}
		}
		retried := !c.returnedNil && c.behaviour != "permanent" && (c.behaviour != "panic" || maxRetriesFor(s.policy, CodePanic) >= 0)
		if retried {
			open[k][c.attempt]++
		}
	}
}

// verifyOrder checks per-key order (FIFO at concurrency 1) of first
// deliveries, for subscribers whose dead letters were never redriven.
func (r *chaosRun) verifyOrder() {
	type gk struct {
		topic, name string
		gen         int
	}
	firstSeen := map[gk]map[string]bool{}
	lastSeq := map[gk]map[string]int{}
	for _, c := range r.calls {
		s := r.sub(c.topic, c.name)
		if s.redrivable || c.attempt != 1 {
			continue
		}
		g := gk{c.topic, c.name, c.gen}
		if firstSeen[g] == nil {
			firstSeen[g], lastSeq[g] = map[string]bool{}, map[string]int{}
		}
		if firstSeen[g][c.id] {
			continue // a later dispatch of a duplicate
		}
		firstSeen[g][c.id] = true
		// Per Key; keyless messages leave the lane in dispatch order, so
		// one worker starts their first attempts in publish order, and
		// Ordered makes them one ordering key.
		orderKey := c.key
		if orderKey == "" && s.concurrency > 1 && !s.ordered {
			continue
		}
		if prev, ok := lastSeq[g][orderKey]; ok && c.pseq < prev {
			r.t.Errorf("%s/%s (gen %d, concurrency %d): %s (publish #%d) delivered after publish #%d of key %q",
				c.topic, c.name, c.gen, s.concurrency, c.id, c.pseq, prev, orderKey)
		}
		lastSeq[g][orderKey] = c.pseq
	}
}

// maxRetriesFor is how many retries p allows after a failure with code.
func maxRetriesFor(p RetryPolicy, code string) int {
	if r, ok := p.ByCode[code]; ok {
		return r.MaxRetries
	}
	return p.MaxRetries
}

// noneIfZero keeps the random policies' range of 0 to 3 retries: 0 is
// NoRetries (a zero MaxRetries means the default).
func noneIfZero(n int) int {
	if n == 0 {
		return NoRetries
	}
	return n
}

func hasRule(p RetryPolicy, code string) bool {
	_, ok := p.ByCode[code]
	return ok
}
