package timing

import (
	"math"
	"time"
)

// Add returns a + b, saturated at the bounds of a Duration instead of
// overflowing.
func Add(a, b time.Duration) time.Duration {
	s := a + b
	switch {
	case b > 0 && s < a:
		return math.MaxInt64
	case b < 0 && s > a:
		return math.MinInt64
	}
	return s
}

// Mul returns d·n, saturated at the bounds of a Duration instead of
// overflowing.
func Mul(d time.Duration, n int64) time.Duration {
	if d == 0 || n == 0 {
		return 0
	}
	if p := d * time.Duration(n); p/time.Duration(n) == d && (n != -1 || d != math.MinInt64) {
		return p
	}
	if (d < 0) == (n < 0) {
		return math.MaxInt64
	}
	return math.MinInt64
}

// Scale returns d·f rounded toward zero, saturated at the bounds of a
// Duration instead of overflowing (Go leaves a float conversion out of
// range undefined); a NaN product gives 0.
func Scale(d time.Duration, f float64) time.Duration {
	switch p := float64(d) * f; {
	case p >= 1<<63:
		return math.MaxInt64
	case p <= -(1 << 63):
		return math.MinInt64
	case p == p:
		return time.Duration(p)
	}
	return 0
}

// Latest is the latest time a time.Time holds: the largest count of
// seconds since year 1 (62135596800 before the Unix epoch), and the last
// nanosecond of it. [Later] saturates there. It is never changed.
var Latest = time.Unix(math.MaxInt64-62135596800, 999_999_999)

// Later returns t+d (t for d <= 0), saturated near [Latest]: a sum past
// the end of time gives a time in its last second, never one before t nor
// after Latest. (time.Time.Add saturates whole seconds, but the
// nanoseconds it adds on top may then land before t: that result is
// replaced by Latest.)
func Later(t time.Time, d time.Duration) time.Time {
	if d <= 0 {
		return t
	}
	if u := t.Add(d); !u.Before(t) {
		return u
	}
	return Latest
}

// Offset returns t−now, clamped to ±2⁶¹ns, about 73 years (time.Time.Sub
// saturates first, at the bounds of a Duration). The clamp keeps the sign
// of each offset and the order of offsets taken from one now, so sums and
// differences of a few of them never overflow, whatever the times (even
// centuries apart).
func Offset(t, now time.Time) time.Duration {
	const limit = time.Duration(1) << 61
	return min(max(t.Sub(now), -limit), limit)
}
