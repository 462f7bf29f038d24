package brokerprom_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"

	"github.com/inproc/broker"
	"github.com/inproc/broker/brokerprom"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Example wires a Collector to a broker and serves its metrics the usual
// way, with promhttp. The collector is the broker's Observer (for the
// histograms) and watches it (for everything read from Stats).
func Example() {
	c, err := brokerprom.New()
	if err != nil {
		panic(err)
	}
	b, err := broker.New(broker.WithObserver(c), broker.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		panic(err)
	}
	if err := c.Watch(b); err != nil {
		panic(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	metrics := promhttp.HandlerFor(reg, promhttp.HandlerOpts{}) // http.Handle("/metrics", metrics)

	_, err = b.Subscribe("orders", "billing", func(_ context.Context, m broker.Message) error {
		if m.ID == "o-3" {
			return broker.Permanent(errors.New("unknown customer"))
		}
		return nil
	})
	if err != nil {
		panic(err)
	}
	for _, id := range []string{"o-1", "o-2", "o-3"} {
		if err := b.Publish(context.Background(), broker.Message{ID: id, Topic: "orders"}); err != nil {
			panic(err)
		}
	}
	if err := b.Close(context.Background()); err != nil { // delivers everything first
		panic(err)
	}

	rec := httptest.NewRecorder()
	metrics.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		line := sc.Text()
		for _, name := range []string{
			"broker_routed_messages_total", "broker_delivered_messages_total",
			"broker_dead_lettered_messages_total", "broker_dead_letter_store_size",
			"broker_handler_duration_seconds_count", "broker_end_to_end_duration_seconds_count",
		} {
			if strings.HasPrefix(line, name) {
				fmt.Println(line)
			}
		}
	}
	// Output:
	// broker_dead_letter_store_size 1
	// broker_dead_lettered_messages_total{subscriber="billing",topic="orders"} 1
	// broker_delivered_messages_total{subscriber="billing",topic="orders"} 2
	// broker_end_to_end_duration_seconds_count{state="dead_lettered",subscriber="billing",topic="orders"} 1
	// broker_end_to_end_duration_seconds_count{state="delivered",subscriber="billing",topic="orders"} 2
	// broker_handler_duration_seconds_count{outcome="dead_lettered",subscriber="billing",topic="orders"} 1
	// broker_handler_duration_seconds_count{outcome="delivered",subscriber="billing",topic="orders"} 2
	// broker_handler_duration_seconds_count{outcome="retry",subscriber="billing",topic="orders"} 0
	// broker_routed_messages_total{subscriber="billing",topic="orders"} 3
}
