package broker

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// This file is the last stage of delivery, the failure exit included: it
// moves the counters, calls the Observer, logs with the contract's fields,
// and puts dead letters into the store (retrying a store that refuses).

// recorder is the last stage of the delivery pipeline for one subscriber:
// it moves the counters, calls the Observer, logs, and puts dead letters into
// the store. It knows nothing of queues or goroutines.
type recorder struct {
	topic, subscriber string
	c                 *subCounters
	obs               Observer // nil: none
	log               *slog.Logger
	limits            *logLimits // rate limits of the lines that could flood log
	dlq               DeadLetterStore
	newID             func() string                  // dead-letter IDs
	onDeadLetter      func(reason string, lost bool) // lost: the store refused it for good
	stop              <-chan struct{}                // closed when the subscription must stop at once: a failing Put is given up
	storeCtx          context.Context                // the stores' ctx: ends storeGrace after stop (see storeContext)
	// keep says a dead letter the store failed until the stop stays with
	// the transport (a transport's pipeline, see pipeline.deadLetter): it
	// is then not counted, announced or logged as a dead letter.
	keep bool
}

// storeGrace is how long after a stop's ctx ends the stores' calls get:
// the stop's deadline (ShutdownGrace), plus one grace. A store that
// honours its ctx returns soon after the stop gave up on its call.
const storeGrace = 2 * ShutdownGrace

// storeContext is the ctx of a subscription's calls to the dead-letter and
// idempotency stores: never cancelled while the subscription runs, it ends
// storeGrace after stop (the subscription's context, cancelled when a
// stop's ctx ends, with the stop's cause) does, so a store call that waits
// for its backend or its ctx returns by then. The timer it arms then is
// its only resource.
func storeContext(stop context.Context) context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	context.AfterFunc(stop, func() {
		time.AfterFunc(storeGrace, func() { cancel(context.Cause(stop)) })
	})
	return ctx
}

// Retries of a dead letter the store refused.
const (
	putRetryBase = 10 * time.Millisecond
	putRetryMax  = 5 * time.Second
)

// put stores dl, retrying with backoff while the store refuses it, until
// the subscription must stop at once (Close's or Unsubscribe's deadline)
// or the store refuses it for good (ErrDeadLetterRefused): then the last
// error is returned. The worker (so the message's key) is
// held meanwhile: a dead letter is never dropped while the broker runs.
//
// h is the caller's hand (see hand): a stop may abandon it while Put
// runs, and then put returns errAbandoned at once.
func (r *recorder) put(dl *DeadLetter, h *hand) error {
	err := r.putIn(h, dl)
	for retry := 1; err != nil && !errors.Is(err, ErrDeadLetterRefused) && !errors.Is(err, errAbandoned); retry++ {
		delay := exponential(putRetryBase, putRetryMax, retry)
		if r.log.Enabled(context.Background(), slog.LevelWarn) {
			r.log.LogAttrs(context.Background(), slog.LevelWarn, "broker: dead-letter store refused a dead letter; retrying",
				slog.String("dead_letter_id", dl.ID), slog.String("topic", r.topic),
				slog.String("message_id", dl.Message.ID), slog.String("subscriber", r.subscriber),
				slog.Int("retry", retry), slog.Duration("delay", delay), slog.String("store_error", err.Error()))
		}
		t := time.NewTimer(delay)
		select {
		case <-r.stop:
			t.Stop()
			return err
		case <-t.C:
		}
		err = r.putIn(h, dl)
	}
	return err
}

// errAbandoned is what a call a stop gave up on returns to the broker.
var errAbandoned = errors.New("broker: the stop's deadline passed while the call ran: abandoned")

// putIn is one Put, by the goroutine whose hand is h.
func (r *recorder) putIn(h *hand, dl *DeadLetter) error {
	if !h.enter() {
		return errAbandoned
	}
	err := r.dlq.Put(r.storeCtx, *dl)
	if !h.leave() {
		return ErrDeadLetterRefused // no retry: the stop counted it
	}
	return err
}

// timing is an attempt's, measured only when an Observer listens: when the
// handler was called, and how long it ran.
type timing struct {
	start time.Time
	d     time.Duration
}

func (r *recorder) attempted(h *hand, msg *Message, t timing, code string, retryable bool, out Outcome, delay time.Duration, err error) {
	if r.obs != nil && h.enter() {
		attempt := msg.Attempt
		if out == OutcomeDeduplicated {
			attempt = 0 // also for a retry found delivered by another copy meanwhile
		}
		r.obs.Attempted(AttemptEvent{
			Topic: r.topic, Subscriber: r.subscriber, MessageID: msg.ID,
			Attempt: attempt, Start: t.start, Duration: t.d, ErrorCode: code, Retryable: retryable,
			Outcome: out, Delay: delay, PublishedAt: msg.PublishedAt, Err: err, Headers: msg.Headers,
		})
		h.leave()
	}
}

// fault is why a message failed: its code, whether the policy retries it,
// the error, and the error's text, read once (a handler's error may not be
// safe to ask twice; see vetError).
type fault struct {
	code      string
	retryable bool
	err       error
	text      string
}

// brokerFault is a fault of the broker's own making (shutdown, overflow).
func brokerFault(code string, err error) fault {
	return fault{code: code, err: err, text: err.Error()}
}

// delivered counts msg delivered, by the goroutine whose hand is h (nil:
// none) once h claimed its end (h.end). The recorder's methods with a hand
// record nothing if a stop abandoned it (the stop counted the message).
func (r *recorder) delivered(h *hand, msg *Message, t timing) {
	r.c.delivered.Add(1)
	r.attempted(h, msg, t, "", false, OutcomeDelivered, 0, nil)
	if r.log.Enabled(context.Background(), slog.LevelDebug) {
		r.logAttrs(slog.LevelDebug, "broker: delivered", msg, fault{}, OutcomeDelivered)
	}
}

// deduplicated counts msg deduplicated; false if a stop abandoned h.
// counted, if not nil, runs once the message is counted, before its event.
func (r *recorder) deduplicated(h *hand, msg *Message, counted func()) bool {
	if !h.end() {
		return false
	}
	r.c.deduplicated.Add(1)
	if counted != nil {
		counted()
	}
	r.attempted(h, msg, timing{}, "", false, OutcomeDeduplicated, 0, nil)
	if r.log.Enabled(context.Background(), slog.LevelInfo) && r.limits.duplicate.allow(logKey{topic: r.topic, subscriber: r.subscriber}) {
		window := slog.String("dedup_window", "the idempotency store's")
		if r.limits.window > 0 {
			window = slog.Duration("dedup_window", r.limits.window)
		}
		r.logAttrs(slog.LevelInfo, "broker: duplicate message ID skipped: this subscriber already handled a message with this ID within the dedup window; "+
			"an ID must name one message, not an entity (for example, one order ID used for both its paid and its shipped events: the second is skipped)",
			msg, fault{}, OutcomeDeduplicated, window)
	} else if r.log.Enabled(context.Background(), slog.LevelDebug) {
		r.logAttrs(slog.LevelDebug, "broker: duplicate skipped", msg, fault{}, OutcomeDeduplicated)
	}
	return true
}

func (r *recorder) retrying(h *hand, msg *Message, t timing, delay time.Duration, f fault) {
	r.c.retries.Add(1)
	r.attempted(h, msg, t, f.code, true, OutcomeRetry, delay, f.err)
	if r.log.Enabled(context.Background(), slog.LevelDebug) {
		r.logAttrs(slog.LevelDebug, "broker: attempt failed, retrying", msg, f, OutcomeRetry,
			slog.Duration("delay", delay))
	}
}

// deadLetter puts msg into the store, then counts it; the dead letter is in
// the store before it is counted. attempted says that msg.Attempt just ran
// and has no event yet. It returns the store's error when the store refused
// the dead letter until the stop's deadline. counted, if not nil, runs as
// soon as the dead letter is stored and counted, before any event or log
// line.
func (r *recorder) deadLetter(msg *Message, t timing, reason string, f fault, attempted bool, counted func(), h *hand) error {
	code, retryable := f.code, f.retryable
	dl := DeadLetter{
		ID:         r.newID(),
		Message:    *msg,
		Subscriber: r.subscriber,
		Attempts:   msg.Attempt,
		ErrorCode:  code,
		Error:      f.text,
		Retryable:  retryable,
		Reason:     reason,
		FailedAt:   time.Now(),
	}
	storeErr := r.put(&dl, h)
	if storeErr != nil && r.keep && !errors.Is(storeErr, ErrDeadLetterRefused) {
		if r.log.Enabled(context.Background(), slog.LevelWarn) {
			r.log.LogAttrs(context.Background(), slog.LevelWarn, "broker: dead-letter store failed until the stop; the message stays with the transport",
				slog.String("topic", r.topic), slog.String("message_id", msg.ID), slog.String("subscriber", r.subscriber),
				slog.String("reason", reason), slog.String("store_error", storeErr.Error()))
		}
		return storeErr
	}
	if !h.end() {
		return storeErr
	}
	if storeErr != nil {
		r.c.dlErrors.Add(1)
	}
	r.c.deadLettered.Add(1)
	if counted != nil {
		counted()
	}
	r.onDeadLetter(reason, storeErr != nil)
	if attempted {
		r.attempted(h, msg, t, code, retryable, OutcomeDeadLettered, 0, f.err)
	}
	if r.obs != nil && h.enter() {
		r.obs.DeadLettered(DeadLetterEvent{DeadLetter: dl, StoreErr: storeErr})
		h.leave()
	}
	level := slog.LevelWarn
	if storeErr != nil {
		level = slog.LevelError // never folded into a summary
	}
	if r.log.Enabled(context.Background(), level) &&
		(storeErr != nil || r.limits.deadLetter.allow(logKey{topic: r.topic, subscriber: r.subscriber, reason: reason})) {
		attrs := []slog.Attr{slog.String("dead_letter_id", dl.ID), slog.String("reason", reason)}
		if storeErr != nil {
			// Given up at a stop's deadline: the log line is all that is
			// left of it, so it carries every field (the payload's size).
			attrs = append(attrs, slog.String("store_error", storeErr.Error()),
				slog.String("key", msg.Key), slog.Time("published_at", msg.PublishedAt),
				slog.Time("failed_at", dl.FailedAt), slog.Any("headers", msg.Headers),
				slog.Int("payload_bytes", len(msg.Payload)))
		}
		r.logAttrs(level, "broker: dead-lettered", msg, f, OutcomeDeadLettered, attrs...)
	}
	return storeErr
}

func (r *recorder) logAttrs(level slog.Level, text string, msg *Message, f fault, out Outcome, extra ...slog.Attr) {
	attrs := make([]slog.Attr, 0, 9+len(extra))
	attrs = append(attrs,
		slog.String("topic", r.topic),
		slog.String("message_id", msg.ID),
		slog.String("subscriber", r.subscriber),
		slog.Int("attempt", msg.Attempt),
		slog.String("error_code", f.code),
		slog.Bool("retryable", f.retryable),
		slog.String("final_state", string(out)),
	)
	if f.text != "" {
		attrs = append(attrs, slog.String("error", f.text))
	}
	attrs = append(attrs, extra...)
	r.log.LogAttrs(context.Background(), level, text, attrs...)
}
