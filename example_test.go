package broker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/inproc/broker"
)

// quiet is a logger that writes nowhere, to keep example output stable.
var quiet = slog.New(slog.DiscardHandler)

// journal collects lines from concurrent handlers, per subscriber.
type journal struct {
	mu    sync.Mutex
	lines map[string][]string
}

func (j *journal) add(sub, format string, args ...any) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.lines == nil {
		j.lines = map[string][]string{}
	}
	j.lines[sub] = append(j.lines[sub], fmt.Sprintf(format, args...))
}

func (j *journal) print(subs ...string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, s := range subs {
		for _, l := range j.lines[s] {
			fmt.Println(l)
		}
	}
}

// The article's worked example: order.created goes to billing and
// inventory; inventory fails once and succeeds on its retry. While m-1
// waits out its backoff, inventory goes on with m-2: a retry holds only its
// message (and its Key, if it has one).
func Example() {
	b, err := broker.New(
		broker.WithLogger(quiet),
		broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: 2, Backoff: broker.ConstantBackoff(10 * time.Millisecond)}),
	)
	if err != nil {
		panic(err)
	}
	var j journal
	_, _ = b.Subscribe("order.created", "billing", func(ctx context.Context, m broker.Message) error {
		j.add("billing", "[billing] id=%s attempt=%d payload=%s ok", m.ID, m.Attempt, m.Payload)
		return nil
	})
	var failed sync.Once
	_, _ = b.Subscribe("order.created", "inventory", func(ctx context.Context, m broker.Message) error {
		err := errors.New("temporary timeout")
		failed.Do(func() {
			j.add("inventory", "[inventory] id=%s attempt=%d simulated fail", m.ID, m.Attempt)
		})
		if m.Attempt == 1 && m.ID == "m-1" {
			return err
		}
		j.add("inventory", "[inventory] id=%s attempt=%d ok", m.ID, m.Attempt)
		return nil
	})

	ctx := context.Background()
	_ = b.Publish(ctx, broker.Message{ID: "m-1", Topic: "order.created", Payload: []byte("order=1001")})
	_ = b.Publish(ctx, broker.Message{ID: "m-2", Topic: "order.created", Payload: []byte("order=1002")})

	// Close delivers everything queued, retries included, before it returns.
	if err := b.Close(ctx); err != nil {
		panic(err)
	}
	j.print("billing", "inventory")
	inv := b.Stats().Topics["order.created"].Subscribers["inventory"]
	fmt.Printf("inventory: delivered=%d attempts=%d retries=%d dead=%d\n",
		inv.Delivered, inv.Attempts, inv.Retries, inv.DeadLettered)
	// Output:
	// [billing] id=m-1 attempt=1 payload=order=1001 ok
	// [billing] id=m-2 attempt=1 payload=order=1002 ok
	// [inventory] id=m-1 attempt=1 simulated fail
	// [inventory] id=m-2 attempt=1 ok
	// [inventory] id=m-1 attempt=2 ok
	// inventory: delivered=2 attempts=3 retries=1 dead=0
}

// invalidInput is a handler error that names its own code.
type invalidInput struct{ field string }

func (e invalidInput) Error() string     { return "invalid " + e.field }
func (e invalidInput) ErrorCode() string { return "invalid" }

// The article's second worked example as configuration: timeouts are
// retried 3 times, invalid input never, throttling 5 times with a longer
// backoff; everything else twice.
func ExampleRetryPolicy() {
	policy := broker.RetryPolicy{
		MaxRetries: 2,
		Backoff:    broker.ExponentialBackoff(time.Millisecond, 5*time.Millisecond),
		ByCode: map[string]broker.RetryRule{
			broker.CodeTimeout:   {MaxRetries: 3},
			"invalid":            {MaxRetries: broker.NoRetries},
			broker.CodeThrottled: {MaxRetries: 5, Backoff: broker.ConstantBackoff(10 * time.Millisecond)},
		},
	}
	b, _ := broker.New(broker.WithLogger(quiet), broker.WithRetryPolicy(policy))
	_, _ = b.Subscribe("calls", "downstream", func(ctx context.Context, m broker.Message) error {
		switch m.ID {
		case "slow":
			<-ctx.Done() // runs past HandlerTimeout: code "timeout"
			return ctx.Err()
		case "bad":
			return broker.Permanent(invalidInput{"amount"})
		case "busy":
			return broker.RetryAfter(errors.New("429 too many requests"), 5*time.Millisecond)
		default:
			return errors.New("connection reset")
		}
	}, broker.HandlerTimeout(5*time.Millisecond))

	for _, id := range []string{"slow", "bad", "busy", "other"} {
		_ = b.Publish(context.Background(), broker.Message{ID: id, Topic: "calls"})
	}
	_ = b.Close(context.Background())

	dls, _ := b.DeadLetters().List(context.Background(), broker.DeadLetterFilter{})
	// Oldest first is the order they failed in; print them by message ID.
	slices.SortFunc(dls, func(a, b broker.DeadLetter) int { return strings.Compare(a.Message.ID, b.Message.ID) })
	for _, dl := range dls {
		fmt.Printf("%-5s code=%-9s attempts=%d reason=%s\n", dl.Message.ID, dl.ErrorCode, dl.Attempts, dl.Reason)
	}
	// Output:
	// bad   code=invalid   attempts=1 reason=permanent
	// busy  code=throttled attempts=6 reason=exhausted
	// other code=error     attempts=3 reason=exhausted
	// slow  code=timeout   attempts=4 reason=exhausted
}

// Reading dead letters, then redriving one to the subscriber that failed it
// once the cause is fixed.
func ExampleBroker_Redrive() {
	b, _ := broker.New(broker.WithLogger(quiet), broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: broker.NoRetries}))
	var mu sync.Mutex
	fixed := false
	done := make(chan string, 1)
	_, _ = b.Subscribe("payments", "ledger", func(ctx context.Context, m broker.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if !fixed {
			return errors.New("ledger offline")
		}
		done <- fmt.Sprintf("ledger booked %s on attempt %d", m.ID, m.Attempt)
		return nil
	})
	_ = b.Publish(context.Background(), broker.Message{ID: "pay-1", Topic: "payments"})
	waitFor(func() bool { return b.Stats().Topics["payments"].Subscribers["ledger"].DeadLettered == 1 })

	dls, _ := b.DeadLetters().List(context.Background(), broker.DeadLetterFilter{Subscriber: "ledger"})
	dl := dls[0]
	fmt.Printf("dead letter: topic=%s message_id=%s subscriber=%s attempt=%d error_code=%s error=%q\n",
		dl.Message.Topic, dl.Message.ID, dl.Subscriber, dl.Attempts, dl.ErrorCode, dl.Error)

	mu.Lock()
	fixed = true
	mu.Unlock()
	n, err := b.Redrive(context.Background(), dl.ID)
	fmt.Println("redriven:", n, err)
	fmt.Println(<-done)
	_ = b.Close(context.Background())
	left, _ := b.DeadLetters().Len(context.Background())
	fmt.Println("dead letters left:", left)
	// Output:
	// dead letter: topic=payments message_id=pay-1 subscriber=ledger attempt=1 error_code=error error="ledger offline"
	// redriven: 1 <nil>
	// ledger booked pay-1 on attempt 1
	// dead letters left: 0
}

// Redriving what a shedding subscriber dropped, once it keeps up again:
// every dead letter of reason overflow, in one call.
func ExampleBroker_RedriveMatching() {
	b, _ := broker.New(broker.WithLogger(quiet))
	release := make(chan struct{})
	var mu sync.Mutex
	var got []string
	_, _ = b.Subscribe("logs", "cleaner", func(ctx context.Context, m broker.Message) error {
		<-release
		mu.Lock()
		defer mu.Unlock()
		got = append(got, m.ID)
		return nil
	}, broker.LaneSize(1), broker.WhenLaneFull(broker.DeadLetterNewest))
	for i := range 5 {
		_ = b.Publish(context.Background(), broker.Message{ID: fmt.Sprint("line-", i), Topic: "logs"})
		if i == 0 {
			waitFor(func() bool { return b.Stats().Topics["logs"].Subscribers["cleaner"].InFlight == 1 })
		}
	}
	waitFor(func() bool { return b.Stats().Topics["logs"].Subscribers["cleaner"].DeadLettered == 3 })
	close(release)

	n, err := b.RedriveMatching(context.Background(), broker.DeadLetterFilter{Reason: broker.ReasonOverflow})
	fmt.Println("redriven:", n, err)
	_ = b.Close(context.Background())
	fmt.Println("handled:", got)
	// Output:
	// redriven: 3 <nil>
	// handled: [line-0 line-1 line-2 line-3 line-4]
}

// The same message ID published 100 times: the side effect happens once.
func ExampleWithIdempotencyStore() {
	b, _ := broker.New(
		broker.WithLogger(quiet),
		broker.WithIdempotencyStore(broker.NewMemoryIdempotencyStore(10*time.Minute, 50_000)),
	)
	var charges int
	_, _ = b.Subscribe("order.paid", "charge", func(ctx context.Context, m broker.Message) error {
		charges++ // one worker: no data race
		return nil
	})
	for range 100 {
		_ = b.Publish(context.Background(), broker.Message{ID: "order-42", Topic: "order.paid"})
	}
	_ = b.Close(context.Background())
	s := b.Stats().Topics["order.paid"].Subscribers["charge"]
	fmt.Printf("charges=%d delivered=%d deduplicated=%d\n", charges, s.Delivered, s.Deduplicated)
	// Output:
	// charges=1 delivered=1 deduplicated=99
}

// PublishBatch publishes many messages and says which were refused: here
// one without an ID. Over a transport that stores remotely (natsjs) it
// sends them all before it waits for the acknowledgements.
func ExampleBroker_PublishBatch() {
	b, _ := broker.New(broker.WithLogger(quiet))
	_, _ = b.Subscribe("audit", "archive", func(ctx context.Context, m broker.Message) error { return nil })
	err := b.PublishBatch(context.Background(), []broker.Message{
		{ID: "a-1", Topic: "audit"},
		{Topic: "audit"},
		{ID: "a-3", Topic: "audit"},
	})
	var be *broker.BatchError
	if errors.As(err, &be) {
		for i, e := range be.Errs {
			fmt.Printf("message %d: %v\n", i, e)
		}
	}
	_ = b.Close(context.Background())
	fmt.Println("delivered:", b.Stats().Topics["audit"].Subscribers["archive"].Delivered)
	// Output:
	// message 0: <nil>
	// message 1: broker: invalid message: empty ID (topic "audit")
	// message 2: <nil>
	// delivered: 2
}

// Stats say where the backlog is: here a slow subscriber holds messages in
// its lane while a fast one is done.
func ExampleBroker_Stats() {
	b, _ := broker.New(broker.WithLogger(quiet))
	release := make(chan struct{})
	_, _ = b.Subscribe("logs", "fast", func(ctx context.Context, m broker.Message) error { return nil })
	_, _ = b.Subscribe("logs", "slow", func(ctx context.Context, m broker.Message) error {
		<-release
		return nil
	})
	for i := range 10 {
		_ = b.Publish(context.Background(), broker.Message{ID: fmt.Sprint("log-", i), Topic: "logs"})
	}
	waitFor(func() bool { // fast is done and slow holds all ten
		t := b.Stats().Topics["logs"]
		return t.Subscribers["fast"].Delivered == 10 && t.Subscribers["slow"].InFlight == 1 && t.Subscribers["slow"].Queued == 9
	})
	show := func() {
		t := b.Stats().Topics["logs"]
		fmt.Printf("published=%d queued=%d\n", t.Published, t.Queued)
		for _, name := range []string{"fast", "slow"} {
			s := t.Subscribers[name]
			fmt.Printf("  %s: routed=%d delivered=%d queued=%d in_flight=%d backlog=%d\n",
				name, s.Routed, s.Delivered, s.Queued, s.InFlight, s.Backlog())
		}
	}
	show()
	close(release)
	_ = b.Close(context.Background())
	show()
	// Output:
	// published=10 queued=0
	//   fast: routed=10 delivered=10 queued=0 in_flight=0 backlog=0
	//   slow: routed=10 delivered=0 queued=9 in_flight=1 backlog=10
	// published=10 queued=0
	//   fast: routed=10 delivered=10 queued=0 in_flight=0 backlog=0
	//   slow: routed=10 delivered=10 queued=0 in_flight=0 backlog=0
}

// waitFor polls cond every millisecond, for at most five seconds.
func waitFor(cond func() bool) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if cond() {
			return true
		}
	}
	return false
}

// A stuck webhook must not hold up billing: with WhenLaneFull its full lane
// sheds (here the newest messages) as dead letters with reason "overflow",
// at the webhook only, and billing gets everything.
func ExampleWhenLaneFull() {
	b, _ := broker.New(broker.WithLogger(quiet))
	release := make(chan struct{})
	_, _ = b.Subscribe("orders", "billing", func(ctx context.Context, m broker.Message) error { return nil })
	_, _ = b.Subscribe("orders", "webhook", func(ctx context.Context, m broker.Message) error {
		<-release // the remote end hangs
		return nil
	}, broker.LaneSize(2), broker.WhenLaneFull(broker.DeadLetterNewest))

	publish := func(i int) {
		_ = b.Publish(context.Background(), broker.Message{ID: fmt.Sprint("o-", i), Topic: "orders"})
	}
	publish(0)
	waitFor(func() bool { return b.Stats().Topics["orders"].Subscribers["webhook"].InFlight == 1 })
	for i := 1; i < 6; i++ {
		publish(i) // o-1 and o-2 fill the webhook's lane; o-3..o-5 do not fit
	}
	waitFor(func() bool { return b.Stats().Topics["orders"].Subscribers["billing"].Delivered == 6 })
	// The webhook's own goroutine stores what it sheds: wait for it too.
	waitFor(func() bool { return b.Stats().Topics["orders"].Subscribers["webhook"].DeadLettered == 3 })
	dls, _ := b.DeadLetters().List(context.Background(), broker.DeadLetterFilter{Subscriber: "webhook"})
	for _, dl := range dls {
		fmt.Printf("dead letter %s reason=%s\n", dl.Message.ID, dl.Reason)
	}
	fmt.Println("billing delivered:", b.Stats().Topics["orders"].Subscribers["billing"].Delivered)
	close(release)
	_ = b.Close(context.Background())
	// Output:
	// dead letter o-3 reason=overflow
	// dead letter o-4 reason=overflow
	// dead letter o-5 reason=overflow
	// billing delivered: 6
}

// breakerLog prints circuit breaker transitions (an Observer that also
// implements BreakerObserver).
type breakerLog struct {
	broker.NopObserver
	mu    sync.Mutex
	lines []string
	open  chan struct{}
}

func (l *breakerLog) BreakerChanged(e broker.BreakerEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	line := fmt.Sprintf("breaker %s → %s", e.From, e.To)
	if e.To == broker.BreakerOpen {
		line += fmt.Sprintf(" for %v", e.OpenFor)
		select {
		case l.open <- struct{}{}:
		default:
		}
	}
	l.lines = append(l.lines, line)
}

func (l *breakerLog) add(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, line)
}

// A circuit breaker pauses a subscriber whose dependency is down: after
// three failures in a row no attempt runs (none is burnt) until one probe,
// after the open interval, finds the dependency back.
func ExampleCircuitBreaker() {
	log := &breakerLog{open: make(chan struct{}, 1)}
	b, _ := broker.New(broker.WithLogger(quiet), broker.WithObserver(log),
		broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: 5, Backoff: broker.ConstantBackoff(5 * time.Millisecond)}))
	var mu sync.Mutex
	down := true
	_, _ = b.Subscribe("emails", "smtp", func(ctx context.Context, m broker.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if down {
			log.add(fmt.Sprintf("attempt %d fails", m.Attempt))
			return errors.New("smtp: connection refused")
		}
		log.add(fmt.Sprintf("attempt %d delivered", m.Attempt))
		return nil
	}, broker.CircuitBreaker(broker.BreakerPolicy{Failures: 3, OpenFor: 50 * time.Millisecond}))

	_ = b.Publish(context.Background(), broker.Message{ID: "welcome-1", Topic: "emails"})
	<-log.open // the breaker opened: mend the dependency while it waits
	mu.Lock()
	down = false
	mu.Unlock()
	_ = b.Close(context.Background())
	for _, l := range log.lines {
		fmt.Println(l)
	}
	// Output:
	// attempt 1 fails
	// attempt 2 fails
	// attempt 3 fails
	// breaker closed → open for 50ms
	// breaker open → half_open
	// attempt 4 delivered
	// breaker half_open → closed
}

// Keyless messages are ordered only by dispatch: a retry does not hold the
// messages behind it. Ordered makes them strict FIFO through retries.
func ExampleOrdered() {
	for _, ordered := range []bool{false, true} {
		b, _ := broker.New(broker.WithLogger(quiet),
			broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: 1, Backoff: broker.ConstantBackoff(100 * time.Millisecond)}))
		var j journal
		var opts []broker.SubscribeOption
		if ordered {
			opts = append(opts, broker.Ordered())
		}
		_, _ = b.Subscribe("audit", "store", func(ctx context.Context, m broker.Message) error {
			j.add("store", "%s#%d", m.ID, m.Attempt)
			if m.ID == "a" && m.Attempt == 1 {
				return errors.New("disk busy")
			}
			return nil
		}, opts...)
		for _, id := range []string{"a", "b", "c"} {
			_ = b.Publish(context.Background(), broker.Message{ID: id, Topic: "audit"})
		}
		_ = b.Close(context.Background())
		fmt.Printf("ordered=%v:", ordered)
		j.mu.Lock()
		for _, l := range j.lines["store"] {
			fmt.Print(" ", l)
		}
		j.mu.Unlock()
		fmt.Println()
	}
	// Output:
	// ordered=false: a#1 b#1 c#1 a#2
	// ordered=true: a#1 a#2 b#1 c#1
}

// Middleware wraps every attempt; a publish hook decorates each message
// before it is queued. Together they carry a request ID from the
// publisher's context to the handler's log line, as a tracing adapter
// carries trace context.
func ExampleWithMiddleware() {
	type requestIDKey struct{}
	stamp := func(ctx context.Context, m *broker.Message) error {
		if id, ok := ctx.Value(requestIDKey{}).(string); ok {
			m.Headers["request_id"] = id
		}
		return nil
	}
	logAttempts := func(sub broker.SubscriberInfo, next broker.Handler) broker.Handler {
		return func(ctx context.Context, m broker.Message) error {
			err := next(ctx, m)
			fmt.Printf("%s/%s %s attempt %d request %s code=%q\n",
				sub.Topic, sub.Name, m.ID, m.Attempt, m.Headers["request_id"], broker.ErrorCodeOf(err))
			return err
		}
	}
	b, _ := broker.New(broker.WithLogger(quiet),
		broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: 1, Backoff: broker.ConstantBackoff(0)}),
		broker.WithPublishHook(stamp), broker.WithMiddleware(logAttempts))
	failed := false
	_, _ = b.Subscribe("orders", "billing", func(ctx context.Context, m broker.Message) error {
		if !failed {
			failed = true
			return errors.New("card service down")
		}
		return nil
	})
	ctx := context.WithValue(context.Background(), requestIDKey{}, "req-7")
	_ = b.Publish(ctx, broker.Message{ID: "o-1", Topic: "orders"})
	_ = b.Close(context.Background())
	// Output:
	// orders/billing o-1 attempt 1 request req-7 code="error"
	// orders/billing o-1 attempt 2 request req-7 code=""
}
