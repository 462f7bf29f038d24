package brokerprom_test

import (
	"os"
	"os/exec"
	"testing"
)

// promtool is the promtool binary: $PROMTOOL, else the one on the PATH;
// "" when there is none.
func promtool() string {
	if p := os.Getenv("PROMTOOL"); p != "" {
		return p
	}
	p, _ := exec.LookPath("promtool")
	return p
}

// TestAlertRulesPromtool checks alerts.yml with promtool and runs its unit
// test, testdata/alerts_test.yml: each loss the broker reports (evictions,
// dedup forgetting early, shed messages, dead letters) fires its alert
// after its for:, and a healthy broker fires none. It needs promtool (go
// install github.com/prometheus/prometheus/cmd/promtool@v0.316.0); without
// it the test is skipped, and TestAlertsUseExportedMetrics still checks
// the rules' shape and metric names.
func TestAlertRulesPromtool(t *testing.T) {
	bin := promtool()
	if bin == "" {
		t.Skip("promtool not found: set PROMTOOL or put it on the PATH")
	}
	for _, args := range [][]string{
		{"check", "rules", "alerts.yml"},
		{"test", "rules", "testdata/alerts_test.yml"},
	} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}
