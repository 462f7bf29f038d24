// Package bench compares the broker with the channel floor, the design
// article's naive broker, Watermill's GoChannel and embedded NATS (core and
// JetStream) on the same workloads with the same harness. See README.md.
package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Workload is the shape of one benchmark cell.
type Workload struct {
	Name        string        // short name, e.g. "W1"
	Title       string        // what it is, for the table
	Topics      int           // topics
	Subs        int           // subscribers per topic
	Publishers  int           // concurrent publisher goroutines (each owns topics t with t%Publishers == p)
	Concurrency int           // workers per subscriber
	Work        time.Duration // handler time per delivery (busy-wait, or time.Sleep with SleepWork; 0: no-op)
	SleepWork   bool          // Work sleeps (an I/O-bound handler) instead of busy-waiting (a CPU-bound one)
	FailEvery   int           // message seq%FailEvery == 0 fails its first attempt at every subscriber (0: none)
	// FailingSubs is how many subscribers of each topic (the first ones)
	// fail every attempt; a cell is then timed to the last delivery at the
	// others. Implementations retry such a failure MaxRetries (2) times,
	// RetryBackoff apart, then give up on the message.
	FailingSubs  int
	RetryBackoff time.Duration
	PayloadSize  int     // payload bytes (at least 8)
	Scale        float64 // message count relative to the run's base count (0 means 1)
}

// Messages returns the number of messages a cell of w publishes for a base
// count n: n·Scale rounded to a multiple of Topics, at least one per topic.
func (w Workload) Messages(n int) int {
	s := w.Scale
	if s == 0 {
		s = 1
	}
	m := int(float64(n) * s)
	per := max(m/w.Topics, 1)
	return per * w.Topics
}

// Workloads are the table's rows, in order.
var Workloads = []Workload{
	{Name: "W1", Title: "1 topic, 1 sub, no-op, 64 B", Topics: 1, Subs: 1, Publishers: 1, Concurrency: 1, PayloadSize: 64},
	{Name: "W2", Title: "1 topic, 8 subs (fan-out)", Topics: 1, Subs: 8, Publishers: 1, Concurrency: 1, PayloadSize: 64},
	{Name: "W3", Title: "64 topics × 1 sub, 4 publishers", Topics: 64, Subs: 1, Publishers: 4, Concurrency: 1, PayloadSize: 64},
	{Name: "W4", Title: "1 sub, concurrency 8, 50 µs handler", Topics: 1, Subs: 1, Publishers: 1, Concurrency: 8, Work: 50 * time.Microsecond, PayloadSize: 64, Scale: 0.4},
	{Name: "W5", Title: "1% of messages fail once, 0 backoff", Topics: 1, Subs: 1, Publishers: 1, Concurrency: 1, FailEvery: 100, PayloadSize: 64},
	{Name: "W6/4KiB", Title: "W1 with 4 KiB payload", Topics: 1, Subs: 1, Publishers: 1, Concurrency: 1, PayloadSize: 4 << 10},
	{Name: "W6/64KiB", Title: "W1 with 64 KiB payload", Topics: 1, Subs: 1, Publishers: 1, Concurrency: 1, PayloadSize: 64 << 10, Scale: 0.4},
	{Name: "W7", Title: "2 subs, one failing every attempt (2 retries, 10 ms apart)", Topics: 1, Subs: 2, Publishers: 1, Concurrency: 1,
		FailingSubs: 1, RetryBackoff: 10 * time.Millisecond, PayloadSize: 64},
}

// Shapes are extra rows, not in the default table (name them with
// -workloads): the three shapes the hot path is tuned on, so that a
// pairs.sh round gives each implementation's ratio to the floor on them.
// P1 is W1's shape; P2 and P3 are W2 and W3 with fewer subscribers and
// topics (W2 has 8 subscribers, W3 64 topics).
var Shapes = []Workload{
	{Name: "P1", Title: "1 topic, 1 sub, no-op (W1's shape)", Topics: 1, Subs: 1, Publishers: 1, Concurrency: 1, PayloadSize: 64},
	{Name: "P2", Title: "1 topic, 4 subs (fan-out)", Topics: 1, Subs: 4, Publishers: 1, Concurrency: 1, PayloadSize: 64},
	{Name: "P3", Title: "16 topics × 1 sub, 4 publishers", Topics: 16, Subs: 1, Publishers: 4, Concurrency: 1, PayloadSize: 64},
}

// W7MaxRetries is how often implementations retry a W7 failure.
const W7MaxRetries = 2

// ErrNotMeasured is wrapped by what an implementation returns for a
// workload it has no fair way to run; the report prints "n/a" and the
// reason as a note.
var ErrNotMeasured = errors.New("not measured")

func errNotMeasured(why string) error { return fmt.Errorf("%w: %s", ErrNotMeasured, why) }

// WorkloadByName returns the workload called name, Shapes included.
func WorkloadByName(name string) (Workload, bool) {
	for _, w := range append(Workloads[:len(Workloads):len(Workloads)], Shapes...) {
		if w.Name == name {
			return w, true
		}
	}
	return Workload{}, false
}

// Env is what an implementation gets to build one instance for one cell.
type Env struct {
	Workload
	PerTopic   int      // messages per topic: seq runs 0..PerTopic-1 on every topic
	TopicNames []string // topic i's name (letters, digits and dots only)
	IDs        []string // IDs[seq] is the decimal seq, for message IDs (ParseSeq reads it back)

	payload  []byte   // shared payload (throughput cells)
	payloads [][]byte // one payload per seq (queued-memory cells); seq is in the first 8 bytes
	handle   func(sub, seq int) error
	fail     func(error)
}

// Sub returns the global index of subscriber j of topic t, as Handle wants it.
func (e *Env) Sub(t, j int) int { return t*e.Subs + j }

// Handle must be called for every delivery attempt of message seq at
// subscriber sub. A non-nil error is an injected failure (workload W5): the
// implementation retries the message its own natural way.
func (e *Env) Handle(sub, seq int) error { return e.handle(sub, seq) }

// Payload returns the payload of message seq. Throughput cells share one
// payload between all messages (in-process brokers pass it by reference); it
// must not be modified. Its first 8 bytes are not meaningful: an
// implementation that copies payloads may write seq there (see PutSeq).
func (e *Env) Payload(seq int) []byte {
	if e.payloads != nil {
		return e.payloads[seq]
	}
	return e.payload
}

// DistinctPayloads reports whether each message has its own payload with
// its seq already written in the first 8 bytes.
func (e *Env) DistinctPayloads() bool { return e.payloads != nil }

// Fail aborts the cell with err (an asynchronous error an implementation
// noticed, such as a NATS slow consumer).
func (e *Env) Fail(err error) { e.fail(err) }

// PutSeq writes seq into the first 8 bytes of p.
func PutSeq(p []byte, seq int) { binary.LittleEndian.PutUint64(p, uint64(seq)) }

// GetSeq reads what PutSeq wrote.
func GetSeq(p []byte) int {
	if len(p) < 8 {
		return -1
	}
	return int(binary.LittleEndian.Uint64(p))
}

// ParseSeq parses a decimal ID from Env.IDs; -1 when it is not one.
func ParseSeq(id string) int {
	if id == "" || len(id) > 18 {
		return -1
	}
	n := 0
	for i := 0; i < len(id); i++ {
		c := id[i]
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// Instance is one running implementation, built for one cell.
type Instance interface {
	// Publish publishes message seq to topic from publisher goroutine pub.
	// It may block for backpressure but must return when ctx ends.
	Publish(ctx context.Context, pub, topic, seq int) error
	// Close releases everything the instance started.
	Close(ctx context.Context) error
}

// Diagnoser is implemented by instances that can say something useful
// about a failed cell (reconnects, slow-consumer events...).
type Diagnoser interface{ Diagnose() string }

// Flusher is implemented by instances that buffer publishes to send them
// in batches: the harness calls Flush for each publisher after its last
// Publish, and the cell's time includes it.
type Flusher interface {
	Flush(ctx context.Context, pub int) error
}

// PublishRetrier is implemented by instances that retry a publish the
// broker refused for backpressure (ErrQueueFull and the like).
type PublishRetrier interface{ PublishRetries() uint64 }

// Impl is one implementation under test.
type Impl struct {
	Name string
	// New builds an instance for env: topics, subscribers and workers, all
	// ready to receive before it returns. The handler is env.Handle.
	New func(env *Env) (Instance, error)
	// Note, if not nil, says how the implementation maps workload w, for the
	// report's notes ("" when nothing to say).
	Note func(w Workload) string
	// Extra implementations (variants for diagnosis) are left out of
	// Impls, and so of the default table; name them to run them.
	Extra bool
}

var (
	implsMu sync.Mutex
	impls   []Impl
)

func register(i Impl) {
	implsMu.Lock()
	defer implsMu.Unlock()
	impls = append(impls, i)
}

// Impls returns the implementations of the table, in table order.
func Impls() []Impl {
	var out []Impl
	for _, i := range AllImpls() {
		if !i.Extra {
			out = append(out, i)
		}
	}
	return out
}

// AllImpls returns every implementation, extras (diagnostic variants) last.
func AllImpls() []Impl {
	implsMu.Lock()
	defer implsMu.Unlock()
	order := map[string]int{"floor": 0, "naive": 1, "broker": 2, "watermill": 3, "nats": 4, "jetstream": 5}
	rank := func(i Impl) int {
		if r, ok := order[i.Name]; ok {
			return r
		}
		return len(order)
	}
	out := append([]Impl(nil), impls...)
	for i := 1; i < len(out); i++ { // insertion sort: table order, then extras by name
		for j := i; j > 0 && (rank(out[j]) < rank(out[j-1]) || rank(out[j]) == rank(out[j-1]) && out[j].Name < out[j-1].Name); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// ImplByName returns the implementation called name, extras included.
func ImplByName(name string) (Impl, bool) {
	for _, i := range AllImpls() {
		if i.Name == name {
			return i, true
		}
	}
	return Impl{}, false
}

// Result is one cell's measurement.
type Result struct {
	Impl, Workload string
	Messages       int           // published
	Deliveries     int           // Messages × healthy subscribers per topic
	Elapsed        time.Duration // first publish to last first-time delivery
	NsPerMsg       float64       // Elapsed / Messages
	AllocsPerMsg   float64       // heap allocations / Messages
	BytesPerMsg    float64       // heap bytes allocated / Messages
	OutOfOrder     uint64        // deliveries of a seq lower than one the subscriber already had, summed over subscribers
	Duplicates     uint64        // deliveries of a seq the subscriber already had
	Injected       uint64        // injected failures (W5)
	PublishRetries uint64        // publishes retried after a backpressure refusal
	Err            error         // nil when every subscriber got every message in time
}

// DeliveriesPerSec is the throughput the chart draws.
func (r Result) DeliveriesPerSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Deliveries) / r.Elapsed.Seconds()
}

// Options tune RunCell.
type Options struct {
	Timeout time.Duration // the whole cell, setup to close (default 60s)
	// OnStart and OnStop run right before the first publish and right after
	// the last delivery (testing.B uses them to time only the run).
	OnStart, OnStop func()
}

var errInjected = errors.New("bench: injected failure")

// ErrTimeout is wrapped by a cell's error when it did not finish in time.
var ErrTimeout = errors.New("timeout")

// subState is one subscriber's tracking, padded against false sharing.
type subState struct {
	seen   []atomic.Uint32
	failed []atomic.Bool
	maxSeq atomic.Int64
	got    atomic.Int64
	ooo    atomic.Uint64
	dups   atomic.Uint64
	_      [64]byte
}

// tracker checks every delivery of a cell.
type tracker struct {
	subs      []subState
	want      int64
	work      time.Duration
	sleep     bool
	failEvery int
	failing   int           // subscribers of each topic (the first ones) that fail every attempt
	perTopic  int           // subscribers per topic
	gate      chan struct{} // if not nil, Handle waits for it to close (queued-memory cells)

	left     atomic.Int64
	injected atomic.Uint64
	bad      atomic.Uint64 // deliveries with an impossible seq
	started  atomic.Int64  // nanoseconds since epoch0 at the first publish
	elapsed  atomic.Int64  // nanoseconds from start to the last first-time delivery
	done     chan struct{}

	failOnce sync.Once
	failErr  error
	failed   chan struct{}
}

var epoch0 = time.Now()

func newTracker(env *Env) *tracker {
	n := env.Topics * env.Subs
	tr := &tracker{
		subs:      make([]subState, n),
		want:      int64(env.PerTopic),
		work:      env.Work,
		sleep:     env.SleepWork,
		failEvery: env.FailEvery,
		failing:   env.FailingSubs,
		perTopic:  env.Subs,
		done:      make(chan struct{}),
		failed:    make(chan struct{}),
	}
	for i := range tr.subs {
		s := &tr.subs[i]
		s.seen = make([]atomic.Uint32, env.PerTopic)
		if env.FailEvery > 0 {
			s.failed = make([]atomic.Bool, env.PerTopic)
		}
		s.maxSeq.Store(-1)
	}
	tr.left.Store(int64(n - env.Topics*min(env.FailingSubs, env.Subs)))
	return tr
}

func (tr *tracker) fail(err error) {
	tr.failOnce.Do(func() {
		tr.failErr = err
		close(tr.failed)
	})
}

func (tr *tracker) handle(sub, seq int) error {
	if tr.gate != nil {
		<-tr.gate
	}
	if tr.work > 0 {
		if tr.sleep {
			time.Sleep(tr.work)
		} else {
			spin(tr.work)
		}
	}
	if sub < 0 || sub >= len(tr.subs) || seq < 0 || seq >= int(tr.want) {
		tr.bad.Add(1)
		tr.fail(fmt.Errorf("delivery of seq %d to subscriber %d: out of range", seq, sub))
		return nil
	}
	s := &tr.subs[sub]
	if sub%tr.perTopic < tr.failing {
		tr.injected.Add(1)
		return errInjected
	}
	if tr.failEvery > 0 && seq%tr.failEvery == 0 && s.failed[seq].CompareAndSwap(false, true) {
		tr.injected.Add(1)
		return errInjected
	}
	if s.seen[seq].Add(1) > 1 {
		s.dups.Add(1)
		return nil
	}
	for {
		m := s.maxSeq.Load()
		if int64(seq) < m {
			s.ooo.Add(1)
			break
		}
		if s.maxSeq.CompareAndSwap(m, int64(seq)) {
			break
		}
	}
	if s.got.Add(1) == tr.want {
		if tr.left.Add(-1) == 0 {
			tr.elapsed.Store(int64(time.Since(epoch0)) - tr.started.Load())
			close(tr.done)
		}
	}
	return nil
}

// spin busy-waits for d: a CPU-bound handler of a precise length (a short
// time.Sleep on Linux lasts anywhere from d to about a millisecond,
// depending on what else the process is doing, which would favour whichever
// implementation keeps the scheduler busiest).
func spin(d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
	}
}

// missing describes which subscribers are short, for a failure message.
func (tr *tracker) missing() string {
	short, got, want := 0, int64(0), int64(0)
	for i := range tr.subs {
		g := tr.subs[i].got.Load()
		got += g
		want += tr.want
		if g < tr.want {
			short++
		}
	}
	return fmt.Sprintf("%d/%d subscribers short, %d/%d deliveries", short, len(tr.subs), got, want)
}

var (
	idsMu sync.Mutex
	ids   []string
)

// idTable returns at least n decimal IDs, built once and reused so building
// them is never measured.
func idTable(n int) []string {
	idsMu.Lock()
	defer idsMu.Unlock()
	for len(ids) < n {
		ids = append(ids, strconv.Itoa(len(ids)))
	}
	return ids[:n:n]
}

func newEnv(w Workload, messages int) *Env {
	if w.Topics < 1 {
		w.Topics = 1
	}
	if w.Subs < 1 {
		w.Subs = 1
	}
	if w.Publishers < 1 {
		w.Publishers = 1
	}
	w.Publishers = min(w.Publishers, w.Topics)
	if w.Concurrency < 1 {
		w.Concurrency = 1
	}
	w.PayloadSize = max(w.PayloadSize, 8)
	per := max(messages/w.Topics, 1)
	env := &Env{Workload: w, PerTopic: per, IDs: idTable(per), TopicNames: make([]string, w.Topics)}
	for t := range env.TopicNames {
		env.TopicNames[t] = "t" + strconv.Itoa(t)
	}
	return env
}

// RunCell runs impl on workload w with the given number of messages (all
// topics together) and checks that every subscriber got every message. It
// never hangs: the whole cell is bounded by opts.Timeout, and a cell that
// did not finish comes back with an error wrapping ErrTimeout.
func RunCell(impl Impl, w Workload, messages int, opts Options) (res Result) {
	if opts.Timeout <= 0 {
		opts.Timeout = 60 * time.Second
	}
	env := newEnv(w, messages)
	res = Result{Impl: impl.Name, Workload: w.Name, Messages: env.PerTopic * env.Topics}
	res.Deliveries = res.Messages * (env.Subs - min(env.FailingSubs, env.Subs))
	env.payload = make([]byte, env.PayloadSize)
	tr := newTracker(env)
	env.handle, env.fail = tr.handle, tr.fail

	deadline := time.Now().Add(opts.Timeout)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()

	inst, err := newInstance(ctx, impl, env)
	if err != nil {
		res.Err = err
		return res
	}
	defer func() {
		if d, ok := inst.(Diagnoser); ok && res.Err != nil {
			if s := d.Diagnose(); s != "" {
				res.Err = fmt.Errorf("%w [%s]", res.Err, s)
			}
		}
		if err := closeInstance(inst, deadline); err != nil && res.Err == nil {
			res.Err = err
		}
		if r, ok := inst.(PublishRetrier); ok {
			res.PublishRetries = r.PublishRetries()
		}
	}()

	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	if opts.OnStart != nil {
		opts.OnStart()
	}
	tr.started.Store(int64(time.Since(epoch0)))
	publishAll(ctx, inst, env, tr)

	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-tr.done:
	case <-tr.failed:
	case <-timer.C:
	}
	if opts.OnStop != nil {
		opts.OnStop()
	}
	runtime.ReadMemStats(&m1)

	select {
	case <-tr.done:
		res.Elapsed = time.Duration(tr.elapsed.Load())
	default:
	}
	n := float64(res.Messages)
	res.NsPerMsg = float64(res.Elapsed.Nanoseconds()) / n
	res.AllocsPerMsg = float64(m1.Mallocs-m0.Mallocs) / n
	res.BytesPerMsg = float64(m1.TotalAlloc-m0.TotalAlloc) / n
	for i := range tr.subs {
		res.OutOfOrder += tr.subs[i].ooo.Load()
		res.Duplicates += tr.subs[i].dups.Load()
	}
	res.Injected = tr.injected.Load()

	select {
	case <-tr.failed:
		res.Err = fmt.Errorf("%w (%s)", tr.failErr, tr.missing())
	case <-tr.done:
	default:
		res.Err = fmt.Errorf("%w after %v (%s)", ErrTimeout, opts.Timeout, tr.missing())
	}
	return res
}

// newInstance builds an instance, giving up at ctx's deadline.
func newInstance(ctx context.Context, impl Impl, env *Env) (Instance, error) {
	type built struct {
		inst Instance
		err  error
	}
	ch := make(chan built, 1)
	go func() {
		inst, err := impl.New(env)
		ch <- built{inst, err}
	}()
	select {
	case b := <-ch:
		if b.err != nil {
			return nil, fmt.Errorf("setup: %w", b.err)
		}
		return b.inst, nil
	case <-ctx.Done():
		go func() { // close it whenever it shows up
			if b := <-ch; b.inst != nil {
				_ = b.inst.Close(context.Background())
			}
		}()
		return nil, fmt.Errorf("setup: %w", ErrTimeout)
	}
}

// closeInstance closes inst, waiting at most until deadline (and at least a
// couple of seconds); a Close that does not return is left running and reported.
func closeInstance(inst Instance, deadline time.Time) error {
	d := max(time.Until(deadline), 2*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	ch := make(chan error, 1)
	go func() { ch <- inst.Close(ctx) }()
	select {
	case err := <-ch:
		if err != nil {
			return fmt.Errorf("close: %w", err)
		}
		return nil
	case <-time.After(d + time.Second):
		return fmt.Errorf("close: %w (left running)", ErrTimeout)
	}
}

// pubRun is a running set of publishers.
type pubRun struct {
	done chan struct{} // closed when every publisher returned
	err  error         // the first publish error; read after done
}

// publishAll starts the publishers and returns at once.
func publishAll(ctx context.Context, inst Instance, env *Env, tr *tracker) *pubRun {
	pr := &pubRun{done: make(chan struct{})}
	var (
		wg   sync.WaitGroup
		once sync.Once
	)
	for p := range env.Publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := range env.PerTopic {
				for t := p; t < env.Topics; t += env.Publishers {
					if err := inst.Publish(ctx, p, t, seq); err != nil {
						once.Do(func() { pr.err = err })
						tr.fail(fmt.Errorf("publish seq %d to topic %d: %w", seq, t, err))
						return
					}
				}
			}
			if f, ok := inst.(Flusher); ok {
				if err := f.Flush(ctx, p); err != nil {
					once.Do(func() { pr.err = err })
					tr.fail(fmt.Errorf("flush publisher %d: %w", p, err))
				}
			}
		}()
	}
	go func() { wg.Wait(); close(pr.done) }()
	return pr
}

// QueuedResult is the memory held per queued message.
type QueuedResult struct {
	Impl    string
	Payload int
	Queued  int
	PerMsg  float64 // bytes of heap and stack held per queued message, beyond the payloads the publisher already holds
	Idle    float64 // bytes of heap and stack the idle instance holds (after setup, nothing queued)
	Err     error
}

// RunQueued publishes q messages of payload bytes each (each its own
// payload, allocated before measuring) to one topic with one subscriber
// whose handler is blocked, lets the implementation settle, and measures how
// much heap and stack it holds per queued message. Then it releases the
// handler and checks that every message arrives.
func RunQueued(impl Impl, payload, q int, timeout time.Duration) (res QueuedResult) {
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	w := Workload{Name: "W6q", Topics: 1, Subs: 1, Publishers: 1, Concurrency: 1, PayloadSize: payload}
	env := newEnv(w, q)
	res = QueuedResult{Impl: impl.Name, Payload: env.PayloadSize, Queued: env.PerTopic}
	env.payloads = make([][]byte, env.PerTopic)
	for i := range env.payloads {
		env.payloads[i] = make([]byte, env.PayloadSize)
		PutSeq(env.payloads[i], i)
	}
	tr := newTracker(env)
	tr.gate = make(chan struct{})
	env.handle, env.fail = tr.handle, tr.fail
	var gateOnce sync.Once
	openGate := func() { gateOnce.Do(func() { close(tr.gate) }) }
	defer openGate()

	settle := func() uint64 { // GC until the heap stops moving (goroutines of the previous cell may still be ending)
		var ms runtime.MemStats
		prev := uint64(0)
		for i := range 20 {
			runtime.GC()
			runtime.ReadMemStats(&ms)
			cur := ms.HeapAlloc + ms.StackInuse
			if i > 0 && max(cur, prev)-min(cur, prev) < 2<<10 {
				return cur
			}
			prev = cur
			time.Sleep(25 * time.Millisecond)
		}
		return prev
	}
	empty := settle()

	deadline := time.Now().Add(timeout)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	inst, err := newInstance(ctx, impl, env)
	if err != nil {
		res.Err = err
		return res
	}
	defer func() {
		openGate()
		if err := closeInstance(inst, deadline); err != nil && res.Err == nil {
			res.Err = err
		}
	}()
	time.Sleep(50 * time.Millisecond)
	before := settle()
	res.Idle = float64(before) - float64(empty)
	pr := publishAll(ctx, inst, env, tr)
	select { // publishing must not block: every implementation holds q messages
	case <-pr.done:
	case <-tr.failed:
	case <-ctx.Done():
	}
	time.Sleep(200 * time.Millisecond)
	after := settle()
	res.PerMsg = (float64(after) - float64(before)) / float64(res.Queued)
	openGate()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-tr.done:
	case <-tr.failed:
		res.Err = fmt.Errorf("%w (%s)", tr.failErr, tr.missing())
	case <-timer.C:
		res.Err = fmt.Errorf("%w (%s)", ErrTimeout, tr.missing())
	}
	return res
}

// Sweep points of the chart.
var (
	SweepSubs   = []int{1, 2, 4, 8, 16, 32, 64}
	SweepTopics = []int{1, 4, 16, 64, 256}
)

// SubsWorkload is the chart's left panel at subs subscribers: one topic,
// one publisher, no-op handlers, 64 B payload.
func SubsWorkload(subs int) Workload {
	return Workload{Name: fmt.Sprintf("subs=%d", subs), Title: "1 topic, fan-out", Topics: 1, Subs: subs, Publishers: 1, Concurrency: 1, PayloadSize: 64}
}

// TopicsWorkload is the chart's right panel at topics topics: one
// subscriber each, min(4, topics) publishers, no-op handlers, 64 B payload.
func TopicsWorkload(topics int) Workload {
	return Workload{Name: fmt.Sprintf("topics=%d", topics), Title: "1 sub per topic", Topics: topics, Subs: 1, Publishers: min(4, topics), Concurrency: 1, PayloadSize: 64}
}
