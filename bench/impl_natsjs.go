package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/natsjs"
	"github.com/nats-io/nats.go/jetstream"
)

// natsjs-mem and natsjs-file: this library over NATS JetStream (module
// natsjs). natsjs.Embedded starts a nats-server in the process (no port,
// files in a temporary directory) and natsjs.New builds the broker over its
// transport, with the same discarding logger and one-minute publish timeout
// as the broker column, so an ErrQueueFull would be retried and counted.
// natsjs-mem keeps the topics' streams (and the dead-letter stream) in
// memory (WithStreamStorage(jetstream.MemoryStorage)); natsjs-file is the
// durable default, file storage.
//
// Both run with Config{NoDedup: true}: no KV idempotency store, so what is
// left of deduplication is the server's publish-side window (Nats-Msg-Id,
// 2 min per topic stream), and per delivery the broker does what the raw
// jetstream column does (an explicit ack), not two KV round trips more.
// The topic gets as many partitions as the workload has Concurrency
// (WithPartitions), but the workloads' messages are keyless: each
// subscriber's keyless consumer hands them out (MaxAckPending 1000, pulls
// of up to 64), as raw jetstream's Consume does (up to 1000
// unacknowledged). Publish returns once the server stored the message (a
// synchronous PublishMsg), where raw jetstream publishes async with up to
// 4000 acks outstanding; natsjs-mem-batch and natsjs-file-batch publish
// with PublishBatch, 256 at a time (async publishes, every ack awaited
// before it returns: the same acknowledgement as Publish, pipelined).
// natsjs-mem-p8 is natsjs-mem with 8 partitions whatever the workload;
// BenchmarkPhases (phases_test.go) splits W1's time into its publish and
// deliver halves for these columns and raw JetStream variants.
//
// They are extras, out of the default table: at about 70 µs per message
// (W1) and 250 µs (W2) on 2 cores, a cell of run.sh's 100,000 messages takes
// 7 to 25 s, and the sweeps' 64 subscribers or 256 topics far longer. Run
// them by name with the runner (see README.md).

type natsjsInst struct {
	env     *Env
	batch   int                // PublishBatch every batch messages; 0: Publish each
	bufs    [][]broker.Message // per publisher, the batch being filled
	dir     string
	conn    *natsjs.Conn
	b       *broker.Broker
	diag    *natsjs.Transport // looks consumers up for Diagnose; never subscribes
	retries atomic.Uint64
}

// natsjsConfig says how one natsjs column is set up.
type natsjsConfig struct {
	name       string
	storage    jetstream.StorageType
	partitions int // 0: the workload's Concurrency
	batch      int // publish with PublishBatch, this many at a time; 0: Publish
}

// natsjsBatch is the batch of the -batch columns: what natsjs's
// PublishBatch keeps in flight at most.
const natsjsBatch = 256

func init() {
	for _, c := range []natsjsConfig{
		{name: "natsjs-mem", storage: jetstream.MemoryStorage},
		{name: "natsjs-file", storage: jetstream.FileStorage},
		{name: "natsjs-mem-p8", storage: jetstream.MemoryStorage, partitions: 8},
		{name: "natsjs-mem-batch", storage: jetstream.MemoryStorage, batch: natsjsBatch},
		{name: "natsjs-file-batch", storage: jetstream.FileStorage, batch: natsjsBatch},
	} {
		register(Impl{
			Name:  c.name,
			New:   func(env *Env) (Instance, error) { return newNatsJS(env, c) },
			Note:  func(w Workload) string { return natsjsNote(c, w) },
			Extra: true,
		})
	}
}

func natsjsNote(c natsjsConfig, w Workload) string {
	parts := c.partitions
	if parts == 0 {
		parts = max(w.Concurrency, 1)
	}
	storage := "memory streams"
	if c.storage == jetstream.FileStorage {
		storage = "file streams (the durable default)"
	}
	publish := "Publish waits for the server's ack"
	if c.batch > 0 {
		publish = fmt.Sprintf("each publisher calls PublishBatch every %d messages (async publishes, every ack awaited before it returns)", c.batch)
	}
	s := fmt.Sprintf("%s: natsjs.New over an embedded server, %s, Config{NoDedup: true} (only the server's publish-side dedup window, as raw jetstream has none of the KV store's round trips), %d partition(s); the messages are keyless, so each subscriber's keyless consumer delivers them (MaxAckPending 1000, pulls of up to 64); %s", c.name, storage, parts, publish)
	switch {
	case w.Concurrency > 1:
		s += fmt.Sprintf("; Concurrency(%d)", w.Concurrency)
	case w.FailEvery > 0:
		s += "; RetryPolicy{MaxRetries: 2, Backoff: ConstantBackoff(0)}: a Nak with the transport's least delay, 1 ms, which the server acts on at its next pending check, 10 ms later; the messages are keyless, so the retry holds none of the others (it arrives late)"
	case w.FailingSubs > 0:
		s += "; RetryPolicy{MaxRetries: 2, Backoff: ConstantBackoff(10ms)}, Naks with a 10 ms delay; each subscriber has its own consumers, so the failing one holds up nobody else; what it has not given up on stays in the stream (interest retention), so the queue size is raised to the cell's message count"
	}
	return s
}

func newNatsJS(env *Env, c natsjsConfig) (_ Instance, err error) {
	n := &natsjsInst{env: env, batch: c.batch, bufs: make([][]broker.Message, env.Publishers)}
	defer func() {
		if err != nil {
			_ = n.Close(context.Background())
		}
	}()
	if n.dir, err = os.MkdirTemp("", "bench-natsjs-"); err != nil {
		return nil, err
	}
	if n.conn, err = natsjs.Embedded(n.dir); err != nil {
		return nil, err
	}
	parts := c.partitions
	if parts == 0 {
		parts = env.Concurrency
	}
	logger := slog.New(slog.DiscardHandler)
	topts := []natsjs.TransportOption{
		natsjs.WithStreamStorage(c.storage),
		natsjs.WithPartitions(parts),
		natsjs.WithLogger(logger),
	}
	if env.FailingSubs > 0 {
		// The failing subscriber gives a message up only after its
		// retries (20 ms): its consumer holds nearly every message of the
		// cell, and the stream keeps them until it acks or terminates.
		topts = append(topts, natsjs.WithQueueSize(max(natsjs.DefaultQueueSize, int64(env.PerTopic)+1)))
	}
	cfg := natsjs.Config{
		Transport:         topts,
		DeadLetterOptions: []natsjs.Option{natsjs.WithStorage(c.storage)},
		NoDedup:           true,
		Logger:            logger,
	}
	opts := []broker.Option{broker.WithPublishTimeout(time.Minute)}
	if env.FailEvery > 0 {
		opts = append(opts, broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: 2, Backoff: broker.ConstantBackoff(0)}))
	}
	if env.FailingSubs > 0 {
		opts = append(opts, broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: W7MaxRetries, Backoff: broker.ConstantBackoff(env.RetryBackoff)}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if n.b, err = natsjs.New(ctx, n.conn.JetStream(), cfg, opts...); err != nil {
		return nil, err
	}
	if n.diag, err = natsjs.NewTransport(n.conn.JetStream(), natsjs.WithLogger(logger)); err != nil {
		return nil, err
	}
	for t, name := range env.TopicNames {
		for j := range env.Subs {
			sub := env.Sub(t, j)
			if _, err := n.b.Subscribe(name, "s"+strconv.Itoa(j), func(_ context.Context, m broker.Message) error {
				return env.Handle(sub, ParseSeq(m.ID))
			}, broker.Concurrency(env.Concurrency)); err != nil {
				return nil, err
			}
		}
	}
	return n, nil
}

func (n *natsjsInst) Publish(ctx context.Context, pub, topic, seq int) error {
	msg := broker.Message{ID: n.env.IDs[seq], Topic: n.env.TopicNames[topic], Payload: n.env.Payload(seq)}
	if n.batch > 0 {
		n.bufs[pub] = append(n.bufs[pub], msg)
		if len(n.bufs[pub]) < n.batch {
			return nil
		}
		return n.Flush(ctx, pub)
	}
	for {
		err := n.b.Publish(ctx, msg)
		if !errors.Is(err, broker.ErrQueueFull) || ctx.Err() != nil {
			return err
		}
		n.retries.Add(1)
	}
}

// Flush publishes publisher pub's batch with PublishBatch, publishing again
// (in order) the messages a full stream refused, as Publish's callers do.
func (n *natsjsInst) Flush(ctx context.Context, pub int) error {
	msgs := n.bufs[pub]
	for len(msgs) > 0 {
		err := n.b.PublishBatch(ctx, msgs)
		if err == nil {
			break
		}
		var be *broker.BatchError
		if !errors.As(err, &be) {
			return err
		}
		var again []broker.Message
		for i, e := range be.Errs {
			switch {
			case e == nil:
			case errors.Is(e, broker.ErrQueueFull) && ctx.Err() == nil:
				again = append(again, msgs[i])
			default:
				return e
			}
		}
		n.retries.Add(uint64(len(again)))
		msgs = again
	}
	n.bufs[pub] = n.bufs[pub][:0]
	return nil // every message is published (a context that ended now changes nothing)
}

func (n *natsjsInst) PublishRetries() uint64 { return n.retries.Load() }

// Diagnose lists the consumers that still have work: the server's view of
// a cell that lost or stalled messages.
func (n *natsjsInst) Diagnose() string {
	if n.diag == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var parts []string
	for _, topic := range n.env.TopicNames {
		for j := range n.env.Subs {
			infos, err := n.diag.ConsumerInfo(ctx, topic, "s"+strconv.Itoa(j))
			if err != nil {
				parts = append(parts, err.Error())
				return strings.Join(parts, "; ")
			}
			for p, ci := range infos {
				which := strconv.Itoa(p) // a partition; the last consumer is the keyless messages'
				if p == len(infos)-1 {
					which = "u"
				}
				if ci.NumAckPending > 0 || ci.NumPending > 0 {
					parts = append(parts, fmt.Sprintf("%s/s%d/%s: ack pending %d, redelivered %d, pending %d, waiting pulls %d",
						topic, j, which, ci.NumAckPending, ci.NumRedelivered, ci.NumPending, ci.NumWaiting))
				}
				if len(parts) > 6 {
					return strings.Join(parts, "; ")
				}
			}
		}
	}
	return strings.Join(parts, "; ")
}

func (n *natsjsInst) Close(ctx context.Context) error {
	var errs []error
	if n.b != nil {
		errs = append(errs, n.b.Close(ctx))
	}
	if n.diag != nil {
		errs = append(errs, n.diag.Close(ctx))
	}
	if n.conn != nil {
		errs = append(errs, n.conn.Close(ctx))
	}
	if n.dir != "" {
		errs = append(errs, os.RemoveAll(n.dir))
	}
	return errors.Join(errs...)
}
