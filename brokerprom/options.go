package brokerprom

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultNamespace is the prefix of every metric name unless WithNamespace
// sets another: broker_published_messages_total and so on.
const DefaultNamespace = "broker"

// DefaultHandlerBuckets returns the upper bounds, in seconds, of the
// handler_duration_seconds histogram's buckets: from 100 µs, since an
// in-process handler often takes well under a millisecond, then those
// OpenTelemetry's messaging conventions recommend for
// messaging.process.duration (5 ms to 10 s), so that queries on their
// bounds keep working.
func DefaultHandlerBuckets() []float64 {
	return []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025,
		0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}
}

// DefaultEndToEndBuckets returns the upper bounds, in seconds, of the
// end_to_end_duration_seconds histogram's buckets: from 500 µs (an
// in-process delivery) to 10 minutes, since a message may wait out
// retries and backoffs before it is finished.
func DefaultEndToEndBuckets() []float64 {
	return []float64{0.0005, 0.001, 0.0025,
		0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
}

// DefaultPublishBuckets returns the upper bounds, in seconds, of the
// publish_duration_seconds buckets: from 10 µs (an in-memory Publish
// takes about a microsecond) to 10 s (a Publish waiting for room in a full
// queue waits up to its publish timeout).
func DefaultPublishBuckets() []float64 {
	return []float64{0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10}
}

// Option configures a Collector in New. An option given a bad value makes
// New return an error wrapping ErrInvalidOption.
type Option func(*config) error

// config is what the options set; its zero value is not used: New starts
// from defaults().
type config struct {
	namespace       string
	constLabels     prometheus.Labels
	handlerBounds   []float64
	e2eBounds       []float64
	publishBounds   []float64
	publishDuration bool
	nativeFactor    float64 // > 1: native histograms too
}

func defaults() config {
	return config{
		namespace:     DefaultNamespace,
		handlerBounds: DefaultHandlerBuckets(),
		e2eBounds:     DefaultEndToEndBuckets(),
		publishBounds: DefaultPublishBuckets(),
	}
}

// namePattern is what a namespace or a label name may look like: the
// classic Prometheus name syntax, without colons (reserved for recording
// rules), so that every exporter format and promlint accept the result.
var namePattern = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// WithNamespace sets the prefix of every metric name (default
// DefaultNamespace): "inproc_broker" gives inproc_broker_published_messages_total.
// It must match [a-zA-Z_][a-zA-Z0-9_]*. Dashboards and alert rules (see
// alerts.yml) name the metrics, so change it only before they exist.
func WithNamespace(ns string) Option {
	return func(c *config) error {
		if !namePattern.MatchString(ns) {
			return fmt.Errorf("%w: namespace %q must match %s", ErrInvalidOption, ns, namePattern)
		}
		c.namespace = ns
		return nil
	}
}

// WithConstLabels adds labels with fixed values to every metric, such as
// {"broker": "orders"} when a process registers the collectors of two
// brokers with one registry. Label names must match [a-zA-Z_][a-zA-Z0-9_]*,
// must not start with "__" and must not be one of the collector's own
// labels (topic, subscriber, outcome, state, reason, error_code); values must be valid UTF-8.
// The map is copied.
func WithConstLabels(l prometheus.Labels) Option {
	return func(c *config) error {
		cp := make(prometheus.Labels, len(l))
		for name, value := range l {
			switch {
			case !namePattern.MatchString(name) || len(name) >= 2 && name[:2] == "__":
				return fmt.Errorf("%w: const label name %q", ErrInvalidOption, name)
			case slices.Contains(ownLabels, name):
				return fmt.Errorf("%w: const label %q is one of the collector's own labels", ErrInvalidOption, name)
			case !utf8.ValidString(value):
				return fmt.Errorf("%w: const label %q: value is not valid UTF-8", ErrInvalidOption, name)
			}
			cp[name] = value
		}
		c.constLabels = cp
		return nil
	}
}

// WithHandlerBuckets sets the upper bounds, in seconds, of the
// handler_duration_seconds buckets (default DefaultHandlerBuckets). They
// must be finite, positive and strictly increasing, at least one of them;
// the slice is copied.
func WithHandlerBuckets(bounds []float64) Option {
	return func(c *config) error {
		b, err := checkBuckets("handler", bounds)
		c.handlerBounds = b
		return err
	}
}

// WithEndToEndBuckets sets the upper bounds, in seconds, of the
// end_to_end_duration_seconds buckets (default DefaultEndToEndBuckets), with
// the same rules as WithHandlerBuckets.
func WithEndToEndBuckets(bounds []float64) Option {
	return func(c *config) error {
		b, err := checkBuckets("end-to-end", bounds)
		c.e2eBounds = b
		return err
	}
}

// WithPublishDuration fills publish_duration_seconds: how long each
// Publish took, the wait for room in a full queue included. It costs a
// clock read and a histogram observation per publish (with one no-op
// subscriber, about a quarter more per message with the collector), so it
// is off by default; rejected_by_reason_total counts refusals either way.
func WithPublishDuration() Option {
	return func(c *config) error {
		c.publishDuration = true
		return nil
	}
}

// WithPublishBuckets sets the upper bounds, in seconds, of the
// publish_duration_seconds buckets (default DefaultPublishBuckets), with
// the same rules as WithHandlerBuckets.
func WithPublishBuckets(bounds []float64) Option {
	return func(c *config) error {
		b, err := checkBuckets("publish", bounds)
		c.publishBounds = b
		return err
	}
}

// WithNativeHistograms makes both histograms native (sparse) histograms as
// well as classic ones, with the given bucket growth factor (> 1, e.g. 1.1:
// each bucket at most 10% wider than the last). A scraper that negotiates
// the protobuf format gets the native histogram; the text format still
// carries the classic buckets. Off by default.
func WithNativeHistograms(factor float64) Option {
	return func(c *config) error {
		if !(factor > 1) || math.IsInf(factor, 1) {
			return fmt.Errorf("%w: native histogram bucket factor %v must be > 1", ErrInvalidOption, factor)
		}
		c.nativeFactor = factor
		return nil
	}
}

func checkBuckets(which string, bounds []float64) ([]float64, error) {
	if len(bounds) == 0 {
		return nil, fmt.Errorf("%w: %s buckets: none given", ErrInvalidOption, which)
	}
	for i, b := range bounds {
		switch {
		case !(b > 0) || math.IsInf(b, 1):
			return nil, fmt.Errorf("%w: %s bucket %v must be finite and positive", ErrInvalidOption, which, b)
		case i > 0 && b <= bounds[i-1]:
			return nil, fmt.Errorf("%w: %s buckets must increase strictly (%v after %v)", ErrInvalidOption, which, b, bounds[i-1])
		}
	}
	return slices.Clone(bounds), nil
}
