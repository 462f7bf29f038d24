package natsjs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultReadyTimeout is how long Embedded waits for its server to accept
// connections.
const DefaultReadyTimeout = 10 * time.Second

// DefaultReconnectWait is how long Connect's connection waits between two
// attempts to reach a server it lost (plus nats.go's jitter, up to
// nats.DefaultReconnectJitter): a quarter of nats.go's default of 2 s. The
// first attempt follows the loss at once; after a planned restart, which
// that attempt usually finds still down, the subscribers resume within
// this wait, the jitter and about a second of the server accepting
// connections again. Set nats.ReconnectWait in Connect's options to wait
// longer (many clients of one server) or less.
const DefaultReconnectWait = 500 * time.Millisecond

// Conn is a client connection to NATS with JetStream: to a server embedded in
// the process (Embedded) or to a NATS URL or cluster (Connect). It is safe
// for concurrent use; Close it once done.
type Conn struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	srv *server.Server // nil when connected with Connect
	dir *dirLock       // the embedded server's directory, held until Close

	closeOnce sync.Once
	closeErr  error
}

// EmbedOption configures Embedded.
type EmbedOption func(*embedConfig) error

type embedConfig struct {
	listen       bool
	host         string
	port         int
	readyTimeout time.Duration
	serverOpts   []func(*server.Options)
	natsOpts     []nats.Option
}

// Listen makes the embedded server accept clients on host:port as well
// (port 0 picks a free port; see Conn.ClientURL), so that other processes,
// or a client that must survive a server restart, can connect. Without it
// the server opens no port and the Conn talks to it in memory.
func Listen(host string, port int) EmbedOption {
	return func(c *embedConfig) error {
		if port < 0 || port > 65535 {
			return fmt.Errorf("%w: port %d", ErrInvalidOption, port)
		}
		c.listen, c.host, c.port = true, host, port
		return nil
	}
}

// WithReadyTimeout sets how long Embedded waits for the server to start
// (DefaultReadyTimeout if not given).
func WithReadyTimeout(d time.Duration) EmbedOption {
	return func(c *embedConfig) error {
		if d <= 0 {
			return fmt.Errorf("%w: ready timeout %v <= 0", ErrInvalidOption, d)
		}
		c.readyTimeout = d
		return nil
	}
}

// WithServerOptions lets f adjust the server's options after Embedded has
// set its own (JetStream limits, logging, a server name, ...). Embedded
// still sets JetStream and StoreDir after f.
func WithServerOptions(f func(*server.Options)) EmbedOption {
	return func(c *embedConfig) error {
		if f == nil {
			return fmt.Errorf("%w: nil WithServerOptions function", ErrInvalidOption)
		}
		c.serverOpts = append(c.serverOpts, f)
		return nil
	}
}

// WithConnectOptions adds client options to the Conn's connection (a name,
// handlers, ...); they apply after Embedded's own.
func WithConnectOptions(opts ...nats.Option) EmbedOption {
	return func(c *embedConfig) error {
		c.natsOpts = append(c.natsOpts, opts...)
		return nil
	}
}

// Embedded starts a nats-server inside the process, with JetStream keeping
// its data in files under dir (created if needed), and returns a connection
// to it. One server at a time per dir: Embedded locks dir (the file
// .natsjs.lock in it, with flock on Unix) until Close, and a second
// Embedded of the same dir, in this process or another, fails with
// ErrDirInUse instead of writing the same files. By default the server opens no
// network port: the connection is in memory (nats.InProcessServer), so
// nothing outside the process can reach it. Reopening the same dir later
// finds every stream and bucket as it was.
//
// Close the Conn to drain the connection and shut the server down.
func Embedded(dir string, opts ...EmbedOption) (*Conn, error) {
	if dir == "" {
		return nil, fmt.Errorf("%w: Embedded needs a directory for JetStream's files", ErrInvalidOption)
	}
	cfg := embedConfig{readyTimeout: DefaultReadyTimeout}
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt(&cfg); err != nil {
			return nil, err
		}
	}
	sopts := &server.Options{
		DontListen: !cfg.listen,
		Host:       cfg.host,
		Port:       cfg.port,
		NoLog:      true,
		NoSigs:     true,
	}
	if cfg.listen && cfg.port == 0 {
		sopts.Port = server.RANDOM_PORT
	}
	for _, f := range cfg.serverOpts {
		f(sopts)
	}
	sopts.JetStream, sopts.StoreDir = true, dir
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	c, err := startEmbedded(sopts, cfg)
	if err != nil {
		lock.release()
		return nil, err
	}
	c.dir = lock
	return c, nil
}

// startEmbedded starts the server of Embedded and connects to it.
func startEmbedded(sopts *server.Options, cfg embedConfig) (*Conn, error) {
	srv, err := server.NewServer(sopts)
	if err != nil {
		return nil, fmt.Errorf("natsjs: embedded server: %w", err)
	}
	if !sopts.NoLog {
		srv.ConfigureLogger()
	}
	srv.Start()
	if !srv.ReadyForConnections(cfg.readyTimeout) {
		stopServer(srv)
		return nil, fmt.Errorf("natsjs: embedded server not ready after %v", cfg.readyTimeout)
	}
	if !srv.JetStreamEnabled() {
		stopServer(srv)
		return nil, errors.New("natsjs: embedded server started without JetStream")
	}
	nopts := []nats.Option{nats.Name("inproc-broker-embedded")}
	if cfg.listen {
		nopts = append(nopts, nats.MaxReconnects(-1))
	} else {
		nopts = append(nopts, nats.InProcessServer(srv))
	}
	nopts = append(nopts, cfg.natsOpts...)
	url := ""
	if cfg.listen {
		url = srv.ClientURL()
	}
	nc, err := nats.Connect(url, nopts...)
	if err != nil {
		stopServer(srv)
		return nil, fmt.Errorf("natsjs: connect to the embedded server: %w", err)
	}
	c, err := newConn(nc, srv)
	if err != nil {
		stopServer(srv)
		return nil, err
	}
	return c, nil
}

// stopServer shuts srv down and waits until it has stopped.
func stopServer(srv *server.Server) {
	srv.Shutdown()
	srv.WaitForShutdown()
}

// Connect connects to a NATS server or cluster at url (one URL, or several
// separated by commas) that has JetStream enabled. It reconnects forever,
// DefaultReconnectWait between attempts, unless opts say otherwise (they
// apply after Connect's own). While the connection is down the
// subscribers wait for it, and pull again from the server it comes back
// to; a consumer is created again only when that server says it does not
// exist. This is the
// scale-out path: replicas of a service that connect to the same cluster
// share the stores.
func Connect(url string, opts ...nats.Option) (*Conn, error) {
	if url == "" {
		return nil, fmt.Errorf("%w: Connect needs a URL", ErrInvalidOption)
	}
	nopts := append([]nats.Option{nats.Name("inproc-broker"), nats.MaxReconnects(-1), nats.ReconnectWait(DefaultReconnectWait)}, opts...)
	nc, err := nats.Connect(url, nopts...)
	if err != nil {
		return nil, fmt.Errorf("natsjs: connect to %s: %w", url, err)
	}
	return newConn(nc, nil)
}

func newConn(nc *nats.Conn, srv *server.Server) (*Conn, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("natsjs: jetstream: %w", err)
	}
	return &Conn{nc: nc, js: js, srv: srv}, nil
}

// NATS returns the client connection.
func (c *Conn) NATS() *nats.Conn { return c.nc }

// JetStream returns the JetStream API on the connection, for
// NewDeadLetterStore, NewIdempotencyStore and anything else.
func (c *Conn) JetStream() jetstream.JetStream { return c.js }

// Server returns the embedded server, or nil for a Conn made by Connect.
func (c *Conn) Server() *server.Server { return c.srv }

// ClientURL returns the URL other clients can connect to: the embedded
// server's when it listens (Listen), else "" for an embedded server without
// a port; for a Conn made by Connect, the server it is connected to.
func (c *Conn) ClientURL() string {
	if c.srv == nil {
		return c.nc.ConnectedUrl()
	}
	if c.srv.Addr() == nil {
		return ""
	}
	return c.srv.ClientURL()
}

// Close drains the connection (what was published is flushed, pending
// replies delivered) and, for an embedded server, shuts the server down and
// waits until it has stopped, its files closed. When ctx ends first the
// connection is closed without waiting for the drain, and Close returns
// ctx's error after stopping the server. Calling Close again returns the
// first call's result.
func (c *Conn) Close(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background()
	}
	c.closeOnce.Do(func() { c.closeErr = c.close(ctx) })
	return c.closeErr
}

func (c *Conn) close(ctx context.Context) error {
	var errs []error
	closed := c.nc.StatusChanged(nats.CLOSED)
	defer c.nc.RemoveStatusListener(closed)
	switch err := c.nc.Drain(); {
	case err == nil:
		select {
		case <-closed:
		case <-ctx.Done():
			c.nc.Close()
			errs = append(errs, fmt.Errorf("natsjs: close: drain cut short: %w", ctx.Err()))
		}
	case errors.Is(err, nats.ErrConnectionClosed):
	default:
		c.nc.Close() // Drain closed it already when reconnecting; Close is idempotent
	}
	if c.srv != nil {
		stopServer(c.srv)
	}
	if c.dir != nil {
		c.dir.release() // after the server closed its files
	}
	return errors.Join(errs...)
}
