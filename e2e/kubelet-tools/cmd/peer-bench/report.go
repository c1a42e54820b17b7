package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// level is everything one plugin did at one concurrency over all rounds.
type level struct {
	Prepare, Unprepare []time.Duration
	Pairs              int
	Wall, CPU, APICPU  time.Duration
	// Worst p99 of a single round: the goal holds "in every run".
	WorstPrepareP99, WorstUnprepareP99 time.Duration
}

func (l *level) add(p phase) {
	l.Prepare = append(l.Prepare, p.Prepare...)
	l.Unprepare = append(l.Unprepare, p.Unprepare...)
	l.Pairs += p.Pairs
	l.Wall += p.Wall
	l.CPU += p.CPU
	l.APICPU += p.APICPU
	l.WorstPrepareP99 = max(l.WorstPrepareP99, percentile(p.Prepare, 99))
	l.WorstUnprepareP99 = max(l.WorstUnprepareP99, percentile(p.Unprepare, 99))
}

// percentile is the nearest-rank percentile of d (0 for none).
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// pairsPerCPUSecond is how many prepare/unprepare pairs one second of the plugin's CPU time buys.
func (l *level) pairsPerCPUSecond() float64 {
	if l.CPU <= 0 {
		return 0
	}
	return float64(l.Pairs) / l.CPU.Seconds()
}

// apiMicrosPerPair is the API server's CPU per pair in µs (0 when not measured).
func (l *level) apiMicrosPerPair() float64 {
	if l.Pairs == 0 {
		return 0
	}
	return float64(l.APICPU.Microseconds()) / float64(l.Pairs)
}

// memory is what the bench read of a plugin's resident set.
type memory struct {
	IdleKiB, PeakKiB int64
}

// goal is a target on the ratio ours ÷ theirs (atLeast / atMost) or on ours alone (maxMs).
type goal struct {
	kind  string // "", "atLeast", "atMost", "maxMs"
	value float64
	text  string
}

var (
	noGoal      = goal{text: "—"}
	cpuGoal     = goal{kind: "atLeast", value: 3, text: "≥ 3×"}
	rssGoal     = goal{kind: "atMost", value: 1.0 / 3, text: "≤ 1/3"}
	latencyGoal = goal{kind: "maxMs", value: 5, text: "≤ 5 ms (ours)"}
)

// missedSee points a missed goal at the page that shows where the time and memory go (the table
// lives in perf.md, beside peers.md).
const missedSee = "; see peers.md#where-the-goals-stand"

// verdict says whether ours meets g and, where it does not, by how much and where to read why.
func (g goal) verdict(ours, theirs float64, unit string) string {
	ratio := ratioOf(ours, theirs)
	switch g.kind {
	case "atLeast":
		if ratio >= g.value {
			return g.text + ": met"
		}
		return fmt.Sprintf("%s: MISSED, %.2f× short%s", g.text, g.value/ratio, missedSee)
	case "atMost":
		if ratio <= g.value {
			return g.text + ": met"
		}
		return fmt.Sprintf("%s: MISSED by %.1f %s (needs ≤ %.1f)%s", g.text, ours-theirs*g.value, unit, theirs*g.value, missedSee)
	case "maxMs":
		if ours <= g.value {
			return g.text + ": met"
		}
		return fmt.Sprintf("%s: MISSED by %.2f ms%s", g.text, ours-g.value, missedSee)
	}
	return g.text
}

func ratioOf(ours, theirs float64) float64 {
	if theirs == 0 {
		return 0
	}
	return ours / theirs
}

// row prints one `peer|figure|ours|theirs|ratio|goal` line for tools/perf-table.py.
func row(w io.Writer, figure string, ours, theirs float64, format, unit string, g goal) {
	cell := func(v float64) string { return strings.TrimSpace(fmt.Sprintf(format, v) + " " + unit) }
	fmt.Fprintf(w, "peer|%s|%s|%s|%.2f×|%s\n", figure, cell(ours), cell(theirs), ratioOf(ours, theirs), g.verdict(ours, theirs, unit))
}

// cpuRow is the CPU figure: pairs per CPU second (what the goal is on) with CPU per pair beside.
func cpuRow(w io.Writer, figure string, ours, theirs *level) {
	cell := func(l *level) string {
		pps := l.pairsPerCPUSecond()
		if pps == 0 {
			return "—"
		}
		return fmt.Sprintf("%.0f (%.0f µs/pair)", pps, 1e6/pps)
	}
	o, t := ours.pairsPerCPUSecond(), theirs.pairsPerCPUSecond()
	fmt.Fprintf(w, "peer|%s|%s|%s|%.2f×|%s\n", figure, cell(ours), cell(theirs), ratioOf(o, t), cpuGoal.verdict(o, t, ""))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func mib(kib int64) float64 { return float64(kib) / 1024 }

// report writes the peer rows: latency, CPU and throughput per concurrency, the worst round at the
// highest concurrency, then memory.
type report struct {
	Levels             []int
	Rounds             int
	Ours, Theirs       map[int]*level
	OursMem, TheirsMem memory
	// The idle RSS of our plugin with its largest profile (0: not measured), and what it is.
	LargestKiB   int64
	LargestLabel string
	// Appended to every figure but the largest profile's: which pairing of settings this is.
	Label string
}

// name is a figure's name with the pairing's label, if any.
func (r *report) name(format string, args ...any) string {
	n := fmt.Sprintf(format, args...)
	if r.Label != "" {
		n += ", " + r.Label
	}
	return n
}

func (r *report) write(w io.Writer) {
	for _, c := range r.Levels {
		o, t := r.Ours[c], r.Theirs[c]
		for _, op := range []struct {
			name string
			o, t []time.Duration
		}{{"prepare", o.Prepare, t.Prepare}, {"unprepare", o.Unprepare, t.Unprepare}} {
			for _, p := range []float64{50, 99} {
				row(w, r.name("%s p%.0f, %d concurrent", op.name, p, c),
					ms(percentile(op.o, p)), ms(percentile(op.t, p)), "%.2f", "ms", noGoal)
			}
		}
		cpuRow(w, r.name("plugin CPU: prepare/unprepare pairs per CPU second, %d concurrent", c), o, t)
		row(w, r.name("prepare/unprepare pairs per second, %d concurrent", c),
			float64(o.Pairs)/o.Wall.Seconds(), float64(t.Pairs)/t.Wall.Seconds(), "%.0f", "", noGoal)
		if o.APICPU > 0 || t.APICPU > 0 {
			row(w, r.name("kube-apiserver CPU per pair, %d concurrent", c),
				o.apiMicrosPerPair(), t.apiMicrosPerPair(), "%.0f", "µs", noGoal)
		}
	}
	top := r.Levels[len(r.Levels)-1]
	o, t := r.Ours[top], r.Theirs[top]
	row(w, r.name("prepare p99, %d concurrent, worst round", top), ms(o.WorstPrepareP99), ms(t.WorstPrepareP99), "%.2f", "ms", latencyGoal)
	row(w, r.name("unprepare p99, %d concurrent, worst round", top), ms(o.WorstUnprepareP99), ms(t.WorstUnprepareP99), "%.2f", "ms", latencyGoal)
	row(w, r.name("peak RSS (VmHWM) over the run"), mib(r.OursMem.PeakKiB), mib(r.TheirsMem.PeakKiB), "%.1f", "MiB", rssGoal)
	row(w, r.name("RSS at idle, 8 devices"), mib(r.OursMem.IdleKiB), mib(r.TheirsMem.IdleKiB), "%.1f", "MiB", rssGoal)
	if r.LargestKiB > 0 {
		row(w, fmt.Sprintf("RSS at idle, ours (%s) vs theirs (8 devices)", r.LargestLabel),
			mib(r.LargestKiB), mib(r.TheirsMem.IdleKiB), "%.1f", "MiB", rssGoal)
	}
}

// summary is the human-readable side: CPU per pair and the pair counts behind each figure.
func (r *report) summary(w io.Writer, ours, theirs string) {
	fmt.Fprintf(w, "%-8s %-11s %7s %9s %9s %9s %9s %10s %9s %10s\n", "plugin", "concurrent", "pairs",
		"prep p50", "prep p99", "unp p50", "unp p99", "CPU/pair", "pairs/s", "API/pair")
	for _, c := range r.Levels {
		for _, s := range []struct {
			name string
			l    *level
		}{{ours, r.Ours[c]}, {theirs, r.Theirs[c]}} {
			l := s.l
			perPair := time.Duration(0)
			if l.Pairs > 0 {
				perPair = l.CPU / time.Duration(l.Pairs)
			}
			fmt.Fprintf(w, "%-8s %-11d %7d %7.2fms %7.2fms %7.2fms %7.2fms %8dµs %9.0f %8.0fµs\n", s.name, c, l.Pairs,
				ms(percentile(l.Prepare, 50)), ms(percentile(l.Prepare, 99)),
				ms(percentile(l.Unprepare, 50)), ms(percentile(l.Unprepare, 99)),
				perPair.Microseconds(), float64(l.Pairs)/l.Wall.Seconds(), l.apiMicrosPerPair())
		}
	}
}
