package bench

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
)

// watermill: Watermill's GoChannel pub/sub with the zero Config a user gets
// from the docs (OutputChannelBuffer 0, BlockPublishUntilSubscriberAck
// false, Persistent false): Publish does not wait; each message is handed to
// each subscriber by a goroutine of its own that waits for the Ack (or, on
// Nack, sends it again). A subscriber is one Subscribe channel read by
// Concurrency goroutines, each calling msg.Ack() (msg.Nack() on failure).

type watermillInst struct {
	env    *Env
	ps     *gochannel.GoChannel
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func init() {
	register(Impl{
		Name: "watermill",
		New:  newWatermill,
		Note: func(w Workload) string {
			switch {
			case w.Concurrency > 1:
				return "watermill: one Subscribe channel read by 8 goroutines, Ack each"
			case w.FailEvery > 0:
				return "watermill: Nack, GoChannel sends the message again at once"
			case w.FailingSubs > 0:
				return "watermill: the failing handler sleeps 10 ms and Nacks, up to 2 retries, then Acks (gives up); GoChannel's goroutine per message and subscriber keeps the other subscriber flowing"
			}
			return ""
		},
	})
}

func newWatermill(env *Env) (Instance, error) {
	ctx, cancel := context.WithCancel(context.Background())
	wi := &watermillInst{env: env, cancel: cancel,
		ps: gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})}
	for t, name := range env.TopicNames {
		for j := range env.Subs {
			sub := env.Sub(t, j)
			ch, err := wi.ps.Subscribe(ctx, name)
			if err != nil {
				_ = wi.Close(context.Background())
				return nil, err
			}
			if j < env.FailingSubs {
				wi.wg.Add(1)
				go wi.failing(ch, sub)
				continue
			}
			for range env.Concurrency {
				wi.wg.Add(1)
				go func() {
					defer wi.wg.Done()
					for msg := range ch {
						if env.Handle(sub, ParseSeq(msg.UUID)) != nil {
							msg.Nack()
						} else {
							msg.Ack()
						}
					}
				}()
			}
		}
	}
	return wi, nil
}

// failing reads a W7 failing subscriber: each message is retried after a
// sleep of the backoff (Nack), at most W7MaxRetries times, then given up
// (Ack).
func (wi *watermillInst) failing(ch <-chan *message.Message, sub int) {
	defer wi.wg.Done()
	tries := map[string]int{}
	for msg := range ch {
		if wi.env.Handle(sub, ParseSeq(msg.UUID)) == nil {
			msg.Ack()
			continue
		}
		if tries[msg.UUID]++; tries[msg.UUID] > W7MaxRetries {
			delete(tries, msg.UUID)
			msg.Ack()
			continue
		}
		time.Sleep(wi.env.RetryBackoff)
		msg.Nack()
	}
}

func (wi *watermillInst) Publish(_ context.Context, _, topic, seq int) error {
	return wi.ps.Publish(wi.env.TopicNames[topic], message.NewMessage(wi.env.IDs[seq], wi.env.Payload(seq)))
}

func (wi *watermillInst) Close(ctx context.Context) error {
	wi.cancel()
	err := wi.ps.Close()
	if werr := waitCtx(ctx, &wi.wg); err == nil {
		err = werr
	}
	return err
}
