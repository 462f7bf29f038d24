package natsjs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/natsjs"
	"github.com/nats-io/nats.go/jetstream"
)

// rig is a broker over a Transport of its own, with the stream and KV
// stores, on a connection the test gives it.
type rig struct {
	conn  *natsjs.Conn
	tr    *natsjs.Transport
	b     *broker.Broker
	dlq   *natsjs.DeadLetterStore
	dedup *natsjs.IdempotencyStore
}

// testPolicy retries twice, 10 ms apart.
func testPolicy() broker.RetryPolicy {
	return broker.RetryPolicy{MaxRetries: 2, Backoff: broker.ConstantBackoff(10 * time.Millisecond)}
}

// newRig builds a broker over a new Transport on conn with topts, the
// test policy, a discarding logger and bopts; noDedup leaves out the KV
// store. The broker is closed when the test ends.
func newRig(t *testing.T, conn *natsjs.Conn, noDedup bool, topts []natsjs.TransportOption, bopts ...broker.Option) *rig {
	t.Helper()
	dlq, dedup := stores(t, conn)
	base := []natsjs.TransportOption{natsjs.WithLogger(discardLogger), natsjs.WithDeadLetterCheck(dlq), natsjs.WithPullExpiry(testPullExpiry)}
	if !noDedup {
		base = append(base, natsjs.WithDedupCheck(dedup))
	}
	tr, err := natsjs.NewTransport(conn.JetStream(), append(base, topts...)...)
	if err != nil {
		t.Fatalf("NewTransport: %v", err)
	}
	opts := []broker.Option{broker.WithTransport(tr), broker.WithDeadLetterStore(dlq), quiet, broker.WithRetryPolicy(testPolicy())}
	if noDedup {
		opts = append(opts, broker.WithIdempotencyStore(nil))
	} else {
		opts = append(opts, broker.WithIdempotencyStore(dedup))
	}
	b, err := broker.New(append(opts, bopts...)...)
	if err != nil {
		t.Fatalf("broker.New: %v", err)
	}
	t.Cleanup(func() { closeBroker(t, b) })
	return &rig{conn: conn, tr: tr, b: b, dlq: dlq, dedup: dedup}
}

// testPullExpiry is the tests' pull expiry: heartbeats every second, so a
// stall is noticed (and recovered from) within about two.
const testPullExpiry = 2 * time.Second

// calls records handler calls, safe for concurrent use.
type calls struct {
	mu  sync.Mutex
	all []call
}

type call struct {
	who string // which broker, where several share the work
	msg broker.Message
	at  time.Time // when it started
	end time.Time // when it returned
}

func (c *calls) add(cl call) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.all = append(c.all, cl)
	return len(c.all) - 1
}

func (c *calls) ended(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.all[i].end = time.Now()
}

func (c *calls) snapshot() []call {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.all)
}

// of returns the calls for message id.
func (c *calls) of(id string) []call {
	var out []call
	for _, cl := range c.snapshot() {
		if cl.msg.ID == id {
			out = append(out, cl)
		}
	}
	return out
}

// attempts returns the Attempt of each call for id.
func (c *calls) attempts(id string) []int {
	var out []int
	for _, cl := range c.of(id) {
		out = append(out, cl.msg.Attempt)
	}
	return out
}

// handler records each call as who, then runs f (nil: succeed).
func (c *calls) handler(who string, f broker.Handler) broker.Handler {
	return func(ctx context.Context, m broker.Message) error {
		i := c.add(call{who: who, msg: m, at: time.Now()})
		defer c.ended(i)
		if f == nil {
			return nil
		}
		return f(ctx, m)
	}
}

// subscribe subscribes name on topic, failing the test on error.
func (r *rig) subscribe(t *testing.T, topic, name string, h broker.Handler, opts ...broker.SubscribeOption) *broker.Subscription {
	t.Helper()
	s, err := r.b.Subscribe(topic, name, h, opts...)
	if err != nil {
		t.Fatalf("Subscribe(%q, %q): %v", topic, name, err)
	}
	return s
}

// publish publishes m, failing the test on error.
func (r *rig) publish(t *testing.T, m broker.Message) {
	t.Helper()
	if err := r.b.Publish(t.Context(), m); err != nil {
		t.Fatalf("Publish(%q): %v", m.ID, err)
	}
}

// streamMsgs returns how many messages topic's stream holds.
func (r *rig) streamMsgs(t *testing.T, topic string) uint64 {
	t.Helper()
	s, err := r.conn.JetStream().Stream(t.Context(), r.tr.StreamName(topic))
	if err != nil {
		t.Fatalf("Stream(%s): %v", r.tr.StreamName(topic), err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	return info.State.Msgs
}

// backlog returns the server's pending and unacknowledged counts of a
// subscriber, over its partitions.
func (r *rig) backlog(t *testing.T, topic, name string) (pending uint64, ackPending int) {
	t.Helper()
	infos, err := r.tr.ConsumerInfo(t.Context(), topic, name)
	if err != nil {
		t.Fatalf("ConsumerInfo: %v", err)
	}
	for _, in := range infos {
		pending += in.NumPending
		ackPending += in.NumAckPending
	}
	return pending, ackPending
}

// conserved reports how a subscriber's counters break the conservation
// law (Routed = Delivered + Deduplicated + DeadLettered + Queued +
// InFlight), or "" when they keep it.
func conserved(ss broker.SubscriberStats) string {
	sum := ss.Delivered + ss.Deduplicated + ss.DeadLettered + uint64(ss.Queued) + uint64(ss.InFlight)
	if ss.Routed != sum {
		return fmt.Sprintf("Routed %d != Delivered %d + Deduplicated %d + DeadLettered %d + Queued %d + InFlight %d",
			ss.Routed, ss.Delivered, ss.Deduplicated, ss.DeadLettered, ss.Queued, ss.InFlight)
	}
	return ""
}

// watchdog watches subscribers' consumers and reports a stall: a
// partition with messages pending and none in flight whose delivered
// count has not moved for more than twice the pull heartbeat. A healthy
// consumer pulls again as soon as a message is acknowledged, so this is
// the signature of a client that stopped pulling (natsjs-notes.md, "Stall
// with ackpending=0, waiting=0"). Failures to read consumer info (the
// server is restarting) reset what it saw.
type watchdog struct {
	stop chan struct{}
	once sync.Once
	done chan struct{}
}

// watched names a subscriber to watch and how to read its consumers.
type watched struct {
	topic, name string
	info        func(ctx context.Context) ([]*jetstream.ConsumerInfo, error)
}

func watch(tr *natsjs.Transport, topic, name string) watched {
	return watched{topic: topic, name: name, info: func(ctx context.Context) ([]*jetstream.ConsumerInfo, error) {
		return tr.ConsumerInfo(ctx, topic, name)
	}}
}

// startWatchdog checks the subscribers every heartbeat/4 and calls
// onStall (once per partition) with the consumer info of a stall.
func startWatchdog(heartbeat time.Duration, onStall func(string), subs ...watched) *watchdog {
	w := &watchdog{stop: make(chan struct{}), done: make(chan struct{})}
	type state struct {
		delivered uint64
		since     time.Time // when it was first seen stuck at delivered; zero: moving
		reported  bool
	}
	seen := map[string]*state{}
	go func() { // ends at w.halt
		defer close(w.done)
		tick := time.NewTicker(heartbeat / 4)
		defer tick.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
			for _, s := range subs {
				ctx, cancel := context.WithTimeout(context.Background(), heartbeat)
				infos, err := s.info(ctx)
				cancel()
				if err != nil {
					clear(seen)
					continue
				}
				for p, in := range infos {
					k := fmt.Sprintf("%s/%s/%d", s.topic, s.name, p)
					st := seen[k]
					if st == nil {
						st = &state{}
						seen[k] = st
					}
					now := time.Now()
					switch {
					case in.NumPending == 0 || in.NumAckPending > 0 || in.Delivered.Consumer != st.delivered:
						st.delivered, st.since = in.Delivered.Consumer, time.Time{}
					case st.since.IsZero():
						st.since = now
					case now.Sub(st.since) > 2*heartbeat && !st.reported:
						st.reported = true
						js, _ := json.MarshalIndent(in, "", "  ")
						onStall(fmt.Sprintf("stall: subscriber %q of %q, partition %d: %d pending, none in flight, nothing delivered for %v:\n%s",
							s.name, s.topic, p, in.NumPending, now.Sub(st.since).Round(time.Millisecond), js))
					}
				}
			}
		}
	}()
	return w
}

// halt stops the watchdog and waits for it; it may be called again.
func (w *watchdog) halt() {
	w.once.Do(func() { close(w.stop) })
	<-w.done
}

// watchT starts a watchdog failing t, stopped when the test ends.
func watchT(t *testing.T, subs ...watched) *watchdog {
	w := startWatchdog(testPullExpiry/2, func(s string) { t.Error(s) }, subs...)
	t.Cleanup(w.halt)
	return w
}

// ids returns "prefix-0" ... "prefix-(n-1)".
func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

// missing returns the IDs of want that handled has not seen.
func missing(want []string, handled map[string]int) []string {
	var out []string
	for _, id := range want {
		if handled[id] == 0 {
			out = append(out, id)
		}
	}
	if len(out) > 10 {
		out = append(out[:10], fmt.Sprintf("... %d more", len(out)-10))
	}
	return out
}

// TestWatchdogCatchesAStall: the watchdog reports a consumer with messages
// pending that nobody pulls (here: its subscriber unsubscribed), with the
// consumer's info.
func TestWatchdogCatchesAStall(t *testing.T) {
	conn := embedded(t, "")
	r := newRig(t, conn, false, nil)
	sub := r.subscribe(t, "stall", "s", func(context.Context, broker.Message) error { return nil })
	if err := sub.Unsubscribe(t.Context()); err != nil {
		t.Fatal(err)
	}
	r.publish(t, broker.Message{ID: "m", Topic: "stall"})
	stalls := make(chan string, 1)
	w := startWatchdog(100*time.Millisecond, func(s string) {
		select {
		case stalls <- s:
		default:
		}
	}, watch(r.tr, "stall", "s"))
	defer w.halt()
	select {
	case s := <-stalls:
		if !strings.Contains(s, `"num_pending": 1`) || !strings.Contains(s, `"num_ack_pending": 0`) {
			t.Errorf("the report lacks the consumer info:\n%s", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no stall reported after 10s")
	}
}

// TestNoStallUnderLoad: one subscriber (one partition: every message
// waits for the previous one's acknowledgement, and the handler makes two
// requests of its own to the KV dedup store) takes thousands of messages
// from 16 concurrent publishers without its consumer ever stalling (the
// watchdog: nothing pending-and-idle for over two seconds). The pull
// expiry is long here, so that a stall would last 10 s rather than be
// healed within the watchdog's limit by the missed-heartbeat recovery. The
// jetstream package's Consume stalled in 6 of 16 such runs (see
// partitionLoop).
func TestNoStallUnderLoad(t *testing.T) {
	conn := embedded(t, "")
	r := newRig(t, conn, false, []natsjs.TransportOption{natsjs.WithPullExpiry(20 * time.Second)})
	var handled atomic.Int64
	r.subscribe(t, "load", "s", func(context.Context, broker.Message) error {
		handled.Add(1)
		return nil
	})
	w := startWatchdog(time.Second, func(s string) { t.Error(s) }, watch(r.tr, "load", "s"))
	defer w.halt()
	const n, publishers = 6000, 16
	var wg sync.WaitGroup
	for p := range publishers {
		wg.Go(func() {
			for i := p; i < n; i += publishers {
				if err := r.b.Publish(context.Background(), broker.Message{ID: strconv.Itoa(i), Topic: "load", Payload: make([]byte, 128)}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	deadline := time.Now().Add(60 * time.Second)
	for handled.Load() < n && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := handled.Load(); got != n {
		t.Fatalf("handled %d of %d", got, n)
	}
}
