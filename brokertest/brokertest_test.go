package brokertest

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/inproc/broker"
)

// The suites pass for the core's stores and for the package's own correct
// stores (a second implementation of each, and the TTL branch of the
// idempotency suite).

func TestMemoryDeadLetterStore(t *testing.T) {
	TestDeadLetterStore(t, func(*testing.T) broker.DeadLetterStore {
		return broker.NewMemoryDeadLetterStore(0, nil)
	})
}

func TestSliceDeadLetterStore(t *testing.T) {
	TestDeadLetterStore(t, func(*testing.T) broker.DeadLetterStore { return &sliceStore{} })
}

func TestMemoryIdempotencyStore(t *testing.T) {
	TestIdempotencyStore(t, func(_ *testing.T, window time.Duration) broker.IdempotencyStore {
		return broker.NewMemoryIdempotencyStore(window, 0)
	}, ExpiresByPublishTime(0), IgnoresContext())
}

func TestTTLIdempotencyStore(t *testing.T) {
	TestIdempotencyStore(t, func(_ *testing.T, window time.Duration) broker.IdempotencyStore {
		return newTTLStore(window, idemFaults{})
	}, ExpiresAfterRecord(100*time.Millisecond))
}

// fault is a broken store and the subtests of its suite that must fail.
type fault struct {
	name  string
	suite func(tb) // runs a suite against the broken store
	want  []string // full names of subtests that must fail
	// flaky: the fault shows only when goroutines interleave, so the
	// suite is run up to 10 times until it shows.
	flaky bool
}

func dlFault(name string, f dlFaults, want ...string) fault {
	return fault{name: "DeadLetterStore/" + name, want: want, flaky: f.lossyConcurrentPut, suite: func(t tb) {
		deadLetterSuite(t, func(tb) broker.DeadLetterStore { return &sliceStore{f: f} }, buildOptions(nil))
	}}
}

// fastExpiry keeps the expiry test of a store that never forgets short.
var fastExpiry = []Option{ExpiresAfterRecord(50 * time.Millisecond), ExpiryTimeout(300 * time.Millisecond)}

func idemFault(name string, f idemFaults, opts []Option, want ...string) fault {
	return fault{name: "IdempotencyStore/" + name, want: want, flaky: f.lossyConcurrent, suite: func(t tb) {
		idempotencySuite(t, func(_ tb, window time.Duration) broker.IdempotencyStore {
			return newTTLStore(window, f)
		}, buildOptions(opts))
	}}
}

func faults() []fault {
	fs := []fault{
		dlFault("drops headers", dlFaults{dropHeaders: true}, "RoundTrip/every field", "RoundTrip/odd names"),
		dlFault("stamps a zero FailedAt", dlFaults{stampZeroTime: true}, "RoundTrip/zero values"),
		dlFault("trims names", dlFaults{trimNames: true}, "RoundTrip/odd names"),
		dlFault("unknown ID is an error", dlFaults{unknownIsError: true}, "GetUnknown"),
		dlFault("accepts an empty ID", dlFaults{acceptEmptyID: true}, "PutWithoutID"),
		dlFault("Put appends", dlFaults{putAppends: true}, "PutReplaces", "Len"),
		dlFault("empty List is an error", dlFaults{emptyListErrors: true}, "ListEmpty", "ListFilter/no such topic"),
		dlFault("newest first", dlFaults{newestFirst: true},
			"ListOldestFirst", "ListFilter/empty filter", "ListLimit/limit 1", "ListLimit/limit above count", "Concurrent"),
		dlFault("ignores the topic filter", dlFaults{ignoreTopic: true},
			"ListFilter/topic orders", "ListFilter/topic orders.eu", "ListFilter/topic with a space",
			"ListFilter/topic and error code", "ListFilter/no such combination", "ListLimit/limit with filter"),
		dlFault("topic filter by prefix", dlFaults{prefixTopic: true},
			"ListFilter/topic orders", "ListFilter/no such topic", "ListFilter/topic and subscriber"),
		dlFault("ignores the subscriber filter", dlFaults{ignoreSubscriber: true},
			"ListFilter/subscriber bill", "ListFilter/subscriber billing", "ListFilter/subscriber ship.ping",
			"ListFilter/topic and subscriber", "ListLimit/limit above matches"),
		dlFault("ignores the error code filter", dlFaults{ignoreCode: true},
			"ListFilter/error code", "PutReplaces"),
		dlFault("ignores the reason filter", dlFaults{ignoreReason: true},
			"ListFilter/reason", "ListFilter/reason prefix", "ListFilter/reason and subscriber", "ListLimit/limit with reason"),
		dlFault("reason filter by prefix", dlFaults{prefixReason: true}, "ListFilter/reason prefix"),
		dlFault("ignores Limit", dlFaults{ignoreLimit: true}, "ListLimit/limit 1", "ListLimit/limit 3"),
		dlFault("limit before filter", dlFaults{limitBeforeFilter: true}, "ListLimit/limit with filter"),
		dlFault("accepts a negative Limit", dlFaults{acceptNegativeLimit: true}, "ListNegativeLimit"),
		dlFault("Delete of an unknown ID is an error", dlFaults{deleteUnknownErrors: true}, "Delete"),
		dlFault("Len counts deleted", dlFaults{lenCountsDeleted: true}, "Len", "Delete"),
		dlFault("ignores the context", dlFaults{ignoreContext: true},
			"Context/Put", "Context/Get", "Context/List", "Context/Delete", "Context/Len"),
		dlFault("loses concurrent Puts", dlFaults{lossyConcurrentPut: true}, "Concurrent"),
		dlFault("ListNewest oldest first", dlFaults{newestOldestFirst: true},
			"ListNewest/everything", "ListNewest/limit", "ListNewest/since"),
		dlFault("ListNewest ignores the message ID", dlFaults{newestIgnoresID: true}, "ListNewest/message ID", "ListNewest/message ID prefix"),
		dlFault("ListNewest ignores the time range", dlFaults{newestIgnoresTime: true},
			"ListNewest/since", "ListNewest/until", "ListNewest/since and until", "ListNewest/time range and limit"),
		dlFault("ListNewest limits before filtering", dlFaults{newestLimitFirst: true}, "ListNewest/reason and limit", "ListNewest/time range and limit"),
		dlFault("ListNewest takes a malformed query", dlFaults{newestNoValidate: true}, "ListNewest/malformed"),

		idemFault("seen always", idemFaults{seenAlways: true}, fastExpiry, "Unseen", "Concurrent"),
		idemFault("Record is a no-op", idemFaults{recordNoop: true}, fastExpiry, "RecordThenSeen", "Concurrent"),
		idemFault("key without topic", idemFaults{ignoreTopic: true}, fastExpiry,
			"NoCrossTalk/topic", "NoCrossTalk/topic prefix"),
		idemFault("key without subscriber", idemFaults{ignoreSubscriber: true}, fastExpiry, "NoCrossTalk/subscriber"),
		idemFault("names sorted", idemFaults{sortedNames: true}, fastExpiry,
			"NoCrossTalk/topic and subscriber swapped", "NoCrossTalk/subscriber and ID swapped"),
		idemFault("ID truncated to 64 bytes", idemFaults{truncateID: 64}, fastExpiry, "NoCrossTalk/long IDs differing at the end"),
		idemFault("ID truncated to 2 bytes", idemFaults{truncateID: 2}, fastExpiry, "NoCrossTalk/ID prefix"),
		idemFault("case-insensitive", idemFaults{caseInsensitive: true}, fastExpiry, "NoCrossTalk/case"),
		idemFault("trims spaces", idemFaults{trimSpace: true}, fastExpiry, "NoCrossTalk/trailing space"),
		idemFault("accent-insensitive", idemFaults{accentFold: true}, fastExpiry, "NoCrossTalk/unicode normal forms"),
		idemFault("lazy subject encoding", idemFaults{sanitize: true}, fastExpiry, "NoCrossTalk/wildcards"),
		idemFault("never expires", idemFaults{neverExpires: true}, fastExpiry, "Expiry"),
		idemFault("expires early", idemFaults{earlyBy: 4}, []Option{ExpiresAfterRecord(400 * time.Millisecond)}, "Expiry"),
		idemFault("ignores PublishedAt", idemFaults{}, []Option{ExpiresByPublishTime(time.Minute)}, "Expiry"),
		idemFault("ignores the context", idemFaults{ignoreContext: true}, fastExpiry, "Context/Seen", "Context/Record"),
		idemFault("loses concurrent Records", idemFaults{lossyConcurrent: true}, fastExpiry, "Concurrent"),
		{
			name: "IdempotencyStore/memory store without IgnoresContext",
			want: []string{"Context/Seen", "Context/Record"},
			suite: func(t tb) {
				idempotencySuite(t, func(_ tb, window time.Duration) broker.IdempotencyStore {
					return broker.NewMemoryIdempotencyStore(window, 0)
				}, buildOptions([]Option{ExpiresByPublishTime(0)}))
			},
		},
	}
	for _, sep := range []string{"", ".", ":", "|", "/", "-", "_", "\x00"} {
		fs = append(fs, idemFault(fmt.Sprintf("names joined with %q", sep),
			idemFaults{joinWith: sep, joinUnescaped: true}, fastExpiry,
			fmt.Sprintf("NoCrossTalk/separator %q between topic and subscriber", sep),
			fmt.Sprintf("NoCrossTalk/separator %q between subscriber and ID", sep)))
	}
	return fs
}

// runFault runs a fault's suite (until its fault shows, if flaky) and
// returns the failed leaves of the last run and all its failures.
func runFault(f fault) (leaves, all []string, log *runLog) {
	tries := 1
	if f.flaky {
		tries = 10
	}
	for range tries {
		log, _ = runSuite(f.suite)
		leaves, all = log.failed(true), log.failed(false)
		if !slices.ContainsFunc(f.want, func(w string) bool { return !slices.Contains(all, w) }) {
			break
		}
	}
	return leaves, all, log
}

// TestSuitesCatchFaults runs each suite against stores with one bug each and
// checks that the subtests meant to catch it fail.
func TestSuitesCatchFaults(t *testing.T) {
	for _, f := range faults() {
		t.Run(f.name, func(t *testing.T) {
			_, failed, log := runFault(f)
			if len(failed) == 0 {
				t.Fatalf("the suite passed a store that %s", f.name)
			}
			for _, w := range f.want {
				if !slices.Contains(failed, w) {
					t.Errorf("subtest %q passed; failed: %q\n%s", w, failed, log.report())
				}
			}
		})
	}
}

// TestEverySubtestCanFail checks that every leaf subtest of both suites
// fails for at least one of the broken stores: no subtest passes whatever
// the store does.
func TestEverySubtestCanFail(t *testing.T) {
	good := map[string]func(tb){
		"DeadLetterStore": func(t tb) {
			deadLetterSuite(t, func(tb) broker.DeadLetterStore { return &sliceStore{} }, buildOptions(nil))
		},
		"IdempotencyStore": func(t tb) {
			idempotencySuite(t, func(_ tb, w time.Duration) broker.IdempotencyStore { return newTTLStore(w, idemFaults{}) },
				buildOptions(fastExpiry))
		},
	}
	caught := map[string]bool{}
	for _, f := range faults() {
		leaves, _, _ := runFault(f)
		suite, _, _ := strings.Cut(f.name, "/")
		for _, l := range leaves {
			caught[suite+"/"+l] = true
		}
	}
	for name, suite := range good {
		log, _ := runSuite(suite)
		if failed := log.failed(false); len(failed) > 0 {
			t.Fatalf("%s suite failed for a correct store: %q\n%s", name, failed, log.report())
		}
		leaves := log.leaves()
		if len(leaves) < 10 {
			t.Fatalf("%s suite ran only %d leaf subtests: %q", name, len(leaves), leaves)
		}
		for _, l := range leaves {
			if !caught[name+"/"+l] {
				t.Errorf("%s subtest %q failed for none of the broken stores", name, l)
			}
		}
	}
}

func TestSuiteRejectsBadUse(t *testing.T) {
	for _, c := range []struct {
		name  string
		suite func(tb)
		want  string // in the top-level failure or a subtest's
	}{
		{"negative window", func(t tb) {
			idempotencySuite(t, func(tb, time.Duration) broker.IdempotencyStore { return newTTLStore(0, idemFaults{}) },
				buildOptions([]Option{ExpiresAfterRecord(-time.Second)}))
		}, "negative window"},
		{"negative expiry timeout", func(t tb) {
			idempotencySuite(t, func(tb, time.Duration) broker.IdempotencyStore { return newTTLStore(0, idemFaults{}) },
				buildOptions([]Option{ExpiryTimeout(-time.Second)}))
		}, "ExpiryTimeout"},
		{"nil dead-letter store", func(t tb) {
			deadLetterSuite(t, func(tb) broker.DeadLetterStore { return nil }, buildOptions(nil))
		}, "newStore returned nil"},
		{"nil idempotency store", func(t tb) {
			idempotencySuite(t, func(tb, time.Duration) broker.IdempotencyStore { return nil }, buildOptions(nil))
		}, "newStore returned nil"},
		{"nil broker", func(t tb) {
			brokerSuite(t, func(tb, ...broker.Option) *broker.Broker { return nil }, buildOptions(nil))
		}, "newBroker returned nil"},
		{"negative wait timeout", func(t tb) {
			brokerSuite(t, memBroker(), buildOptions([]Option{WaitTimeout(-time.Second)}))
		}, "WaitTimeout"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRecorder()
			defer r.cancel()
			done := make(chan struct{})
			go func() { defer close(done); c.suite(r) }()
			<-done
			msgs := strings.Join(r.msgs, "\n") + r.log.report()
			if !r.failed || !strings.Contains(msgs, c.want) {
				t.Errorf("failed %v, messages %q; want a failure mentioning %q", r.failed, msgs, c.want)
			}
		})
	}
}

func TestBuildOptionsDefaults(t *testing.T) {
	for _, c := range []struct {
		name        string
		opts        []Option
		mode        expiryMode
		window, exp time.Duration
	}{
		{"none", nil, expiresAfterRecord, DefaultTTLWindow, DefaultExpiryTimeout},
		{"nil option", []Option{nil}, expiresAfterRecord, DefaultTTLWindow, DefaultExpiryTimeout},
		{"publish time default", []Option{ExpiresByPublishTime(0)}, expiresByPublishTime, DefaultPublishWindow, DefaultExpiryTimeout},
		{"record window", []Option{ExpiresAfterRecord(3 * time.Second), ExpiryTimeout(time.Minute)}, expiresAfterRecord, 3 * time.Second, time.Minute},
		{"last mode wins", []Option{ExpiresAfterRecord(time.Second), ExpiresByPublishTime(time.Hour)}, expiresByPublishTime, time.Hour, DefaultExpiryTimeout},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := buildOptions(c.opts)
			if o.expiry != c.mode || o.window != c.window || o.expiryTimeout != c.exp {
				t.Errorf("got %v window %v timeout %v; want %v %v %v", o.expiry, o.window, o.expiryTimeout, c.mode, c.window, c.exp)
			}
		})
	}
}
