// Package naive is the "minimal runnable broker" of the design article
// (seed/broker-design-article.zh.txt, section 可运行实现), rewritten here as a
// library so the benchmarks can drive it: one buffered channel per topic, one
// dispatcher goroutine per topic, and serial delivery to every subscriber of
// the topic with inline retry.
//
// It differs from the article's listing only where a benchmark needs it:
//   - the retry backoff is a parameter (the article sleeps 50ms·(i+1) between
//     attempts; the benchmarks' retry workload asks for zero backoff), and
//   - a message that fails every attempt is reported through a callback
//     instead of log.Printf.
//
// Everything else is the article's: Publish blocks until there is room or ctx
// ends, the dispatcher copies the subscriber list under a read lock for every
// message, and Close stops the dispatchers without draining the queues.
package naive

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Message is the article's message. Payload is a string, as in the article.
type Message struct {
	ID      string
	Topic   string
	Payload string
	Attempt int
}

// Handler handles one delivery attempt.
type Handler func(context.Context, Message) error

type subscriber struct {
	name    string
	handler Handler
}

// Broker is the article's broker.
type Broker struct {
	mu          sync.RWMutex
	queues      map[string]chan Message
	subscribers map[string][]subscriber
	buffer      int
	maxRetry    int
	backoff     func(retry int) time.Duration
	onDrop      func(topic, sub string, msg Message, err error)

	closed bool
	stop   chan struct{}
	wg     sync.WaitGroup
}

// NewBroker returns a broker with per-topic channels of buffer messages and
// up to maxRetry retries after the first attempt. backoff gives the pause
// before retry i (1-based); nil is the article's 50ms·i. onDrop, if not nil,
// is told about messages that failed every attempt (the article logs them).
func NewBroker(buffer, maxRetry int, backoff func(int) time.Duration, onDrop func(topic, sub string, msg Message, err error)) *Broker {
	if buffer <= 0 {
		buffer = 64
	}
	if maxRetry < 0 {
		maxRetry = 0
	}
	if backoff == nil {
		backoff = func(i int) time.Duration { return time.Duration(50*i) * time.Millisecond }
	}
	if onDrop == nil {
		onDrop = func(string, string, Message, error) {}
	}
	return &Broker{
		queues:      make(map[string]chan Message),
		subscribers: make(map[string][]subscriber),
		buffer:      buffer,
		maxRetry:    maxRetry,
		backoff:     backoff,
		onDrop:      onDrop,
		stop:        make(chan struct{}),
	}
}

func (b *Broker) ensureTopic(topic string) (chan Message, error) {
	b.mu.Lock()
	defer b.mu.Unlock()

	if b.closed {
		return nil, errors.New("broker closed")
	}
	if q, ok := b.queues[topic]; ok {
		return q, nil
	}

	q := make(chan Message, b.buffer)
	b.queues[topic] = q

	b.wg.Add(1)
	go b.dispatch(topic, q)

	return q, nil
}

// Subscribe adds a subscriber to topic.
func (b *Broker) Subscribe(topic, name string, h Handler) error {
	if topic == "" || name == "" || h == nil {
		return errors.New("invalid subscribe args")
	}

	_, err := b.ensureTopic(topic)
	if err != nil {
		return err
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	b.subscribers[topic] = append(b.subscribers[topic], subscriber{name: name, handler: h})
	return nil
}

// Publish enqueues msg, waiting for room until ctx ends.
func (b *Broker) Publish(ctx context.Context, msg Message) error {
	if msg.Topic == "" || msg.ID == "" {
		return errors.New("message requires non-empty topic and id")
	}

	q, err := b.ensureTopic(msg.Topic)
	if err != nil {
		return err
	}

	select {
	case <-ctx.Done():
		return ctx.Err()
	case q <- msg:
		return nil
	}
}

func (b *Broker) dispatch(topic string, q <-chan Message) {
	defer b.wg.Done()

	for {
		select {
		case <-b.stop:
			return
		case msg := <-q:
			b.mu.RLock()
			subs := append([]subscriber(nil), b.subscribers[topic]...)
			b.mu.RUnlock()

			for _, sub := range subs {
				err := b.deliverWithRetry(context.Background(), sub, msg)
				if err != nil {
					b.onDrop(topic, sub.name, msg, err)
				}
			}
		}
	}
}

func (b *Broker) deliverWithRetry(ctx context.Context, sub subscriber, msg Message) error {
	var err error
	for i := 0; i <= b.maxRetry; i++ {
		attemptMsg := msg
		attemptMsg.Attempt = i + 1
		err = sub.handler(ctx, attemptMsg)
		if err == nil {
			return nil
		}

		if i < b.maxRetry {
			backoff := b.backoff(i + 1)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(backoff):
			}
		}
	}
	return err
}

// Close stops the dispatchers (without draining) and waits for them.
func (b *Broker) Close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	close(b.stop)
	b.mu.Unlock()

	b.wg.Wait()
}
