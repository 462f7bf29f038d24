package natsjs_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/natsjs"
)

// The crash test runs this test binary again as a child process
// (TestCrashChild, selected by environment variables) that publishes and
// handles messages with an embedded server keeping its files in a shared
// directory, and kills it with SIGKILL at random moments, then starts it
// again on the same directory. The child appends what it did to plain
// files (O_APPEND, fsync after each line):
//
//	accepted.log  "<id>"                    Publish returned nil
//	handled.log   "start <id> <attempt>"    the handler began
//	              "<outcome> <id> <attempt>" it returned: ok, fail or perm
//	stall.log     the watchdog's reports
//	final.log     (last, clean run) "dl <id> <reason> <attempts>" per dead letter, then "done"
const (
	crashDirEnv  = "NATSJS_CRASH_DIR"
	crashRunEnv  = "NATSJS_CRASH_RUN"
	crashModeEnv = "NATSJS_CRASH_MODE" // "work" (publish, handle, get killed) or "final" (finish, check, exit)
	crashURLEnv  = "NATSJS_CRASH_URL"  // a server to connect to; none: embed one in dir/nats
)

// The child's workload: crashPerRun messages per work run, keyed over 7
// keys; every tenth is published twice. A message's class is its number
// modulo 10: 0-5 succeed, 6-7 fail at attempt 1 then succeed, 8 always
// fails (dead-lettered "exhausted"), 9 is refused for good ("permanent").
const (
	crashPerRun     = 50
	crashMaxRetries = 2
)

func crashClass(id string) string {
	i, _ := strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
	switch i % 10 {
	case 6, 7:
		return "flaky"
	case 8:
		return "poison"
	case 9:
		return "bad"
	}
	return "ok"
}

// crashRuns is how often each class's handler runs when nothing crashes.
var crashRuns = map[string]int{"ok": 1, "flaky": 2, "poison": crashMaxRetries + 1, "bad": 1}

// appendLog is a file written a line at a time, each line fsynced.
type appendLog struct {
	mu sync.Mutex
	f  *os.File
}

func openLog(dir, name string) (*appendLog, error) {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &appendLog{f: f}, nil
}

func (l *appendLog) line(format string, args ...any) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := fmt.Fprintf(l.f, format+"\n", args...); err != nil {
		return err
	}
	return l.f.Sync()
}

func (l *appendLog) Close() error { return l.f.Close() }

func TestCrashChild(t *testing.T) {
	dir := os.Getenv(crashDirEnv)
	if dir == "" {
		t.Skip("run by TestCrash as a child process")
	}
	run, mode := os.Getenv(crashRunEnv), os.Getenv(crashModeEnv)
	logs := map[string]*appendLog{}
	for _, name := range []string{"accepted.log", "handled.log", "stall.log"} {
		l, err := openLog(dir, name)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		logs[name] = l
	}
	var conn *natsjs.Conn
	var err error
	if url := os.Getenv(crashURLEnv); url != "" {
		conn, err = natsjs.Connect(url)
	} else {
		conn, err = natsjs.Embedded(filepath.Join(dir, "nats"))
	}
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer closeConn(t, conn)
	cfg := natsjs.Config{
		Transport: []natsjs.TransportOption{natsjs.WithPartitions(4), natsjs.WithAckWait(time.Second), natsjs.WithPullExpiry(testPullExpiry)},
		Logger:    discardLogger,
	}
	b, err := natsjs.New(t.Context(), conn.JetStream(), cfg, broker.WithRetryPolicy(broker.RetryPolicy{
		MaxRetries: crashMaxRetries, Backoff: broker.ConstantBackoff(20 * time.Millisecond),
	}))
	if err != nil {
		t.Fatalf("natsjs.New: %v", err)
	}
	handled := logs["handled.log"]
	_, err = b.Subscribe("jobs", "worker", func(ctx context.Context, m broker.Message) error {
		if err := handled.line("start %s %d", m.ID, m.Attempt); err != nil {
			return err
		}
		time.Sleep(2 * time.Millisecond) // work: a kill may land in it
		outcome, err := "ok", error(nil)
		switch c := crashClass(m.ID); {
		case c == "flaky" && m.Attempt == 1, c == "poison":
			outcome, err = "fail", errors.New("failing")
		case c == "bad":
			outcome, err = "perm", broker.Permanent(errors.New("refused"))
		}
		if werr := handled.line("%s %s %d", outcome, m.ID, m.Attempt); werr != nil {
			return werr
		}
		return err
	}, broker.Concurrency(4))
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	observer, err := natsjs.NewTransport(conn.JetStream())
	if err != nil {
		t.Fatal(err)
	}
	defer observer.Close(context.Background())
	w := startWatchdog(testPullExpiry/2, func(s string) { _ = logs["stall.log"].line("%s", strings.ReplaceAll(s, "\n", " ")) },
		watch(observer, "jobs", "worker"))
	defer w.halt()

	if mode == "work" {
		accepted := logs["accepted.log"]
		for i := range crashPerRun {
			id := fmt.Sprintf("r%s-%d", run, i)
			m := broker.Message{ID: id, Topic: "jobs", Key: fmt.Sprintf("k%d", i%7)}
			for n := 0; n < 1+btoi(i%10 == 3); n++ {
				if err := b.Publish(context.Background(), m); err == nil {
					if err := accepted.line("%s", id); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		<-t.Context().Done() // until killed
		return
	}

	// Final run: every accepted message must end, handled successfully or
	// dead-lettered; give redeliveries (AckWait 1 s) time.
	want := readAccepted(t, dir)
	var dls []broker.DeadLetter
	deadline := time.Now().Add(30 * time.Second)
	for {
		oks := okIDs(t, dir)
		dls, err = b.DeadLetters().List(t.Context(), broker.DeadLetterFilter{Topic: "jobs"})
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		var open []string
		dead := map[string]bool{}
		for _, dl := range dls {
			dead[dl.Message.ID] = true
		}
		for id := range want {
			if !oks[id] && !dead[id] {
				open = append(open, id)
			}
		}
		if len(open) == 0 {
			break
		}
		if time.Now().After(deadline) {
			sort.Strings(open)
			t.Fatalf("lost: %d accepted messages neither handled nor dead-lettered after 30s: %v", len(open), open)
		}
		time.Sleep(50 * time.Millisecond)
	}
	final, err := openLog(dir, "final.log")
	if err != nil {
		t.Fatal(err)
	}
	defer final.Close()
	for _, dl := range dls {
		if err := final.line("dl %s %s %d", dl.Message.ID, dl.Reason, dl.Attempts); err != nil {
			t.Fatal(err)
		}
	}
	w.halt()
	closeBroker(t, b)
	if err := final.line("done"); err != nil {
		t.Fatal(err)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// readLines returns the lines of dir/name, split in fields.
func readLines(t *testing.T, dir, name string) [][]string {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out [][]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) > 0 {
			out = append(out, fs)
		}
	}
	return out
}

func readAccepted(t *testing.T, dir string) map[string]bool {
	ids := map[string]bool{}
	for _, l := range readLines(t, dir, "accepted.log") {
		ids[l[0]] = true
	}
	return ids
}

func okIDs(t *testing.T, dir string) map[string]bool {
	ids := map[string]bool{}
	for _, l := range readLines(t, dir, "handled.log") {
		if l[0] == "ok" && len(l) == 3 {
			ids[l[1]] = true
		}
	}
	return ids
}

// TestCrash: a process publishing and handling over JetStream is killed
// (SIGKILL) at random moments, six times, and started again on the same
// directory; then a last run finishes. Twice: with the server embedded in
// the process (the durable default: the server dies with it), and with a
// server that outlives it (the test's, reached by URL). Every message whose
// Publish returned nil ends handled or dead-lettered (no loss) and no
// handler ever sees an attempt above MaxRetries+1. With a server that
// outlives the process a message never runs more than MaxRetries+1 times
// either; with the embedded one, the consumer state the server had not saved
// yet (it saves about ten times a second) dies with it, so a message's
// attempt count can start over: those extra runs are counted and reported.
func TestCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	for _, tt := range []struct {
		name     string
		external bool
	}{
		{"embedded server", false},
		{"server outlives the process", true},
	} {
		t.Run(tt.name, func(t *testing.T) { crashTest(t, tt.external) })
	}
}

func crashTest(t *testing.T, external bool) {
	const kills = 6
	dir := t.TempDir()
	url := ""
	if external {
		srv := embedded(t, filepath.Join(dir, "server"), natsjs.Listen("127.0.0.1", 0))
		url = srv.ClientURL()
	}
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 0))
	t.Logf("seed %d", seed)
	lines := func(name string) int { return len(readLines(t, dir, name)) }
	child := func(run int, mode string) (*exec.Cmd, *bytes.Buffer) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1", "-test.timeout=2m")
		cmd.Env = append(os.Environ(), crashDirEnv+"="+dir, crashRunEnv+"="+strconv.Itoa(run), crashModeEnv+"="+mode, crashURLEnv+"="+url)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		return cmd, &out
	}
	for run := range kills {
		cmd, out := child(run, "work")
		// Kill after a random number of new lines in one of the logs:
		// every run adds at least crashPerRun of each (absent a kill).
		log, k := "handled.log", 1+rng.IntN(crashPerRun)
		if rng.IntN(3) == 0 { // while publishing
			log, k = "accepted.log", crashPerRun/2+rng.IntN(crashPerRun/2)
		}
		base := lines(log)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }() // ends when the child does
		deadline := time.Now().Add(60 * time.Second)
		for lines(log) < base+k {
			select {
			case err := <-exited:
				t.Fatalf("run %d: the child exited (%v) before %d lines of %s:\n%s", run, err, k, log, out)
			default:
			}
			if time.Now().After(deadline) {
				_ = cmd.Process.Kill()
				<-exited
				t.Fatalf("run %d: no %d new lines in %s after 60s:\n%s", run, k, log, out)
			}
			time.Sleep(2 * time.Millisecond)
		}
		if err := cmd.Process.Kill(); err != nil { // SIGKILL
			t.Fatal(err)
		}
		<-exited
		t.Logf("run %d: killed after %d new lines of %s", run, k, log)
	}
	cmd, out := child(kills, "final")
	if err := cmd.Run(); err != nil {
		t.Fatalf("final run: %v\n%s", err, out)
	}

	// What happened.
	accepted := readAccepted(t, dir)
	type hist struct {
		starts, ends, oks int
		maxAttempt        int
		lastStart         int // attempt of the last start
		restarts          int // starts at an attempt no higher than the one before
	}
	per := map[string]*hist{}
	for _, l := range readLines(t, dir, "handled.log") {
		if len(l) != 3 {
			continue // a line cut by a kill
		}
		h := per[l[1]]
		if h == nil {
			h = &hist{}
			per[l[1]] = h
		}
		at, _ := strconv.Atoi(l[2])
		h.maxAttempt = max(h.maxAttempt, at)
		switch l[0] {
		case "start":
			h.starts++
			if h.starts > 1 && at <= h.lastStart {
				h.restarts++
			}
			h.lastStart = at
		case "ok":
			h.oks++
			h.ends++
		default:
			h.ends++
		}
	}
	dead := map[string][]string{}
	done := false
	for _, l := range readLines(t, dir, "final.log") {
		if l[0] == "dl" && len(l) == 4 {
			dead[l[1]] = l[2:]
		}
		done = done || l[0] == "done"
	}
	if !done {
		t.Fatalf("the final run did not finish:\n%s", out)
	}
	var lost, crashDead, extraRuns, cutRuns, dupOK, restarts, mostRuns int
	for id := range accepted {
		h := per[id]
		if h == nil {
			h = &hist{}
		}
		class := crashClass(id)
		d, isDead := dead[id]
		switch {
		case h.oks == 0 && !isDead:
			lost++
			t.Errorf("%s (%s) accepted, never handled nor dead-lettered", id, class)
		case class == "poison" && (!isDead || d[0] != broker.ReasonExhausted):
			t.Errorf("%s (poison) ended %v, oks %d; want dead-lettered exhausted", id, d, h.oks)
		case class == "bad" && (!isDead || d[0] != broker.ReasonPermanent):
			t.Errorf("%s (bad) ended %v; want dead-lettered permanent", id, d)
		case (class == "ok" || class == "flaky") && isDead:
			crashDead++ // its attempts were used up by kills: dead-lettered, redrivable
		}
		if h.maxAttempt > crashMaxRetries+1 {
			t.Errorf("%s: a handler saw attempt %d, above MaxRetries+1 = %d", id, h.maxAttempt, crashMaxRetries+1)
		}
		if external && h.starts > crashMaxRetries+1 {
			t.Errorf("%s: ran %d times, above MaxRetries+1 = %d, with a server that outlives the process", id, h.starts, crashMaxRetries+1)
		}
		extraRuns += max(0, h.starts-crashRuns[class])
		cutRuns += h.starts - h.ends
		restarts += h.restarts
		mostRuns = max(mostRuns, h.starts)
		dupOK += max(0, h.oks-1)
	}
	stalls := readLines(t, dir, "stall.log")
	for _, s := range stalls {
		t.Errorf("watchdog: %s", strings.Join(s, " "))
	}
	if external && restarts > 0 {
		t.Errorf("attempt numbers started over %d times with a server that outlives the process", restarts)
	}
	t.Logf("crash test: %d runs (%d killed), %d messages accepted, %d lost; %d handler runs beyond the crash-free count "+
		"(%d cut off by a kill, %d successes run again), %d times a message's attempt number started over (consumer state lost with the process), "+
		"at most %d runs of one message (MaxRetries+1 = %d), %d dead-lettered because kills used up their attempts, %d stalls",
		kills+1, kills, len(accepted), lost, extraRuns, cutRuns, dupOK, restarts, mostRuns, crashMaxRetries+1, crashDead, len(stalls))
}
