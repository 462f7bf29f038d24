package broker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A shed copy of an ID already delivered at the subscriber ends
// deduplicated, not as an overflow dead letter: redriving every dead letter
// then runs the ID's handler no second time (the article's check 3).
// Before, each shed copy became a dead letter and redrive ran it again.
func TestShedDuplicateIsDeduplicated(t *testing.T) {
	for _, policy := range []FullLanePolicy{DeadLetterNewest, DeadLetterOldest} {
		t.Run(policy.String(), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b := newTestBroker(t)
				var got calls
				release := make(chan struct{})
				_, err := b.Subscribe("t", "s", recording(&got, func(m Message) error {
					if m.ID == "block" {
						<-release
					}
					return nil
				}), LaneSize(2), WhenLaneFull(policy))
				require.NoError(t, err)
				pub := func(id string) {
					t.Helper()
					require.NoError(t, b.Publish(context.Background(), Message{ID: id, Topic: "t"}))
					idle()
				}
				pub("charge-42")
				pub("block")
				for range 5 { // each finds the lane full: it (or the copy before it) is shed
					pub("charge-42")
				}
				pub("other-1")
				pub("other-2")
				close(release)
				settle(t, b)
				dls := deadLetters(t, b)
				ids := make([]string, 0, len(dls))
				for _, dl := range dls {
					ids = append(ids, dl.ID)
					assert.NotEqual(t, "charge-42", dl.Message.ID, "a delivered ID shed again is not a dead letter")
				}
				_, err = b.Redrive(context.Background(), ids...)
				require.NoError(t, err)
				settle(t, b)
				assert.Len(t, got.attempts("charge-42"), 1, "the side effect happens once")
				ss := subStats(t, b, "t", "s")
				assert.Equal(t, uint64(5), ss.Deduplicated)
				requireConserved(t, b.Stats())
			})
		})
	}
}

// keyLog records when each message's handler started and ended, and when
// each dead letter was stored.
type keyLog struct {
	mu      sync.Mutex
	started map[string]time.Time
	stored  map[string]time.Time
}

// slowKeyStore stores each dead letter a minute after its Put began.
type slowKeyStore struct {
	*MemoryDeadLetterStore
	log *keyLog
}

func (s *slowKeyStore) Put(ctx context.Context, dl DeadLetter) error {
	time.Sleep(time.Minute)
	err := s.MemoryDeadLetterStore.Put(ctx, dl)
	s.log.mu.Lock()
	s.log.stored[dl.Message.ID] = time.Now()
	s.log.mu.Unlock()
	return err
}

// A shed message holds its ordering key until its dead letter is stored:
// k2, published after k1 with the same Key, does not start before k1 has
// ended (I1), under both shedding policies. Before, k1's key was freed
// when it was shed, and k2 ran while k1's Put was still in progress.
func TestShedMessageHoldsItsKeyUntilStored(t *testing.T) {
	for _, policy := range []FullLanePolicy{DeadLetterNewest, DeadLetterOldest} {
		t.Run(policy.String(), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b, log, release, pub := keyedShedding(t, policy, 2, "block")
				pub("block", "x") // runs, and waits
				if policy == DeadLetterNewest {
					pub("f1", "f")
					pub("f2", "g") // the lane is full
					pub("k1", "K") // shed: the newest
				} else {
					pub("k1", "K")
					pub("f1", "f") // the lane is full
					pub("f2", "g") // sheds k1: the oldest
				}
				close(release) // f1 and f2 run, and room appears
				idle()
				pub("k2", "K")
				requireStartedAfterStored(t, b, log, "k1", "k2")
			})
		})
	}
}

// A message shed while an earlier message of its Key runs is one more
// owner of the key: the next message of the Key starts only after both
// ended (the one running, and the shed one's dead letter stored), whether
// it was shed arriving (DeadLetterNewest) or held behind the key
// (DeadLetterOldest, which sheds a held message when none is queued).
func TestShedMessageHoldsItsKeyWhileItsKeyRuns(t *testing.T) {
	for _, policy := range []FullLanePolicy{DeadLetterNewest, DeadLetterOldest} {
		t.Run(policy.String(), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b, log, release, pub := keyedShedding(t, policy, 1, "k1")
				pub("k1", "K") // runs, and waits
				if policy == DeadLetterNewest {
					pub("f1", "f") // the lane is full
					pub("k2", "K") // shed: the newest
				} else {
					pub("k2", "K") // held behind k1: the lane is full
					pub("f1", "f") // sheds k2: the oldest waiting
				}
				close(release) // k1 ends, f1 runs
				idle()
				pub("k3", "K")
				requireStartedAfterStored(t, b, log, "k2", "k3")
			})
		})
	}
}

// keyedShedding is a broker whose subscriber s of topic t has a lane of
// laneSize under policy and a dead-letter store that stores a minute after
// each Put began; its handler records when each message started, and the
// one with ID blocker waits for release. pub publishes a message of key
// and waits until the broker is idle.
func keyedShedding(t *testing.T, policy FullLanePolicy, laneSize int, blocker string) (
	b *Broker, log *keyLog, release chan struct{}, pub func(id, key string)) {
	t.Helper()
	log = &keyLog{started: map[string]time.Time{}, stored: map[string]time.Time{}}
	store := &slowKeyStore{MemoryDeadLetterStore: NewMemoryDeadLetterStore(0, nil), log: log}
	b = newTestBroker(t, WithDeadLetterStore(store))
	release = make(chan struct{})
	_, err := b.Subscribe("t", "s", func(_ context.Context, m Message) error {
		log.mu.Lock()
		log.started[m.ID] = time.Now()
		log.mu.Unlock()
		if m.ID == blocker {
			<-release
		}
		return nil
	}, LaneSize(laneSize), WhenLaneFull(policy))
	require.NoError(t, err)
	pub = func(id, key string) {
		t.Helper()
		require.NoError(t, b.Publish(context.Background(), Message{ID: id, Topic: "t", Key: key}))
		idle()
	}
	return b, log, release, pub
}

// requireStartedAfterStored settles b and checks that shed was shed (stored,
// never started) and that next started no earlier than shed's dead letter
// was stored, with Stats conserved.
func requireStartedAfterStored(t *testing.T, b *Broker, log *keyLog, shed, next string) {
	t.Helper()
	settle(t, b)
	log.mu.Lock()
	defer log.mu.Unlock()
	require.Contains(t, log.stored, shed, "%s was shed", shed)
	require.Contains(t, log.started, next)
	assert.NotContains(t, log.started, shed)
	assert.False(t, log.started[next].Before(log.stored[shed]),
		"%s started at %v, before %s's dead letter was stored at %v", next, log.started[next], shed, log.stored[shed])
	requireConserved(t, b.Stats())
}
