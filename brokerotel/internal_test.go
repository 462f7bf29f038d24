package brokerotel

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/inproc/broker"
	"github.com/stretchr/testify/assert"
)

func TestCodeBound(t *testing.T) {
	var c codeBound
	c.init()
	custom := func(i int) string { return fmt.Sprintf("custom_%d", i) }
	for i := range MaxCustomErrorTypes {
		assert.Equal(t, custom(i), c.bound(custom(i)), "custom code %d of %d", i+1, MaxCustomErrorTypes)
	}
	tests := []struct{ code, want string }{
		{custom(MaxCustomErrorTypes), "_OTHER"},     // one too many
		{custom(MaxCustomErrorTypes + 1), "_OTHER"}, // and more
		{custom(0), custom(0)},                      // seen before: still itself
		{"", "_OTHER"},
	}
	for _, code := range []string{broker.CodeError, broker.CodeTimeout, broker.CodePanic, broker.CodePermanent,
		broker.CodeThrottled, broker.CodeShutdown, broker.CodeUnsubscribed, broker.CodeOverflow} {
		tests = append(tests, struct{ code, want string }{code, code}) // the broker's: always
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, c.bound(tt.code), "bound(%q)", tt.code)
	}
}

func TestRejectType(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: publish %q", broker.ErrQueueFull, "m1"), "queue_full"},
		{fmt.Errorf("broker: publish: %w", context.Canceled), "canceled"},
		{fmt.Errorf("broker: publish: %w", context.DeadlineExceeded), "deadline_exceeded"},
		{errors.New("something else"), "_OTHER"},
		{nil, "_OTHER"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, rejectType(tt.err), "%v", tt.err)
	}
}

func TestSetCacheIsBounded(t *testing.T) {
	var c setCache
	c.init()
	for i := range maxCachedSets + 10 {
		c.topic(fmt.Sprint("topic", i))
		c.subscriber("orders", fmt.Sprint("sub", i))
	}
	assert.Len(t, c.topics, maxCachedSets)
	assert.Len(t, c.subs, maxCachedSets)
	assert.Same(t, c.topic("topic1"), c.topic("topic1"), "cached")
	assert.NotSame(t, c.topic(fmt.Sprint("topic", maxCachedSets+1)), c.topic(fmt.Sprint("topic", maxCachedSets+1)), "beyond the bound: built each time")
}
