package brokertest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inproc/broker"
)

// dlFaults are the bugs a sliceStore can be told to have. The zero value is
// a correct store: a second implementation besides the core's, so that the
// suite is shown to accept what the contract allows, not one store's
// details.
type dlFaults struct {
	dropHeaders         bool // Put forgets Message.Headers
	stampZeroTime       bool // Put sets a zero FailedAt to now
	trimNames           bool // Put trims spaces around topic and subscriber names
	unknownIsError      bool // Get of an unknown ID is an error
	acceptEmptyID       bool // Put of a dead letter without ID succeeds
	putAppends          bool // Put of an existing ID adds a second one
	emptyListErrors     bool // List that matches nothing is an error
	newestFirst         bool // List is newest first
	ignoreTopic         bool // List ignores Filter.Topic
	prefixTopic         bool // List matches Filter.Topic as a prefix
	ignoreSubscriber    bool // List ignores Filter.Subscriber
	ignoreCode          bool // List ignores Filter.ErrorCode
	ignoreReason        bool // List ignores Filter.Reason
	prefixReason        bool // List matches Filter.Reason as a prefix
	ignoreLimit         bool // List ignores Filter.Limit
	limitBeforeFilter   bool // List takes Limit dead letters, then filters them
	acceptNegativeLimit bool // List takes a negative Limit as no limit
	deleteUnknownErrors bool // Delete of an unknown ID is an error
	lenCountsDeleted    bool // Len counts every Put, deleted or not
	ignoreContext       bool // methods ignore their context
	lossyConcurrentPut  bool // Put reads and writes the slice in two steps: concurrent Puts lose updates
	newestOldestFirst   bool // ListNewest is oldest first
	newestIgnoresID     bool // ListNewest ignores Query.MessageID
	newestIgnoresTime   bool // ListNewest ignores Query.Since and Until
	newestLimitFirst    bool // ListNewest takes the newest Limit, then filters them
	newestNoValidate    bool // ListNewest takes a malformed query as no bound
}

// sliceStore is a DeadLetterStore over a slice, with optional faults.
type sliceStore struct {
	f    dlFaults
	mu   sync.Mutex // guards the fields below
	dls  []broker.DeadLetter
	puts int
}

var _ broker.DeadLetterStore = (*sliceStore)(nil)

func (s *sliceStore) ctxErr(ctx context.Context) error {
	if s.f.ignoreContext {
		return nil
	}
	return ctx.Err()
}

func (s *sliceStore) Put(ctx context.Context, dl broker.DeadLetter) error {
	if err := s.ctxErr(ctx); err != nil {
		return err
	}
	if dl.ID == "" && !s.f.acceptEmptyID {
		return errors.New("slice store: dead letter without ID")
	}
	if s.f.dropHeaders {
		dl.Message.Headers = nil
	}
	if s.f.stampZeroTime && dl.FailedAt.IsZero() {
		dl.FailedAt = time.Now()
	}
	if s.f.trimNames {
		dl.Message.Topic, dl.Subscriber = strings.TrimSpace(dl.Message.Topic), strings.TrimSpace(dl.Subscriber)
	}
	s.mu.Lock()
	s.puts++
	if !s.f.putAppends {
		s.dls = slices.DeleteFunc(s.dls, func(old broker.DeadLetter) bool { return old.ID == dl.ID })
	}
	if !s.f.lossyConcurrentPut {
		s.dls = append(s.dls, dl)
		s.mu.Unlock()
		return nil
	}
	snapshot := slices.Clone(s.dls)
	s.mu.Unlock()
	runtime.Gosched() // another Put's update is lost when it lands here
	s.mu.Lock()
	s.dls = append(snapshot, dl)
	s.mu.Unlock()
	return nil
}

func (s *sliceStore) List(ctx context.Context, f broker.DeadLetterFilter) ([]broker.DeadLetter, error) {
	if err := s.ctxErr(ctx); err != nil {
		return nil, err
	}
	if f.Limit < 0 && !s.f.acceptNegativeLimit {
		return nil, errors.New("slice store: negative limit")
	}
	s.mu.Lock()
	all := slices.Clone(s.dls)
	s.mu.Unlock()
	if s.f.newestFirst {
		slices.Reverse(all)
	}
	if s.f.limitBeforeFilter && f.Limit > 0 && len(all) > f.Limit {
		all = all[:f.Limit]
	}
	var out []broker.DeadLetter
	for _, dl := range all {
		topicOK := f.Topic == "" || s.f.ignoreTopic || dl.Message.Topic == f.Topic ||
			s.f.prefixTopic && strings.HasPrefix(dl.Message.Topic, f.Topic)
		subOK := f.Subscriber == "" || s.f.ignoreSubscriber || dl.Subscriber == f.Subscriber
		codeOK := f.ErrorCode == "" || s.f.ignoreCode || dl.ErrorCode == f.ErrorCode
		reasonOK := f.Reason == "" || s.f.ignoreReason || dl.Reason == f.Reason ||
			s.f.prefixReason && strings.HasPrefix(dl.Reason, f.Reason)
		if !topicOK || !subOK || !codeOK || !reasonOK {
			continue
		}
		out = append(out, dl)
		if f.Limit > 0 && len(out) == f.Limit && !s.f.ignoreLimit {
			break
		}
	}
	if len(out) == 0 && s.f.emptyListErrors {
		return nil, errors.New("slice store: no rows")
	}
	return out, nil
}

func (s *sliceStore) Get(ctx context.Context, id string) (broker.DeadLetter, bool, error) {
	if err := s.ctxErr(ctx); err != nil {
		return broker.DeadLetter{}, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, dl := range s.dls {
		if dl.ID == id {
			return dl, true, nil
		}
	}
	if s.f.unknownIsError {
		return broker.DeadLetter{}, false, fmt.Errorf("slice store: %q not found", id)
	}
	return broker.DeadLetter{}, false, nil
}

func (s *sliceStore) Delete(ctx context.Context, ids ...string) error {
	if err := s.ctxErr(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		n := len(s.dls)
		s.dls = slices.DeleteFunc(s.dls, func(dl broker.DeadLetter) bool { return dl.ID == id })
		if n == len(s.dls) && s.f.deleteUnknownErrors {
			return fmt.Errorf("slice store: %q not found", id)
		}
	}
	return nil
}

func (s *sliceStore) Len(ctx context.Context) (int, error) {
	if err := s.ctxErr(ctx); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f.lenCountsDeleted {
		return s.puts, nil
	}
	return len(s.dls), nil
}

// idemFaults are the bugs a ttlStore can be told to have; the zero value is
// a correct store whose window is a TTL from Record.
type idemFaults struct {
	seenAlways       bool   // Seen reports true for every key
	recordNoop       bool   // Record remembers nothing
	ignoreTopic      bool   // the key leaves out the topic
	ignoreSubscriber bool   // the key leaves out the subscriber
	joinWith         string // the key joins the names with this separator, unescaped
	joinUnescaped    bool   // use joinWith (so that "" can be tested)
	sortedNames      bool   // the key is the names sorted: their order is lost
	truncateID       int    // the key keeps this many bytes of the ID (0: all)
	caseInsensitive  bool   // the key is lower-cased
	trimSpace        bool   // the key's names are trimmed
	accentFold       bool   // é and a combining acute accent are dropped to e (an accent-insensitive collation)
	sanitize         bool   // characters outside [A-Za-z0-9-] become '_' (a lazy subject-safe encoding)
	neverExpires     bool   // the window is ignored
	earlyBy          int    // expire after window/earlyBy instead (0: on time)
	ignoreContext    bool   // methods ignore their context
	lossyConcurrent  bool   // Record copies the map and stores it back: concurrent Records lose updates
}

// ttlStore is an IdempotencyStore that forgets a key window after Record,
// with optional faults.
type ttlStore struct {
	f      idemFaults
	window time.Duration
	m      atomic.Pointer[map[string]time.Time] // key → expiry; replaced whole under mu (or without, when lossy)
	mu     sync.Mutex
}

var _ broker.IdempotencyStore = (*ttlStore)(nil)

func newTTLStore(window time.Duration, f idemFaults) *ttlStore {
	s := &ttlStore{f: f, window: window}
	s.m.Store(&map[string]time.Time{})
	return s
}

func (s *ttlStore) key(k broker.DeliveryKey) string {
	names := []string{k.Topic, k.Subscriber, k.MessageID}
	if s.f.ignoreTopic {
		names[0] = ""
	}
	if s.f.ignoreSubscriber {
		names[1] = ""
	}
	if s.f.truncateID > 0 && len(names[2]) > s.f.truncateID {
		names[2] = names[2][:s.f.truncateID]
	}
	if s.f.sortedNames {
		slices.Sort(names)
	}
	for i, n := range names {
		if s.f.caseInsensitive {
			n = strings.ToLower(n)
		}
		if s.f.trimSpace {
			n = strings.TrimSpace(n)
		}
		if s.f.accentFold {
			n = strings.NewReplacer("\u00e9", "e", "\u0301", "").Replace(n)
		}
		if s.f.sanitize {
			n = strings.Map(func(r rune) rune {
				if r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
					return r
				}
				return '_'
			}, n)
		}
		names[i] = n
	}
	if s.f.joinUnescaped {
		return strings.Join(names, s.f.joinWith)
	}
	return fmt.Sprintf("%d:%s%d:%s%s", len(names[0]), names[0], len(names[1]), names[1], names[2])
}

func (s *ttlStore) Seen(ctx context.Context, k broker.DeliveryKey) (bool, error) {
	if !s.f.ignoreContext {
		if err := ctx.Err(); err != nil {
			return false, err
		}
	}
	if s.f.seenAlways {
		return true, nil
	}
	exp, ok := (*s.m.Load())[s.key(k)]
	return ok && (s.f.neverExpires || time.Now().Before(exp)), nil
}

func (s *ttlStore) Record(ctx context.Context, k broker.DeliveryKey) error {
	if !s.f.ignoreContext {
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	if s.f.recordNoop {
		return nil
	}
	ttl := s.window
	if s.f.earlyBy > 0 {
		ttl /= time.Duration(s.f.earlyBy)
	}
	if !s.f.lossyConcurrent {
		s.mu.Lock()
		defer s.mu.Unlock()
	}
	m := maps.Clone(*s.m.Load())
	if s.f.lossyConcurrent {
		runtime.Gosched() // another Record's update is lost when it lands here
	}
	m[s.key(k)] = time.Now().Add(ttl)
	s.m.Store(&m)
	return nil
}

var _ broker.DeadLetterLister = (*sliceStore)(nil)

// ListNewest filters a copy of the slice from its end, with the newest*
// faults.
func (s *sliceStore) ListNewest(ctx context.Context, q broker.DeadLetterQuery) ([]broker.DeadLetter, error) {
	if err := s.ctxErr(ctx); err != nil {
		return nil, err
	}
	if err := q.Validate(); err != nil && !s.f.newestNoValidate {
		return nil, err
	}
	s.mu.Lock()
	all := slices.Clone(s.dls)
	s.mu.Unlock()
	if !s.f.newestOldestFirst {
		slices.Reverse(all)
	}
	if s.f.newestLimitFirst && q.Limit > 0 && len(all) > q.Limit {
		all = all[:q.Limit]
	}
	if s.f.newestIgnoresID {
		q.MessageID = ""
	}
	if s.f.newestIgnoresTime {
		q.Since, q.Until = time.Time{}, time.Time{}
	}
	var out []broker.DeadLetter
	for _, dl := range all {
		if !q.Match(dl) {
			continue
		}
		out = append(out, dl)
		if q.Limit > 0 && len(out) == q.Limit {
			break
		}
	}
	return out, nil
}
