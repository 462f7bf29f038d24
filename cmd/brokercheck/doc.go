// Command brokercheck runs the design article's pre-release checks
// ("压测与验收清单") against the broker, scaled from half an hour to seconds,
// and prints PASS or FAIL for each with the figures behind it. It exits
// with status 1 when a check fails (2 for bad flags).
//
//	go run ./cmd/brokercheck                      # all five checks, about 20 s
//	go run ./cmd/brokercheck -check 2 -fault-duration 5s
//	go run ./cmd/brokercheck -chart /tmp/brokercheck.svg
//
// Every check uses only the broker's public API: it builds a broker,
// publishes from a load generator, measures with Stats polling and an
// Observer, closes the broker and verifies that none of its own goroutines
// is left. Time is real: handlers sleep their service time, publishers pace
// by an absolute schedule (Poisson or evenly spaced arrivals at rate λ),
// and a monitor samples Stats every -sample interval.
//
// # The checks
//
//  1. Steady state. Input at 1.2× the target rate (-steady-rate ×
//     -steady-load), one subscriber provisioned for that load by the
//     article's rule W = ceil(λ/μ), with μ the measured rate of one worker
//     (raised if the utilisation λ/(W·μ) would exceed -max-util, since a
//     queue at ρ = 1 never settles). Proves that with enough workers the
//     backlog (topic Queued + subscriber Queued + InFlight) stays in a
//     stable range: its p95 is below half the buffer (topic queue + lane
//     capacity), it has no upward trend and no publish is refused.
//
//  2. Fault injection. Two subscribers on one topic; during a fault window
//     every attempt of one of them ("webhook") runs past its HandlerTimeout.
//     Its retries park without holding a worker, but each attempt holds one
//     for the whole timeout, so the webhook falls behind: under the default
//     full-lane policy (-fault-when-full block) its lane fills, the topic's
//     dispatcher waits, the topic queue fills and Publish pushes back; with
//     dead_letter_newest or dead_letter_oldest the webhook sheds with reason
//     overflow and the topic flows. The chart draws the healthy
//     subscriber's delivery rate beside the backlog. Proves that publishers
//     always return (the longest Publish is at most the publish timeout plus a margin, and every
//     publisher goroutine ends), that the retry rate stays within its bounds
//     (in the fault window at most r/(r+1), the most that r retries per
//     message allow; over the whole run below -max-retry-rate, the article's
//     15%), and that after the fault the backlog returns to its steady level
//     (twice the steady p95, at least 10) and holds it (p95 over the next
//     -fault-hold) within -recover-within (by default twice the fault, the
//     article's 10 minutes after a 5-minute fault). It also shows what the
//     fault costs the healthy subscriber: under Block, once the failing
//     subscriber's lane is full the topic's dispatcher waits, so both slow
//     down (Stats' BlockedFor says for how long); under a dead-letter
//     policy the healthy one keeps the input rate.
//
//  3. Idempotency. One message ID published -dup-count times, concurrently
//     and under different ordering keys, to a subscriber with several
//     workers whose first attempt fails (so a retry is in flight while
//     duplicates arrive) and to a plain one. Proves that each side effect
//     happens exactly once: Delivered 1, Deduplicated count−1 at each.
//
//  4. Failure exit. Messages that fail for good — a retryable coded error
//     every time, a Permanent error, a handler timeout (with its own retry
//     rule) — reach the dead-letter store. Proves that each dead letter has
//     topic, message_id, subscriber, attempt and error_code set right (and
//     reason, retryable, error text), that the handler saw attempts
//     1..MaxRetries+1 in order, and that the Observer event and the Warn
//     log line carry the same fields. A healthy subscriber of the same
//     topic gets no dead letter.
//
//  5. The backlog model. Phase A under-provisions a subscriber (W·μ < λ):
//     the backlog's measured growth (least-squares slope) must match the
//     article's λ − W·μ within -model-tol (15%), with λ and μ as measured in
//     the run (the nominal figure, from -model-service, is printed too).
//     Phase B provisions W = ceil(λ_p95/μ_p50), the article's sizing rule,
//     from phase A's measured input rate (95th percentile over one-second
//     windows) and median worker rate: the backlog must stay bounded (p95
//     below half the buffer, no upward trend).
//
// After each check the broker is closed and its Stats must balance: at each
// subscriber Routed = Published = Delivered + Deduplicated + DeadLettered,
// nothing queued or in flight, and the dead-letter store holds every dead
// letter counted.
//
// # Reading the output
//
// Each check prints its set-up (λ, μ, W, capacity, buffer), then one
// progress line per second:
//
//	[c1   3.0s] published=2402 delivered=2399 backlog=3 retries=0 dead=0 rejected=0
//
// elapsed time, messages accepted by Publish, deliveries (summed over
// subscribers), backlog, retries, dead letters and refused publishes. Then
// come its figures, one "ok"/"FAIL" line per criterion with the measured
// value and the bound, and a PASS/FAIL line. A summary ends the run.
//
// Rates are in messages per second. μ is one worker's rate, 1/(mean handler
// time); a handler that sleeps 2 ms takes a little longer than 2 ms (timer
// slack), so the measured μ is the one the figures rely on. With -chart
// the backlog of every check is drawn over time into an SVG file, one panel
// per check, with the fault window, bounds and the model's prediction.
//
// Run "brokercheck -h" for every flag.
package main
