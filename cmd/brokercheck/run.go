package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/inproc/broker"
)

// discard is the brokers' logger: the checks measure through Stats and the
// Observer, and check 4 installs its own.
var discard = slog.New(slog.DiscardHandler)

// checkFunc runs one check, reporting into r.
type checkFunc func(ctx context.Context, cfg *config, r *result)

var checks = [numChecks]struct {
	name string
	run  checkFunc
}{
	{"steady state at 1.2× target traffic", checkSteady},
	{"one subscriber times out for a while", checkFault},
	{"same message ID published many times", checkDedup},
	{"permanent failure reaches the dead-letter store", checkDeadLetter},
	{"backlog model λ − W·μ", checkModel},
}

// result is one check's outcome: its criteria, a headline for the summary
// and a chart panel.
type result struct {
	ID       int
	Name     string
	Headline string        // the key figure, for the summary
	Failures []string      // failed criteria; empty means PASS
	Elapsed  time.Duration // wall time of the check
	Panel    panel

	out io.Writer
}

// Pass reports whether every criterion held.
func (r *result) Pass() bool { return len(r.Failures) == 0 }

// printf prints a figure line of the check.
func (r *result) printf(format string, args ...any) {
	fmt.Fprintf(r.out, "  "+format+"\n", args...)
}

// expect prints a criterion with its verdict and records a failure.
func (r *result) expect(ok bool, format string, args ...any) bool {
	line := fmt.Sprintf(format, args...)
	verdict := "ok  "
	if !ok {
		verdict = "FAIL"
		r.Failures = append(r.Failures, line)
	}
	fmt.Fprintf(r.out, "  %s %s\n", verdict, line)
	return ok
}

// fatal records an error that stops the check.
func (r *result) fatal(err error) {
	r.expect(false, "%v", err)
}

// runChecks runs the configured checks in order and returns their results.
func runChecks(ctx context.Context, cfg *config, out io.Writer) []*result {
	var results []*result
	for _, id := range cfg.Checks {
		c := checks[id-1]
		r := &result{ID: id, Name: c.name, out: out}
		fmt.Fprintf(out, "\n== check %d: %s\n", id, c.name)
		before := runtime.NumGoroutine()
		start := time.Now()
		c.run(ctx, cfg, r)
		r.Elapsed = time.Since(start)
		if ctx.Err() != nil {
			r.expect(false, "interrupted: %v", context.Cause(ctx))
		}
		after := settleGoroutines(before, 2*time.Second)
		r.expect(after <= before, "no goroutine left running (%d before the check, %d after)", before, after)
		verdict := "PASS"
		if !r.Pass() {
			verdict = "FAIL"
		}
		fmt.Fprintf(out, "%s check %d: %s (%.1fs)\n", verdict, id, c.name, r.Elapsed.Seconds())
		results = append(results, r)
		if ctx.Err() != nil {
			break
		}
	}
	return results
}

// settleGoroutines waits up to timeout for the goroutine count to fall to
// want and returns the last count.
func settleGoroutines(want int, timeout time.Duration) int {
	deadline := time.Now().Add(timeout)
	for {
		n := runtime.NumGoroutine()
		if n <= want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// printSummary prints one line per result and the overall verdict; it
// returns whether every check passed.
func printSummary(out io.Writer, results []*result, elapsed time.Duration) bool {
	fmt.Fprintf(out, "\n== summary\n")
	var failed []string
	for _, r := range results {
		verdict := "PASS"
		if !r.Pass() {
			verdict = "FAIL"
			failed = append(failed, fmt.Sprint(r.ID))
		}
		fmt.Fprintf(out, "%s  %d  %-48s %5.1fs  %s\n", verdict, r.ID, r.Name, r.Elapsed.Seconds(), r.Headline)
	}
	if len(failed) > 0 {
		fmt.Fprintf(out, "FAIL: check %s failed (%.1fs)\n", strings.Join(failed, ", "), elapsed.Seconds())
		return false
	}
	fmt.Fprintf(out, "PASS: all %d checks passed (%.1fs)\n", len(results), elapsed.Seconds())
	return true
}

// closeBroker closes b, waiting at most timeout for it to drain.
func closeBroker(b *broker.Broker, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return b.Close(ctx)
}

// expectClosed records Close's result: nil, or for a DrainError, how many
// messages it dead-lettered.
func (r *result) expectClosed(err error) {
	var de *broker.DrainError
	switch {
	case err == nil:
		r.expect(true, "Close drained every queue and returned nil")
	case errors.As(err, &de):
		r.expect(false, "Close did not drain in time: %d dead-lettered with reason %q", de.DeadLettered, de.Reason)
	default:
		r.expect(false, "Close: %v", err)
	}
}

// expectBalanced checks, on a closed broker whose subscribers all joined
// before the first publish, that nothing was lost: at each subscriber
// routed = published = delivered + deduplicated + dead-lettered with nothing
// queued or in flight, and the dead-letter store holds every dead letter.
func (r *result) expectBalanced(b *broker.Broker) {
	st := b.Stats()
	var problems, parts []string
	var dead uint64
	for _, topic := range slices.Sorted(maps.Keys(st.Topics)) {
		ts := st.Topics[topic]
		if ts.Queued != 0 {
			problems = append(problems, fmt.Sprintf("topic %s: %d still queued", topic, ts.Queued))
		}
		for _, name := range slices.Sorted(maps.Keys(ts.Subscribers)) {
			ss := ts.Subscribers[name]
			done := ss.Delivered + ss.Deduplicated + ss.DeadLettered
			parts = append(parts, fmt.Sprintf("%s %d = %d+%d+%d", name, ss.Routed, ss.Delivered, ss.Deduplicated, ss.DeadLettered))
			if ss.Routed != ts.Published || done != ss.Routed || ss.Queued != 0 || ss.InFlight != 0 {
				problems = append(problems, fmt.Sprintf("%s/%s: published %d, routed %d, finished %d, queued %d, in flight %d",
					topic, name, ts.Published, ss.Routed, done, ss.Queued, ss.InFlight))
			}
			dead += ss.DeadLettered - ss.DeadLetterErrors
		}
	}
	stored, err := b.DeadLetters().Len(context.Background())
	if err != nil {
		problems = append(problems, "dead-letter store: "+err.Error())
	} else if uint64(stored)+st.DeadLetterEvicted != dead {
		problems = append(problems, fmt.Sprintf("dead-letter store holds %d (+%d evicted), counted %d", stored, st.DeadLetterEvicted, dead))
	}
	detail := strings.Join(parts, "; ")
	if len(problems) > 0 {
		detail = strings.Join(problems, "; ")
	}
	r.expect(len(problems) == 0, "nothing lost: routed = delivered+deduplicated+dead-lettered, store holds %d (%s)", stored, detail)
}
