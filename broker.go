package broker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inproc/broker/internal/queue"
)

// Broker is an in-process message broker. Create one with New, publish with
// Publish, register handlers with Subscribe, and end it with Close. All
// methods are safe for concurrent use.
type Broker struct {
	cfg config
	mem *MemoryIdempotencyStore // cfg.dedup when it is the default kind, for its hashed fast path

	mu     sync.Mutex  // serialises topic creation and retirement, Subscribe and the start of Close
	topics sync.Map    // name → *topic, the live topics (created and retired under mu)
	gone   *goneTopics // counters of retired topics, bounded
	// statsMu makes a topic's retirement (from live to gone) one step for
	// Stats, which hold it for reading.
	statsMu sync.RWMutex
	closed  atomic.Bool // set under mu by Close

	epoch    time.Time               // New's time: PublishedAt minus it is a monotonic time for the topic queues
	abortCtx context.Context         // parent of every subscription's context
	abort    context.CancelCauseFunc // cancels it with errShutdown
	wg       sync.WaitGroup          // dispatchers, each deferring its Done (workers and cutters: Subscription.finish)

	dlq   guardedDLQ       // cfg.dlq, guarded against panics
	dedup IdempotencyStore // cfg.dedup, guarded against panics (unless it is the default kind)
	obs   Observer         // cfg.obs, guarded against panics; nil: none
	timed bool             // an Observer is a PublishTimer: events carry the publish's Duration
	guard guard            // guard.panics counts the recovered panics of plugged-in code (the logger's included)

	closeDone chan struct{} // closed when the first Close returned
	closeErr  error         // the first Close's result, set before closeDone is closed

	remote *remote // the transport's side, when one was given (WithTransport); nil: in-memory

	dlPrefix string        // makes dead-letter IDs unique across brokers and restarts
	dlSeq    atomic.Uint64 // dead-letter sequence
	redrive  chan struct{} // holds a token while a Redrive runs, so a dead letter is redriven once

	logs *logLimits // what could flood the log, rate-limited
}

// New returns a running broker configured by opts. It fails with an error
// wrapping ErrInvalidOption when an option is given a bad value.
func New(opts ...Option) (*Broker, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, err // "broker: invalid option: …"
		}
	}
	panics := new(atomic.Uint64)
	cfg.logger = slog.New(guardedLogHandler{h: cfg.logger.Handler(), panics: panics})
	if cfg.dlq == nil {
		cfg.dlq = NewMemoryDeadLetterStore(DefaultDeadLetterCapacity, cfg.logger)
	}
	cfg.policy = cfg.policy.over(DefaultRetryPolicy()) // rules resolved per subscriber (normalized)
	b := &Broker{
		cfg:       cfg,
		closeDone: make(chan struct{}),
		redrive:   make(chan struct{}, 1),
		dlPrefix:  newDeadLetterPrefix(time.Now()),
		epoch:     time.Now(),
		gone:      newGoneTopics(),
	}
	b.mem, _ = cfg.dedup.(*MemoryIdempotencyStore)
	var window time.Duration
	if b.mem != nil {
		window = b.mem.window
	}
	b.logs = newLogLimits(cfg.logger, window)
	b.guard = guard{panics: panics, log: cfg.logger}
	b.dlq = guardedDLQ{s: cfg.dlq, g: b.guard}
	if cfg.dedup != nil && b.mem == nil {
		b.dedup = guardedDedup{s: cfg.dedup, g: b.guard}
	} else if b.mem != nil {
		b.dedup = b.mem
	}
	for _, o := range cfg.obs {
		if pt, ok := o.(PublishTimer); ok && b.guard.timesPublish(pt) {
			b.timed = true
		}
	}
	if len(cfg.obs) > 0 {
		b.obs = observers{list: cfg.obs, g: b.guard}
	}
	b.abortCtx, b.abort = context.WithCancelCause(context.Background())
	if cfg.transport != nil {
		b.remote = newRemote(cfg.transport)
	}
	return b, nil
}

// Publish validates msg, stamps PublishedAt and puts it into its topic's
// queue; it returns once the message is queued ("published" never means
// "handled"), and runs no handler.
//
// It returns an error wrapping ErrInvalidMessage for a message without ID or
// Topic, ErrClosed after Close, and, when the queue stays full for the
// publish timeout, an error wrapping ErrQueueFull (at once with a timeout of
// 0). If ctx ends while Publish waits for room, it returns an error wrapping
// ctx's error. A nil ctx counts as context.Background().
func (b *Broker) Publish(ctx context.Context, msg Message) error {
	msg, err := b.prepare(ctx, msg)
	if err != nil {
		return err
	}
	if b.remote != nil {
		if b.closed.Load() {
			return ErrClosed
		}
		return b.publishRemote(ctx, msg)
	}
	env := envelope{msg: msg}
	if b.mem != nil {
		env.idh = b.mem.hashID(msg.ID) // once here rather than once per subscriber
	}
	var t *topic
	var idle bool
	for {
		if t, err = b.topic(msg.Topic); err != nil {
			return err
		}
		idle, err = t.q.TryPush(env, int64(msg.PublishedAt.Sub(b.epoch)))
		if err == queue.ErrFull && b.cfg.publishTimeout > 0 {
			err = pushWait(t.q, env, ctx, b.cfg.publishTimeout)
		}
		if err != queue.ErrClosed || b.closed.Load() {
			break
		}
		// The topic retired meanwhile (its queue closed): a new one takes it.
	}
	switch err {
	case nil:
		if idle {
			t.routeIdle()
		}
		if b.obs != nil {
			b.obs.Published(PublishEvent{Topic: msg.Topic, MessageID: msg.ID, PublishedAt: msg.PublishedAt, Duration: b.publishTime(&msg)})
		}
		return nil
	case queue.ErrClosed:
		return ErrClosed
	}
	if err == queue.ErrStopped {
		err = fmt.Errorf("broker: publish %q to %q: %w", msg.ID, msg.Topic, ctx.Err())
	} else {
		err = fmt.Errorf("%w: publish %q to %q: topic queue of %d stayed full for %v%s",
			ErrQueueFull, msg.ID, msg.Topic, t.q.Cap(), b.cfg.publishTimeout, t.holder())
	}
	t.tally.rejected.Add(1)
	if b.obs != nil {
		b.obs.Rejected(RejectEvent{Topic: msg.Topic, MessageID: msg.ID, Err: err, Duration: b.publishTime(&msg)})
	}
	if b.cfg.logger.Enabled(context.Background(), slog.LevelDebug) {
		b.cfg.logger.LogAttrs(context.Background(), slog.LevelDebug, "broker: publish rejected",
			slog.String("topic", msg.Topic), slog.String("message_id", msg.ID), slog.String("error", err.Error()))
	}
	return err
}

// publishTime is how long msg's Publish took since PublishedAt was
// stamped; 0 without a PublishTimer, so that no other Observer costs a
// clock read per publish.
func (b *Broker) publishTime(msg *Message) time.Duration {
	if !b.timed {
		return 0
	}
	return time.Since(msg.PublishedAt)
}

// prepare makes msg ready to publish: validated, through the publish
// hooks, Attempt cleared and PublishedAt set. It takes and returns the
// message by value: handing Publish's message to a call by pointer made it
// escape to the heap (Publish 27–30% slower, bench/ab.sh).
func (b *Broker) prepare(ctx context.Context, msg Message) (Message, error) {
	if err := msg.validate(); err != nil {
		return msg, err
	}
	if len(b.cfg.publishHooks) > 0 {
		var err error
		if msg, err = b.hooked(ctx, msg); err != nil {
			return msg, err
		}
	}
	msg.Attempt = 0
	msg.PublishedAt = time.Now()
	return msg, nil
}

// pushWait waits for room in q for at most timeout, or until ctx ends.
func pushWait[T any](q *queue.Queue[T], v T, ctx context.Context, timeout time.Duration) error {
	var cancel <-chan struct{}
	if ctx != nil {
		cancel = ctx.Done()
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	return q.PushWait(v, cancel, nil, timer.C)
}

// DeadLetters returns the dead-letter store, to list, inspect and delete
// dead letters. Use Redrive to send them back.
func (b *Broker) DeadLetters() DeadLetterStore { return b.cfg.dlq }

// Redrive sends each dead letter back to the one subscriber that failed it,
// starting again at attempt 1 under that subscriber's current policy and
// bypassing deduplication (a dead letter was never delivered there). A dead
// letter leaves the store once its message is accepted into the
// subscriber's lane, waiting for room as Publish does.
//
// It returns how many were accepted, and the joined errors of the rest: an
// unknown ID wraps ErrDeadLetterNotFound, a subscriber no longer subscribed
// wraps ErrSubscriberNotFound, a lane that stayed full wraps ErrQueueFull,
// and after Close every ID fails with ErrClosed.
func (b *Broker) Redrive(ctx context.Context, ids ...string) (int, error) {
	ctx, err := b.takeRedrive(ctx, "redrive")
	if err != nil {
		return 0, err
	}
	defer func() { <-b.redrive }()
	n, errs := 0, make([]error, len(ids))
	for i, id := range ids {
		if errs[i] = b.redriveOne(ctx, id); errs[i] == nil {
			n++
		}
	}
	return n, errors.Join(errs...)
}

// takeRedrive takes the redrive token: one Redrive or RedriveMatching at
// a time, so a dead letter is redriven once; Close waits for the running
// one. The caller gives it back with <-b.redrive. It returns ctx, or
// context.Background() for a nil ctx.
func (b *Broker) takeRedrive(ctx context.Context, op string) (context.Context, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	select {
	case b.redrive <- struct{}{}:
		return ctx, nil
	case <-b.closeDone:
		return ctx, fmt.Errorf("%w: %s", ErrClosed, op)
	case <-ctx.Done():
		return ctx, fmt.Errorf("broker: %s: %w", op, ctx.Err())
	}
}

// redriveStopped is why a redrive (op) stops now: its ctx ended, or the
// broker closed; nil while neither.
func (b *Broker) redriveStopped(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("broker: %s: %w", op, err)
	}
	if b.closed.Load() {
		return fmt.Errorf("%w: %s", ErrClosed, op)
	}
	return nil
}

// redriveErrorsShown is how many of RedriveMatching's failures its error
// joins; the rest are counted in its last line.
const redriveErrorsShown = 10

// RedriveMatching redrives, as Redrive does, every dead letter that
// matches f (Topic, Subscriber, ErrorCode and Reason, each an exact match
// when set), oldest first, at most f.Limit of them when f.Limit > 0.
//
// It redrives a snapshot: the dead letters that match when it is called.
// A dead letter put while it runs (a subscriber still failing what is
// redriven to it) waits for the next call, so RedriveMatching always
// ends. A dead letter of the snapshot that is gone by its turn (deleted,
// or redriven by a Redrive in between) is skipped. When ctx ends, or the
// broker closes, it stops, and the dead letters not yet redriven stay in
// the store.
//
// It returns how many were accepted, and one error for the rest: the
// first few failures joined (each as Redrive reports it, so errors.Is
// finds ErrQueueFull, ErrSubscriberNotFound and the like), then a line
// counting all of them; and ctx's error, or ErrClosed, if it stopped
// early. A malformed filter (a negative Limit) wraps ErrInvalidOption.
func (b *Broker) RedriveMatching(ctx context.Context, f DeadLetterFilter) (int, error) {
	if err := f.Validate(); err != nil {
		return 0, err
	}
	ctx, err := b.takeRedrive(ctx, "redrive matching")
	if err != nil {
		return 0, err
	}
	defer func() { <-b.redrive }()
	list, err := b.dlq.List(ctx, f)
	if err != nil {
		return 0, fmt.Errorf("broker: redrive matching %+v: list: %w", f, err)
	}
	var shown []error
	n, failed := 0, 0
	for i, dl := range list {
		if f.Limit > 0 && i == f.Limit {
			break // a store that ignores Limit
		}
		if !f.Match(dl) {
			continue // a store that ignores a field of the filter
		}
		if stop := b.redriveStopped(ctx, "redrive matching"); stop != nil {
			shown = append(shown, fmt.Errorf("%w (%d of %d not tried)", stop, len(list)-i, len(list)))
			break
		}
		switch err := b.redriveOne(ctx, dl.ID); {
		case err == nil:
			n++
		case errors.Is(err, ErrDeadLetterNotFound):
			// gone since the List: dealt with elsewhere
		default:
			failed++
			if failed <= redriveErrorsShown {
				shown = append(shown, err)
			}
		}
	}
	if failed > 0 {
		shown = append(shown, fmt.Errorf("broker: redrive matching: %d of %d dead letters failed", failed, len(list)))
	}
	return n, errors.Join(shown...)
}

// redriveOne redrives dead letter id and, once its message is accepted,
// deletes it from the store.
func (b *Broker) redriveOne(ctx context.Context, id string) error {
	op := fmt.Sprintf("redrive %q", id)
	if b.closed.Load() {
		return fmt.Errorf("%w: %s", ErrClosed, op)
	}
	dl, ok, err := b.dlq.Get(ctx, id)
	if err != nil {
		return fmt.Errorf("broker: %s: get: %w", op, err)
	}
	if !ok {
		return fmt.Errorf("%w: %q", ErrDeadLetterNotFound, id)
	}
	if err := b.redriveTo(ctx, op, dl); err != nil {
		return err
	}
	if err := b.dlq.Delete(context.WithoutCancel(ctx), id); err != nil {
		b.cfg.logger.LogAttrs(ctx, slog.LevelError, "broker: redriven dead letter not deleted; it may be redriven twice",
			slog.String("dead_letter_id", id), slog.String("error", err.Error()))
	}
	return nil
}

// redriveTo hands dl's message to its subscriber's lane (or to the
// transport), as redrive op.
func (b *Broker) redriveTo(ctx context.Context, op string, dl DeadLetter) error {
	if b.remote != nil {
		rctx, cancel := b.publishCtx(ctx)
		defer cancel()
		if err := b.guard.call("Transport", "Redrive", func() error { return b.remote.t.Redrive(rctx, dl) }); err != nil {
			return fmt.Errorf("broker: %s: %w", op, err)
		}
		return nil
	}
	gone := func(why string) error {
		return fmt.Errorf("%w: %s: %q on topic %q%s", ErrSubscriberNotFound, op, dl.Subscriber, dl.Message.Topic, why)
	}
	s := b.subscription(dl.Message.Topic, dl.Subscriber)
	if s == nil {
		return gone("")
	}
	timer := time.NewTimer(b.cfg.publishTimeout)
	defer timer.Stop()
	switch err := s.routeRedriven(dl.Message, ctx.Done(), timer.C); err {
	case nil:
		return nil
	case queue.ErrClosed:
		if b.closed.Load() {
			return fmt.Errorf("%w: %s", ErrClosed, op)
		}
		return gone(" is unsubscribing")
	case queue.ErrStopped:
		if err := b.redriveStopped(ctx, op); err != nil {
			return err
		}
		return gone(" stopped while Redrive waited for room in its lane")
	default:
		return fmt.Errorf("%w: %s: lane of %q on topic %q stayed full", ErrQueueFull, op, dl.Subscriber, dl.Message.Topic)
	}
}

// subscription returns the active subscriber name on topicName, or nil.
func (b *Broker) subscription(topicName, name string) *Subscription {
	v, ok := b.topics.Load(topicName)
	if !ok {
		return nil
	}
	t := v.(*topic)
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.active[name]
}

// newDeadLetterPrefix returns the prefix of a broker's dead-letter IDs:
// its start time (milliseconds, base 36) and 64 random bits. IDs are then
// unique across brokers and restarts (a persistent store never sees an ID
// reused: two brokers would have to start in the same millisecond and draw
// the same 64 bits), and those of one broker sort by creation within their
// length.
func newDeadLetterPrefix(now time.Time) string {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:]) // crypto/rand.Read never fails (Go 1.24+)
	return "dl-" + strconv.FormatInt(now.UnixMilli(), 36) + "-" + hex.EncodeToString(rnd[:]) + "-"
}

func (b *Broker) newDeadLetterID() string {
	var buf [64]byte
	id := append(buf[:0], b.dlPrefix...)
	return string(strconv.AppendUint(id, b.dlSeq.Add(1), 10)) // one allocation
}

// How: Stats takes no broker-wide lock: each queue's lock briefly, one at
// a time (as a push or a take does), and each topic's subscriber list lock.

// Stats returns a snapshot of every topic's and subscriber's counters and
// queues. It takes no broker-wide lock, so it is cheap enough for every
// metrics scrape and does not wait for a busy or stuck subscriber.
func (b *Broker) Stats() Stats {
	now := time.Now()
	evicted := b.dlq.evicted() // plugged-in code: outside statsMu, which topic creation needs
	b.statsMu.RLock()
	defer b.statsMu.RUnlock()
	topics := b.liveTopics()
	st := Stats{Topics: make(map[string]TopicStats, len(topics))}
	b.gone.stats(&st)
	st.DeadLetterEvicted = evicted
	st.PluginPanics = b.guard.panics.Load()
	if b.mem != nil {
		st.Dedup = b.mem.Stats()
	}
	for _, t := range topics {
		st.Topics[t.name] = t.stats(now)
	}
	if b.remote != nil {
		b.statsRemote(&st)
	}
	return st
}
