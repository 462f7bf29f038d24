// Command ops shows what operating the broker looks like: a broker with
// simulated traffic and failures — a healthy subscriber, a flaky one that
// retries, one that rejects some messages (dead letters), one whose
// dependency goes down for a while behind a circuit breaker — serving
// Prometheus metrics at /metrics and the admin page at /admin/.
//
//	go run ./examples/ops                      # then open http://127.0.0.1:8080/admin/
//	go run ./examples/ops -addr 127.0.0.1:9090 -for 30s
//
// Sample alert rules for these metrics: ../../brokerprom/alerts.yml.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/inproc/broker"
	"github.com/inproc/broker/admin"
	"github.com/inproc/broker/brokerprom"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "where to serve /metrics and /admin/")
	run := flag.Duration("for", 0, "stop after this long (0: until interrupted)")
	rate := flag.Int("rate", 200, "messages published per second")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if *run > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *run)
		defer cancel()
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	if err := serve(ctx, ln, *rate, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// serve runs the simulation and the HTTP server on ln until ctx ends.
func serve(ctx context.Context, ln net.Listener, rate int, out *os.File) error {
	metrics, err := brokerprom.New()
	if err != nil {
		return err
	}
	b, err := broker.New(
		broker.WithObserver(metrics),
		broker.WithLogger(slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelError}))),
		broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: 3, Backoff: broker.ExponentialBackoff(20*time.Millisecond, time.Second)}),
	)
	if err != nil {
		return err
	}
	if err := metrics.Watch(b); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	page, err := admin.New(b, admin.Options{AllowActions: true, Title: "ops example", SampleInterval: time.Second, SampleInBackground: true})
	if err != nil {
		return err
	}
	defer page.Close()
	if err := subscribe(b); err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/admin/", http.StripPrefix("/admin", page))
	mux.Handle("/", http.RedirectHandler("/admin/", http.StatusFound))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }() // ends at Shutdown below
	fmt.Fprintf(out, "serving http://%s/admin/ and http://%s/metrics (Ctrl-C to stop)\n", ln.Addr(), ln.Addr())

	publish(ctx, b, rate)

	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(shutdownCtx)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	var drain *broker.DrainError
	if cerr := b.Close(shutdownCtx); cerr != nil && !errors.As(cerr, &drain) {
		err = errors.Join(err, cerr)
	}
	st := b.Stats()
	for _, name := range []string{"orders", "payments"} {
		ts := st.Topics[name]
		fmt.Fprintf(out, "%s: published %d\n", name, ts.Published)
		for sub, ss := range ts.Subscribers {
			fmt.Fprintf(out, "  %-12s delivered %d, retries %d, dead letters %d\n", sub, ss.Delivered, ss.Retries, ss.DeadLettered)
		}
	}
	return err
}

// subscribe registers the simulated subscribers.
func subscribe(b *broker.Broker) error {
	down := func() bool { return time.Now().Unix()%20 < 5 } // the card service, down 5 s of every 20
	subs := []struct {
		topic, name string
		h           broker.Handler
		opts        []broker.SubscribeOption
	}{
		{"orders", "billing", work(2*time.Millisecond, nil), []broker.SubscribeOption{broker.Concurrency(2)}},
		{"orders", "inventory", work(time.Millisecond, func(broker.Message) error {
			if rand.IntN(10) == 0 {
				return errors.New("inventory: lock timeout") // retried, then fine
			}
			return nil
		}), nil},
		{"orders", "email", work(time.Millisecond, func(m broker.Message) error {
			if rand.IntN(50) == 0 {
				return broker.Permanent(fmt.Errorf("email: invalid address in %s", m.ID)) // dead letter
			}
			return nil
		}), nil},
		{"payments", "card", work(3*time.Millisecond, func(broker.Message) error {
			if down() {
				return errors.New("card: gateway unavailable")
			}
			return nil
		}), []broker.SubscribeOption{
			broker.Concurrency(4),
			broker.CircuitBreaker(broker.BreakerPolicy{Failures: 5, OpenFor: time.Second, MaxOpenFor: 4 * time.Second}),
			broker.WhenLaneFull(broker.DeadLetterNewest),
			broker.LaneSize(256),
		}},
	}
	for _, s := range subs {
		if _, err := b.Subscribe(s.topic, s.name, s.h, s.opts...); err != nil {
			return err
		}
	}
	return nil
}

// work is a handler that takes about d and then returns fail's verdict.
func work(d time.Duration, fail func(broker.Message) error) broker.Handler {
	return func(ctx context.Context, m broker.Message) error {
		t := time.NewTimer(d + rand.N(d))
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
		if fail != nil {
			return fail(m)
		}
		return nil
	}
}

// publish sends orders and payments at about rate per second until ctx ends.
func publish(ctx context.Context, b *broker.Broker, rate int) {
	tick := time.NewTicker(time.Second / time.Duration(max(rate, 1)))
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		id := strconv.Itoa(i)
		_ = b.Publish(ctx, broker.Message{ID: "o-" + id, Topic: "orders", Key: "customer-" + strconv.Itoa(i%50), Payload: []byte(`{"order":` + id + `}`)})
		if i%2 == 0 {
			_ = b.Publish(ctx, broker.Message{ID: "p-" + id, Topic: "payments", Payload: []byte(`{"amount":` + strconv.Itoa(10+i%90) + `}`)})
		}
	}
}
