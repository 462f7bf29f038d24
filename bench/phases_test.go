package bench

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/natsjs"
	"github.com/nats-io/nats.go/jetstream"
)

// BenchmarkPhases splits W1 (one topic, one subscriber, 64 B) into its two
// halves, to say where the natsjs columns' time goes next to raw
// JetStream's: "publish" times b.N publishes to a topic whose one durable
// consumer is not being read (the messages stay in the stream), "deliver"
// times delivering and acknowledging b.N messages already stored. ns/op is
// per message.
//
// The natsjs cases are set up as the W1 columns: the broker's Publish
// waits for the server's ack (the -batch cases call PublishBatch every 256
// messages instead), and the keyless messages are delivered by the
// subscriber's keyless consumer (pulls of up to 64, MaxAckPending 1000).
// jetstream is the raw column (PublishAsync; Consume with batched pulls
// and up to 1000 unacknowledged). jetstream-sync publishes with Publish,
// waiting for each ack as natsjs's Publish does, and jetstream-sync-msgid
// adds a Nats-Msg-Id (natsjs's publish-side dedup). jetstream-ackpending1
// consumes from a consumer with MaxAckPending 1, a keyed partition's one
// message in flight.
//
//	go test -run '^$' -bench Phases -benchtime 20000x -count 3
func BenchmarkPhases(b *testing.B) {
	for _, c := range []struct {
		name string
		run  func(b *testing.B, deliver bool)
	}{
		{"natsjs-mem", func(b *testing.B, d bool) { phaseNatsJS(b, d, jetstream.MemoryStorage, 1, 0) }},
		{"natsjs-mem-batch", func(b *testing.B, d bool) { phaseNatsJS(b, d, jetstream.MemoryStorage, 1, natsjsBatch) }},
		{"natsjs-mem-p8", func(b *testing.B, d bool) { phaseNatsJS(b, d, jetstream.MemoryStorage, 8, 0) }},
		{"natsjs-file", func(b *testing.B, d bool) { phaseNatsJS(b, d, jetstream.FileStorage, 1, 0) }},
		{"natsjs-file-batch", func(b *testing.B, d bool) { phaseNatsJS(b, d, jetstream.FileStorage, 1, natsjsBatch) }},
		{"jetstream", func(b *testing.B, d bool) { phaseJetStream(b, d, false, false, 0) }},
		{"jetstream-sync", func(b *testing.B, d bool) { phaseJetStream(b, d, true, false, 0) }},
		{"jetstream-sync-msgid", func(b *testing.B, d bool) { phaseJetStream(b, d, true, true, 0) }},
		{"jetstream-ackpending1", func(b *testing.B, d bool) { phaseJetStream(b, d, false, false, 1) }},
	} {
		b.Run(c.name+"/publish", func(b *testing.B) { c.run(b, false) })
		b.Run(c.name+"/deliver", func(b *testing.B) { c.run(b, true) })
	}
}

// publishPhase is what both halves do first: without deliver, it times
// publish and reports true (the phase is done); with deliver, it runs
// publish untimed, for the caller to time the delivery of its backlog.
func publishPhase(b *testing.B, deliver bool, publish func()) (done bool) {
	if deliver {
		publish()
		return false
	}
	b.ResetTimer()
	publish()
	b.StopTimer()
	return true
}

// phaseWait is how long the deliver phase waits for its last message.
const phaseWait = 5 * time.Minute

// counter closes done when it has been called n times.
type counter struct {
	n    int64
	got  atomic.Int64
	done chan struct{}
}

func newCounter(n int) *counter { return &counter{n: int64(n), done: make(chan struct{})} }

func (c *counter) add() {
	if c.got.Add(1) == c.n {
		close(c.done)
	}
}

func (c *counter) wait(b *testing.B) {
	select {
	case <-c.done:
	case <-time.After(phaseWait):
		b.Fatalf("%d of %d messages delivered after %v", c.got.Load(), c.n, phaseWait)
	}
}

func phaseNatsJS(b *testing.B, deliver bool, storage jetstream.StorageType, partitions, batch int) {
	conn, err := natsjs.Embedded(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(context.Background())
	logger := slog.New(slog.DiscardHandler)
	br, err := natsjs.New(b.Context(), conn.JetStream(), natsjs.Config{
		Transport:         []natsjs.TransportOption{natsjs.WithStreamStorage(storage), natsjs.WithPartitions(partitions)},
		DeadLetterOptions: []natsjs.Option{natsjs.WithStorage(storage)},
		NoDedup:           true,
		Logger:            logger,
	}, broker.WithPublishTimeout(time.Minute))
	if err != nil {
		b.Fatal(err)
	}
	defer br.Close(context.Background())
	cnt := newCounter(b.N)
	handler := func(context.Context, broker.Message) error { cnt.add(); return nil }
	// Subscribing creates the durable consumers; they keep what is
	// published while no one reads them.
	sub, err := br.Subscribe("t", "s", handler)
	if err != nil {
		b.Fatal(err)
	}
	if err := sub.Unsubscribe(context.Background()); err != nil {
		b.Fatal(err)
	}
	ids, payload := idTable(b.N), make([]byte, 64)
	publish := func() {
		if batch > 0 {
			msgs := make([]broker.Message, 0, batch)
			for i := range b.N {
				msgs = append(msgs, broker.Message{ID: ids[i], Topic: "t", Payload: payload})
				if len(msgs) == batch || i == b.N-1 {
					if err := br.PublishBatch(context.Background(), msgs); err != nil {
						b.Fatal(err)
					}
					msgs = msgs[:0]
				}
			}
			return
		}
		for i := range b.N {
			if err := br.Publish(context.Background(), broker.Message{ID: ids[i], Topic: "t", Payload: payload}); err != nil {
				b.Fatal(err)
			}
		}
	}
	if publishPhase(b, deliver, publish) {
		return
	}
	b.ResetTimer()
	if _, err := br.Subscribe("t", "s", handler); err != nil {
		b.Fatal(err)
	}
	cnt.wait(b)
	b.StopTimer()
}

func phaseJetStream(b *testing.B, deliver, sync, msgID bool, maxAckPending int) {
	conn, err := natsjs.Embedded(b.TempDir()) // the same embedded server and in-process connection
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(context.Background())
	js, ctx := conn.JetStream(), b.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "S", Subjects: []string{"t"}, Storage: jetstream.MemoryStorage, Retention: jetstream.InterestPolicy,
	}); err != nil {
		b.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "S", jetstream.ConsumerConfig{
		Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: maxAckPending,
	})
	if err != nil {
		b.Fatal(err)
	}
	ids, payload := idTable(b.N), make([]byte, 64)
	publish := func() {
		for i := range b.N {
			if sync {
				var opts []jetstream.PublishOpt
				if msgID {
					opts = append(opts, jetstream.WithMsgID(ids[i]))
				}
				if _, err := js.Publish(ctx, "t", payload, opts...); err != nil {
					b.Fatal(err)
				}
				continue
			}
			for {
				_, err := js.PublishAsync("t", payload)
				if err == nil {
					break
				}
				if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
					b.Fatal(err)
				}
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(phaseWait):
			b.Fatal("async publishes not acknowledged")
		}
	}
	if publishPhase(b, deliver, publish) {
		return
	}
	cnt := newCounter(b.N)
	b.ResetTimer()
	cc, err := cons.Consume(func(m jetstream.Msg) {
		_ = m.Ack()
		cnt.add()
	}, jetstream.PullExpiry(5*time.Second), jetstream.PullHeartbeat(time.Second))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Stop()
	cnt.wait(b)
	b.StopTimer()
}
