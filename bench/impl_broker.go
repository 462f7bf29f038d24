package bench

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/inproc/broker"
)

// broker: this library with its defaults (dedup on, stats on, default
// queue and lane sizes), a discarding logger, and a publish timeout long
// enough that Publish never gives up; an ErrQueueFull would be retried and
// counted. broker-nodedup (an extra, not in the default table) is the same
// with WithIdempotencyStore(nil), to show what deduplication costs.
// broker-observer (an extra) is broker with an Observer whose hooks do
// nothing, to show what watching the broker costs by itself.

type brokerInst struct {
	env     *Env
	b       *broker.Broker
	retries atomic.Uint64
}

func init() {
	register(Impl{
		Name:  "broker-nodedup",
		New:   func(env *Env) (Instance, error) { return newBroker(env, broker.WithIdempotencyStore(nil)) },
		Extra: true,
	})
	register(Impl{
		Name:  "broker-observer",
		New:   func(env *Env) (Instance, error) { return newBroker(env, broker.WithObserver(nopObserver{})) },
		Extra: true,
	})
	register(Impl{
		Name: "broker",
		New:  func(env *Env) (Instance, error) { return newBroker(env) },
		Note: func(w Workload) string {
			switch {
			case w.Concurrency > 1:
				return "broker: Concurrency(8)"
			case w.FailEvery > 0:
				return "broker: RetryPolicy{MaxRetries: 2, Backoff: ConstantBackoff(0)}"
			case w.FailingSubs > 0:
				return "broker: RetryPolicy{MaxRetries: 2, Backoff: ConstantBackoff(10ms)}; the failing subscriber has WhenLaneFull(DeadLetterNewest): at this rate its parked retries (rate × 20 ms) overflow any lane, and under Block the topic would move at lane/backoff"
			}
			return ""
		},
	})
}

// nopObserver is an Observer that ignores every event: its own type, not
// broker.NopObserver, so that it costs what any observer's dispatch costs.
type nopObserver struct{ broker.NopObserver }

func newBroker(env *Env, extra ...broker.Option) (Instance, error) {
	opts := []broker.Option{
		broker.WithLogger(slog.New(slog.DiscardHandler)),
		broker.WithPublishTimeout(time.Minute),
	}
	if env.FailEvery > 0 {
		opts = append(opts, broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: 2, Backoff: broker.ConstantBackoff(0)}))
	}
	if env.FailingSubs > 0 {
		opts = append(opts, broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: W7MaxRetries, Backoff: broker.ConstantBackoff(env.RetryBackoff)}))
	}
	b, err := broker.New(append(opts, extra...)...)
	if err != nil {
		return nil, err
	}
	bi := &brokerInst{env: env, b: b}
	for t, name := range env.TopicNames {
		for j := range env.Subs {
			sub := env.Sub(t, j)
			sopts := []broker.SubscribeOption{broker.Concurrency(env.Concurrency)}
			if j < env.FailingSubs {
				sopts = append(sopts, broker.WhenLaneFull(broker.DeadLetterNewest))
			}
			if _, err := b.Subscribe(name, "s"+strconv.Itoa(j), func(_ context.Context, m broker.Message) error {
				return env.Handle(sub, ParseSeq(m.ID))
			}, sopts...); err != nil {
				_ = b.Close(context.Background())
				return nil, err
			}
		}
	}
	return bi, nil
}

func (bi *brokerInst) Publish(ctx context.Context, _, topic, seq int) error {
	msg := broker.Message{ID: bi.env.IDs[seq], Topic: bi.env.TopicNames[topic], Payload: bi.env.Payload(seq)}
	for {
		err := bi.b.Publish(ctx, msg)
		if !errors.Is(err, broker.ErrQueueFull) || ctx.Err() != nil {
			return err
		}
		bi.retries.Add(1)
	}
}

func (bi *brokerInst) PublishRetries() uint64 { return bi.retries.Load() }

func (bi *brokerInst) Close(ctx context.Context) error { return bi.b.Close(ctx) }
