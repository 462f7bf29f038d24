package brokerotel

import (
	"errors"

	"github.com/inproc/broker"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the tracer and meter.
const ScopeName = "github.com/inproc/broker/brokerotel"

// System is the messaging.system value of every span and metric. The
// conventions allow custom values and ask for them to be prefixed by the
// organisation.
const System = "inproc.broker"

// Attribute keys the conventions do not define.
const (
	// AttemptKey is the attempt number (1 for the first) on process spans.
	AttemptKey = attribute.Key("inproc.broker.attempt")
	// ReasonKey is the dead-letter reason on inproc.broker.dead_lettered.messages.
	ReasonKey = attribute.Key("inproc.broker.reason")
	// StateKey is how a message ended (delivered, dead_lettered) on
	// inproc.broker.end_to_end.duration.
	StateKey = attribute.Key("inproc.broker.state")
	// RedrivenKey is true on the process spans of a redriven dead letter's
	// attempts (broker.Redriven); absent on a first delivery's.
	RedrivenKey = attribute.Key("inproc.broker.redriven")
)

// ErrInvalidArgument is returned (wrapped) for a nil argument.
var ErrInvalidArgument = errors.New("brokerotel: invalid argument")

// Options configures a Telemetry. The zero value uses the global providers
// and W3C Trace Context.
type Options struct {
	// TracerProvider makes the spans; nil means otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider makes the metrics; nil means otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Propagator carries the trace context in Headers; nil means
	// propagation.TraceContext{} (traceparent and tracestate). Pass a
	// composite with propagation.Baggage{} to carry baggage too.
	Propagator propagation.TextMapPropagator
	// LinkOnly makes every process span the root of a new trace that links
	// to the message's creation context, instead of its child (linked as
	// well). Use it when a consumer's traces should not grow the producer's.
	LinkOnly bool
	// PublishDuration records messaging.client.operation.duration: how
	// long each Publish took, the wait for room included, with error.type
	// for a refused one. It costs a clock read and a histogram record per
	// publish (the broker measures only for an Observer that asks), so it
	// is off by default.
	PublishDuration bool
}

// Telemetry traces and measures brokers. Its PublishHook, Middleware and
// Observer methods are what the broker calls; one Telemetry may serve
// several brokers. It is safe for concurrent use and starts no goroutine.
type Telemetry struct {
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
	linkOnly bool
	timed    bool // Options.PublishDuration
	meter    metric.Meter
	inst     instruments
	codes    codeBound
	sets     setCache
}

// New returns a Telemetry for o. It fails only when the MeterProvider
// refuses to create an instrument.
func New(o Options) (*Telemetry, error) {
	tp := o.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	mp := o.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	prop := o.Propagator
	if prop == nil {
		prop = propagation.TraceContext{}
	}
	t := &Telemetry{
		tracer:   tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		prop:     prop,
		linkOnly: o.LinkOnly,
		timed:    o.PublishDuration,
		meter:    mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL)),
	}
	if err := t.inst.init(t.meter); err != nil {
		return nil, err
	}
	t.codes.init()
	t.sets.init()
	return t, nil
}

// Options returns the broker options that plug t in: its publish hook, its
// middleware (outermost of the broker's, so its span covers the others) and
// t as the broker's Observer. Append others as usual:
//
//	broker.New(append(t.Options(), broker.WithQueueSize(4096))...)
//
// Other observers (the Prometheus collector) are added with their own
// WithObserver: each gets every event.
func (t *Telemetry) Options() []broker.Option {
	return []broker.Option{
		broker.WithPublishHook(t.PublishHook),
		broker.WithMiddleware(t.Middleware),
		broker.WithObserver(t),
	}
}

// Common attributes.
var (
	systemAttr    = semconv.MessagingSystemKey.String(System)
	opPublish     = semconv.MessagingOperationName("publish")
	opTypeSend    = semconv.MessagingOperationTypeSend
	opProcess     = semconv.MessagingOperationName("process")
	opTypeProcess = semconv.MessagingOperationTypeProcess
)
