package brokertest

import (
	"context"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"
)

// recorder is a tb that records which subtests failed instead of failing
// the test that runs it, so a suite can be run against a broken store. Like
// testing, it runs each subtest in its own goroutine (Fatalf ends it with
// runtime.Goexit), cancels the subtest's context when it ends, and marks a
// test failed when a subtest failed.
type recorder struct {
	name   string
	log    *runLog
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex // guards the fields below: Errorf may be called from several goroutines
	failed   bool
	children int
	msgs     []string
	cleanups []func()
}

// runLog collects the outcome of every (sub)test of one run, by full name.
type runLog struct {
	mu      sync.Mutex
	results map[string]result
}

type result struct {
	failed, leaf bool
	msgs         []string
}

func newRecorder() *recorder {
	ctx, cancel := context.WithCancel(context.Background())
	return &recorder{log: &runLog{results: map[string]result{}}, ctx: ctx, cancel: cancel}
}

func (r *recorder) Helper()                   {}
func (r *recorder) Logf(string, ...any)       {}
func (r *recorder) Context() context.Context  { return r.ctx }
func (r *recorder) Errorf(f string, a ...any) { r.fail(fmt.Sprintf(f, a...)) }

func (r *recorder) Fatalf(f string, a ...any) {
	r.fail(fmt.Sprintf(f, a...))
	runtime.Goexit()
}

func (r *recorder) Cleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

// runCleanups runs the registered cleanups, the last registered first.
func (r *recorder) runCleanups() {
	for {
		r.mu.Lock()
		n := len(r.cleanups)
		if n == 0 {
			r.mu.Unlock()
			return
		}
		f := r.cleanups[n-1]
		r.cleanups = r.cleanups[:n-1]
		r.mu.Unlock()
		f()
	}
}

func (r *recorder) fail(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
	if msg != "" {
		r.msgs = append(r.msgs, msg)
	}
}

func (r *recorder) run(name string, f func(tb)) bool {
	r.mu.Lock()
	r.children++
	r.mu.Unlock()
	full := name
	if r.name != "" {
		full = r.name + "/" + name
	}
	ctx, cancel := context.WithCancel(r.ctx)
	c := &recorder{name: full, log: r.log, ctx: ctx, cancel: cancel}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer c.runCleanups()
		defer cancel()
		f(c)
	}()
	<-done
	c.mu.Lock()
	res := result{failed: c.failed, leaf: c.children == 0, msgs: c.msgs}
	c.mu.Unlock()
	if res.failed {
		r.fail("")
	}
	r.log.mu.Lock()
	r.log.results[full] = res
	r.log.mu.Unlock()
	return !res.failed
}

// runSuite runs suite on a fresh recorder and returns its log, and whether
// the top level failed by itself (a Fatalf outside any subtest).
func runSuite(suite func(tb)) (*runLog, bool) {
	r := newRecorder()
	defer r.cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer r.runCleanups()
		suite(r)
	}()
	<-done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.log, len(r.msgs) > 0
}

// failed returns the full names of the failed subtests, sorted.
func (l *runLog) failed(leavesOnly bool) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for name, res := range l.results {
		if res.failed && (res.leaf || !leavesOnly) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// leaves returns the full names of the subtests that ran no subtest.
func (l *runLog) leaves() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for name, res := range l.results {
		if res.leaf {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// report is the failures of a run, with their messages, for a test log.
func (l *runLog) report() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	names := make([]string, 0, len(l.results))
	for name := range l.results {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if res := l.results[name]; res.failed && len(res.msgs) > 0 {
			fmt.Fprintf(&b, "  %s: %s\n", name, strings.Join(res.msgs, "; "))
		}
	}
	return b.String()
}
