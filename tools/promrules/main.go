// promrules: Prometheus' own rule-file validation and PromQL evaluation, as the reference for the
// bundle's PrometheusRule (tests/kustomize/test_kustomize_monitoring.py).
//
//	promrules check FILE   validate a rule file as Prometheus loads it (rulefmt: YAML fields,
//	                       PromQL of every expr, templates of labels and annotations); prints the
//	                       rules as JSON, or the errors and exit status 1
//	promrules eval FILE    read {"samples": [{"labels": {...}, "t": seconds, "v": value}], "at":
//	                       seconds} on stdin, store the samples in a TSDB, and print what each
//	                       alerting rule's expr returns at "at" ({"Alert": [{"labels", "value"}]});
//	                       a value JSON cannot hold (NaN, ±Inf: a quantile of no observations) is
//	                       written as Prometheus writes it, in a string
//	promrules alerts FILE  the same input plus "from" and "interval" (seconds): every alerting
//	                       rule is evaluated by Prometheus' rule engine (rules.AlertingRule, with its
//	                       `for` and `keep_firing_for`) at from, from+interval, ... up to at, and
//	                       what is active at the end is printed ({"Alert": [{"labels", "value",
//	                       "state": "pending"|"firing"}]}; labels as in eval, without alertname and
//	                       the rule's own labels)
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"sort"
	"strconv"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/rules"
	"github.com/prometheus/prometheus/tsdb"
)

type ruleOut struct {
	Group  string `json:"group"`
	Alert  string `json:"alert,omitempty"`
	Record string `json:"record,omitempty"`
	Expr   string `json:"expr"`
	For    string `json:"for,omitempty"`
}

type sample struct {
	Labels map[string]string `json:"labels"`
	T      float64           `json:"t"`
	V      float64           `json:"v"`
}

type evalIn struct {
	Samples  []sample `json:"samples"`
	At       float64  `json:"at"`
	From     float64  `json:"from"`
	Interval float64  `json:"interval"`
}

type seriesOut struct {
	Labels map[string]string `json:"labels"`
	Value  value             `json:"value"`
	State  string            `json:"state,omitempty"`
}

type value float64

func (v value) MarshalJSON() ([]byte, error) {
	f := float64(v)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return json.Marshal(strconv.FormatFloat(f, 'g', -1, 64))
	}
	return json.Marshal(f)
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "promrules: "+format+"\n", args...)
	os.Exit(2)
}

func load(file string) *rulefmt.RuleGroups {
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	groups, errs := rulefmt.ParseFile(file, false, model.UTF8Validation, parser.NewParser(parser.Options{}), logger)
	if len(errs) > 0 {
		for _, e := range errs {
			fmt.Fprintln(os.Stderr, e)
		}
		os.Exit(1)
	}
	return groups
}

func check(file string) {
	out := []ruleOut{}
	for _, g := range load(file).Groups {
		for _, r := range g.Rules {
			ro := ruleOut{Group: g.Name, Alert: r.Alert, Record: r.Record, Expr: r.Expr}
			if r.For != 0 {
				ro.For = r.For.String()
			}
			out = append(out, ro)
		}
	}
	emit(out)
}

func ms(seconds float64) int64 { return int64(seconds * 1000) }

// stored reads the input on stdin and stores its samples in a fresh TSDB; close() removes it.
func stored() (evalIn, *tsdb.DB, promql.QueryEngine, func()) {
	raw, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail("reading stdin: %v", err)
	}
	var in evalIn
	if err := json.Unmarshal(raw, &in); err != nil {
		fail("stdin is not the expected JSON: %v", err)
	}
	dir, err := os.MkdirTemp("", "promrules-")
	if err != nil {
		fail("%v", err)
	}
	db, err := tsdb.Open(dir, nil, nil, tsdb.DefaultOptions(), nil)
	if err != nil {
		os.RemoveAll(dir)
		fail("opening a TSDB: %v", err)
	}
	closeAll := func() {
		db.Close()
		os.RemoveAll(dir)
	}
	// One series' samples must arrive in time order.
	sort.SliceStable(in.Samples, func(i, j int) bool { return in.Samples[i].T < in.Samples[j].T })
	app := db.Appender(context.Background())
	for _, s := range in.Samples {
		if _, err := app.Append(0, labels.FromMap(s.Labels), ms(s.T), s.V); err != nil {
			closeAll()
			fail("sample %v at %v: %v", s.Labels, s.T, err)
		}
	}
	if err := app.Commit(); err != nil {
		closeAll()
		fail("committing samples: %v", err)
	}
	engine := promql.NewEngine(promql.EngineOpts{
		MaxSamples: 1_000_000, Timeout: time.Minute, LookbackDelta: 5 * time.Minute, EnableAtModifier: true,
	})
	return in, db, engine, closeAll
}

func eval(file string) {
	groups := load(file)
	in, db, engine, closeAll := stored()
	defer closeAll()
	at := time.UnixMilli(ms(in.At))
	out := map[string][]seriesOut{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			q, err := engine.NewInstantQuery(context.Background(), db, nil, r.Expr, at)
			if err != nil {
				fail("%s: %v", r.Alert, err)
			}
			res := q.Exec(context.Background())
			if res.Err != nil {
				fail("%s: %v", r.Alert, res.Err)
			}
			vec, err := res.Vector()
			if err != nil {
				fail("%s: not an instant vector: %v", r.Alert, err)
			}
			series := []seriesOut{}
			for _, s := range vec {
				series = append(series, seriesOut{Labels: s.Metric.Map(), Value: value(s.F)})
			}
			out[r.Alert] = series
			q.Close()
		}
	}
	emit(out)
}

func alerts(file string) {
	groups := load(file)
	in, db, engine, closeAll := stored()
	defer closeAll()
	if in.Interval <= 0 || in.From > in.At {
		fail("alerts needs \"interval\" > 0 and \"from\" <= \"at\"")
	}
	query := rules.EngineQueryFunc(engine, db)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	out := map[string][]seriesOut{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			expr, err := parser.NewParser(parser.Options{}).ParseExpr(r.Expr)
			if err != nil {
				fail("%s: %v", r.Alert, err)
			}
			rule := rules.NewAlertingRule(r.Alert, expr, time.Duration(r.For), time.Duration(r.KeepFiringFor),
				labels.FromMap(r.Labels), labels.FromMap(r.Annotations), labels.EmptyLabels(), "", true, logger)
			for t := in.From; t <= in.At+1e-9; t += in.Interval {
				if _, err := rule.Eval(context.Background(), 0, time.UnixMilli(ms(t)), query, nil, 0); err != nil {
					fail("%s at %v: %v", r.Alert, t, err)
				}
			}
			series := []seriesOut{}
			for _, a := range rule.ActiveAlerts() {
				lbls := a.Labels.Map()
				delete(lbls, labels.AlertName)
				for k := range r.Labels {
					delete(lbls, k)
				}
				series = append(series, seriesOut{Labels: lbls, Value: value(a.Value), State: a.State.String()})
			}
			sort.Slice(series, func(i, j int) bool {
				return labels.FromMap(series[i].Labels).String() < labels.FromMap(series[j].Labels).String()
			})
			out[r.Alert] = series
		}
	}
	emit(out)
}

func emit(v any) {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		fail("%v", err)
	}
}

func main() {
	if len(os.Args) != 3 {
		fail("usage: promrules check|eval|alerts RULES.yaml")
	}
	switch os.Args[1] {
	case "check":
		check(os.Args[2])
	case "eval":
		eval(os.Args[2])
	case "alerts":
		alerts(os.Args[2])
	default:
		fail("unknown command %q (check, eval, alerts)", os.Args[1])
	}
}
