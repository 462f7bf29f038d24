package brokerotel

import "github.com/inproc/broker"

// Observers returns an Observer that passes every event to each of obs in
// turn (nil entries are skipped), and circuit breaker transitions to those
// that implement broker.BreakerObserver. A broker takes one Observer: this
// is how a Telemetry shares it with another adapter (a Prometheus
// collector). Like every Observer's, the hooks must not block or panic: the
// broker recovers a panic, but the observers after the one that panicked
// miss that event.
func Observers(obs ...broker.Observer) broker.Observer {
	m := make(multiObserver, 0, len(obs))
	for _, o := range obs {
		if o != nil {
			m = append(m, o)
		}
	}
	return m
}

// multiObserver fans events out, in order.
type multiObserver []broker.Observer

var (
	_ broker.Observer        = multiObserver(nil)
	_ broker.BreakerObserver = multiObserver(nil)
)

// Published passes ev to every observer.
func (m multiObserver) Published(ev broker.PublishEvent) {
	for _, o := range m {
		o.Published(ev)
	}
}

// Rejected passes ev to every observer.
func (m multiObserver) Rejected(ev broker.RejectEvent) {
	for _, o := range m {
		o.Rejected(ev)
	}
}

// Unrouted passes ev to every observer.
func (m multiObserver) Unrouted(ev broker.UnroutedEvent) {
	for _, o := range m {
		o.Unrouted(ev)
	}
}

// Attempted passes ev to every observer.
func (m multiObserver) Attempted(ev broker.AttemptEvent) {
	for _, o := range m {
		o.Attempted(ev)
	}
}

// DeadLettered passes ev to every observer.
func (m multiObserver) DeadLettered(ev broker.DeadLetterEvent) {
	for _, o := range m {
		o.DeadLettered(ev)
	}
}

// BreakerChanged passes ev to every observer that implements
// broker.BreakerObserver.
func (m multiObserver) BreakerChanged(ev broker.BreakerEvent) {
	for _, o := range m {
		if bo, ok := o.(broker.BreakerObserver); ok {
			bo.BreakerChanged(ev)
		}
	}
}
