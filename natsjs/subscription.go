package natsjs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inproc/broker"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// subscription is one subscriber's share of the work in this process: a
// pull loop per partition of the topic, each on the partition's durable
// consumer, and one on the consumer of keyless messages, handing each
// message to the broker (sub.Deliver), at most sub.Concurrency at once over
// the loops. A partition's loop delivers one message at a time (its
// consumer has one in flight, for key order); the keyless loop pulls many
// at a time and, with Concurrency above 1, delivers them on goroutines of
// their own.
type subscription struct {
	t     *Transport
	ts    *topicState
	sub   broker.TransportSubscriber
	slots chan struct{} // a slot per running Deliver
	loops []*partitionLoop

	stopping chan struct{} // closed by Stop
	stopOnce sync.Once
	wg       sync.WaitGroup // the pull loops
	running  sync.WaitGroup // Deliver calls on goroutines of their own (the keyless loop's)
	done     chan struct{}  // closed when every loop and Deliver call has returned
}

// Keyless messages: their consumer lets keylessAckPending be delivered and
// not yet acknowledged, across every process (an Ordered subscriber's,
// one). A process queues at most keylessBatch, and no more than its
// handlers start within keylessQueueFor at the average time they take
// (keylessAhead per handler until that is known). The queue is what a
// Close or Unsubscribe whose deadline passes hands back unstarted, each
// with an attempt number used up (the server counted the delivery): kept
// to about a second of work, a stop's drain finishes it. A fixed 8 per
// handler instead cost W1's deliver half 35% (BenchmarkPhases: 24–27 µs
// against 17–20 µs with 64).
const (
	keylessAckPending = 1000
	keylessAhead      = 8
	keylessBatch      = 64
	keylessQueueFor   = time.Second
)

// Subscribe creates (or updates) the subscriber's durable consumers, one
// for each of the topic's partitions and one for its keyless messages,
// delivering what is published from now on, or resuming from where the
// consumer is when it exists (another process subscribed under the name
// shares it), and starts pulling. With Ordered, the keyless messages'
// consumer has one message in flight (strict FIFO through retries): every
// process subscribed under the name must agree on it, and a Subscribe that
// does not is refused (broker.ErrInvalidOption) while the consumer exists.
func (t *Transport) Subscribe(sub broker.TransportSubscriber) (broker.TransportSubscription, error) {
	if sub.Deliver == nil || sub.Concurrency < 1 {
		return nil, fmt.Errorf("%w: natsjs: subscribe %q to %q: no Deliver or Concurrency < 1", broker.ErrInvalidOption, sub.Name, sub.Topic)
	}
	ctx := context.Background() // each call is bounded by the JetStream API's default timeout
	ts, err := t.topic(ctx, sub.Topic, true)
	if err != nil {
		return nil, err
	}
	s := &subscription{t: t, ts: ts, sub: sub, stopping: make(chan struct{}), done: make(chan struct{}),
		slots: make(chan struct{}, sub.Concurrency)}
	for p := range ts.parts + 1 { // the partitions, then the keyless messages
		l, err := s.newLoop(ctx, p)
		if err != nil {
			for _, l := range s.loops {
				l.close()
			}
			return nil, err
		}
		s.loops = append(s.loops, l)
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		for _, l := range s.loops {
			l.close()
		}
		return nil, errClosed
	}
	t.subs[s] = struct{}{}
	t.mu.Unlock()
	s.wg.Add(len(s.loops))
	for _, l := range s.loops {
		go l.run()
	}
	return s, nil
}

// consumerConfig is the configuration of the durable consumer of
// partition p, or of keyless messages for p == ts.parts.
func (s *subscription) consumerConfig(p int, name string) jetstream.ConsumerConfig {
	ts := s.ts
	if p == ts.parts {
		pending := keylessAckPending
		if s.sub.Ordered {
			pending = 1 // the topic is their ordering key: one at a time, through retries
		}
		return jetstream.ConsumerConfig{
			Durable: name,
			Description: fmt.Sprintf("inproc broker subscriber %s of topic %s, keyless messages",
				strconv.Quote(s.sub.Name), strconv.Quote(ts.topic)),
			DeliverPolicy:  jetstream.DeliverNewPolicy,
			AckPolicy:      jetstream.AckExplicitPolicy,
			AckWait:        s.t.cfg.ackWait,
			MaxDeliver:     -1,
			MaxAckPending:  pending,
			FilterSubjects: []string{ts.keylessSubject(), ts.keylessRedriveSubject(s.sub.Name)},
			Metadata:       map[string]string{metaTopic: ts.topic, metaSubscriber: s.sub.Name, metaOrdered: strconv.FormatBool(s.sub.Ordered)},
		}
	}
	return jetstream.ConsumerConfig{
		Durable: name,
		Description: fmt.Sprintf("inproc broker subscriber %s of topic %s, partition %d of %d",
			strconv.Quote(s.sub.Name), strconv.Quote(ts.topic), p, ts.parts),
		DeliverPolicy:  jetstream.DeliverNewPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        s.t.cfg.ackWait,
		MaxDeliver:     -1, // the broker enforces its retry policy
		MaxAckPending:  1,  // one message of the partition at a time, across every process
		FilterSubjects: []string{ts.msgSubject(p), ts.redriveSubject(s.sub.Name, p)},
		Metadata:       map[string]string{metaTopic: ts.topic, metaSubscriber: s.sub.Name},
	}
}

// Buffer of a pull loop's inbox: a pull has at most keylessBatch messages
// and a few status messages in flight, and a pull given up on (two missed
// heartbeats, a reconnection) may still bring some, so it never fills (a
// full one would drop).
const inboxBuffer = 4 * keylessBatch

// partitionLoop pulls from one durable consumer, a partition's (one message
// at a time) or the keyless messages' (up to batch at a time), on an inbox
// of its own.
//
// It does not use the jetstream package's Consume or Messages: their
// client-side count of the messages still to come from outstanding pulls
// drifts under load when every message waits for an acknowledgement
// (MaxAckPending 1) and the handler makes requests of its own (the broker's
// dedup store), and the consumer then stalls, no pull at the server, until
// two heartbeats are missed (reproduced here with nats.go v1.55.0: 6 of 16
// runs of 10,000 messages stalled 5 s; TestNoStallUnderLoad). This loop
// has one pull outstanding and sends the next when the previous ended (its
// last message, the server's end-of-pull status, a reconnect, or two
// missed heartbeats), so there is no count to drift. Each pull has a reply subject
// of its own, so that the end of a pull given up on but still at the
// server is not taken for the current pull's: such extra pulls expire
// without being replaced.
type partitionLoop struct {
	s     *subscription
	name  string // the durable consumer
	nc    *nats.Conn
	next  string       // the pull request subject
	batch int          // most messages a pull asks for (1: a partition's)
	took  atomic.Int64 // keyless: moving average of a Deliver's time, in ns (0: none yet)
	// queue holds the keyless messages pulled and not yet started, oldest
	// first; the loop starts each on a goroutine of its own when a slot is
	// free, and keeps them alive meanwhile (only the loop touches it).
	queue  []*delivery
	alive  <-chan time.Time // ticks every third of the AckWait while the loop runs; nil (never) without a queue
	inbox  chan *nats.Msg
	prefix string // of the inbox subjects: each pull has its own, prefix + "." + a number
	sub    *nats.Subscription
	closed chan struct{}    // closed by the inbox subscription's closed handler
	status chan nats.Status // reconnections
	hb     time.Duration    // the server's heartbeat interval during a pull
	cfg    jetstream.ConsumerConfig
}

// newLoop creates or updates partition p's consumer and subscribes the
// loop's inbox.
func (s *subscription) newLoop(ctx context.Context, p int) (*partitionLoop, error) {
	name, batch := durableName(s.sub.Name, p), 1
	if p == s.ts.parts {
		name = keylessName(s.sub.Name)
		if !s.sub.Ordered {
			batch = keylessBatch
		}
	}
	cfg := s.consumerConfig(p, name)
	if p == s.ts.parts {
		if err := s.sameOrdered(ctx, name); err != nil {
			return nil, err
		}
	}
	if _, err := s.t.js.CreateOrUpdateConsumer(ctx, s.ts.stream, cfg); err != nil {
		return nil, fmt.Errorf("natsjs: consumer %s on stream %s (subscriber %q of %q): %w", name, s.ts.stream, s.sub.Name, s.ts.topic, err)
	}
	exp := s.t.cfg.pullExpiry
	prefix := s.t.js.Options().APIPrefix
	if prefix == "" {
		prefix = jetstream.DefaultAPIPrefix
	}
	if !strings.HasSuffix(prefix, ".") {
		prefix += "."
	}
	nc := s.t.js.Conn()
	l := &partitionLoop{
		s: s, name: name, nc: nc, cfg: cfg, hb: exp / 2, batch: batch,
		next:   prefix + "CONSUMER.MSG.NEXT." + s.ts.stream + "." + name,
		inbox:  make(chan *nats.Msg, inboxBuffer),
		closed: make(chan struct{}),
	}
	l.prefix = nc.NewInbox()
	var err error
	l.sub, err = nc.ChanSubscribe(l.prefix+".*", l.inbox)
	if err != nil {
		return nil, fmt.Errorf("natsjs: subscribe the pull inbox of %s: %w", name, err)
	}
	l.sub.SetClosedHandler(func(string) { close(l.closed) })
	l.status = nc.StatusChanged(nats.CONNECTED)
	return l, nil
}

// sameOrdered refuses (broker.ErrInvalidOption) to subscribe with Ordered
// when the subscriber's keyless messages' consumer exists without it, or
// the other way round: processes subscribed under one name must agree, or
// one would take the others' order away. RemoveSubscriber, with no process
// subscribed, lets the name start again either way.
func (s *subscription) sameOrdered(ctx context.Context, name string) error {
	c, err := s.t.js.Consumer(ctx, s.ts.stream, name)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("natsjs: consumer %s on stream %s (subscriber %q of %q): %w", name, s.ts.stream, s.sub.Name, s.ts.topic, err)
	}
	if v, ok := c.CachedInfo().Config.Metadata[metaOrdered]; ok && v != strconv.FormatBool(s.sub.Ordered) {
		return fmt.Errorf("%w: natsjs: subscriber %q of %q has Ordered %s in another process (or an earlier run); all must agree (RemoveSubscriber starts the name again)",
			broker.ErrInvalidOption, s.sub.Name, s.ts.topic, v)
	}
	return nil
}

// close releases a loop that never ran.
func (l *partitionLoop) close() {
	_ = l.sub.Unsubscribe()
	l.nc.RemoveStatusListener(l.status)
}

// drainWait is how long a stopping loop waits for its inbox's drain to end.
// The drain ends with a round trip to the server (a flush), after which no
// message can arrive; nats.go can lose track of that round trip after a
// reconnect ("outstanding flush points", a FIXME in its doReconnect) and
// wait out its 10 s flush timeout, so the wait is bounded: then the inbox
// is unsubscribed, and a message still on its way comes back after the
// AckWait.
const drainWait = time.Second

// Pacing of the attempts to pull again after an error, or to create the
// consumer again.
const (
	retryFirst = 100 * time.Millisecond
	retryMax   = 5 * time.Second
)

// run pulls and delivers until Stop; then it drains the inbox (delivering
// what still arrives) and returns.
func (l *partitionLoop) run() {
	s := l.s
	defer s.wg.Done()
	defer l.nc.RemoveStatusListener(l.status)
	silence := stoppedTimer() // two missed heartbeats of the outstanding pull
	defer silence.Stop()
	retry := stoppedTimer() // the next pull after an error
	defer retry.Stop()
	if l.batch > 1 { // keeps the queued keyless messages alive
		alive := time.NewTicker(l.s.t.cfg.ackWait / 3)
		defer alive.Stop()
		l.alive = alive.C
	}
	retrying := false
	backoff := retryFirst
	later := func() { // pull again after the backoff
		retry.Reset(backoff)
		retrying = true
		backoff = min(2*backoff, retryMax)
	}
	// offline: the server is going away (409 Server Shutdown) or the
	// connection is down: no pull until the connection is back (CONNECTED),
	// or retryMax at the latest.
	offline := false
	waitConnection := func() {
		offline = true
		retry.Reset(retryMax)
		retrying = true
	}
	outstanding := false // the pull on reply subject cur waits at the server
	left := 0            // messages the outstanding pull may still bring
	var cur string
	var curReconnects uint64 // the connection's reconnections when cur was sent
	var pulls uint64
	var req []byte
	for {
		if n := l.pullSize(); n > 0 && !outstanding && !retrying {
			offline = false
			pulls++
			curReconnects = l.nc.Stats().Reconnects
			cur = l.prefix + "." + strconv.FormatUint(pulls, 10)
			left = n
			exp := l.s.t.cfg.pullExpiry
			req = pullRequest(req[:0], left, exp)
			if err := l.nc.PublishRequest(l.next, cur, req); err != nil {
				l.logAttrs(slog.LevelWarn, "natsjs: pull request failed; trying again", err)
				later()
			} else {
				outstanding = true
				silence.Reset(2*l.hb + l.hb/2)
			}
		}
		select {
		case <-s.stopping:
			l.drain()
			return
		case <-l.closed: // the connection was closed under the transport
			l.logAttrs(slog.LevelError, "natsjs: connection closed; the subscriber stops pulling in this process", nats.ErrConnectionClosed)
			<-s.stopping
			// What this process holds can no longer be acknowledged: its
			// handlers would run for nothing (the server delivers each
			// again after its AckWait), so it is left to the server.
			if n := len(l.queue) + len(l.inbox); n > 0 {
				l.logAttrs(slog.LevelWarn, fmt.Sprintf("natsjs: %d messages left to the server, which delivers them again", n), nats.ErrConnectionClosed)
			}
			clear(l.queue)
			l.queue = nil
			return
		case l.free() <- struct{}{}:
			l.start()
		case <-l.alive:
			l.keepQueuedAlive()
		case <-retry.C:
			retrying = false
		case st := <-l.status:
			if st == nats.CONNECTED { // a pull sent before is gone with the old connection, or expires: pull now
				outstanding = false
				silence.Stop()
				retry.Stop()
				retrying, offline, backoff = false, false, retryFirst
			}
		case <-silence.C:
			outstanding = false
			if !l.nc.IsConnected() { // disconnected: the pull waits for the connection
				waitConnection()
				break
			}
			l.logAttrs(slog.LevelWarn, "natsjs: no heartbeat from the server for two intervals; pulling again", errors.New("pull silent"))
		case m := <-l.inbox:
			code, desc := m.Header.Get("Status"), m.Header.Get("Description")
			switch {
			case code == "" && !strings.HasPrefix(m.Reply, "$JS.ACK."):
				// neither a message nor a status: ignore
			case code != "" && m.Subject != cur:
				// The status of an earlier pull, given up for a
				// reconnection or two missed heartbeats but still at
				// the server: it changes nothing. (A message carries its
				// own subject, not the pull's: whichever pull it
				// answered, the next is sent.)
			case code == "":
				backoff = retryFirst
				if left--; left <= 0 { // the pull's last message
					outstanding = false
					silence.Stop()
				}
				l.handle(m)
				if outstanding { // a message in the middle of a pull: the server is alive
					silence.Reset(2*l.hb + l.hb/2)
				}
			case code == "100": // idle heartbeat: the pull waits
				silence.Reset(2*l.hb + l.hb/2)
			case code == "408", code == "404": // the pull expired, or found nothing
				outstanding = false
				silence.Stop()
			case code == "409" && strings.Contains(desc, "Server Shutdown"):
				// A planned restart (or this server leaving its cluster):
				// pull again once the connection is back, from the server
				// it is back on; at once if it is back already.
				outstanding = false
				silence.Stop()
				if l.nc.Stats().Reconnects == curReconnects {
					waitConnection()
				}
			case code == "503" && offline:
				// No one answers the pull subject of a server going away.
				outstanding = false
				silence.Stop()
			case code == "409" && strings.Contains(desc, "Consumer Deleted"), code == "503":
				// The consumer was deleted, or no one answers its pull
				// subject (deleted, or the server is shutting down or not
				// ready yet): create it again, delivering from now on, only
				// when the server says it does not exist.
				outstanding = false
				silence.Stop()
				switch gone, err := l.consumerGone(code, desc); {
				case !gone && !l.nc.IsConnected():
					waitConnection()
				case !gone:
					if err != nil {
						l.logAttrs(slog.LevelInfo, "natsjs: pull not answered ("+code+" "+desc+"); pulling again", err)
					}
					later()
				default:
					l.logAttrs(slog.LevelWarn, "natsjs: the consumer is gone; creating it again", errors.New(code+" "+desc))
					if !l.recreate(&backoff) {
						l.drain()
						return
					}
				}
			default: // 409 leadership change, max waiting exceeded, ...: pull again, paced
				outstanding = false
				silence.Stop()
				l.logAttrs(slog.LevelWarn, "natsjs: pull ended by the server; pulling again", errors.New(code+" "+desc))
				later()
			}
		}
	}
}

// pullRequest appends to b the JSON of a pull of up to n messages that
// expires after exp, with idle heartbeats every exp/2 (a partition's loop
// sends one per message: no fmt, nothing allocated).
func pullRequest(b []byte, n int, exp time.Duration) []byte {
	b = append(b, `{"batch":`...)
	b = strconv.AppendInt(b, int64(n), 10)
	b = append(b, `,"expires":`...)
	b = strconv.AppendInt(b, int64(exp), 10)
	b = append(b, `,"idle_heartbeat":`...)
	b = strconv.AppendInt(b, int64(exp/2), 10)
	return append(b, '}')
}

// stoppedTimer returns a timer that has not started.
func stoppedTimer() *time.Timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}

// pause waits out the backoff (doubling it) and reports whether to go on
// (false: Stop was called).
func (l *partitionLoop) pause(backoff *time.Duration) bool {
	timer := time.NewTimer(*backoff)
	defer timer.Stop()
	*backoff = min(2**backoff, retryMax)
	for {
		select { // the queued keyless messages go on meanwhile
		case <-l.s.stopping:
			return false
		case <-timer.C:
			return true
		case l.free() <- struct{}{}:
			l.start()
		case <-l.alive:
			l.keepQueuedAlive()
		}
	}
}

// consumerGone reports whether the server says the loop's consumer does
// not exist, after a pull ended with code and desc: a deletion the server
// announced ("409 Consumer Deleted") is taken at its word, else the
// consumer is looked up (an error there: not known to be gone).
func (l *partitionLoop) consumerGone(code, desc string) (bool, error) {
	if code == "409" {
		return true, nil
	}
	if !l.nc.IsConnected() {
		return false, nats.ErrConnectionReconnecting
	}
	ctx, cancel := context.WithTimeout(context.Background(), consumerLookupTimeout)
	defer cancel()
	_, err := l.s.t.js.Consumer(ctx, l.s.ts.stream, l.name)
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return true, nil
	}
	return false, err
}

// consumerLookupTimeout bounds consumerGone's lookup, which the server
// answers in milliseconds: one sent just before the connection is lost is
// never answered (nats.go does not send it again), and the loop must not
// wait long for it.
const consumerLookupTimeout = time.Second

// recreate creates the consumer again, pacing the attempts, until it
// succeeds (true) or Stop is called (false). While the connection is down
// it waits for it instead of sending requests that cannot be answered.
func (l *partitionLoop) recreate(backoff *time.Duration) bool {
	for {
		if !l.pause(backoff) || !l.connected() {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := l.s.t.js.CreateOrUpdateConsumer(ctx, l.s.ts.stream, l.cfg)
		cancel()
		if err == nil {
			return true
		}
		l.logAttrs(slog.LevelError, "natsjs: cannot create the consumer again; retrying", err)
	}
}

// connected waits until the connection is up (true) or Stop is called
// (false), keeping the queued keyless messages alive meanwhile.
func (l *partitionLoop) connected() bool {
	for !l.nc.IsConnected() {
		select {
		case <-l.s.stopping:
			return false
		case <-l.status: // CONNECTED
		case l.free() <- struct{}{}:
			l.start()
		case <-l.alive:
			l.keepQueuedAlive()
		}
	}
	return true
}

// drain stops the inbox: the server learns it has no one to deliver to,
// and what it sent before is still delivered, the queued keyless messages
// too (kept alive until they start).
func (l *partitionLoop) drain() {
	if err := l.sub.Drain(); err != nil {
		_ = l.sub.Unsubscribe()
	}
	timer := time.NewTimer(drainWait)
	defer timer.Stop()
	for done := false; !done; {
		select {
		case m := <-l.inbox:
			if m.Header.Get("Status") == "" && strings.HasPrefix(m.Reply, "$JS.ACK.") {
				l.handle(m)
			}
		case <-l.closed:
			done = true
		case <-timer.C:
			_ = l.sub.Unsubscribe()
			done = true
		case l.free() <- struct{}{}:
			l.start()
		case <-l.alive:
			l.keepQueuedAlive()
		}
	}
	l.flush()
	l.empty()
}

// empty starts every queued keyless message, oldest first, as slots free
// up, keeping the others alive meanwhile.
func (l *partitionLoop) empty() {
	for len(l.queue) > 0 {
		select {
		case l.s.slots <- struct{}{}:
			l.start()
		case <-l.alive:
			l.keepQueuedAlive()
		}
	}
}

// start runs the oldest queued keyless message on a goroutine of its own,
// holding the slot the loop took for it. With one slot, one runs at a
// time, in the order pulled.
func (l *partitionLoop) start() {
	s := l.s
	d := l.queue[0]
	l.queue[0] = nil
	l.queue = l.queue[1:]
	s.running.Add(1)
	go func() { // ends when Deliver returns
		defer s.running.Done()
		defer func() { <-s.slots }()
		if d.check && !l.stoppingAtOnce() && l.deadLettered(d) { // stopping: Deliver hands it back unstarted
			return
		}
		start := time.Now()
		s.sub.Deliver(d)
		took := int64(time.Since(start))
		if avg := l.took.Load(); avg > 0 {
			took = avg + (took-avg)/8 // a lost update between goroutines only slows the average down
		}
		l.took.Store(max(took, 1))
	}()
}

// keepQueuedAlive tells the server the queued keyless messages are held
// here (+WPI), so that none is delivered again while it waits for a slot.
// If one fails, that message comes back after its AckWait: allowed.
func (l *partitionLoop) keepQueuedAlive() {
	for _, d := range l.queue {
		_ = d.KeepAlive()
	}
}

// free is where the loop takes a slot for its oldest queued keyless
// message: the subscription's slots, or nil (never ready) with none queued.
func (l *partitionLoop) free() chan<- struct{} {
	if len(l.queue) == 0 {
		return nil
	}
	return l.s.slots
}

// flush delivers what is left in the inbox after its subscription ended.
func (l *partitionLoop) flush() {
	for {
		select {
		case m := <-l.inbox:
			if m.Header.Get("Status") == "" && strings.HasPrefix(m.Reply, "$JS.ACK.") {
				l.handle(m)
			}
		default:
			return
		}
	}
}

// logAttrs logs on the transport's logger. A panic of the logger's
// handler (the user's) is dropped: it must not end the pull loop, and with
// it the process.
func (l *partitionLoop) logAttrs(level slog.Level, msg string, err error) {
	defer func() { _ = recover() }()
	s := l.s
	s.t.cfg.logger.LogAttrs(context.Background(), level, msg,
		slog.String("topic", s.ts.topic), slog.String("subscriber", s.sub.Name),
		slog.String("stream", s.ts.stream), slog.String("consumer", l.name), slog.String("error", err.Error()))
}

// handle hands one message to the broker: a partition's at once, once a
// slot is free; a keyless one joins the loop's queue.
func (l *partitionLoop) handle(m *nats.Msg) {
	s := l.s
	meta, err := m.Metadata()
	if err != nil { // not a JetStream delivery: nothing to acknowledge
		l.logAttrs(slog.LevelError, "natsjs: a message without JetStream metadata on the pull inbox; ignored", err)
		return
	}
	msg, redriven, err := decodeMessage(s.ts.topic, m, meta)
	if err != nil {
		l.logAttrs(slog.LevelWarn, "natsjs: undecodable broker headers; delivering what could be read (message "+strconv.Quote(msg.ID)+")", err)
	}
	d := &delivery{
		nc: l.nc, reply: m.Reply, msg: msg, redriven: redriven, every: s.t.cfg.ackWait / 3,
		dlID: deadLetterID(meta.Stream, meta.Sequence.Stream, meta.Timestamp, s.sub.Name),
		l:    l, redelivered: meta.NumDelivered > 1, arrived: time.Now(), reconnects: l.nc.Stats().Reconnects,
	}
	// A message delivered before may have been dead-lettered by a process
	// that died before the server heard of it. The server's delivery count
	// says so, unless the crash also lost the consumer's latest state
	// (saved about ten times a second): so a message stored before this
	// transport started is looked up too.
	d.check = s.t.cfg.deadLetters != nil && (meta.NumDelivered > 1 || meta.Timestamp.Before(s.t.started))
	if d.check && meta.Timestamp.Before(s.t.started) {
		// It may have been dead-lettered by an earlier version, under the
		// ID it gave (see legacyDeadLetterID).
		d.legacyID = legacyDeadLetterID(meta.Stream, meta.Sequence.Stream, s.sub.Name)
	}
	if l.batch > 1 {
		l.queue = append(l.queue, d) // looked up when it starts: the loop must not wait on the store
		return
	}
	if d.check && !l.stoppingAtOnce() && l.deadLettered(d) {
		return
	}
	l.acquire(d)
	defer func() { <-s.slots }()
	s.sub.Deliver(d)
}

// pullSize is how many messages the next pull may ask for: a partition's
// one; the keyless loop tops its queue up to its limit (see keylessBatch)
// once it is down to half (0: not yet).
func (l *partitionLoop) pullSize() int {
	if l.batch == 1 {
		return 1
	}
	limit := l.queueLimit()
	if n := limit - len(l.queue); n > 0 && n >= limit/2 {
		return n
	}
	return 0
}

// queueLimit is how many keyless messages the loop may hold: what its
// handlers start within keylessQueueFor at their average time, between 1
// and l.batch (keylessAhead per handler until an average is known).
func (l *partitionLoop) queueLimit() int {
	handlers := int64(cap(l.s.slots))
	avg := time.Duration(l.took.Load())
	if avg <= 0 {
		return int(min(keylessAhead*handlers, int64(l.batch)))
	}
	return int(max(1, min(int64(keylessQueueFor)*handlers/int64(avg), int64(l.batch))))
}

// stoppingAtOnce reports that the broker stops the subscription at once:
// a delivery is handed back unstarted, so the dead-letter lookup before it
// can wait for its next delivery.
func (l *partitionLoop) stoppingAtOnce() bool {
	select {
	case <-l.s.sub.Stopping:
		return true
	default:
		return false
	}
}

// deadLettered reports whether d's dead letter is stored already (a
// process died after storing it and before the server heard of the
// outcome): d is then terminated without running. A dead letter under d's
// legacy ID counts only when it is of d's message (same message ID and
// publish time): that ID also names other messages stored at the sequence.
func (l *partitionLoop) deadLettered(d *delivery) bool {
	found, err := l.storedDeadLetter(d.dlID)
	if err == nil && found == nil && d.legacyID != "" {
		found, err = l.storedDeadLetter(d.legacyID)
		if found != nil && !sameMessage(&found.Message, &d.msg) {
			found = nil // another message's, stored at this sequence in an earlier life of the stream
		}
	}
	if err != nil || found == nil {
		return false // the broker decides; at worst the dead letter is written again, replacing this one
	}
	if err := d.term("dead-lettered before a restart"); err != nil {
		l.logAttrs(slog.LevelWarn, "natsjs: terminating a message already dead-lettered failed; it comes back", err)
	}
	return true
}

// storeCtx is the context of a call to a store on a delivery's path:
// at most storeTimeout, and cancelled when the broker stops the
// subscription at once (Stopping), so that a store unreachable during an
// outage cannot hold a stop past its deadline.
func (l *partitionLoop) storeCtx() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	go func() { // ends with ctx: at the call's end (cancel), its timeout or the stop
		select {
		case <-l.s.sub.Stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// storeTimeout bounds a store call on a delivery's path.
const storeTimeout = 10 * time.Second

// sameMessage reports whether a dead letter's message is m: same topic,
// ID and publish time.
func sameMessage(dl, m *broker.Message) bool {
	return dl.Topic == m.Topic && dl.ID == m.ID && dl.PublishedAt.Equal(m.PublishedAt)
}

// storedDeadLetter asks the dead-letter store (the user's, with
// WithDeadLetterCheck) for the dead letter id (nil: not stored). A panic
// there is logged and returned as an error, so that it ends neither the
// pull loop nor the process.
func (l *partitionLoop) storedDeadLetter(id string) (dl *broker.DeadLetter, err error) {
	defer func() {
		if v := recover(); v != nil {
			dl, err = nil, fmt.Errorf("natsjs: DeadLetterStore.Get panicked: %v", v)
			l.logAttrs(slog.LevelError, "natsjs: the dead-letter store panicked; the broker decides", err)
		}
	}()
	ctx, cancel := l.storeCtx()
	defer cancel()
	got, ok, err := l.s.t.cfg.deadLetters.Get(ctx, id)
	if err != nil || !ok {
		return nil, err
	}
	return &got, nil
}

// deliveredElsewhere asks the idempotency store (WithDedupCheck) whether
// d's message was delivered to the subscriber. A failure or a panic there
// counts as "no" (logged): the dead letter then stays, as before.
func (l *partitionLoop) deliveredElsewhere(d *delivery) (seen bool) {
	store := l.s.t.cfg.dedup
	if store == nil {
		return false
	}
	defer func() {
		if v := recover(); v != nil {
			seen = false
			l.logAttrs(slog.LevelError, "natsjs: the idempotency store panicked; the dead letter stays", fmt.Errorf("natsjs: IdempotencyStore.Seen panicked: %v", v))
		}
	}()
	ctx, cancel := l.storeCtx()
	defer cancel()
	seen, err := store.Seen(ctx, broker.DeliveryKey{Topic: d.msg.Topic, Subscriber: l.s.sub.Name, MessageID: d.msg.ID, PublishedAt: d.msg.PublishedAt})
	if err != nil {
		l.logAttrs(slog.LevelWarn, "natsjs: idempotency store lookup before terminating failed; the dead letter stays", err)
		return false
	}
	return seen
}

// dropDeadLetter deletes d's dead letter when the store (WithDeadLetterCheck)
// holds one of d's message, logging why (msg). A failure or a panic there
// is logged: the dead letter then stays.
func (l *partitionLoop) dropDeadLetter(d *delivery, msg string) {
	store := l.s.t.cfg.deadLetters
	if store == nil {
		return
	}
	dl, err := l.storedDeadLetter(d.dlID)
	if err != nil || dl == nil || dl.Subscriber != l.s.sub.Name || !sameMessage(&dl.Message, &d.msg) {
		return
	}
	err = func() (err error) {
		defer func() {
			if v := recover(); v != nil {
				err = fmt.Errorf("natsjs: DeadLetterStore.Delete panicked: %v", v)
			}
		}()
		ctx, cancel := l.storeCtx()
		defer cancel()
		return store.Delete(ctx, d.dlID)
	}()
	if err != nil {
		l.logAttrs(slog.LevelError, "natsjs: deleting the dead letter of a delivered message failed; it stays", err)
		return
	}
	l.logAttrs(slog.LevelWarn, msg+" (dead letter "+strconv.Quote(d.dlID)+")", errors.New("two deliveries of one message overlapped"))
}

// acquire takes a slot, telling the server the message is held meanwhile
// (it was delivered to this process and waits for a free handler).
func (l *partitionLoop) acquire(d *delivery) {
	s := l.s
	select {
	case s.slots <- struct{}{}:
		return
	default:
	}
	tick := time.NewTicker(s.t.cfg.ackWait / 3)
	defer tick.Stop()
	for {
		select {
		case s.slots <- struct{}{}:
			return
		case <-tick.C:
			_ = d.KeepAlive() // if it fails the message comes back later: allowed
		}
	}
}

// Stop stops pulling (each inbox drains: a message already on its way is
// still delivered) and returns once no Deliver call runs, or ctx's error
// when it ends first (Stop may then be called again). Unacknowledged
// messages stay with the consumer, for another process subscribed under
// the name or for the next subscription.
func (s *subscription) Stop(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background()
	}
	s.stopOnce.Do(func() {
		close(s.stopping)
		go func() { // ends when the loops and their Deliver calls do
			s.wg.Wait()
			s.running.Wait()
			s.t.mu.Lock()
			delete(s.t.subs, s)
			s.t.mu.Unlock()
			close(s.done)
		}()
	})
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("natsjs: stop subscriber %q of %q: %w", s.sub.Name, s.ts.topic, ctx.Err())
	}
}
