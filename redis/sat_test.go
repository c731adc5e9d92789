package flightredis

import (
	"math"
	"testing"
	"time"
)

// forever is the largest duration: "never", for the Loader's options.
const forever = time.Duration(math.MaxInt64)

// The tier's conversions to and from what Redis stores saturate: a
// duration of "never" stays the largest, never a short or negative one.
func TestDurationConversions(t *testing.T) {
	const maxI, minI = math.MaxInt64, math.MinInt64
	for _, tc := range []struct {
		d    time.Duration
		want int64
	}{
		{-time.Hour, 1}, {0, 1}, {time.Nanosecond, 1}, {999 * time.Microsecond, 1},
		{time.Millisecond, 1}, {1500 * time.Millisecond, 1500},
		{forever, math.MaxInt64 / int64(time.Millisecond)},
	} {
		if got := px(tc.d); got != tc.want {
			t.Errorf("px(%v) = %d; want %d", tc.d, got, tc.want)
		}
	}
	for _, tc := range []struct {
		n      int64
		ms, us time.Duration
	}{
		{0, 0, 0},
		{1, time.Millisecond, time.Microsecond},
		{-1, -time.Millisecond, -time.Microsecond},
		{math.MaxInt64 / 1_000_000, math.MaxInt64 / 1_000_000 * time.Millisecond, math.MaxInt64 / 1_000_000 * time.Microsecond},
		{math.MaxInt64 / 1000, forever, math.MaxInt64 / 1000 * time.Microsecond},
		{maxI, forever, forever},
		{minI, time.Duration(minI), time.Duration(minI)},
	} {
		if got := fromMS(tc.n); got != tc.ms {
			t.Errorf("fromMS(%d) = %v; want %v", tc.n, got, tc.ms)
		}
		if got := fromUS(tc.n); got != tc.us {
			t.Errorf("fromUS(%d) = %v; want %v", tc.n, got, tc.us)
		}
	}
	now := time.Now()
	if got := unixNanoAfter(now, forever); got != math.MaxInt64 {
		t.Errorf("unixNanoAfter(now, forever) = %d; want math.MaxInt64", got)
	}
	if got, want := unixNanoAfter(now, time.Second), now.UnixNano()+int64(time.Second); got != want {
		t.Errorf("unixNanoAfter(now, 1s) = %d; want %d", got, want)
	}
	for _, d := range []time.Duration{0, time.Nanosecond, time.Second, forever / 2, forever / 3 * 2, forever} {
		for range 100 {
			got := jitter(d)
			if got < d/2 || (d <= forever/3*2 && got > d+d/2) || (d > 1 && got <= 0) {
				t.Fatalf("jitter(%v) = %v; want in [d/2, 3d/2], saturated", d, got)
			}
		}
	}
}
