package broker

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gatedStore is a dead-letter store whose Put waits until gate is closed
// (a slow database, say); its Puts are counted as they start.
type gatedStore struct {
	*MemoryDeadLetterStore
	gate chan struct{}
	mu   sync.Mutex
	puts int
}

func (s *gatedStore) Put(ctx context.Context, dl DeadLetter) error {
	s.mu.Lock()
	s.puts++
	s.mu.Unlock()
	<-s.gate
	return s.MemoryDeadLetterStore.Put(ctx, dl)
}

func (s *gatedStore) started() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.puts
}

// A message a dead-letter policy sheds is dead-lettered by the
// subscription's own goroutine: while the dead-letter store takes its time,
// the topic's dispatcher goes on and the neighbour gets every message,
// with up to the lane's capacity of shed messages waiting for the store
// (counted in flight, so Stats balance). Beyond that the dispatcher waits
// for the store, as under Block, and the dead letters keep the order they
// were shed in. (The dispatcher used to call the store itself: the
// neighbour got nothing until the store answered.)
func TestShedWhileTheStoreIsSlow(t *testing.T) {
	for _, policy := range []FullLanePolicy{DeadLetterNewest, DeadLetterOldest} {
		t.Run(policy.String(), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				store := &gatedStore{MemoryDeadLetterStore: NewMemoryDeadLetterStore(0, nil), gate: make(chan struct{})}
				b := newTestBroker(t, WithQueueSize(100), WithPublishTimeout(0), WithDeadLetterStore(store))
				release, _, other := stuckAndOther(t, b, policy)
				// m-1..m-4 fill the lane; 4 more are shed and wait for the
				// store, one of them in its Put.
				for i := 1; i < 9; i++ {
					require.NoError(t, b.Publish(context.Background(), Message{ID: fmt.Sprint("m-", i), Topic: "t"}))
				}
				idle()
				assert.Len(t, other.ids(), 9, "the neighbour got everything while the store was busy")
				assert.Equal(t, 1, store.started(), "one Put at a time, by the shedder")
				st := subStats(t, b, "t", "stuck")
				assert.Equal(t, 1+4, st.InFlight, "m-0 runs, four shed wait for the store")
				requireConserved(t, b.Stats())

				// The shedder took those four (it puts them one by one), so
				// four more fit, waiting for it (capacity 4); the next one
				// waits for the store, and the dispatcher with it.
				for i := 9; i < 14; i++ {
					require.NoError(t, b.Publish(context.Background(), Message{ID: fmt.Sprint("m-", i), Topic: "t"}))
				}
				idle()
				assert.Equal(t, "stuck", b.Stats().Topics["t"].BlockedOn, "past capacity shed messages, the dispatcher waits for the store")
				require.NoError(t, b.Publish(context.Background(), Message{ID: "later", Topic: "t"}))
				idle()
				assert.NotContains(t, other.ids(), "later", "the neighbour waits behind the dispatcher")
				requireConserved(t, b.Stats())

				close(store.gate)
				idle()
				assert.Len(t, other.ids(), 15)
				var shed []string
				for _, dl := range deadLetters(t, b) {
					assert.Equal(t, ReasonOverflow, dl.Reason)
					shed = append(shed, dl.Message.ID)
				}
				want := []string{"m-5", "m-6", "m-7", "m-8", "m-9", "m-10", "m-11", "m-12", "m-13", "later"}
				if policy == DeadLetterOldest {
					want = []string{"m-1", "m-2", "m-3", "m-4", "m-5", "m-6", "m-7", "m-8", "m-9", "m-10"}
				}
				assert.Equal(t, want, shed, "dead-lettered in the order shed")
				close(release)
				settle(t, b)
				requireConserved(t, b.Stats())
			})
		})
	}
}

// Shed messages are never lost to a stop: a Close or an Unsubscribe that
// waits dead-letters each before it returns, though the store takes longer
// than the handlers; a Close whose context ended dead-letters what the
// shedder had not reached (the store answering before the stop's
// deadline), still with reason "overflow" (they
// were shed, not cut off), and does not count them in its DrainError.
func TestShedMessagesAtClose(t *testing.T) {
	for _, stop := range []string{"close", "close at once", "unsubscribe"} {
		t.Run(stop, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				store := &gatedStore{MemoryDeadLetterStore: NewMemoryDeadLetterStore(0, nil), gate: make(chan struct{})}
				b, err := New(WithLogger(discard), WithQueueSize(100), WithPublishTimeout(0), WithDeadLetterStore(store))
				require.NoError(t, err)
				release := make(chan struct{})
				sub, err := b.Subscribe("t", "stuck", func(ctx context.Context, m Message) error {
					select {
					case <-release:
					case <-ctx.Done():
					}
					return nil
				}, LaneSize(2), WhenLaneFull(DeadLetterNewest))
				require.NoError(t, err)
				publishN(t, b, "t", "m", 1) // m-0 runs
				idle()
				for i := 1; i < 6; i++ { // m-1 and m-2 wait, m-3..m-5 are shed
					require.NoError(t, b.Publish(context.Background(), Message{ID: fmt.Sprint("m-", i), Topic: "t"}))
				}
				idle()
				require.Equal(t, 1, store.started())
				storeLate := 2 * time.Minute
				if stop == "close at once" { // the store answers before the stop's deadline
					storeLate = ShutdownGrace / 2
				}
				go func() { // the handlers finish before the store answers
					time.Sleep(storeLate / 2)
					close(release)
					time.Sleep(storeLate / 2)
					close(store.gate)
				}()
				ctx := context.Background()
				if stop == "close at once" {
					var cancel context.CancelFunc
					ctx, cancel = context.WithCancel(ctx)
					cancel()
				}
				if stop == "unsubscribe" {
					err = sub.Unsubscribe(ctx)
				} else {
					err = b.Close(ctx)
				}
				reasons := map[string]string{}
				for _, dl := range deadLetters(t, b) {
					reasons[dl.Message.ID] = dl.Reason
				}
				if stop == "close at once" {
					var de *DrainError
					require.ErrorAs(t, err, &de)
					assert.Equal(t, ReasonOverflow, reasons["m-3"])
					assert.Equal(t, ReasonOverflow, reasons["m-4"])
					assert.Equal(t, ReasonOverflow, reasons["m-5"])
					assert.Equal(t, ReasonShutdown, reasons["m-1"])
					assert.Equal(t, ReasonShutdown, reasons["m-2"])
					assert.Equal(t, 2, de.DeadLettered, "m-1 and m-2 (m-0's handler returned nil when cancelled): the shed ones are not the stop's")
				} else {
					require.NoError(t, err)
					assert.Equal(t, map[string]string{"m-3": ReasonOverflow, "m-4": ReasonOverflow, "m-5": ReasonOverflow}, reasons,
						"every shed message is stored when the stop returns")
				}
				requireConserved(t, b.Stats())
				ss := b.Stats().Topics["t"].Subscribers["stuck"]
				assert.Equal(t, uint64(6), ss.DeadLettered+ss.Delivered)
				assert.Zero(t, ss.InFlight)
				if stop == "unsubscribe" {
					require.NoError(t, b.Close(context.Background()))
				}
			})
		})
	}
}

// downStore fails every Put, after slow for the messages in it (the
// shedder's, say): a store that is down.
type downStore struct {
	*MemoryDeadLetterStore
	slow map[string]time.Duration
}

func (s *downStore) Put(_ context.Context, dl DeadLetter) error {
	time.Sleep(s.slow[dl.Message.ID])
	return errBoom
}

// A stop at once while the store is down loses the dead letters it gives
// up, the shed ones the shedder still holds included: the stop waits (a
// grace at most) for the shedder to give them up, and its DrainError counts
// every one of them in Lost.
func TestShedderLossesCountedAtAStop(t *testing.T) {
	for _, stop := range []string{"close", "unsubscribe"} {
		t.Run(stop, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				store := &downStore{MemoryDeadLetterStore: NewMemoryDeadLetterStore(0, nil),
					slow: map[string]time.Duration{"m-3": 100 * time.Millisecond, "m-4": 100 * time.Millisecond}}
				b, err := New(WithLogger(discard), WithQueueSize(100), WithPublishTimeout(0), WithDeadLetterStore(store))
				require.NoError(t, err)
				sub, err := b.Subscribe("t", "stuck", func(ctx context.Context, m Message) error {
					<-ctx.Done()
					return nil
				}, LaneSize(2), WhenLaneFull(DeadLetterNewest))
				require.NoError(t, err)
				publishN(t, b, "t", "m", 1) // m-0 runs
				idle()
				for i := 1; i < 5; i++ { // m-1 and m-2 wait, the shedder takes m-3 and m-4
					require.NoError(t, b.Publish(context.Background(), Message{ID: fmt.Sprint("m-", i), Topic: "t"}))
				}
				idle()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
				defer cancel()
				if stop == "unsubscribe" {
					err = sub.Unsubscribe(ctx)
				} else {
					err = b.Close(ctx)
				}
				var de *DrainError
				require.ErrorAs(t, err, &de)
				assert.Equal(t, 2, de.DeadLettered, "m-1 and m-2 cut off (m-0's handler returned nil)")
				assert.Equal(t, 4, de.Lost, "m-1 and m-2, and the shed m-3 and m-4: the store refused them all")
				ss := b.Stats().Topics["t"].Subscribers["stuck"]
				assert.Equal(t, uint64(4), ss.DeadLetterErrors)
				requireConserved(t, b.Stats())
				if stop == "unsubscribe" {
					require.NoError(t, b.Close(context.Background()))
				}
			})
		})
	}
}

// goexitOnceStore ends the goroutine of its first Put with runtime.Goexit
// (what t.FailNow in a fake store does), before storing.
type goexitOnceStore struct {
	*MemoryDeadLetterStore
	once sync.Once
}

func (s *goexitOnceStore) Put(ctx context.Context, dl DeadLetter) error {
	exit := false
	s.once.Do(func() { exit = true })
	if exit {
		runtime.Goexit()
	}
	return s.MemoryDeadLetterStore.Put(ctx, dl)
}

// runtime.Goexit in plugged-in code that the shedder calls loses no shed
// message and dead-letters none twice: a store ending the goroutine in its
// first Put (nothing stored: another shedder puts that one and the rest,
// in order), or an Observer ending it after the first dead letter was
// stored and counted (the next shedder goes on from the one after).
func TestShedderGoexit(t *testing.T) {
	tests := []struct {
		name string
		opts func() []Option
	}{
		{"store", func() []Option {
			return []Option{WithDeadLetterStore(&goexitOnceStore{MemoryDeadLetterStore: NewMemoryDeadLetterStore(0, nil)})}
		}},
		{"observer", func() []Option { return []Option{WithObserver(&goexitOnceObserver{})} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b := newTestBroker(t, append([]Option{WithQueueSize(100), WithPublishTimeout(0)}, tt.opts()...)...)
				release := make(chan struct{})
				_, err := b.Subscribe("t", "stuck", func(context.Context, Message) error {
					<-release
					return nil
				}, LaneSize(1), WhenLaneFull(DeadLetterNewest))
				require.NoError(t, err)
				publishN(t, b, "t", "m", 1) // m-0 runs
				idle()
				for i := 1; i < 5; i++ { // m-1 waits, m-2..m-4 are shed
					require.NoError(t, b.Publish(context.Background(), Message{ID: fmt.Sprint("m-", i), Topic: "t"}))
				}
				idle()
				var shed []string
				for _, dl := range deadLetters(t, b) {
					shed = append(shed, dl.Message.ID)
				}
				assert.Equal(t, []string{"m-2", "m-3", "m-4"}, shed, "each shed message dead-lettered once, in order")
				close(release)
				settle(t, b)
				requireConserved(t, b.Stats())
			})
		})
	}
}

// goexitOnceObserver ends the goroutine of the first overflow DeadLettered
// event with runtime.Goexit: the dead letter is stored and counted already.
type goexitOnceObserver struct {
	NopObserver
	once sync.Once
}

func (o *goexitOnceObserver) DeadLettered(ev DeadLetterEvent) {
	if ev.DeadLetter.Reason != ReasonOverflow {
		return
	}
	exit := false
	o.once.Do(func() { exit = true })
	if exit {
		runtime.Goexit()
	}
}

// firstGatedStore holds only its first Put until gate is closed.
type firstGatedStore struct {
	*MemoryDeadLetterStore
	gate chan struct{}
	once sync.Once
}

func (s *firstGatedStore) Put(ctx context.Context, dl DeadLetter) error {
	first := false
	s.once.Do(func() { first = true })
	if first {
		<-s.gate
	}
	return s.MemoryDeadLetterStore.Put(ctx, dl)
}

// An Unsubscribe whose deadline passed while the dispatcher waits for room
// among the shed messages (the store holds its first Put): the message the
// dispatcher was routing is the stop's (reason unsubscribed, in the
// DrainError), the shed ones stay overflow dead letters, none is
// dead-lettered twice, and the neighbour gets everything.
func TestUnsubscribeWhileTheDispatcherWaitsForShedRoom(t *testing.T) {
	// Lane of 1: m-0 runs, m-1 waits; the shedder holds the first shed
	// message in Put, the ring the next, the dispatcher waits with m-4; m-5
	// is still in the topic's queue, owed.
	for _, tc := range []struct {
		policy FullLanePolicy
		want   map[string]string // message ID → dead-letter reason
	}{
		{DeadLetterNewest, map[string]string{"m-1": ReasonUnsubscribed, "m-2": ReasonOverflow, "m-3": ReasonOverflow,
			"m-4": ReasonUnsubscribed, "m-5": ReasonUnsubscribed}},
		{DeadLetterOldest, map[string]string{"m-1": ReasonOverflow, "m-2": ReasonOverflow, "m-3": ReasonUnsubscribed,
			"m-4": ReasonUnsubscribed, "m-5": ReasonUnsubscribed}},
	} {
		policy := tc.policy
		t.Run(policy.String(), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				store := &firstGatedStore{MemoryDeadLetterStore: NewMemoryDeadLetterStore(0, nil), gate: make(chan struct{})}
				b := newTestBroker(t, WithQueueSize(100), WithPublishTimeout(0), WithDeadLetterStore(store))
				s, err := b.Subscribe("t", "stuck", func(ctx context.Context, m Message) error {
					<-ctx.Done()
					return nil
				}, LaneSize(1), WhenLaneFull(policy))
				require.NoError(t, err)
				var other calls
				_, err = b.Subscribe("t", "other", okHandler(&other))
				require.NoError(t, err)
				publishN(t, b, "t", "m", 1)
				idle()
				for i := 1; i < 6; i++ {
					require.NoError(t, b.Publish(context.Background(), Message{ID: fmt.Sprint("m-", i), Topic: "t"}))
				}
				idle()
				require.Equal(t, "stuck", b.Stats().Topics["t"].BlockedOn)
				requireConserved(t, b.Stats())
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				err = s.Unsubscribe(ctx)
				var de *DrainError
				require.ErrorAs(t, err, &de)
				idle()
				requireConserved(t, b.Stats())
				close(store.gate)
				idle()
				settle(t, b)
				requireConserved(t, b.Stats())
				got := map[string]string{}
				for _, dl := range deadLetters(t, b) {
					if _, dup := got[dl.Message.ID]; dup {
						t.Errorf("%s dead-lettered twice", dl.Message.ID)
					}
					got[dl.Message.ID] = dl.Reason
				}
				unsubscribed := 0
				for _, reason := range got {
					if reason == ReasonUnsubscribed {
						unsubscribed++
					}
				}
				assert.Equal(t, de.DeadLettered, unsubscribed, "the DrainError counts the stop's dead letters, not the shed ones: %v", got)
				assert.Equal(t, tc.want, got, "m-0 was delivered (its handler returned nil when cancelled); m-1..m-5 dead-lettered once each")
				assert.Len(t, other.ids(), 6)
				ss := b.Stats().Topics["t"].Subscribers["stuck"]
				assert.Equal(t, uint64(6), ss.Routed)
			})
		})
	}
}
