package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// nats: nats-server embedded in the process with no listener
// (server.Options{DontListen: true}), clients connected with
// nats.InProcessServer. One connection publishes, one subscribes (as one
// service would hold them). A message's seq travels in the first 8 bytes of
// its payload: each publisher writes it into its own copy of the payload,
// which NATS copies into its buffers before Publish returns.
//
// Core NATS is at-most-once: a subscription's pending limits are lifted
// (SetPendingLimits(-1, -1)) so the client never drops a message as a slow
// consumer; the server keeps its defaults. Core NATS has no redelivery, so
// the retry workload retries inline in the callback (app-level).
//
// jetstream: a memory stream per topic (interest retention, so acked
// messages leave it), a durable pull consumer per subscriber with explicit
// ack, consumed with Consume (default pull batch; pull expiry 5s and
// heartbeat 1s instead of 30s/15s, because with those a consumer that
// stopped pulling, which happened about one W2 run in three here, stalled
// past the cell's timeout) and acked per message;
// a failure is Nak'ed and redelivered by the server. Publishers use
// PublishAsync (default max pending, 4000, lowered for big payloads so at
// most 32 MiB is unacknowledged); a publish refused because too many acks
// are outstanding is retried and counted.

type natsInst struct {
	env     *Env
	js      bool
	sync    bool // jetstream-sync-msgid: Publish waits for each ack, with a Nats-Msg-Id
	ns      *server.Server
	dir     string
	pc, sc  *nats.Conn
	jsPub   jetstream.JetStream
	scratch [][]byte // per publisher: a copy of the payload with seq in it
	subs    []*nats.Subscription
	ccs     []jetstream.ConsumeContext
	retries atomic.Uint64
	discon  atomic.Uint64 // disconnects of either connection
	lastErr atomic.Value  // string: the last disconnect error
}

func init() {
	register(Impl{
		Name: "nats",
		New:  func(env *Env) (Instance, error) { return newNATS(env, false, false) },
		Note: func(w Workload) string {
			switch {
			case w.Concurrency > 1:
				return "nats: a queue group of 8 subscriptions"
			case w.FailEvery > 0:
				return "nats: core NATS has no redelivery; app-level inline retry in the callback"
			case w.PayloadSize > 64:
				return "nats: payload copied into the connection (and out of it at the subscriber)"
			}
			return ""
		},
	})
	register(Impl{
		Name: "jetstream",
		New:  func(env *Env) (Instance, error) { return newNATS(env, true, false) },
		Note: func(w Workload) string { return jetstreamNote("jetstream", w) },
	})
	// jetstream-sync-msgid is raw JetStream with natsjs's Publish semantics: each
	// publish waits for the server's ack (the message is stored), and
	// carries a Nats-Msg-Id for the server's publish-side dedup window.
	// The consumer side is the jetstream column's.
	register(Impl{
		Name: "jetstream-sync-msgid",
		New:  func(env *Env) (Instance, error) { return newNATS(env, true, true) },
		Note: func(w Workload) string {
			s := "jetstream-sync-msgid: Publish waits for each ack, with a Nats-Msg-Id (natsjs's Publish semantics)"
			if n := jetstreamNote("", w); n != "" {
				s += "; " + n
			}
			return s
		},
		Extra: true,
	})
}

// jetstreamNote is what the jetstream columns' consumer side does in w,
// prefixed with name (if not empty).
func jetstreamNote(name string, w Workload) string {
	var s string
	switch {
	case w.Concurrency > 1:
		s = "one consumer, 8 Consume loops on it"
	case w.FailEvery > 0:
		s = "Nak, redelivered by the server at once"
	default:
		return ""
	}
	if name != "" {
		s = name + ": " + s
	}
	return s
}

// newNATS starts an embedded server and sets the workload up on it: core
// NATS, or JetStream (js), publishing asynchronously or, with sync, as
// natsjs's Publish does.
func newNATS(env *Env, js, sync bool) (_ Instance, err error) {
	if env.FailingSubs > 0 {
		return nil, errNotMeasured("no in-process retry policy to compare (JetStream's NakWithDelay is the natsjs transport's business)")
	}
	n := &natsInst{env: env, js: js, sync: sync}
	defer func() {
		if err != nil {
			_ = n.Close(context.Background())
		}
	}()
	opts := &server.Options{DontListen: true, NoLog: true, NoSigs: true, ServerName: "bench"}
	if js {
		if n.dir, err = os.MkdirTemp("", "bench-jetstream-"); err != nil {
			return nil, err
		}
		opts.JetStream, opts.StoreDir = true, n.dir
	}
	if n.ns, err = server.NewServer(opts); err != nil {
		return nil, err
	}
	go n.ns.Start()
	if !n.ns.ReadyForConnections(10 * time.Second) {
		return nil, errors.New("nats: server not ready")
	}
	onErr := nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		env.Fail(fmt.Errorf("nats async error: %w", err))
	})
	onDiscon := nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
		if err != nil && !nc.IsClosed() {
			n.discon.Add(1)
			n.lastErr.Store(nc.Opts.Name + ": " + err.Error())
		}
	})
	if n.pc, err = nats.Connect("", nats.InProcessServer(n.ns), nats.Name("pub"), onErr, onDiscon); err != nil {
		return nil, err
	}
	if n.sc, err = nats.Connect("", nats.InProcessServer(n.ns), nats.Name("sub"), onErr, onDiscon); err != nil {
		return nil, err
	}
	n.scratch = make([][]byte, env.Publishers)
	for p := range n.scratch {
		n.scratch[p] = append([]byte(nil), env.Payload(0)...)
	}
	if js {
		err = n.setupJetStream()
	} else {
		err = n.setupCore()
	}
	if err != nil {
		return nil, err
	}
	return n, nil
}

func (n *natsInst) setupCore() error {
	env := n.env
	for t, subject := range env.TopicNames {
		for j := range env.Subs {
			sub := env.Sub(t, j)
			cb := func(m *nats.Msg) {
				seq := GetSeq(m.Data)
				for env.Handle(sub, seq) != nil { // app-level retry: no redelivery in core NATS
				}
			}
			for range env.Concurrency {
				var s *nats.Subscription
				var err error
				if env.Concurrency == 1 {
					s, err = n.sc.Subscribe(subject, cb)
				} else {
					s, err = n.sc.QueueSubscribe(subject, "q"+strconv.Itoa(j), cb)
				}
				if err != nil {
					return err
				}
				if err := s.SetPendingLimits(-1, -1); err != nil {
					return err
				}
				n.subs = append(n.subs, s)
			}
		}
	}
	return n.sc.Flush() // the server knows every subscription before the first publish
}

func (n *natsInst) setupJetStream() error {
	env := n.env
	var err error
	// At most 32 MiB in flight: the stream's ingest queue holds 128 MiB,
	// and the default 4000 pending × 64 KiB overflows it (the server then
	// answers 429 "too many requests" and the message is lost).
	maxPending := min(4000, max(64, (32<<20)/env.PayloadSize))
	n.jsPub, err = jetstream.New(n.pc,
		jetstream.WithPublishAsyncMaxPending(maxPending),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) {
			env.Fail(fmt.Errorf("jetstream async publish to %s: %w", m.Subject, err))
		}))
	if err != nil {
		return err
	}
	jsSub, err := jetstream.New(n.sc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for t, subject := range env.TopicNames {
		stream := "S" + subject
		if _, err := n.jsPub.CreateStream(ctx, jetstream.StreamConfig{
			Name:      stream,
			Subjects:  []string{subject},
			Storage:   jetstream.MemoryStorage,
			Retention: jetstream.InterestPolicy,
		}); err != nil {
			return err
		}
		for j := range env.Subs {
			sub := env.Sub(t, j)
			cons, err := jsSub.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
				Durable:   "c" + strconv.Itoa(j),
				AckPolicy: jetstream.AckExplicitPolicy,
			})
			if err != nil {
				return err
			}
			for range env.Concurrency {
				cc, err := cons.Consume(func(m jetstream.Msg) {
					if env.Handle(sub, GetSeq(m.Data())) != nil {
						_ = m.Nak()
					} else {
						_ = m.Ack()
					}
				}, jetstream.PullExpiry(5*time.Second), jetstream.PullHeartbeat(time.Second))
				if err != nil {
					return err
				}
				n.ccs = append(n.ccs, cc)
			}
		}
	}
	return nil
}

func (n *natsInst) Publish(ctx context.Context, pub, topic, seq int) error {
	data := n.env.Payload(seq)
	if !n.env.DistinctPayloads() {
		data = n.scratch[pub]
		PutSeq(data, seq)
	}
	subject := n.env.TopicNames[topic]
	if !n.js {
		return n.pc.Publish(subject, data)
	}
	if n.sync {
		_, err := n.jsPub.Publish(ctx, subject, data, jetstream.WithMsgID(n.env.IDs[seq]))
		return err
	}
	for {
		_, err := n.jsPub.PublishAsync(subject, data)
		if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) || ctx.Err() != nil {
			return err
		}
		n.retries.Add(1)
	}
}

func (n *natsInst) PublishRetries() uint64 { return n.retries.Load() }

func (n *natsInst) Diagnose() string {
	var parts []string
	if d := n.discon.Load(); d > 0 {
		last, _ := n.lastErr.Load().(string)
		parts = append(parts, fmt.Sprintf("%d disconnects, last %s", d, last))
	}
	if n.js {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		js, err := jetstream.New(n.pc)
		if err == nil {
			for _, subject := range n.env.TopicNames {
				s, err := js.Stream(ctx, "S"+subject)
				if err != nil {
					continue
				}
				for j := range n.env.Subs {
					c, err := s.Consumer(ctx, "c"+strconv.Itoa(j))
					if err != nil {
						continue
					}
					ci := c.CachedInfo()
					if ci.NumAckPending > 0 || ci.NumRedelivered > 0 || ci.NumPending > 0 {
						parts = append(parts, fmt.Sprintf("%s/c%d: ack pending %d, redelivered %d, pending %d, waiting pulls %d",
							subject, j, ci.NumAckPending, ci.NumRedelivered, ci.NumPending, ci.NumWaiting))
					}
					if len(parts) > 6 {
						break
					}
				}
			}
		}
	}
	return strings.Join(parts, "; ")
}

func (n *natsInst) Close(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, cc := range n.ccs {
			cc.Stop()
		}
		for _, s := range n.subs {
			_ = s.Unsubscribe()
		}
		if n.pc != nil {
			n.pc.Close()
		}
		if n.sc != nil {
			n.sc.Close()
		}
		if n.ns != nil {
			n.ns.Shutdown()
			n.ns.WaitForShutdown()
		}
		if n.dir != "" {
			_ = os.RemoveAll(n.dir)
		}
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
