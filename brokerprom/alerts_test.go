package brokerprom_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/inproc/broker/brokerprom"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// rules is the shape of a Prometheus rule file, as far as this test reads it.
type rules struct {
	Groups []struct {
		Name  string
		Rules []struct {
			Alert, Expr, For string
			Labels           map[string]string
			Annotations      map[string]string
		}
	}
}

// TestAlertsUseExportedMetrics parses alerts.yml and checks that every
// rule is complete (a for of a minute or more, a summary and a runbook
// line) and every metric an expression names is one the collector exports
// (histogram series by their family's name).
func TestAlertsUseExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile("alerts.yml")
	require.NoError(t, err)
	var f rules
	require.NoError(t, yaml.Unmarshal(raw, &f))
	require.NotEmpty(t, f.Groups)

	c, err := brokerprom.New()
	require.NoError(t, err)
	exported := describedNames(c)
	metric := regexp.MustCompile(`\bbroker_[a-z0-9_]+`)
	used := map[string]bool{}
	for _, g := range f.Groups {
		require.NotEmpty(t, g.Rules, "group %s", g.Name)
		for _, r := range g.Rules {
			assert.NotEmpty(t, r.Alert)
			assert.NotEmpty(t, r.Expr, "alert %s", r.Alert)
			assert.NotEmpty(t, r.Labels["severity"], "alert %s", r.Alert)
			assert.NotEmpty(t, r.Annotations["summary"], "alert %s", r.Alert)
			assert.NotEmpty(t, r.Annotations["runbook"], "alert %s has no runbook line", r.Alert)
			if d, err := model.ParseDuration(r.For); assert.NoError(t, err, "alert %s: for %q", r.Alert, r.For) {
				assert.GreaterOrEqual(t, time.Duration(d), time.Minute, "alert %s fires on one evaluation", r.Alert)
			}
			names := metric.FindAllString(r.Expr, -1)
			assert.NotEmpty(t, names, "alert %s names no metric", r.Alert)
			for _, name := range names {
				family := name
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if base, ok := strings.CutSuffix(name, suffix); ok && exported[base] {
						family = base
					}
				}
				assert.True(t, exported[family], "alert %s uses %s, which the collector does not export", r.Alert, name)
				used[family] = true
			}
		}
	}
	// The rules the design calls for are there.
	for _, name := range []string{
		"broker_topic_queue_capacity", "broker_delivery_retries_total", "broker_delivery_attempts_total",
		"broker_dead_lettered_by_reason_total", "broker_topic_queue_oldest_message_age_seconds",
		// the broker's own losses
		"broker_dead_letter_evictions_total", "broker_dead_letter_store_capacity",
		"broker_dedup_forgotten_early_total", "broker_dedup_effective_window_seconds",
	} {
		assert.True(t, used[name], "no rule uses %s", name)
	}
}
