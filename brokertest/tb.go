package brokertest

import (
	"context"
	"testing"
)

// tb is what the suites need from a test: the part of *testing.T they use,
// with Run over tb itself. *testing.T satisfies it through stdT; the
// package's own tests satisfy it with a recorder, to run a suite against a
// broken store and see which subtests fail (testing.TB cannot be
// implemented outside package testing).
type tb interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
	Context() context.Context
	// Cleanup registers f to run when the test and its subtests are done,
	// the last registered first.
	Cleanup(f func())
	// run runs f as a subtest called name and reports whether it passed.
	run(name string, f func(t tb)) bool
}

// stdT adapts a *testing.T.
type stdT struct{ *testing.T }

func (t stdT) run(name string, f func(tb)) bool {
	return t.T.Run(name, func(t *testing.T) { f(stdT{t}) })
}

// testingT returns the *testing.T behind t, for a constructor given by a
// user; nil when t is not a *testing.T (the package's own recorder).
func testingT(t tb) *testing.T {
	if s, ok := t.(stdT); ok {
		return s.T
	}
	return nil
}
