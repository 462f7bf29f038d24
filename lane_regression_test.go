package broker

// Regression tests for faults an independent review of the lane found
// (each failed before its fix).

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A worker that took a message while the breaker was closed and then waits
// for a rate-limit token makes no attempt if the breaker opened meanwhile
// (it used to).
func TestLaneNoAttemptWhileBreakerOpensDuringRateLimitWait(t *testing.T) {
	bubble(t, func(t *testing.T) {
		var obs breakerLog
		b := newTestBroker(t, WithObserver(&obs), WithRetryPolicy(RetryPolicy{MaxRetries: 5, Backoff: ConstantBackoff(time.Second)}))
		var attempts stamps
		release := make(chan struct{})
		_, err := b.Subscribe("t", "s", func(context.Context, Message) error {
			attempts.add()
			<-release // the first attempt fails once every worker took a message
			return errBoom
		}, Concurrency(4), RateLimit(1, 1),
			CircuitBreaker(BreakerPolicy{Failures: 1, OpenFor: time.Minute}))
		require.NoError(t, err)
		start := time.Now()
		publishN(t, b, "t", "m", 4)
		idle()
		close(release)
		idle()
		require.Equal(t, BreakerOpen, subStats(t, b, "t", "s").Breaker)
		time.Sleep(30 * time.Second)
		idle()
		require.Equal(t, BreakerOpen, subStats(t, b, "t", "s").Breaker)
		attempts.mu.Lock()
		var during []time.Duration
		for _, at := range attempts.at[1:] {
			during = append(during, at.Sub(start))
		}
		attempts.mu.Unlock()
		t.Logf("breaker path %v", obs.path())
		assert.Empty(t, during, "attempts started while the breaker was open (it opened at 0s for 1 min)")
	})
}

// With several workers, a slow handler holds no message of a free key: an
// idle worker runs them (a worker used to take a batch and run it one by
// one, so messages behind a slow one waited although the other was idle).
func TestLaneSlowHandlerHoldsNoOtherKey(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t)
		gate := make(chan struct{})
		var mu sync.Mutex
		late := 0
		start := time.Time{}
		_, err := b.Subscribe("t", "s", func(_ context.Context, m Message) error {
			switch {
			case m.Key == "gate":
				<-gate
			case m.Key == "slow":
				time.Sleep(time.Minute) // a slow webhook
			case m.ID == "g2":
			default:
				mu.Lock()
				if time.Since(start) > time.Second {
					late++
				}
				mu.Unlock()
			}
			return nil
		}, Concurrency(2))
		require.NoError(t, err)
		// Both workers busy.
		require.NoError(t, b.Publish(context.Background(), Message{ID: "g1", Topic: "t", Key: "gate"}))
		require.NoError(t, b.Publish(context.Background(), Message{ID: "g2", Topic: "t", Key: "gate2"}))
		idle()
		start = time.Now()
		require.NoError(t, b.Publish(context.Background(), Message{ID: "slow", Topic: "t", Key: "slow"}))
		for i := range 100 {
			require.NoError(t, b.Publish(context.Background(), Message{ID: fmt.Sprint("f", i), Topic: "t", Key: fmt.Sprint("k", i)}))
		}
		idle()
		close(gate)
		settle(t, b)
		// g2 handler for key gate2 also waits on gate: fine.
		assert.Zero(t, late, "fast messages of free keys that waited > 1 s behind the slow one while a worker was idle")
	})
}

// DeadLetterOldest sheds the oldest messages waiting (it used to miss the
// ones a worker had taken in a batch, and shed newer ones).
func TestLaneDeadLetterOldestShedsOldestWaiting(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b, gate2 := blockedOnM0(t, 4, LaneSize(4), WhenLaneFull(DeadLetterOldest))
		for _, id := range []string{"x4", "x5", "x6"} {
			require.NoError(t, b.Publish(context.Background(), Message{ID: id, Topic: "t"}))
			idle()
		}
		ss := subStats(t, b, "t", "s")
		t.Logf("queued %d inflight %d", ss.Queued, ss.InFlight)
		var shed []string
		for _, dl := range deadLetters(t, b) {
			shed = append(shed, dl.Message.ID)
		}
		close(gate2)
		settle(t, b)
		// m-0 runs; m-1..m-3 and x4 fill the lane; x5 and x6 shed the oldest.
		assert.Equal(t, []string{"m-1", "m-2"}, shed, "the oldest waiting messages are shed, got %v", fmt.Sprint(shed))
	})
}

// Redrive into a full lane under DeadLetterNewest waits, then fails with
// ErrQueueFull and keeps the dead letter (it used to report it accepted
// and shed it again at once, its original failure lost).
func TestLaneRedriveIntoFullSheddingLaneFailsQueueFull(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t)
		gate := make(chan struct{})
		_, err := b.Subscribe("t", "s", func(_ context.Context, m Message) error {
			if m.ID == "bad" {
				return Permanent(errors.New("bad input"))
			}
			<-gate
			return nil
		}, LaneSize(1), WhenLaneFull(DeadLetterNewest))
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "bad", Topic: "t"}))
		idle()
		dls := deadLetters(t, b)
		require.Len(t, dls, 1)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m-0", Topic: "t"}))
		idle() // m-0 runs
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m-1", Topic: "t"}))
		idle() // m-1 fills the lane
		n, err := b.Redrive(context.Background(), dls[0].ID)
		t.Logf("Redrive = %d, %v", n, err)
		after := deadLetters(t, b)
		for _, dl := range after {
			t.Logf("dead letter %s: %s reason=%s code=%s err=%q", dl.ID, dl.Message.ID, dl.Reason, dl.ErrorCode, dl.Error)
		}
		assert.ErrorIs(t, err, ErrQueueFull, "Redrive's doc: a lane that stayed full wraps ErrQueueFull")
		close(gate)
		settle(t, b)
	})
}

// BlockedOn and BlockedFor are the dispatcher's waits only (a Redrive
// waiting for room used to clear the marker while the dispatcher still
// waited, and add its own wait to BlockedFor).
func TestLaneRedriveLeavesBlockedOnAlone(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithPublishTimeout(time.Second))
		gate := make(chan struct{})
		_, err := b.Subscribe("t", "s", func(_ context.Context, m Message) error {
			if m.ID == "bad" {
				return Permanent(errors.New("bad"))
			}
			<-gate
			return nil
		}, LaneSize(1))
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "bad", Topic: "t"}))
		idle()
		dls := deadLetters(t, b)
		require.Len(t, dls, 1)
		publishN(t, b, "t", "m", 3) // m-0 runs, m-1 fills the lane, m-2 blocks the dispatcher
		idle()
		require.Equal(t, "s", b.Stats().Topics["t"].BlockedOn)
		t0 := time.Now()
		_, err = b.Redrive(context.Background(), dls[0].ID) // waits 1 s for room, gives up
		require.ErrorIs(t, err, ErrQueueFull)
		waited := time.Since(t0)
		st := b.Stats().Topics["t"]
		assert.Equal(t, "s", st.BlockedOn, "the dispatcher still waits for s")
		assert.Equal(t, waited, st.Subscribers["s"].BlockedFor, "BlockedFor is the dispatcher's wait")
		close(gate)
		settle(t, b)
	})
}

// Messages a worker took in a batch and has not started count in OldestAge
// as they do in Queued (they used to be left out of OldestAge).
func TestLaneOldestAgeCountsTakenMessages(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b, gate2 := blockedOnM0(t, 10)
		time.Sleep(time.Minute)
		idle()
		ss := subStats(t, b, "t", "s")
		t.Logf("queued %d inflight %d oldest %v", ss.Queued, ss.InFlight, ss.OldestAge)
		assert.Equal(t, 9, ss.Queued)
		assert.GreaterOrEqual(t, ss.OldestAge, time.Minute, "9 messages waited a minute")
		close(gate2)
		settle(t, b)
	})
}

// blockedOnM0 returns a broker whose subscriber "s" of topic "t" (with
// opts) runs m-0 of n messages m-0..m-(n-1) and blocks in it until the
// returned channel is closed; the others were queued while a first message
// held the worker, so they were taken with m-0 when the lane allows it.
func blockedOnM0(t *testing.T, n int, opts ...SubscribeOption) (*Broker, chan struct{}) {
	b := newTestBroker(t)
	gate1, gate2 := make(chan struct{}), make(chan struct{})
	_, err := b.Subscribe("t", "s", func(_ context.Context, m Message) error {
		switch m.ID {
		case "gate":
			<-gate1
		case "m-0":
			<-gate2
		}
		return nil
	}, opts...)
	require.NoError(t, err)
	require.NoError(t, b.Publish(context.Background(), Message{ID: "gate", Topic: "t"}))
	idle()
	publishN(t, b, "t", "m", n)
	idle()
	close(gate1) // the worker goes on to m-0, which blocks
	idle()
	return b, gate2
}

// Direct lane stress: a producer's pushWait races a worker's start on a full
// lane of capacity 1 whose only message was taken (local). After start the
// lane is empty, so the producer must get in.
var spinSink atomic.Int64

func TestLaneStartPushWaitRace(t *testing.T) {
	var routed atomic.Uint64
	var shed atomic.Int64
	lost := 0
	for i := 0; i < 50000 && lost == 0; i++ {
		l := newLane(1, 1, 1, Block, false, nil, false)
		l.routed, l.shed = &routed, &shed
		if err := l.pushWait(laneItem{env: envelope{msg: Message{ID: "a"}}}, false, nil, nil, nil, nil, nil, nil); err != nil {
			t.Fatal(err)
		}
		var buf [laneBatch]laneItem
		if got, _, _ := l.take(buf[:0]); len(got) != 1 {
			t.Fatal("take")
		}
		var go1 atomic.Bool
		done := make(chan error, 1)
		stop := make(chan struct{})
		go func() {
			for !go1.Load() {
			}
			err := l.pushWait(laneItem{env: envelope{msg: Message{ID: "b"}}}, false, stop, nil, nil, nil, nil, func(time.Duration) {})
			done <- err
		}()
		go1.Store(true)
		for k := 0; k < i%400; k++ {
			spinSink.Add(1)
		}
		l.start() // the worker starts its message: the lane is empty now
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second): // a lost wake-up waits for ever; a loaded machine only late
			lost++
			l.mu.Lock()
			t.Logf("iteration %d: producer still waits; waiting=%d local=%d running=%d roomWanted=%v", i, l.waitingLocked(), l.local.Load(), l.running.Load(), l.room.Wanted())
			l.mu.Unlock()
			close(stop)
			<-done
		}
	}
	if lost > 0 {
		t.Fatalf("lost wake-up: the producer waited for room in an empty lane")
	}
}
