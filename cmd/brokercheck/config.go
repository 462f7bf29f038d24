package main

import (
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// config holds every knob of the run; flags set it, tests build it.
type config struct {
	Checks       []int         // which checks, in order
	Chart        string        // SVG file to write, "" for none
	Poisson      bool          // Poisson arrivals (else evenly spaced)
	Seed         uint64        // seed of the arrival schedules
	Sample       time.Duration // Stats polling interval
	Progress     time.Duration // progress line interval
	MaxUtil      float64       // highest utilisation λ/(W·μ) when sizing W
	CloseTimeout time.Duration // longest wait for Close to drain
	Publishers   int           // publisher goroutines of the load generator

	Steady steadyConfig
	Fault  faultConfig
	Dup    dupConfig
	Dead   deadConfig
	Model  modelConfig
}

type steadyConfig struct {
	Rate     float64       // target traffic λ0
	Load     float64       // load factor: λ = Load·λ0
	Service  time.Duration // handler service time
	Workers  int           // 0: sized from λ and μ
	Duration time.Duration
	Queue    int // topic queue (and lane) capacity
}

type faultConfig struct {
	Rate           float64
	Service        time.Duration // of the failing subscriber
	Workers        int           // of the failing subscriber
	Warmup         time.Duration // steady phase before the fault
	Duration       time.Duration // fault window
	Recover        time.Duration // bound on the recovery time; 0: 2×Duration
	Hold           time.Duration // how long the backlog must stay at its level after recovering
	HandlerTimeout time.Duration
	FailProb       float64 // share of attempts that time out during the fault
	MaxRetries     int
	Queue          int
	PublishTimeout time.Duration
	Margin         time.Duration // allowed on top of PublishTimeout
	MaxRetryRate   float64       // bound on the whole run's retry rate
	WhenFull       string        // the failing subscriber's full-lane policy (block, dead_letter_newest, dead_letter_oldest)
}

type dupConfig struct {
	Count   int // publishes of the same ID
	Workers int // of the subscriber whose first attempt fails
}

type deadConfig struct {
	MaxRetries int
}

type modelConfig struct {
	Rate     float64
	Service  time.Duration
	Workers  int // phase A; W·μ must be below λ
	Duration time.Duration
	Queue    int
	Tol      float64 // relative error allowed on the growth rate
	Trend    float64 // phase B: |trend| bound as a share of λ
}

const numChecks = 5

func defaultConfig() config {
	return config{
		Checks:       []int{1, 2, 3, 4, 5},
		Poisson:      true,
		Seed:         1,
		Sample:       10 * time.Millisecond,
		Progress:     time.Second,
		MaxUtil:      0.95,
		CloseTimeout: 5 * time.Second,
		Publishers:   4,
		Steady: steadyConfig{
			Rate: 800, Load: 1.2, Service: 2 * time.Millisecond,
			Duration: 8 * time.Second, Queue: 1024,
		},
		Fault: faultConfig{
			Rate: 500, Service: 2 * time.Millisecond, Workers: 4,
			Warmup: 1500 * time.Millisecond, Duration: 2 * time.Second, Hold: time.Second,
			HandlerTimeout: 50 * time.Millisecond, FailProb: 1, MaxRetries: 2,
			Queue: 256, PublishTimeout: 500 * time.Millisecond, Margin: 100 * time.Millisecond,
			MaxRetryRate: 0.15, WhenFull: "block",
		},
		Dup:  dupConfig{Count: 100, Workers: 4},
		Dead: deadConfig{MaxRetries: 2},
		Model: modelConfig{
			Rate: 1000, Service: 4 * time.Millisecond, Workers: 2,
			Duration: 3 * time.Second, Queue: 4096, Tol: 0.15, Trend: 0.05,
		},
	}
}

// checkList is the -check flag: "all" or a comma-separated list.
type checkList struct{ c *config }

func (l checkList) String() string {
	if l.c == nil {
		return ""
	}
	if len(l.c.Checks) == numChecks {
		return "all"
	}
	s := make([]string, len(l.c.Checks))
	for i, n := range l.c.Checks {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

func (l checkList) Set(v string) error {
	ids, err := parseChecks(v)
	if err != nil {
		return err
	}
	l.c.Checks = ids
	return nil
}

func parseChecks(v string) ([]int, error) {
	if v == "" || v == "all" {
		return []int{1, 2, 3, 4, 5}, nil
	}
	var ids []int
	for f := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > numChecks {
			return nil, fmt.Errorf("bad check %q: want 1..%d or all", f, numChecks)
		}
		if !slices.Contains(ids, n) {
			ids = append(ids, n)
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// arrivalsFlag is the -arrivals flag: poisson or uniform.
type arrivalsFlag struct{ c *config }

func (a arrivalsFlag) String() string {
	switch {
	case a.c == nil:
		return ""
	case a.c.Poisson:
		return "poisson"
	}
	return "uniform"
}

func (a arrivalsFlag) Set(v string) error {
	switch v {
	case "poisson":
		a.c.Poisson = true
	case "uniform":
		a.c.Poisson = false
	default:
		return errors.New(`want "poisson" or "uniform"`)
	}
	return nil
}

// register binds c's fields to flags of fs.
func (c *config) register(fs *flag.FlagSet) {
	fs.Var(checkList{c}, "check", "checks to run: `list` like 1,3 or all")
	fs.StringVar(&c.Chart, "chart", c.Chart, "write the backlog of each check over time to this SVG `file`")
	fs.Var(arrivalsFlag{c}, "arrivals", "arrival process of the load generator: poisson or uniform")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of the Poisson arrival schedules")
	fs.DurationVar(&c.Sample, "sample", c.Sample, "Stats polling interval (backlog samples)")
	fs.DurationVar(&c.Progress, "progress", c.Progress, "interval of the progress lines")
	fs.Float64Var(&c.MaxUtil, "max-util", c.MaxUtil, "checks 1, 5: when W = ceil(λ/μ) would run hotter than this utilisation λ/(W·μ), add workers")
	fs.DurationVar(&c.CloseTimeout, "close-timeout", c.CloseTimeout, "longest wait for Close to drain a broker")
	fs.IntVar(&c.Publishers, "publishers", c.Publishers, "publisher goroutines of the load generator (checks 1, 2, 5)")

	s := &c.Steady
	fs.Float64Var(&s.Rate, "steady-rate", s.Rate, "check 1: target traffic λ0 in msgs/s")
	fs.Float64Var(&s.Load, "steady-load", s.Load, "check 1: load factor; input λ = load × λ0")
	fs.DurationVar(&s.Service, "steady-service", s.Service, "check 1: handler service time (μ = 1/service)")
	fs.IntVar(&s.Workers, "steady-workers", s.Workers, "check 1: workers W; 0 sizes W = ceil(λ/μ) (see -max-util)")
	fs.DurationVar(&s.Duration, "steady-duration", s.Duration, "check 1: how long to run")
	fs.IntVar(&s.Queue, "steady-queue", s.Queue, "check 1: topic queue and lane capacity")

	f := &c.Fault
	fs.Float64Var(&f.Rate, "fault-rate", f.Rate, "check 2: input λ in msgs/s")
	fs.DurationVar(&f.Service, "fault-service", f.Service, "check 2: service time of the failing subscriber")
	fs.IntVar(&f.Workers, "fault-workers", f.Workers, "check 2: workers of the failing subscriber")
	fs.DurationVar(&f.Warmup, "fault-warmup", f.Warmup, "check 2: steady phase before the fault")
	fs.DurationVar(&f.Duration, "fault-duration", f.Duration, "check 2: how long the subscriber times out")
	fs.DurationVar(&f.Recover, "recover-within", f.Recover, "check 2: bound on the backlog's recovery time; 0 means 2 × fault-duration")
	fs.DurationVar(&f.Hold, "fault-hold", f.Hold, "check 2: the backlog must stay at its steady level this long after recovering")
	fs.DurationVar(&f.HandlerTimeout, "handler-timeout", f.HandlerTimeout, "check 2: HandlerTimeout of the failing subscriber")
	fs.Float64Var(&f.FailProb, "fault-prob", f.FailProb, "check 2: share of attempts that time out during the fault")
	fs.IntVar(&f.MaxRetries, "fault-retries", f.MaxRetries, "check 2: MaxRetries of the retry policy")
	fs.IntVar(&f.Queue, "fault-queue", f.Queue, "check 2: topic queue and lane capacity")
	fs.StringVar(&f.WhenFull, "fault-when-full", f.WhenFull, "check 2: the failing subscriber's full-lane policy: block (backpressure to the topic), dead_letter_newest or dead_letter_oldest (shed at that subscriber)")
	fs.DurationVar(&f.PublishTimeout, "publish-timeout", f.PublishTimeout, "check 2: the broker's publish timeout")
	fs.DurationVar(&f.Margin, "publish-margin", f.Margin, "check 2: allowed on top of the publish timeout for the longest Publish")
	fs.Float64Var(&f.MaxRetryRate, "max-retry-rate", f.MaxRetryRate, "check 2: bound on the whole run's retry rate (retries/attempts)")

	fs.IntVar(&c.Dup.Count, "dup-count", c.Dup.Count, "check 3: how many times the same message ID is published")
	fs.IntVar(&c.Dup.Workers, "dup-workers", c.Dup.Workers, "check 3: workers of the subscriber whose first attempt fails")
	fs.IntVar(&c.Dead.MaxRetries, "dl-retries", c.Dead.MaxRetries, "check 4: MaxRetries before a failing message is dead-lettered")

	m := &c.Model
	fs.Float64Var(&m.Rate, "model-rate", m.Rate, "check 5: input λ in msgs/s")
	fs.DurationVar(&m.Service, "model-service", m.Service, "check 5: handler service time (μ = 1/service)")
	fs.IntVar(&m.Workers, "model-workers", m.Workers, "check 5: workers W in phase A (W·μ < λ)")
	fs.DurationVar(&m.Duration, "model-duration", m.Duration, "check 5: length of each phase")
	fs.IntVar(&m.Queue, "model-queue", m.Queue, "check 5: topic queue and lane capacity (phase A must not fill it)")
	fs.Float64Var(&m.Tol, "model-tol", m.Tol, "check 5: relative error allowed between measured and predicted growth")
	fs.Float64Var(&m.Trend, "model-trend", m.Trend, "checks 1, 5: bound on the backlog trend as a share of λ")
}

// validate reports a configuration the checks cannot run with.
func (c *config) validate() error {
	var errs []error
	bad := func(cond bool, format string, args ...any) {
		if cond {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	bad(c.Sample <= 0, "-sample must be > 0")
	bad(c.Progress <= 0, "-progress must be > 0")
	bad(c.MaxUtil <= 0 || c.MaxUtil > 1, "-max-util must be in (0, 1]")
	bad(c.CloseTimeout <= 0, "-close-timeout must be > 0")
	s := c.Steady
	bad(s.Rate <= 0 || s.Load <= 0, "-steady-rate and -steady-load must be > 0")
	bad(s.Service <= 0 || s.Duration <= 0, "-steady-service and -steady-duration must be > 0")
	bad(s.Workers < 0 || s.Queue < 1, "-steady-workers must be >= 0 and -steady-queue >= 1")
	f := c.Fault
	bad(f.Rate <= 0 || f.Service <= 0 || f.Workers < 1, "-fault-rate, -fault-service and -fault-workers must be > 0")
	bad(f.Warmup <= 0 || f.Duration <= 0 || f.Hold < 0 || f.Recover < 0, "-fault-warmup and -fault-duration must be > 0, -fault-hold and -recover-within >= 0")
	bad(f.HandlerTimeout <= f.Service, "-handler-timeout must exceed -fault-service")
	bad(f.FailProb <= 0 || f.FailProb > 1, "-fault-prob must be in (0, 1]")
	bad(c.Publishers < 1, "-publishers must be >= 1")
	bad(f.MaxRetries < 0 || f.Queue < 1, "-fault-retries must be >= 0 and -fault-queue >= 1")
	_, ok := lanePolicy(f.WhenFull)
	bad(!ok, "-fault-when-full must be block, dead_letter_newest or dead_letter_oldest")
	bad(f.PublishTimeout < 0 || f.Margin < 0, "-publish-timeout and -publish-margin must be >= 0")
	bad(f.MaxRetryRate <= 0, "-max-retry-rate must be > 0")
	bad(c.Dup.Count < 1 || c.Dup.Workers < 1, "-dup-count and -dup-workers must be >= 1")
	bad(c.Dead.MaxRetries < 1, "-dl-retries must be >= 1")
	m := c.Model
	bad(m.Rate <= 0 || m.Service <= 0 || m.Duration <= 0, "-model-rate, -model-service and -model-duration must be > 0")
	bad(m.Workers < 1 || m.Queue < 1, "-model-workers and -model-queue must be >= 1")
	bad(float64(m.Workers)/m.Service.Seconds() >= m.Rate, "check 5 phase A needs W·μ < λ: %d workers × %.0f/s >= %.0f/s",
		m.Workers, 1/m.Service.Seconds(), m.Rate)
	bad(m.Tol <= 0 || m.Trend <= 0, "-model-tol and -model-trend must be > 0")
	return errors.Join(errs...)
}

func (c *config) recoverBound() time.Duration {
	if c.Fault.Recover > 0 {
		return c.Fault.Recover
	}
	return 2 * c.Fault.Duration
}
