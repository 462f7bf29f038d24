package broker

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inproc/broker/internal/fifo"
	"github.com/inproc/broker/internal/queue"
)

// This file is a subscriber's lane: the messages routed to it and not yet
// finished, in four states.
//
//	routed ──► queued ──► running ──► (delivered, deduplicated, dead-lettered)
//	  │          ▲           │
//	  ▼          │           ▼ failed, will be retried
//	held ────────┘        parked ──(backoff ends)──► queued
//
// Queued messages wait for any idle worker, in arrival order. A message
// whose ordering key (see orderingKey) is taken by an earlier message —
// queued, running or parked — is held behind it, in order, and queued when
// the earlier one ends. A failed attempt that will be retried parks on a
// timer, keeping its key, and its worker goes on with the next queued
// message. Queued, held and parked messages count against the lane's
// capacity; what happens to a message that does not fit is the
// subscriber's FullLanePolicy. A message a dead-letter policy sheds waits
// in the lane's overflowed ring for the subscription's shedder goroutine to
// dead-letter it, so that the topic's dispatcher, which shed it, goes on
// at once instead of waiting on the dead-letter store.

// FullLanePolicy is what a subscriber's lane does with a message routed to
// it when it is full (its queued, held and parked messages reach its
// capacity).
type FullLanePolicy int

const (
	// Block makes the topic's dispatcher wait for room: the subscriber's
	// backlog pushes back on the topic's publishers (Publish waits, then
	// returns ErrQueueFull), and on its other subscribers. The default.
	Block FullLanePolicy = iota
	// DeadLetterNewest dead-letters the message that does not fit, with
	// reason "overflow", at this subscriber only; the topic flows on.
	DeadLetterNewest
	// DeadLetterOldest makes room by dead-lettering the oldest message
	// waiting in the lane (queued first, then held, then parked), with
	// reason "overflow", at this subscriber only; the topic flows on.
	DeadLetterOldest
)

// String returns the policy's name: block, dead_letter_newest or
// dead_letter_oldest.
func (p FullLanePolicy) String() string {
	switch p {
	case Block:
		return "block"
	case DeadLetterNewest:
		return "dead_letter_newest"
	case DeadLetterOldest:
		return "dead_letter_oldest"
	}
	return fmt.Sprintf("FullLanePolicy(%d)", int(p))
}

// How shedding works: the subscriber's own goroutine (the shedder) stores
// the shed messages' dead letters, in the order shed, taking up to 64 at a
// time; a stop at once dead-letters those the shedder has not taken
// meanwhile. When as many shed messages as the lane's capacity wait for it
// (besides the up to 64 it is storing), the dispatcher waits for room.

// WhenLaneFull sets what the subscriber's lane does with a message that does
// not fit (default Block). Block keeps every message and slows the topic;
// the dead-letter policies keep the topic flowing and shed at this
// subscriber only, each shed message a dead letter that can be redriven.
// A shed message counts as in flight until its dead letter is stored, and
// holds its ordering key until then: a later message of its Key starts
// only after that. A shed copy of an ID already delivered at the
// subscriber ends deduplicated instead. Should the dead-letter store fall
// behind by about a lane's capacity of shed messages, the topic's
// dispatcher waits for it, as under Block.
//
// Over a transport (WithTransport) the stream is the buffer and a full one
// refuses the publish (ErrQueueFull): Subscribe refuses any policy but
// Block with ErrInvalidOption; size the stream with the transport's
// limits (natsjs: WithQueueSize).
func WhenLaneFull(p FullLanePolicy) SubscribeOption {
	return func(c *subConfig) error {
		if p < Block || p > DeadLetterOldest {
			return fmt.Errorf("%w: unknown full-lane policy %d", ErrInvalidOption, int(p))
		}
		c.whenFull = p
		return nil
	}
}

// laneItem is a message in a lane.
type laneItem struct {
	env      envelope // env.msg.Attempt: the attempts made so far
	redriven bool     // a redriven dead letter: no dedup check
	last     *step    // the failure that parked it; nil before any
}

// parked is a message waiting out its backoff.
type parked struct {
	it    laneItem
	timer *time.Timer
}

// lane is a subscriber's messages and what its workers may take. Every
// field is guarded by mu.
type lane struct {
	mu       sync.Mutex
	work     sync.Cond // workers wait here for a message
	capacity int
	// ready is the most messages that may wait ready to run (queued or
	// local) when the dispatcher adds one; the rest of the capacity is
	// room for parked retries and messages held behind their key. The
	// default lane is 8,192 with 1,024 ready: a failing subscriber parks
	// what arrives at 1,000 messages/s through the default retries, while
	// a slow one buffers no more ready work than the topic queue does (8,192
	// ready made W3 about 24% slower than 1,024, bench/ab.sh HEAD
	// 'Workloads/W3/broker$' 300000x 8, p=0.007: memory, no gain).
	ready   int
	policy  FullLanePolicy
	ordered bool // keyless messages share one ordering key

	queued fifo.Ring[laneItem]
	keys   map[string]keyHold // taken ordering keys
	held   int                // messages waiting behind a key (in keys)
	parked map[*parked]struct{}
	idle   int // workers waiting on work
	batch  int // most messages one take hands a worker (64 for a lone worker, else 1)

	// A lone worker takes up to batch queued messages under one lock and
	// starts them one by one: until it starts one, a message is local, and
	// counts as queued and against the capacity. local and running move
	// without the lock; room.Wanted tells a worker starting a message that a
	// producer waits for room. (The lane's first version took one message
	// per lock: W1 +38% against the old per-worker lanes, bench/ab.sh, six
	// rounds; batching brought it back, and these atomics are its price.)
	local   atomic.Int64
	running atomic.Int64
	// localSince is the PublishedAt (Unix nanoseconds) of the first message
	// of the last batch taken: no message still local is older.
	localSince atomic.Int64

	// claimed is set (under mu) when a stopped subscription's Unsubscribe
	// took the messages it was owed that the dispatcher had not routed yet
	// (topic.claimOwed): the dispatcher's later pushes of them are no-ops
	// that count as routed there, so each ends once.
	claimed atomic.Bool

	closed  bool          // no more pushes; workers finish what is left
	stopped bool          // stopped at once: workers return, the stopper dead-letters the rest
	room    queue.Room    // producers waiting for room
	br      *breaker      // nil: none
	shed    *atomic.Int64 // the subscriber's in-flight count: a shed message counts there until it is dead-lettered

	// overflowed are messages shed from the full lane, waiting for the
	// subscription's shedder to dead-letter them (reason "overflow"), at
	// most capacity of them (the shedder holds up to laneBatch more, taken
	// from here): when it is full, a message that does not fit waits for
	// room as under Block (see pushLocked). They count as in flight
	// (shed), not against the capacity. shedding says a shedder runs
	// (started by startShedder, under mu); a closed lane is done only once
	// it ended.
	overflowed   fifo.Ring[cutJob]
	shedding     bool
	startShedder func()
	routed       *atomic.Uint64 // the subscriber's routed count, moved as a message enters (so Stats balance while a push waits)
}

// keyHold is a taken ordering key: n messages own it, and the messages of
// the key that came after them wait behind, in order. An owner is the
// message of the key in the lane (queued, running or parked) or a shed one
// whose dead letter is not stored yet: a later message of the key never
// starts before they all ended.
type keyHold struct {
	n       int
	waiting fifo.Ring[laneItem]
}

// laneBatch is the most messages a worker takes under one lock.
const laneBatch = 64

func newLane(capacity, ready, workers int, policy FullLanePolicy, ordered bool, br *breaker, limited bool) *lane {
	l := &lane{
		capacity: capacity, ready: min(ready, capacity), policy: policy, ordered: ordered, br: br,
		batch:  laneBatch,
		keys:   make(map[string]keyHold),
		parked: make(map[*parked]struct{}),
	}
	if br != nil || limited || workers > 1 || policy == DeadLetterOldest {
		// One at a time: with several workers, a batch taken by one whose
		// handler is slow would hold messages of free keys that another
		// idle worker could run; a breaker or a rate limit decides each
		// take at its moment; DeadLetterOldest must see every waiting
		// message to shed the oldest.
		l.batch = 1
	}
	l.work.L = &l.mu
	if br != nil {
		br.mu, br.wake = &l.mu, l.work.Signal
	}
	return l
}

// orderingKey returns the message's ordering key: its Key; for a keyless
// message, "" when the lane is ordered (the topic is the key), or none.
func (l *lane) orderingKey(m *Message) (string, bool) {
	if m.Key != "" {
		return m.Key, true
	}
	return "", l.ordered
}

// waiting is how many messages count against the capacity.
func (l *lane) waitingLocked() int {
	return l.queued.Len() + l.held + len(l.parked) + int(l.local.Load())
}

// fullLocked reports that the dispatcher may not add a message: the lane
// holds its capacity, or its most ready messages.
func (l *lane) fullLocked() bool {
	return l.waitingLocked() >= l.capacity || l.queued.Len()+int(l.local.Load()) >= l.ready
}

// doneLocked reports that a closed lane has nothing left to do.
func (l *lane) doneLocked() bool {
	return l.closed && l.waitingLocked() == 0 && !l.shedding && l.running.Load() == 0
}

// pushLocked adds it if there is room. When the lane is full it returns
// queue.ErrFull under Block; under a dead-letter policy it makes the
// message fit and hands the one shed to the shedder (overflowed), unless
// capacity shed messages wait already: then it returns queue.ErrFull too,
// and the caller waits for room as under Block. After close or stop it
// returns queue.ErrClosed. With noShed (a redrive), a full lane returns
// queue.ErrFull whatever the policy.
func (l *lane) pushLocked(it laneItem, noShed bool) error {
	if !it.redriven && l.claimed.Load() {
		return nil // its Unsubscribe dead-lettered it (claimOwed)
	}
	if l.closed || l.stopped {
		return queue.ErrClosed
	}
	if l.fullLocked() {
		if noShed || l.policy == Block || l.overflowed.Len() >= l.capacity {
			return queue.ErrFull
		}
		l.shed.Add(1)
		victim, owner, ok := l.evictOldestLocked()
		if !ok { // DeadLetterNewest, or nothing waits: everything is running
			l.routed.Add(1)
			l.overflowLocked(it, false)
			return nil
		}
		l.overflowLocked(victim, owner)
	}
	n := l.queued.Len()
	l.addLocked(it)
	l.routed.Add(1)
	l.wakeLocked(l.queued.Len() - n)
	return nil
}

// overflowLocked hands it, shed, to the shedder, which it starts if none
// runs. Its ordering key stays taken until its dead letter is stored
// (shedEnded): if it owned the key in the lane (owner), the shed copy owns
// it in its place; else it is one owner more. (Messages held behind the key
// before it was shed wait for its dead letter as well: later than needed,
// never too early.)
func (l *lane) overflowLocked(it laneItem, owner bool) {
	if k, ok := l.orderingKey(&it.env.msg); ok && !owner {
		h := l.keys[k]
		h.n++
		l.keys[k] = h
	}
	l.overflowed.Push(cutJob{it: it, kind: cutOverflowed})
	if !l.shedding {
		l.shedding = true
		l.startShedder()
	}
}

// shedEnded says that the dead letter of it, shed, is stored (or given up
// at a stop): it no longer owns its ordering key.
func (l *lane) shedEnded(it *laneItem) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releaseLocked(it)
}

// takeShed appends to buf up to laneBatch shed messages for the shedder to
// dead-letter, making room for a producer that waits. When there are none
// it returns buf unchanged, and the shedder, which must return, no longer
// counts as running.
func (l *lane) takeShed(buf []cutJob) []cutJob {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.overflowed.Len() > 0 {
		l.room.Open()
		return l.overflowed.PopN(buf, laneBatch)
	}
	l.shedding = false
	if l.doneLocked() {
		l.work.Broadcast() // the workers waited for the shedder
	}
	return buf
}

// pushN pushes envs, in order, while they fit without waiting or shedding
// (none after close or stop), and returns how many it pushed.
func (l *lane) pushN(envs []envelope) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.claimed.Load() {
		return len(envs) // its Unsubscribe dead-lettered them (claimOwed)
	}
	if l.closed || l.stopped {
		return 0
	}
	k := min(len(envs), max(l.capacity-l.waitingLocked(), 0), max(l.ready-l.queued.Len()-int(l.local.Load()), 0))
	queued := l.queued.Len()
	for i := range envs[:k] {
		l.addLocked(laneItem{env: envs[i]})
	}
	l.routed.Add(uint64(k))
	l.wakeLocked(l.queued.Len() - queued)
	return k
}

// addLocked queues it, or holds it behind its key, without waking a
// worker (see wakeLocked).
func (l *lane) addLocked(it laneItem) {
	if k, ok := l.orderingKey(&it.env.msg); ok {
		if h, busy := l.keys[k]; busy {
			h.waiting.Push(it)
			l.keys[k] = h
			l.held++
			return
		}
		l.keys[k] = keyHold{n: 1}
	}
	l.queued.Push(it)
}

// wakeLocked wakes up to n idle workers, for n messages newly queued.
func (l *lane) wakeLocked(n int) {
	for range min(n, l.idle) {
		l.work.Signal()
	}
}

// enqueueLocked makes it available to the workers.
func (l *lane) enqueueLocked(it laneItem) {
	l.queued.Push(it)
	l.wakeLocked(1)
}

// releaseLocked says that it no longer owns its ordering key: once no
// message owns the key, the next message held behind it is queued, owning
// it. (A stop dropped every key: nothing to release then.)
func (l *lane) releaseLocked(it *laneItem) {
	k, ok := l.orderingKey(&it.env.msg)
	h, taken := l.keys[k]
	if !ok || !taken {
		return
	}
	if h.n--; h.n > 0 {
		l.keys[k] = h
		return
	}
	next, ok := h.waiting.Pop()
	if !ok {
		delete(l.keys, k)
		return
	}
	h.n = 1
	l.keys[k] = h
	l.held--
	l.enqueueLocked(next)
}

// evictOldestLocked removes, under DeadLetterOldest, the oldest message
// waiting — queued, else held, else parked; owner says it owned its
// ordering key (queued or parked), which it keeps (see overflowLocked). ok
// is false under another policy or when none waits.
func (l *lane) evictOldestLocked() (_ laneItem, owner, ok bool) {
	if l.policy != DeadLetterOldest {
		return laneItem{}, false, false
	}
	if it, ok := l.queued.Pop(); ok {
		return it, true, true
	}
	var oldest *laneItem
	var key string
	for k, h := range l.keys {
		if w := h.waiting.Front(); w != nil && (oldest == nil || w.env.msg.PublishedAt.Before(oldest.env.msg.PublishedAt)) {
			oldest, key = w, k
		}
	}
	if oldest != nil {
		h := l.keys[key]
		it, _ := h.waiting.Pop()
		l.keys[key] = h
		l.held--
		return it, false, true
	}
	var first *parked
	for p := range l.parked {
		if first == nil || p.it.env.msg.PublishedAt.Before(first.it.env.msg.PublishedAt) {
			first = p
		}
	}
	if first == nil {
		return laneItem{}, false, false
	}
	first.timer.Stop() // if it fired, its callback finds it gone
	delete(l.parked, first)
	return first.it, true, true
}

// pushWait pushes it (see pushLocked), waiting for room when the lane is
// full and the policy blocks (or noShed, or capacity shed messages wait
// already) until stop1 or stop2 is closed (queue.ErrStopped) or deadline
// fires (queue.ErrTimeout); any may be nil. While it waits it runs the
// requests that arrive on serve (nil: none). beforeWait, if not nil, runs
// once before the first wait, and blocked receives the time spent waiting.
// nil means the message is the subscriber's: in the lane, or shed for the
// shedder (it or, under DeadLetterOldest, an older one); an error, that it
// was not routed.
func (l *lane) pushWait(it laneItem, noShed bool, stop1, stop2 <-chan struct{}, deadline <-chan time.Time,
	serve <-chan func(), beforeWait func(start time.Time), blocked func(time.Duration)) (err error) {
	var start time.Time
	for {
		l.mu.Lock()
		err = l.pushLocked(it, noShed)
		if err == queue.ErrFull {
			// Say so before looking again: a worker that starts a message
			// (and so makes room) without the lock reads room.Wanted after
			// lowering local (see start); one of the two sees the other.
			l.room.Want()
			if err = l.pushLocked(it, noShed); err != queue.ErrFull {
				l.room.Found()
			}
		}
		if err != queue.ErrFull {
			l.mu.Unlock()
			if !start.IsZero() {
				blocked(time.Since(start))
			}
			return err
		}
		room := l.room.Wait()
		l.mu.Unlock()
		if start.IsZero() {
			start = time.Now()
			if beforeWait != nil {
				beforeWait(start)
			}
		}
		select {
		case <-room:
			continue
		case f := <-serve:
			f()
			continue
		case <-stop1:
			err = queue.ErrStopped
		case <-stop2:
			err = queue.ErrStopped
		case <-deadline:
			err = queue.ErrTimeout
		}
		blocked(time.Since(start))
		return err
	}
}

// take waits for messages a worker may run and appends them to buf: up to
// batch of them. probe reports that the
// one message taken is the half-open breaker's probe. ok is false when the
// worker should return: the lane is stopped, or closed with nothing left.
// The worker calls start before it runs each.
func (l *lane) take(buf []laneItem) (_ []laneItem, probe, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		if l.stopped {
			return buf, false, false
		}
		if n := l.queued.Len(); n > 0 && (l.br == nil || l.br.allows()) {
			k := min(l.batch, n)
			first := len(buf)
			buf = l.queued.PopN(buf, k)
			l.localSince.Store(buf[first].env.msg.PublishedAt.UnixNano())
			l.local.Add(int64(k))
			if l.br != nil {
				probe = l.br.took()
			}
			return buf, probe, true
		}
		if l.doneLocked() {
			l.work.Broadcast() // the other workers are done too
			if l.br != nil {
				l.br.stopTimer()
			}
			return buf, false, false
		}
		l.idle++
		l.work.Wait()
		l.idle--
	}
}

// start moves a message the worker took from local to running: room for
// one more in the lane.
func (l *lane) start() {
	l.running.Add(1)
	l.local.Add(-1)
	if l.room.Wanted() {
		l.mu.Lock()
		if !l.fullLocked() {
			l.room.Open()
		}
		l.mu.Unlock()
	}
}

// mayRun reports whether the worker may attempt it, which it took while
// the breaker let it and then waited (for a rate-limit token): if the
// breaker opened meanwhile, it is put back in front of the queue, and the
// worker goes back to take.
func (l *lane) mayRun(it *laneItem, probe bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if probe || l.br.state == BreakerClosed || l.stopped {
		return true
	}
	l.running.Add(-1)
	l.queued.PushFront(*it)
	return false
}

// finish ends a worker's turn with it: it ended (its key is freed) or it
// parks for delay. It returns the breaker's transition, if any (changed is
// "" when there was none), for the caller to report. orphan reports that
// the lane was stopped while it ran and it did not end: it is still
// running, and the caller dead-letters it, then calls dropped.
func (l *lane) finish(it *laneItem, ended bool, delay time.Duration, h health, probe bool) (from, changed BreakerState, orphan bool) {
	if ended && l.br == nil {
		if _, keyed := l.orderingKey(&it.env.msg); !keyed {
			// Nothing to free and nothing to tell: the worker's next take
			// looks at the lane under its lock. (Kept for speed: taking
			// the lock here made W1 14% and W2 11% slower, medians of ten
			// alternating runs of 200000x.)
			l.running.Add(-1)
			return "", "", false
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.br != nil {
		from = l.br.state
		changed = l.br.record(h, probe, time.Now())
		switch changed {
		case BreakerOpen:
			l.br.stopTimer() // arm starts it again
		case BreakerClosed:
			l.work.Broadcast()
		case "":
			if probe && l.queued.Len() > 0 {
				l.work.Signal() // no verdict: another message probes
			}
		}
	}
	switch {
	case ended:
		l.releaseLocked(it)
	case l.stopped:
		return from, changed, true
	case delay <= 0:
		// Retry at once: queued behind what waits now, with no timer. (A
		// 0-delay AfterFunc inside a synctest bubble takes the runtime's
		// run-now path, where one -race chaos run of 6,000 crashed with a
		// SIGSEGV in runtime.(*timer).modify on Go 1.26.8.)
		l.enqueueLocked(*it)
	default:
		p := &parked{it: *it}
		l.parked[p] = struct{}{}
		p.timer = time.AfterFunc(delay, func() { l.unpark(p) })
	}
	l.running.Add(-1)
	return from, changed, false
}

// dropped ends an orphan (see finish) once the caller dead-lettered it.
func (l *lane) dropped() { l.running.Add(-1) }

// unpark is a parked message's timer callback: its backoff ended, it is
// queued again (behind what is queued now). It does nothing if the message
// was taken out of the lane meanwhile (shed, or stopped).
func (l *lane) unpark(p *parked) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.parked[p]; !ok {
		return
	}
	delete(l.parked, p)
	l.enqueueLocked(p.it)
}

// close refuses further pushes; the workers finish what is left.
func (l *lane) close() {
	l.mu.Lock()
	l.closed = true
	l.room.Open()
	l.work.Broadcast()
	l.mu.Unlock()
}

// claim marks the lane claimed (see lane.claimed).
func (l *lane) claim() {
	l.mu.Lock()
	l.claimed.Store(true)
	l.mu.Unlock()
}

// stop refuses further pushes, makes the workers return after their
// current attempt, and takes every message that waits (queued, held,
// parked) out of the lane for the caller to dead-letter. inFlight is called
// with their number, under the lane's lock, so that they count as in
// flight before they stop counting as queued. It also returns the shed
// messages the shedder has not taken (they count as in flight already),
// for the caller to dead-letter as overflowed.
func (l *lane) stop(inFlight func(int)) (waiting []laneItem, overflowed []cutJob) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed, l.stopped = true, true
	l.room.Open()
	if l.br != nil {
		l.br.stopped = true
		l.br.stopTimer()
	}
	out := l.queued.PopN(make([]laneItem, 0, l.waitingLocked()), l.queued.Len())
	for _, h := range l.keys {
		out = h.waiting.PopN(out, h.waiting.Len())
	}
	for p := range l.parked {
		p.timer.Stop()
		out = append(out, p.it)
	}
	clear(l.keys)
	clear(l.parked)
	l.held = 0
	inFlight(len(out))
	overflowed = l.overflowed.PopN(nil, l.overflowed.Len())
	l.work.Broadcast()
	return out, overflowed
}

// laneStats is a lane's state at one moment.
type laneStats struct {
	queued, held, parked, running int
	oldest                        time.Time // PublishedAt of the oldest waiting message; zero if none
	breaker                       BreakerState
}

func (l *lane) stats() laneStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := laneStats{
		queued: l.queued.Len() + int(l.local.Load()), held: l.held, parked: len(l.parked),
		running: int(l.running.Load()),
	}
	older := func(t time.Time) {
		if !t.IsZero() && (st.oldest.IsZero() || t.Before(st.oldest)) {
			st.oldest = t
		}
	}
	for i := range l.queued.Len() {
		older(l.queued.At(i).env.msg.PublishedAt)
	}
	for _, h := range l.keys {
		if it := h.waiting.Front(); it != nil {
			older(it.env.msg.PublishedAt)
		}
	}
	for p := range l.parked {
		older(p.it.env.msg.PublishedAt)
	}
	if l.local.Load() > 0 {
		older(time.Unix(0, l.localSince.Load()))
	}
	if l.br != nil {
		st.breaker = l.br.state
	}
	return st
}
