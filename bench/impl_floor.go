package bench

import (
	"context"
	"sync"
)

// floor: buffered Go channels, one per subscriber, with its own goroutine(s);
// the publisher fans out itself. Nothing between the publisher and the
// handler but a channel send: the physical limit of this design.

const floorBuffer = 1024 // the broker's default queue size

type floorMsg struct {
	ID      string
	Payload []byte
}

type floorInst struct {
	env   *Env
	chans [][]chan floorMsg // by topic, then subscriber
	wg    sync.WaitGroup
}

func init() {
	register(Impl{
		Name: "floor",
		New:  newFloor,
		Note: func(w Workload) string {
			switch {
			case w.Concurrency > 1:
				return "floor: one channel read by 8 goroutines"
			case w.FailEvery > 0:
				return "floor: app-level inline retry in the consumer goroutine"
			}
			return ""
		},
	})
}

func newFloor(env *Env) (Instance, error) {
	if env.FailingSubs > 0 {
		return nil, errNotMeasured("the floor has no retry or give-up policy to compare")
	}
	f := &floorInst{env: env, chans: make([][]chan floorMsg, env.Topics)}
	for t := range f.chans {
		f.chans[t] = make([]chan floorMsg, env.Subs)
		for j := range f.chans[t] {
			ch := make(chan floorMsg, floorBuffer)
			f.chans[t][j] = ch
			sub := env.Sub(t, j)
			for range env.Concurrency {
				f.wg.Add(1)
				go func() {
					defer f.wg.Done()
					for m := range ch {
						seq := ParseSeq(m.ID)
						for env.Handle(sub, seq) != nil {
						}
					}
				}()
			}
		}
	}
	return f, nil
}

func (f *floorInst) Publish(ctx context.Context, _, topic, seq int) error {
	m := floorMsg{ID: f.env.IDs[seq], Payload: f.env.Payload(seq)}
	for _, ch := range f.chans[topic] {
		select {
		case ch <- m:
		default:
			select {
			case ch <- m:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

func (f *floorInst) Close(ctx context.Context) error {
	for _, subs := range f.chans {
		for _, ch := range subs {
			close(ch)
		}
	}
	return waitCtx(ctx, &f.wg)
}

// waitCtx waits for wg until ctx ends.
func waitCtx(ctx context.Context, wg *sync.WaitGroup) error {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
