package brokertest

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/inproc/broker"
)

// The broker suite passes for the built-in in-memory transport (with and
// without dedup) and for a second, correct transport (fakeTransport), which
// the core drives through its Transport seam as it would NATS JetStream.

func TestBrokerInMemory(t *testing.T) {
	t.Parallel()
	TestBroker(t, func(t *testing.T, opts ...broker.Option) *broker.Broker {
		b, err := broker.New(opts...)
		if err != nil {
			t.Fatalf("broker.New: %v", err)
		}
		return b
	})
}

func TestBrokerInMemoryWithoutDedup(t *testing.T) {
	t.Parallel()
	TestBroker(t, func(t *testing.T, opts ...broker.Option) *broker.Broker {
		b, err := broker.New(append(opts, broker.WithIdempotencyStore(nil))...)
		if err != nil {
			t.Fatalf("broker.New: %v", err)
		}
		return b
	}, WithoutDedup())
}

func TestBrokerFakeTransport(t *testing.T) {
	t.Parallel()
	TestBroker(t, func(t *testing.T, opts ...broker.Option) *broker.Broker {
		b, err := broker.New(append(opts, broker.WithTransport(newFakeTransport(trFaults{})))...)
		if err != nil {
			t.Fatalf("broker.New: %v", err)
		}
		return b
	})
}

// memBroker returns a factory of in-memory brokers with extra options
// appended to the suite's.
func memBroker(extra ...broker.Option) func(tb, ...broker.Option) *broker.Broker {
	return func(t tb, opts ...broker.Option) *broker.Broker {
		b, err := broker.New(append(opts, extra...)...)
		if err != nil {
			t.Fatalf("broker.New: %v", err)
		}
		return b
	}
}

// fakeBroker returns a factory of brokers over a fakeTransport with faults f.
func fakeBroker(f trFaults) func(tb, ...broker.Option) *broker.Broker {
	return func(t tb, opts ...broker.Option) *broker.Broker {
		return memBroker(broker.WithTransport(newFakeTransport(f)))(t, opts...)
	}
}

// faultWait is the wait timeout of the suites run against broken brokers:
// the waits that a fault makes time out cost this much each. A wait of a
// working part that takes longer on a busy machine only adds a failure,
// which the checks below never mind.
const faultWait = 500 * time.Millisecond

func brokerFault(name string, newBroker func(tb, ...broker.Option) *broker.Broker, want ...string) fault {
	return fault{name: name, want: want, suite: func(t tb) {
		brokerSuite(t, newBroker, buildOptions([]Option{WaitTimeout(faultWait)}))
	}}
}

func brokerFaults() []fault {
	dropHeaders := func(_ broker.SubscriberInfo, next broker.Handler) broker.Handler {
		return func(ctx context.Context, m broker.Message) error {
			m.Headers = nil
			return next(ctx, m)
		}
	}
	detach := func(_ broker.SubscriberInfo, next broker.Handler) broker.Handler {
		return func(ctx context.Context, m broker.Message) error {
			return next(context.WithoutCancel(ctx), m)
		}
	}
	flatten := func(_ broker.SubscriberInfo, next broker.Handler) broker.Handler {
		return func(ctx context.Context, m broker.Message) error {
			if err := next(ctx, m); err != nil {
				return errors.New(err.Error())
			}
			return nil
		}
	}
	rewrite := func(_ context.Context, m *broker.Message) error {
		m.Payload = []byte("rewritten")
		return nil
	}
	deadLetters := []string{"DeadLetter/permanent", "DeadLetter/exhausted", "DeadLetter/panic", "DeadLetter/error code"}
	fs := []fault{
		brokerFault("middleware drops Headers", memBroker(broker.WithMiddleware(dropHeaders)),
			"Publish/Fields", "Publish/FanOut", "PublishHook"),
		brokerFault("publish hook rewrites the payload", memBroker(broker.WithPublishHook(rewrite)),
			append([]string{"Publish/Fields"}, deadLetters...)...),
		brokerFault("factory drops the suite's options", func(t tb, _ ...broker.Option) *broker.Broker {
			return memBroker(broker.WithLogger(slog.New(slog.DiscardHandler)))(t)
		}, "Middleware", "PublishHook"),
		brokerFault("dedup off", memBroker(broker.WithIdempotencyStore(nil)), "Dedup"),
		brokerFault("dead-letter store drops headers",
			memBroker(broker.WithDeadLetterStore(&sliceStore{f: dlFaults{dropHeaders: true}})), deadLetters...),
		brokerFault("middleware detaches the context", memBroker(broker.WithMiddleware(detach)), "Close/CancelsHandlers"),
		brokerFault("middleware flattens errors", memBroker(broker.WithMiddleware(flatten)),
			"DeadLetter/permanent", "DeadLetter/panic", "DeadLetter/error code", "Retry/RetryAfter",
			"Retry/ByCode/rule with more retries", "Retry/ByCode/rule without retries", "Retry/ByCode/code without a rule",
			"Middleware"),
		brokerFault("transport loses retries", fakeBroker(trFaults{loseRetries: true}),
			"Retry/Attempts", "Retry/ByCode/rule with more retries", "Retry/ByCode/code without a rule", "Retry/RetryAfter",
			"DeadLetter/exhausted", "DeadLetter/error code", "KeyOrder", "Stats", "Middleware"),
		brokerFault("transport retries at once", fakeBroker(trFaults{retryAtOnce: true}), "Retry/RetryAfter"),
		brokerFault("transport ignores keys", fakeBroker(trFaults{ignoreKeys: true}), "KeyOrder"),
		brokerFault("transport delivers at most 3 times", fakeBroker(trFaults{maxDeliveries: 3}),
			"Retry/ByCode/rule with more retries"),
		brokerFault("transport reaches one subscriber", fakeBroker(trFaults{firstSubOnly: true}),
			"Publish/FanOut", "Redrive", "Stats"),
		brokerFault("transport delivers twice", fakeBroker(trFaults{twice: true}), "Stats"),
		brokerFault("transport redrives as a retry", fakeBroker(trFaults{redriveAsCopy: true}), "Redrive"),
		brokerFault("transport redrives to every subscriber", fakeBroker(trFaults{redriveToAll: true}), "Redrive"),
		brokerFault("transport Stop does not wait", fakeBroker(trFaults{stopNoWait: true}), "Unsubscribe"),
		brokerFault("transport Close fails", fakeBroker(trFaults{closeFails: true}), "Close/Returns"),
	}
	// The in-memory transport keeps order without a retry; the fake's
	// workers interleave; let a few runs show it.
	for i := range fs {
		fs[i].flaky = fs[i].name == "transport ignores keys"
	}
	return fs
}

// exemptLeaves are the broker suite's subtests that no broken broker above
// fails, and why: Publish validates a message before any hook, middleware
// or transport sees it, so only a change to the core can break them.
var exemptLeaves = []string{"Publish/InvalidMessage/no ID", "Publish/InvalidMessage/no topic", "Publish/InvalidMessage/neither"}

// TestBrokerSuiteCatchesFaults runs the broker suite against brokers with
// one fault each (in a middleware, a publish hook, a store, the factory or
// the transport), all at once as most of their time is waiting (go test
// -parallel would run only GOMAXPROCS of them at a time), and checks that
// the subtests meant to catch each fault fail, and that every leaf subtest
// but the exempt ones fails for at least one of them.
func TestBrokerSuiteCatchesFaults(t *testing.T) {
	t.Parallel()
	fs := brokerFaults()
	type outcome struct {
		leaves, failed []string
		log            *runLog
	}
	outcomes := make([]outcome, len(fs))
	var good *runLog
	var wg sync.WaitGroup
	for i, f := range fs {
		wg.Go(func() {
			leaves, failed, log := runFault(f)
			outcomes[i] = outcome{leaves, failed, log}
		})
	}
	wg.Go(func() {
		good, _ = runSuite(func(t tb) { brokerSuite(t, fakeBroker(trFaults{}), buildOptions(nil)) })
	})
	wg.Wait()

	caught := map[string]bool{}
	for i, f := range fs {
		o := outcomes[i]
		for _, l := range o.leaves {
			caught[l] = true
		}
		t.Run(f.name, func(t *testing.T) {
			if len(o.failed) == 0 {
				t.Fatalf("the suite passed a broker whose %s", f.name)
			}
			for _, w := range f.want {
				if !slices.Contains(o.failed, w) {
					t.Errorf("subtest %q passed; failed: %q\n%s", w, o.failed, o.log.report())
				}
			}
		})
	}
	if failed := good.failed(false); len(failed) > 0 {
		t.Fatalf("the suite failed for the correct fake transport: %q\n%s", failed, good.report())
	}
	leaves := good.leaves()
	if len(leaves) < 20 {
		t.Fatalf("the suite ran only %d leaf subtests: %q", len(leaves), leaves)
	}
	for _, l := range leaves {
		if !caught[l] && !slices.Contains(exemptLeaves, l) {
			t.Errorf("subtest %q failed for none of the broken brokers", l)
		}
	}
}

func TestBrokerSuiteOptions(t *testing.T) {
	for _, c := range []struct {
		name    string
		opts    []Option
		noDedup bool
		wait    time.Duration
	}{
		{"none", nil, false, DefaultWaitTimeout},
		{"without dedup", []Option{WithoutDedup()}, true, DefaultWaitTimeout},
		{"wait timeout", []Option{WaitTimeout(time.Minute)}, false, time.Minute},
		{"wait timeout 0", []Option{WaitTimeout(0)}, false, DefaultWaitTimeout},
		{"store options", []Option{IgnoresContext(), ExpiresAfterRecord(time.Second)}, false, DefaultWaitTimeout},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := buildOptions(c.opts)
			if o.noDedup != c.noDedup || o.wait != c.wait || len(o.invalid) > 0 {
				t.Errorf("got noDedup %v, wait %v, invalid %q; want %v, %v, none", o.noDedup, o.wait, o.invalid, c.noDedup, c.wait)
			}
		})
	}
}
