package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/flightcache/flightcache"
)

// table prints rows under a header, indented by two spaces. align has one
// letter per column, l (left) or r (right); columns past its end are
// right-aligned.
func table(w io.Writer, align string, header []string, rows [][]string) {
	width := make([]int, len(header))
	for _, r := range append([][]string{header}, rows...) {
		for i, c := range r {
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	line := func(r []string) {
		var b strings.Builder
		for i, c := range r {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			switch {
			case i < len(align) && align[i] == 'l':
				b.WriteString("  " + c + pad)
			default:
				b.WriteString("  " + pad + c)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	line(header)
	for _, r := range rows {
		line(r)
	}
}

// ms formats a duration in milliseconds with one decimal.
func ms(d time.Duration) string {
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}

// progress draws one status line on stderr while a run goes on. On a
// terminal the line is redrawn in place; elsewhere (a CI log, a pipe) each
// run prints one line when it starts.
type progress struct {
	w   io.Writer
	tty bool
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// start shows label and, every 200 ms on a terminal, the elapsed time of a
// run of length d and the Loader's counters. The returned stop ends the
// display and returns once its goroutine has.
func (p *progress) start(label string, d time.Duration, stats func() flightcache.Stats) (stop func()) {
	if p == nil || p.w == nil {
		return func() {}
	}
	if !p.tty {
		fmt.Fprintf(p.w, "burst: %s (%v)\n", label, d)
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	t0 := time.Now()
	draw := func() {
		s := stats()
		fmt.Fprintf(p.w, "\r\033[K%s  %4.1fs / %.1fs  gets %d  loads %d  load errors %d",
			label, time.Since(t0).Seconds(), d.Seconds(), s.Gets, s.Loads, s.LoadErrors)
	}
	wg.Go(func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			draw()
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
		fmt.Fprint(p.w, "\r\033[K")
	}
}
