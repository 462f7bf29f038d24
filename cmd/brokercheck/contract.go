package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inproc/broker"
)

// checkDedup is check 3: the same message ID published many times; each
// subscriber's side effect must happen exactly once.
func checkDedup(ctx context.Context, cfg *config, r *result) {
	c := cfg.Dup
	const topic, id = "order.paid", "order-42"
	const charge, email = "charge", "email"
	const publishers = 4
	b, err := broker.New(
		broker.WithLogger(discard),
		broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: 2, Backoff: broker.ConstantBackoff(5 * time.Millisecond)}),
	)
	if err != nil {
		r.fatal(err)
		return
	}
	var charges, emails atomic.Int64
	var failedOnce atomic.Bool
	_, err = b.Subscribe(topic, charge, func(ctx context.Context, m broker.Message) error {
		if !failedOnce.Swap(true) {
			return errors.New("payment gateway timeout (nothing charged)")
		}
		if err := serve(ctx, time.Millisecond); err != nil {
			return err
		}
		charges.Add(1) // the side effect
		return nil
	}, broker.Concurrency(c.Workers))
	if err == nil {
		_, err = b.Subscribe(topic, email, func(ctx context.Context, m broker.Message) error {
			emails.Add(1) // the side effect
			return nil
		})
	}
	if err != nil {
		r.fatal(err)
		_ = closeBroker(b, cfg.CloseTimeout)
		return
	}
	r.printf("message %q published %d times to %q by %d goroutines at once, under %d ordering keys",
		id, c.Count, topic, publishers, publishers)
	r.printf("subscribers: %s (W=%d; its first attempt fails before charging, so a retry is in flight while duplicates arrive), %s (W=1)",
		charge, c.Workers, email)

	mon := startMonitor(b, r.out, "c3", cfg)
	var wg sync.WaitGroup
	var pubErrs atomic.Int64
	for p := range publishers {
		wg.Go(func() {
			for i := p; i < c.Count; i += publishers {
				msg := broker.Message{ID: id, Topic: topic, Key: "k" + strconv.Itoa(p), Payload: []byte("amount=42")}
				if b.Publish(ctx, msg) != nil {
					pubErrs.Add(1)
				}
			}
		})
	}
	wg.Wait()
	finished := func(ss broker.SubscriberStats) uint64 { return ss.Delivered + ss.Deduplicated + ss.DeadLettered }
	waitFor(ctx, cfg.CloseTimeout, func() bool {
		ts := b.Stats().Topics[topic]
		return finished(ts.Subscribers[charge]) == ts.Published && finished(ts.Subscribers[email]) == ts.Published
	})
	samples := mon.Stop()
	closeErr := closeBroker(b, cfg.CloseTimeout)
	ts := b.Stats().Topics[topic]

	r.expect(pubErrs.Load() == 0 && ts.Published == uint64(c.Count), "all %d publishes accepted (published %d, errors %d)",
		c.Count, ts.Published, pubErrs.Load())
	dups := uint64(c.Count - 1)
	for _, s := range []struct {
		name    string
		effects int64
	}{{charge, charges.Load()}, {email, emails.Load()}} {
		ss := ts.Subscribers[s.name]
		r.expect(s.effects == 1 && ss.Delivered == 1 && ss.Deduplicated == dups && ss.DeadLettered == 0,
			"%s: side effect happened %d time(s) (want 1); delivered %d, deduplicated %d (want %d), dead-lettered %d, attempts %d, retries %d",
			s.name, s.effects, ss.Delivered, ss.Deduplicated, dups, ss.DeadLettered, ss.Attempts, ss.Retries)
	}
	r.expectClosed(closeErr)
	r.expectBalanced(b)
	r.Headline = fmt.Sprintf("%d publishes of one ID: side effects %s=%d %s=%d", c.Count, charge, charges.Load(), email, emails.Load())
	r.Panel = panel{
		Title:  fmt.Sprintf("Check 3: message %q published %d times", id, c.Count),
		Series: []series{{Name: "backlog", Color: colorMain, Points: points(samples)}},
	}
}

// codedError is a handler error that names its own code.
type codedError struct{ code, text string }

func (e codedError) Error() string     { return e.text }
func (e codedError) ErrorCode() string { return e.code }

// checkDeadLetter is check 4: messages that fail for good reach the
// dead-letter store with topic, message_id, subscriber, attempt and
// error_code, and the Observer event and the log line say the same.
func checkDeadLetter(ctx context.Context, cfg *config, r *result) {
	const topic, ledger, audit = "payments", "ledger", "audit"
	const handlerTimeout = 20 * time.Millisecond
	maxRetries := cfg.Dead.MaxRetries
	type poison struct {
		id, code, reason, errText string
		attempts                  int
		retryable                 bool
	}
	cases := []poison{
		{"pay-1001", "downstream_unavailable", broker.ReasonExhausted, "ledger service unavailable", maxRetries + 1, true},
		{"pay-1002", "invalid_amount", broker.ReasonPermanent, "permanent: amount -5 is negative", 1, false},
		{"pay-1003", broker.CodeTimeout, broker.ReasonExhausted, context.DeadlineExceeded.Error(), 2, true},
	}
	healthyIDs := []string{"pay-1000", "pay-1004"}

	logs := &logCapture{}
	obs := newObserver()
	b, err := broker.New(
		broker.WithLogger(slog.New(logs.handler())),
		broker.WithObserver(obs),
		broker.WithRetryPolicy(broker.RetryPolicy{
			MaxRetries: maxRetries,
			Backoff:    broker.ConstantBackoff(2 * time.Millisecond),
			ByCode:     map[string]broker.RetryRule{broker.CodeTimeout: {MaxRetries: 1}},
		}),
	)
	if err != nil {
		r.fatal(err)
		return
	}
	var mu sync.Mutex
	seen := map[string][]int{} // attempts the ledger handler saw, by ID
	_, err = b.Subscribe(topic, ledger, func(ctx context.Context, m broker.Message) error {
		mu.Lock()
		seen[m.ID] = append(seen[m.ID], m.Attempt)
		mu.Unlock()
		switch m.ID {
		case cases[0].id:
			return codedError{cases[0].code, cases[0].errText}
		case cases[1].id:
			return broker.Permanent(codedError{cases[1].code, "amount -5 is negative"})
		case cases[2].id:
			return serve(ctx, 10*handlerTimeout) // the deadline ends it
		}
		return nil
	}, broker.HandlerTimeout(handlerTimeout))
	if err == nil {
		_, err = b.Subscribe(topic, audit, func(context.Context, broker.Message) error { return nil })
	}
	if err != nil {
		r.fatal(err)
		_ = closeBroker(b, cfg.CloseTimeout)
		return
	}
	r.printf("topic %q, subscribers %s (HandlerTimeout %v) and %s (always succeeds)", topic, ledger, handlerTimeout, audit)
	r.printf("policy: MaxRetries %d, ByCode timeout: MaxRetries 1; poison messages: %s (code %s), %s (Permanent, code %s), %s (runs past the deadline)",
		maxRetries, cases[0].id, cases[0].code, cases[1].id, cases[1].code, cases[2].id)

	mon := startMonitor(b, r.out, "c4", cfg)
	start := time.Now()
	ids := []string{healthyIDs[0], cases[0].id, cases[1].id, cases[2].id, healthyIDs[1]}
	headers := map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	for _, id := range ids {
		msg := broker.Message{ID: id, Topic: topic, Payload: []byte("payment " + id), Headers: headers}
		if err := b.Publish(ctx, msg); err != nil {
			r.fatal(err)
		}
	}
	waitFor(ctx, cfg.CloseTimeout, func() bool {
		ts := b.Stats().Topics[topic]
		for _, ss := range ts.Subscribers {
			if ss.Delivered+ss.DeadLettered != uint64(len(ids)) {
				return false
			}
		}
		return true
	})
	samples := mon.Stop()
	closeErr := closeBroker(b, cfg.CloseTimeout)

	stored, err := b.DeadLetters().List(context.Background(), broker.DeadLetterFilter{Topic: topic})
	if err != nil {
		r.fatal(err)
	}
	events := obs.deadLetters()
	r.printf("%-9s %-8s %-22s %-8s %-9s %-9s %s", "message", "attempt", "error_code", "reason", "retryable", "attempts", "error")
	for _, dl := range stored {
		r.printf("%-9s %-8d %-22s %-8s %-9t %-9s %q", dl.Message.ID, dl.Message.Attempt, dl.ErrorCode, dl.Reason, dl.Retryable,
			fmt.Sprint(seen[dl.Message.ID]), dl.Error)
	}
	r.expect(len(stored) == len(cases), "the store holds %d dead letters (want %d, one per poison message)", len(stored), len(cases))
	for _, want := range cases {
		var got []string
		idx := slices.IndexFunc(stored, func(dl broker.DeadLetter) bool { return dl.Message.ID == want.id })
		if idx < 0 {
			r.expect(false, "%s: no dead letter", want.id)
			continue
		}
		dl := stored[idx]
		field := func(name string, have, wantV any) {
			if fmt.Sprint(have) != fmt.Sprint(wantV) {
				got = append(got, fmt.Sprintf("%s=%v (want %v)", name, have, wantV))
			}
		}
		field("topic", dl.Message.Topic, topic)
		field("message_id", dl.Message.ID, want.id)
		field("subscriber", dl.Subscriber, ledger)
		field("attempt", dl.Message.Attempt, want.attempts)
		field("Attempts", dl.Attempts, want.attempts)
		field("error_code", dl.ErrorCode, want.code)
		field("reason", dl.Reason, want.reason)
		field("retryable", dl.Retryable, want.retryable)
		field("error", dl.Error, want.errText)
		field("payload", string(dl.Message.Payload), "payment "+want.id)
		field("headers", dl.Message.Headers["traceparent"], headers["traceparent"])
		if dl.ID == "" {
			got = append(got, "dead letter ID empty")
		}
		if dl.FailedAt.Before(start) || dl.FailedAt.After(time.Now()) {
			got = append(got, fmt.Sprintf("failed_at %v outside the run", dl.FailedAt))
		}
		mu.Lock()
		attempts := slices.Clone(seen[want.id])
		mu.Unlock()
		field("handler attempts", attempts, upTo(want.attempts))
		evIdx := slices.IndexFunc(events, func(e broker.DeadLetterEvent) bool { return e.DeadLetter.ID == dl.ID })
		if evIdx < 0 {
			got = append(got, "no Observer event")
		} else if e := events[evIdx]; e.StoreErr != nil || !sameDeadLetter(e.DeadLetter, dl) {
			got = append(got, fmt.Sprintf("Observer event differs: %+v (store error %v)", e.DeadLetter, e.StoreErr))
		}
		got = append(got, logs.check(map[string]string{
			"topic": topic, "message_id": want.id, "subscriber": ledger, "attempt": strconv.Itoa(want.attempts),
			"error_code": want.code, "final_state": string(broker.OutcomeDeadLettered), "reason": want.reason,
		})...)
		detail := "topic, message_id, subscriber, attempt, error_code, reason, retryable, error, payload, headers; Observer event; Warn log line"
		if len(got) > 0 {
			detail = strings.Join(got, "; ")
		}
		r.expect(len(got) == 0, "%s → dead letter %s: %s", want.id, dl.ID, detail)
	}
	auditDead, _ := b.DeadLetters().List(context.Background(), broker.DeadLetterFilter{Subscriber: audit})
	r.expect(len(auditDead) == 0, "%s (healthy subscriber of the same topic) has no dead letter (%d)", audit, len(auditDead))
	r.expectClosed(closeErr)
	r.expectBalanced(b)
	r.Headline = fmt.Sprintf("%d/%d dead letters complete", len(cases)-countPrefix(r.Failures, "pay-"), len(cases))
	r.Panel = panel{
		Title:  "Check 4: poison messages reach the dead-letter store",
		Series: []series{{Name: "backlog", Color: colorMain, Points: points(samples)}},
	}
}

func sameDeadLetter(a, b broker.DeadLetter) bool {
	return a.ID == b.ID && a.Message.ID == b.Message.ID && a.Message.Topic == b.Message.Topic &&
		a.Message.Attempt == b.Message.Attempt && a.Subscriber == b.Subscriber && a.Attempts == b.Attempts &&
		a.ErrorCode == b.ErrorCode && a.Error == b.Error && a.Retryable == b.Retryable && a.Reason == b.Reason
}

func upTo(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i + 1
	}
	return s
}

func countPrefix(lines []string, prefix string) int {
	n := 0
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// waitFor polls cond until it holds, ctx ends or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) || !pause(ctx, 2*time.Millisecond) {
			return false
		}
	}
	return true
}

// logCapture keeps Warn and above log records as string attributes, to
// check the broker's dead-letter log lines.
type logCapture struct {
	mu      sync.Mutex
	records []map[string]string
}

// handler returns a slog.Handler writing into c.
func (c *logCapture) handler() slog.Handler { return captureHandler{c: c} }

type captureHandler struct {
	c     *logCapture
	attrs []slog.Attr // from WithAttrs (groups are flattened)
}

func (h captureHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h captureHandler) Handle(_ context.Context, rec slog.Record) error {
	attrs := map[string]string{"msg": rec.Message}
	for _, a := range h.attrs {
		attrs[a.Key] = a.Value.String()
	}
	rec.Attrs(func(a slog.Attr) bool {
		attrs[a.Key] = a.Value.String()
		return true
	})
	h.c.mu.Lock()
	h.c.records = append(h.c.records, attrs)
	h.c.mu.Unlock()
	return nil
}

func (h captureHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return captureHandler{c: h.c, attrs: append(slices.Clip(h.attrs), as...)}
}

func (h captureHandler) WithGroup(string) slog.Handler { return h }

// check returns what is wrong with the log line whose message_id and
// final_state match want: missing or different fields, or no such line.
func (c *logCapture) check(want map[string]string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rec := range c.records {
		if rec["message_id"] != want["message_id"] || rec["final_state"] != want["final_state"] {
			continue
		}
		var bad []string
		for _, k := range slices.Sorted(maps.Keys(want)) {
			if rec[k] != want[k] {
				bad = append(bad, fmt.Sprintf("log %s=%q (want %q)", k, rec[k], want[k]))
			}
		}
		return bad
	}
	return []string{"no Warn log line with final_state=dead_lettered"}
}
