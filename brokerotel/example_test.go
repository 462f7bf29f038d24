package brokerotel_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/inproc/broker"
	"github.com/inproc/broker/brokerotel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// A publish inside a request's span, traced through to the handler: the
// process span continues the producer's trace, and the handler's context
// carries it.
func Example() {
	spans := tracetest.NewSpanRecorder() // in production: an exporter
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader() // in production: a periodic reader or Prometheus
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) }()

	tel, err := brokerotel.New(brokerotel.Options{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		panic(err)
	}
	b, err := broker.New(append(tel.Options(), broker.WithLogger(slog.New(slog.DiscardHandler)))...)
	if err != nil {
		panic(err)
	}
	_, err = b.Subscribe("orders", "billing", func(ctx context.Context, msg broker.Message) error {
		fmt.Println("handler got a traceparent:", msg.Headers["traceparent"] != "")
		return nil
	})
	if err != nil {
		panic(err)
	}

	ctx, request := tp.Tracer("app").Start(context.Background(), "POST /orders")
	if err := b.Publish(ctx, broker.Message{ID: "order-1", Topic: "orders"}); err != nil {
		panic(err)
	}
	request.End()
	if err := b.Close(context.Background()); err != nil { // waits for the handler
		panic(err)
	}

	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans.Ended() {
		byName[s.Name()] = s
	}
	publish, process := byName["publish orders"], byName["process orders"]
	fmt.Println(publish.Name(), publish.SpanKind(), "child of the request:", publish.Parent().SpanID() == request.SpanContext().SpanID())
	fmt.Println(process.Name(), process.SpanKind(), "child of publish:", process.Parent().SpanID() == publish.SpanContext().SpanID(),
		"same trace:", process.SpanContext().TraceID() == request.SpanContext().TraceID())

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if m.Name == "messaging.process.duration" {
			h := m.Data.(metricdata.Histogram[float64])
			fmt.Println(m.Name, m.Unit, "count:", h.DataPoints[0].Count)
		}
	}
	// Output:
	// handler got a traceparent: true
	// publish orders producer child of the request: true
	// process orders consumer child of publish: true same trace: true
	// messaging.process.duration s count: 1
}
