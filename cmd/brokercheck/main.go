package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the command without os.Exit: it parses args, runs the checks,
// writes the chart and returns the exit status (0 all passed, 1 a check
// failed, 2 bad usage or the chart could not be written).
func run(args []string, stdout, stderr io.Writer) int {
	cfg := defaultConfig()
	fs := flag.NewFlagSet("brokercheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg.register(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: brokercheck [flags]\n\n"+
			"Runs the design article's four pre-release checks, scaled to seconds, plus the\n"+
			"backlog model: 1 steady state at 1.2x, 2 a subscriber timing out, 3 one ID\n"+
			"published many times, 4 permanent failures in the dead-letter store, 5 backlog\n"+
			"growth = λ − W·μ. Prints PASS/FAIL with figures; exits 1 if a check fails.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "brokercheck: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if err := cfg.validate(); err != nil {
		fmt.Fprintf(stderr, "brokercheck: %v\n", err)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	start := time.Now()
	fmt.Fprintf(stdout, "brokercheck: checks %s, %s arrivals, Stats sampled every %v\n",
		checkList{&cfg}.String(), arrivalName(&cfg), cfg.Sample)
	results := runChecks(ctx, &cfg, stdout)
	passed := printSummary(stdout, results, time.Since(start))
	if cfg.Chart != "" {
		if err := writeChart(cfg.Chart, results); err != nil {
			fmt.Fprintf(stderr, "brokercheck: %v\n", err)
			return 2
		}
		fmt.Fprintf(stdout, "chart: %s\n", cfg.Chart)
	}
	if !passed {
		return 1
	}
	return 0
}

// writeChart writes one panel per check result to an SVG file.
func writeChart(path string, results []*result) error {
	c := chart{Title: "brokercheck: backlog over time"}
	for _, r := range results {
		p := r.Panel
		if p.Title == "" {
			p.Title = fmt.Sprintf("Check %d: %s", r.ID, r.Name)
		}
		verdict := "PASS"
		if !r.Pass() {
			verdict = "FAIL"
		}
		p.Title += " — " + verdict
		c.Panels = append(c.Panels, p)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := c.WriteSVG(f); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}
