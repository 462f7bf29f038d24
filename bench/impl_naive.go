package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"
	"unsafe"

	"github.com/inproc/broker/bench/internal/naive"
)

// naive: the design article's broker (internal/naive): per-topic channel,
// one dispatcher goroutine per topic, serial delivery to the topic's
// subscribers with inline retry.

type naiveInst struct {
	env     *Env
	b       *naive.Broker
	payload string // the article's Payload is a string (shared payload, viewed without a copy)
}

func init() {
	register(Impl{
		Name: "naive",
		New:  newNaive,
		Note: func(w Workload) string {
			switch {
			case w.Concurrency > 1:
				return "naive: no concurrency option, delivers serially (1 worker)"
			case w.FailEvery > 0:
				return "naive: the article's inline retry (maxRetry 2), backoff 0 instead of its 50ms·n sleep"
			case w.FailingSubs > 0:
				return "naive: not run; its inline retry holds the topic's dispatcher for every backoff (see the cell)"
			case w.PayloadSize > 64:
				return "naive: Payload is a string as in the article (a view of the bytes, no copy)"
			}
			return ""
		},
	})
}

func newNaive(env *Env) (Instance, error) {
	if env.FailingSubs > 0 {
		return nil, errNotMeasured(fmt.Sprintf("its dispatcher retries inline, so each message holds the topic for %v of backoff: %d messages would take %v",
			W7MaxRetries*env.RetryBackoff, env.PerTopic, time.Duration(env.PerTopic)*W7MaxRetries*env.RetryBackoff))
	}
	n := &naiveInst{env: env, payload: bytesToString(env.Payload(0))}
	n.b = naive.NewBroker(floorBuffer, 2, func(int) time.Duration { return 0 },
		func(topic, sub string, m naive.Message, err error) {
			env.Fail(fmt.Errorf("naive dropped %s at %s/%s: %w", m.ID, topic, sub, err))
		})
	for t, name := range env.TopicNames {
		for j := range env.Subs {
			sub := env.Sub(t, j)
			if err := n.b.Subscribe(name, "s"+strconv.Itoa(j), func(_ context.Context, m naive.Message) error {
				return env.Handle(sub, ParseSeq(m.ID))
			}); err != nil {
				return nil, err
			}
		}
	}
	return n, nil
}

func (n *naiveInst) Publish(ctx context.Context, _, topic, seq int) error {
	p := n.payload
	if n.env.DistinctPayloads() {
		p = bytesToString(n.env.Payload(seq))
	}
	return n.b.Publish(ctx, naive.Message{ID: n.env.IDs[seq], Topic: n.env.TopicNames[topic], Payload: p})
}

func (n *naiveInst) Close(ctx context.Context) error {
	done := make(chan struct{})
	go func() { n.b.Close(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// bytesToString views b as a string without copying: the harness never
// modifies payloads, so the article's string Payload costs nothing extra.
func bytesToString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
