package brokerotel_test

import (
	"testing"

	"github.com/inproc/broker"
	"github.com/inproc/broker/brokerotel"
	"github.com/stretchr/testify/assert"
)

// recorder notes the events it gets, in a shared log.
type recorder struct {
	name string
	log  *[]string
}

func (r recorder) note(ev string)                      { *r.log = append(*r.log, r.name+":"+ev) }
func (r recorder) Published(broker.PublishEvent)       { r.note("published") }
func (r recorder) Rejected(broker.RejectEvent)         { r.note("rejected") }
func (r recorder) Unrouted(broker.UnroutedEvent)       { r.note("unrouted") }
func (r recorder) Attempted(broker.AttemptEvent)       { r.note("attempted") }
func (r recorder) DeadLettered(broker.DeadLetterEvent) { r.note("dead_lettered") }

// breakerRecorder also wants breaker transitions.
type breakerRecorder struct{ recorder }

func (r breakerRecorder) BreakerChanged(broker.BreakerEvent) { r.note("breaker") }

func TestObservers(t *testing.T) {
	var log []string
	o := brokerotel.Observers(recorder{"a", &log}, nil, breakerRecorder{recorder{"b", &log}})
	o.Published(broker.PublishEvent{})
	o.Rejected(broker.RejectEvent{})
	o.Unrouted(broker.UnroutedEvent{})
	o.Attempted(broker.AttemptEvent{})
	o.DeadLettered(broker.DeadLetterEvent{})
	bo, ok := o.(broker.BreakerObserver)
	if assert.True(t, ok, "breaker transitions are passed on") {
		bo.BreakerChanged(broker.BreakerEvent{})
	}
	assert.Equal(t, []string{
		"a:published", "b:published", "a:rejected", "b:rejected", "a:unrouted", "b:unrouted",
		"a:attempted", "b:attempted", "a:dead_lettered", "b:dead_lettered", "b:breaker",
	}, log)

	empty := brokerotel.Observers()
	empty.Published(broker.PublishEvent{}) // nothing to call: no panic
}
