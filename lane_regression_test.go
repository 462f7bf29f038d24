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

// With a rate limit, a worker takes a message while the breaker is closed,
// then waits for a token; the breaker opens meanwhile, and the attempt runs
// anyway while the breaker is open.
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

// A worker takes a batch (its "fair share") and runs it one by one: the
// messages behind a slow one in its batch wait for it although the other
// worker is idle and their keys are free.
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

// DeadLetterOldest cannot evict messages sitting in a worker's batch
// (local), which count as queued and against the capacity: it sheds a
// newer message instead of the oldest waiting.
func TestLaneDeadLetterOldestShedsOldestWaiting(t *testing.T) {
	bubble(t, func(t *testing.T) {
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
		}, LaneSize(4), WhenLaneFull(DeadLetterOldest))
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "gate", Topic: "t"}))
		idle()
		publishN(t, b, "t", "m", 4) // m-0..m-3 queued
		idle()
		close(gate1) // the worker takes m-0..m-3 as one batch
		idle()
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

// Redrive into a full lane under DeadLetterNewest: reported as accepted,
// the old dead letter deleted, and the message dead-lettered again at once
// (reason overflow, its original failure gone).
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

// A Redrive that waits for room in a full lane writes the topic's
// "dispatcher blocked" marker: when it gives up it clears the marker while
// the dispatcher still waits, and its own wait is added to BlockedFor.
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

// Messages a worker took in a batch count as Queued but not in OldestAge.
func TestLaneOldestAgeCountsTakenMessages(t *testing.T) {
	bubble(t, func(t *testing.T) {
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
		})
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "gate", Topic: "t"}))
		idle()
		publishN(t, b, "t", "m", 10)
		idle()
		close(gate1) // the worker takes m-0..m-9 as one batch; m-0 blocks
		idle()
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

// Direct lane stress: a producer's pushWait races a worker's start on a full
// lane of capacity 1 whose only message was taken (local). After start the
// lane is empty, so the producer must get in.
var spinSink atomic.Int64

func TestLaneStartPushWaitRace(t *testing.T) {
	var routed atomic.Uint64
	var shed atomic.Int64
	lost := 0
	for i := 0; i < 50000 && lost == 0; i++ {
		l := newLane(1, 1, Block, false, nil, false)
		l.routed, l.shed = &routed, &shed
		if _, _, err := l.push(laneItem{env: envelope{msg: Message{ID: "a"}}}, false); err != nil {
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
			_, _, err := l.pushWait(laneItem{env: envelope{msg: Message{ID: "b"}}}, false, stop, nil, nil, nil, func(time.Duration) {})
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
		case <-time.After(200 * time.Millisecond):
			lost++
			l.mu.Lock()
			t.Logf("iteration %d: producer still waits; waiting=%d local=%d running=%d roomWanted=%v", i, l.waitingLocked(), l.local.Load(), l.running.Load(), l.roomWanted.Load())
			l.mu.Unlock()
			close(stop)
			<-done
		}
	}
	if lost > 0 {
		t.Fatalf("lost wake-up: the producer waited for room in an empty lane")
	}
}
