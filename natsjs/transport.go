package natsjs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inproc/broker"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Transport is a broker.Transport over NATS JetStream: the broker runs its
// delivery engine (dedup, attempts, retry decisions, dead letters, Stats,
// Observer, logs) over messages that JetStream keeps, so they survive a
// restart of the process, and several processes subscribed under one name
// share the work.
//
// Each topic is a stream (DefaultStreamPrefix + "_" + topic, interest
// retention: a message stays until every subscriber has acknowledged or
// terminated it; DiscardNew at WithQueueSize messages) split into
// partitions by the messages' Key. Each subscriber is one durable pull
// consumer per partition, created delivering what is published from then
// on, with explicit acks, at most one unacknowledged message (so a Key is
// handled in order across every process, a retry holding its partition),
// and no delivery limit on the server: the broker counts attempts from the
// server's delivery count and dead-letters past its retry policy.
//
// A Transport serves one broker (see New and Open); it is safe for
// concurrent use. Close releases what it runs in the process; the streams
// and consumers stay on the server, durable.
type Transport struct {
	js      jetstream.JetStream
	cfg     transportConfig
	own     *Conn     // closed by Close (Open's embedded server); nil: the caller's
	started time.Time // messages stored before it may have run before a crash

	mu     sync.Mutex                 // guards the fields below
	topics map[string]*topicState     // by topic name
	subs   map[*subscription]struct{} // not yet stopped
	closed bool

	closeOnce sync.Once
	closeErr  error
}

var _ broker.Transport = (*Transport)(nil)

// errClosed is what a closed Transport answers.
var errClosed = fmt.Errorf("natsjs: transport closed: %w", broker.ErrClosed)

// NewTransport returns a Transport over js with the options given. It
// creates nothing on the server yet: a topic's stream is created (or
// found) when the transport first publishes or subscribes to the topic.
func NewTransport(js jetstream.JetStream, opts ...TransportOption) (*Transport, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: NewTransport: nil JetStream", ErrInvalidOption)
	}
	cfg, err := newTransportConfig(opts)
	if err != nil {
		return nil, err
	}
	return &Transport{
		js: js, cfg: cfg, started: time.Now(),
		topics: make(map[string]*topicState), subs: make(map[*subscription]struct{}),
	}, nil
}

// Stream metadata keys the transport writes, for operators and for other
// processes joining the topic.
const (
	metaTopic      = "inproc.broker.topic"
	metaPartitions = "inproc.broker.partitions"
	metaSubscriber = "inproc.broker.subscriber"
	metaOrdered    = "inproc.broker.ordered" // on a keyless messages' consumer: "true" or "false"
)

// topicState is what the transport knows of a topic's stream.
type topicState struct {
	topic   string
	stream  string
	subject string // subject prefix + "." + topic token

	mu    sync.Mutex // held while looking the stream up or creating it
	ready atomic.Bool
	parts int // set once, before ready; never changed after
}

// msgSubject is the subject of partition p's messages.
func (ts *topicState) msgSubject(p int) string { return ts.subject + ".m." + strconv.Itoa(p) }

// keylessSubject is the subject of the messages without a Key: they are
// not ordered by partition, so one consumer per subscriber hands them out
// many at a time.
func (ts *topicState) keylessSubject() string { return ts.subject + ".u" }

// keylessRedriveSubject is the subject of keyless messages redriven to
// subscriber name: its keyless messages' consumer takes them.
func (ts *topicState) keylessRedriveSubject(name string) string {
	return ts.subject + ".r." + nameToken(name) + ".u"
}

// redriveSubject is the subject of messages redriven to subscriber name
// in partition p.
func (ts *topicState) redriveSubject(name string, p int) string {
	return ts.subject + ".r." + nameToken(name) + "." + strconv.Itoa(p)
}

// durableName is the consumer of subscriber name for partition p.
func durableName(name string, p int) string { return nameToken(name) + "_" + strconv.Itoa(p) }

// keylessName is the consumer of subscriber name for keyless messages.
func keylessName(name string) string { return nameToken(name) + "_u" }

// consumerNames are subscriber name's consumers on a topic of parts
// partitions: one per partition, then the keyless messages'.
func consumerNames(name string, parts int) []string {
	names := make([]string, parts, parts+1)
	for p := range names {
		names[p] = durableName(name, p)
	}
	return append(names, keylessName(name))
}

// StreamName returns the name of the stream the transport uses for topic.
func (t *Transport) StreamName(topic string) string {
	return t.cfg.streamPrefix + "_" + nameToken(topic)
}

// ConsumerNames returns the names of the durable consumers of subscriber
// name on topic, when the topic's stream exists: one per partition (index
// Partition(key, id, partitions)), then the one of keyless messages.
func (t *Transport) ConsumerNames(ctx context.Context, topic, name string) ([]string, error) {
	ts, err := t.topic(ctx, topic, false)
	if err != nil {
		return nil, err
	}
	return consumerNames(name, ts.parts), nil
}

// ConsumerInfo returns the server's view of subscriber name on topic, one
// jetstream.ConsumerInfo per consumer, in the order of ConsumerNames:
// NumPending (published, not yet
// delivered), NumAckPending (delivered and not acknowledged: running, or
// waiting out a retry's delay), NumRedelivered, NumWaiting (pull requests).
// Those are the subscriber's backlog across every process; the broker's
// Stats count what this process did.
func (t *Transport) ConsumerInfo(ctx context.Context, topic, name string) ([]*jetstream.ConsumerInfo, error) {
	ts, err := t.topic(ctx, topic, false)
	if err != nil {
		return nil, err
	}
	names := consumerNames(name, ts.parts)
	infos := make([]*jetstream.ConsumerInfo, len(names))
	for i, cn := range names {
		c, err := t.js.Consumer(ctx, ts.stream, cn)
		if err != nil {
			return nil, fmt.Errorf("natsjs: consumer %s of %q on %q: %w", cn, name, topic, err)
		}
		infos[i] = c.CachedInfo()
	}
	return infos, nil
}

// RemoveSubscriber deletes the durable consumers of subscriber name on
// topic, so that the stream stops keeping messages for it. Unsubscribe
// does not: it only stops this process's share of the work. A process
// still subscribed under the name creates them again (delivering from
// then on). Unknown names are not an error.
func (t *Transport) RemoveSubscriber(ctx context.Context, topic, name string) error {
	ts, err := t.topic(ctx, topic, false)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, cn := range consumerNames(name, ts.parts) {
		err := t.js.DeleteConsumer(ctx, ts.stream, cn)
		if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("natsjs: remove subscriber %q of %q: %w", name, topic, err)
		}
	}
	return nil
}

// topic returns the state of topic's stream, looking it up (and, with
// create, creating it) the first time.
func (t *Transport) topic(ctx context.Context, topic string, create bool) (*topicState, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, errClosed
	}
	ts := t.topics[topic]
	if ts == nil {
		tok := nameToken(topic)
		ts = &topicState{topic: topic, stream: t.cfg.streamPrefix + "_" + tok, subject: t.cfg.subjectPrefix + "." + tok}
		t.topics[topic] = ts
	}
	t.mu.Unlock()
	if ts.ready.Load() {
		return ts, nil
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.ready.Load() {
		return ts, nil
	}
	parts, err := t.openStream(ctx, ts, create)
	if err != nil {
		return nil, err
	}
	ts.parts = parts
	ts.ready.Store(true)
	return ts, nil
}

// forget makes the next use of ts's topic look its stream up again (it
// was deleted, say), in a new topicState: ts itself is not changed, as
// Publish calls and subscriptions still holding it read its parts without
// a lock.
func (t *Transport) forget(ts *topicState) {
	t.mu.Lock()
	if t.topics[ts.topic] == ts {
		delete(t.topics, ts.topic)
	}
	t.mu.Unlock()
}

// openStream creates ts's stream, or finds it and checks that it is one of
// ours with a partition count this transport can use, updating its queue
// size and dedup window to the options; it returns the partition count.
func (t *Transport) openStream(ctx context.Context, ts *topicState, create bool) (int, error) {
	if create {
		cfg := jetstream.StreamConfig{
			Name:        ts.stream,
			Description: "inproc broker topic (github.com/inproc/broker/natsjs)",
			Subjects:    []string{ts.subject + ".>"},
			Retention:   jetstream.InterestPolicy,
			Discard:     jetstream.DiscardNew,
			MaxMsgs:     t.cfg.queueSize,
			Storage:     t.cfg.storage,
			Replicas:    t.cfg.replicas,
			Duplicates:  t.cfg.dedupWindow, // 0: the server's default; no message carries an ID then
			Metadata:    map[string]string{metaTopic: ts.topic, metaPartitions: strconv.Itoa(t.cfg.partitions)},
		}
		_, err := t.js.CreateStream(ctx, cfg)
		if err == nil {
			return t.cfg.partitions, nil
		}
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return 0, fmt.Errorf("natsjs: create stream %s for topic %q: %w", ts.stream, ts.topic, err)
		}
	}
	s, err := t.js.Stream(ctx, ts.stream)
	if err != nil {
		return 0, fmt.Errorf("natsjs: stream %s of topic %q: %w", ts.stream, ts.topic, err)
	}
	info := s.CachedInfo()
	parts, err := strconv.Atoi(info.Config.Metadata[metaPartitions])
	if err != nil || parts < 1 || parts > MaxPartitions {
		return 0, fmt.Errorf("%w: stream %s of topic %q has no valid %s metadata (%q): not a natsjs topic stream",
			ErrInvalidOption, ts.stream, ts.topic, metaPartitions, info.Config.Metadata[metaPartitions])
	}
	if t.cfg.partitionsSet && parts != t.cfg.partitions {
		return 0, fmt.Errorf("%w: topic %q has %d partitions (stream %s), WithPartitions(%d) cannot change that",
			ErrInvalidOption, ts.topic, parts, ts.stream, t.cfg.partitions)
	}
	cfg := info.Config
	if cfg.MaxMsgs != t.cfg.queueSize || (t.cfg.dedupWindow > 0 && cfg.Duplicates != t.cfg.dedupWindow) {
		cfg.MaxMsgs = t.cfg.queueSize
		if t.cfg.dedupWindow > 0 {
			cfg.Duplicates = t.cfg.dedupWindow
		}
		if _, err := t.js.UpdateStream(ctx, cfg); err != nil {
			return 0, fmt.Errorf("natsjs: update stream %s of topic %q: %w", ts.stream, ts.topic, err)
		}
	}
	return parts, nil
}

// Publish stores msg in its topic's stream, in the partition of its Key
// (on the keyless messages' subject when it has none), and returns once
// the server has it.
//
// An error other than a full stream does not mean the message was not
// stored: during an outage or a reconnection the server may have stored
// it and its acknowledgement been lost (or the deadline passed first), and
// it is then delivered. Publishing it again with the same ID is safe: the
// server drops a copy of an ID stored within the dedup window
// (WithPublishDedupWindow, 2 min by default), and later than that the
// subscribers' idempotency store skips a copy of an ID they delivered. A full
// stream is tried again until ctx ends (the broker sets ctx's deadline to
// its publish timeout; without a deadline, once), then Publish returns an
// error wrapping broker.ErrQueueFull. A copy of an ID published within the
// dedup window (WithPublishDedupWindow) is accepted and dropped by the
// server.
func (t *Transport) Publish(ctx context.Context, msg broker.Message) error {
	ts, err := t.topic(ctx, msg.Topic, true)
	if err != nil {
		return err
	}
	until, _ := ctx.Deadline() // the broker's publish timeout
	return t.publish(ctx, ts, ts.newMsg(&msg), msg.ID, until)
}

// newMsg is msg as stored in ts's stream: on its partition's subject with
// a Key, on the keyless messages' without.
func (ts *topicState) newMsg(msg *broker.Message) *nats.Msg {
	subject := ts.keylessSubject()
	if msg.Key != "" {
		subject = ts.msgSubject(Partition(msg.Key, msg.ID, ts.parts))
	}
	return &nats.Msg{Subject: subject, Header: encodeHeader(msg), Data: msg.Payload}
}

// stamp sets the headers JetStream reads from a message with ID id
// published to ts: the expected stream, and the ID for the server's dedup
// window when it is on. (Headers rather than jetstream.PublishOpts, which
// set the same ones: five allocations fewer per message.)
func (t *Transport) stamp(ts *topicState, m *nats.Msg, id string) {
	if m.Header == nil {
		m.Header = make(nats.Header, 2)
	}
	m.Header[jetstream.ExpectedStreamHeader] = []string{ts.stream}
	if t.cfg.dedupWindow > 0 {
		m.Header[jetstream.MsgIDHeader] = []string{headerValue(id)}
	}
}

// Redrive publishes a copy of dl.Message to the redrive subject of
// dl.Subscriber (in the partition of its Key; to its keyless messages'
// consumer without one), marked redriven, for the
// subscriber's consumer only. The consumer must exist (a process has
// subscribed under the name and it was not removed), else the error wraps
// broker.ErrSubscriberNotFound; no process needs to be subscribed now.
func (t *Transport) Redrive(ctx context.Context, dl broker.DeadLetter) error {
	msg := dl.Message
	ts, err := t.topic(ctx, msg.Topic, false)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("%w: natsjs: topic %q has no stream", broker.ErrSubscriberNotFound, msg.Topic)
	}
	if err != nil {
		return err
	}
	consumer, subject := keylessName(dl.Subscriber), ts.keylessRedriveSubject(dl.Subscriber)
	if msg.Key != "" {
		p := Partition(msg.Key, msg.ID, ts.parts)
		consumer, subject = durableName(dl.Subscriber, p), ts.redriveSubject(dl.Subscriber, p)
	}
	if _, err := t.js.Consumer(ctx, ts.stream, consumer); err != nil {
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("%w: natsjs: %q on topic %q has no consumer", broker.ErrSubscriberNotFound, dl.Subscriber, msg.Topic)
		}
		return fmt.Errorf("natsjs: redrive %q: %w", dl.ID, err)
	}
	h := encodeHeader(&msg)
	h.Set(hdrRedrive, headerValue(dl.ID))
	m := &nats.Msg{Subject: subject, Header: h, Data: msg.Payload}
	// The copy has an ID of its own: redriving one dead letter twice
	// within the window stores it once.
	until, _ := ctx.Deadline()
	return t.publish(ctx, ts, m, "redrive "+dl.ID, until)
}

// Retry pacing of a Publish that finds its stream full.
const (
	fullRetryFirst = 2 * time.Millisecond
	fullRetryMax   = 100 * time.Millisecond
)

// publish stores m, with id as its Nats-Msg-Id when publish-side dedup is
// on, trying a full stream again until until (once when it is zero or
// past) or until ctx ends; then the error wraps broker.ErrQueueFull.
func (t *Transport) publish(ctx context.Context, ts *topicState, m *nats.Msg, id string, until time.Time) error {
	t.stamp(ts, m, id)
	wait := fullRetryFirst
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	var full error // the last full-stream refusal
	for {
		_, err := t.js.PublishMsg(ctx, m)
		if err == nil {
			return nil
		}
		if full != nil && ctx.Err() != nil { // the deadline came while trying again
			return fmt.Errorf("%w: natsjs: stream %s of topic %q is full: %v", broker.ErrQueueFull, ts.stream, ts.topic, full)
		}
		if !streamFull(err) {
			// Deleted, or lost with a memory stream in a server restart?
			// The next Publish looks it up, and creates it again. (Not only
			// on ErrNoStreamResponse: the client tries a publish without
			// responders again for 500 ms, the default publish timeout,
			// so a publish to a deleted stream usually ends with ctx.)
			t.forget(ts)
			return fmt.Errorf("natsjs: publish to stream %s: %w", ts.stream, err)
		}
		full = err
		left := time.Until(until)
		if until.IsZero() || left <= 0 {
			return fmt.Errorf("%w: natsjs: stream %s of topic %q is full: %v", broker.ErrQueueFull, ts.stream, ts.topic, err)
		}
		d := min(wait, left)
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-timer.C:
		case <-ctx.Done():
			return fmt.Errorf("%w: natsjs: stream %s of topic %q is full: %v", broker.ErrQueueFull, ts.stream, ts.topic, err)
		}
		wait = min(2*wait, fullRetryMax)
	}
}

// errCodeStreamStoreFailed is the server's JSStreamStoreFailedF: a stream
// could not store a message (the description says why).
const errCodeStreamStoreFailed jetstream.ErrorCode = 10077

// streamFull reports whether err is a stream refusing a message because it
// holds its limit of messages or bytes (DiscardNew).
func streamFull(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != errCodeStreamStoreFailed {
		return false
	}
	d := strings.ToLower(apiErr.Description)
	return strings.Contains(d, "maximum messages") || strings.Contains(d, "maximum bytes")
}

// Partition returns the partition of a message with the given Key in a
// topic of n partitions: FNV-1a (32 bits) of the Key, modulo n. Its
// consumer for subscriber s is ConsumerNames(ctx, topic, s)[Partition(key,
// id, n)]. A keyless message goes to no partition (published or redriven,
// it has subjects of its own, and its consumer is the last of
// ConsumerNames); for it Partition hashes the ID, which no consumer looks
// up. Every process must compute the same, so this never changes.
func Partition(key, id string, n int) int {
	if n <= 1 {
		return 0
	}
	s := key
	if s == "" {
		s = id
	}
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return int(h % uint32(n))
}

// Close stops every subscription still running (see the subscriptions'
// Stop) and, for a Transport made by Open, closes the connection and the
// embedded server. Streams and consumers stay on the server. Calling Close
// again returns the first call's result.
func (t *Transport) Close(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background()
	}
	t.closeOnce.Do(func() { t.closeErr = t.close(ctx) })
	return t.closeErr
}

func (t *Transport) close(ctx context.Context) error {
	t.mu.Lock()
	t.closed = true
	subs := make([]*subscription, 0, len(t.subs))
	for s := range t.subs {
		subs = append(subs, s)
	}
	t.mu.Unlock()
	var errs []error
	for _, s := range subs {
		errs = append(errs, s.Stop(ctx))
	}
	if t.own != nil {
		// The last acknowledgements are on their way: the drain flushes
		// them, and gets at least ownDrainGrace for it even when ctx has
		// ended (else a message handed back at the deadline would wait
		// out its AckWait after a restart).
		dctx := ctx
		if d, ok := ctx.Deadline(); ctx.Err() != nil || (ok && time.Until(d) < ownDrainGrace) {
			var cancel context.CancelFunc
			dctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), ownDrainGrace)
			defer cancel()
		}
		errs = append(errs, t.own.Close(dctx))
	}
	return errors.Join(errs...)
}

// ownDrainGrace is the least time Close gives the drain of a connection it
// owns.
const ownDrainGrace = broker.ShutdownGrace
