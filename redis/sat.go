package flightredis

import (
	"math"
	"time"
)

// Saturating arithmetic. The Loader's options take a TTL or a LoadTimeout
// of math.MaxInt64 to mean "never"; sums and products of such durations
// (an entry's lifetime, a default LeaseTTL, a deadline) must stay at the
// largest value instead of wrapping around to a short or negative one,
// which Redis would take as "expire now" or refuse. Every duration and
// microsecond time the tier adds or multiplies goes through these.

// maxDuration is the largest time.Duration, about 292 years: "never".
const maxDuration = time.Duration(math.MaxInt64)

// addSat returns a+b, saturated at the bounds of int64 instead of
// overflowing.
func addSat[T ~int64](a, b T) T {
	s := a + b
	switch {
	case b > 0 && s < a:
		return math.MaxInt64
	case b < 0 && s > a:
		return math.MinInt64
	}
	return s
}

// subSat returns a-b, saturated at the bounds of int64 instead of
// overflowing.
func subSat[T ~int64](a, b T) T {
	s := a - b
	switch {
	case b < 0 && s < a:
		return math.MaxInt64
	case b > 0 && s > a:
		return math.MinInt64
	}
	return s
}

// mulSat returns a*b, saturated at the bounds of int64 instead of
// overflowing.
func mulSat[T ~int64](a, b T) T {
	if a == 0 || b == 0 {
		return 0
	}
	p := a * b
	if p/b == a && !(a == -1 && b == math.MinInt64) && !(b == -1 && a == math.MinInt64) {
		return p
	}
	if (a > 0) == (b > 0) {
		return math.MaxInt64
	}
	return math.MinInt64
}

// px is d as the argument of a Redis PX or PEXPIRE: whole milliseconds,
// at least 1 (Redis refuses 0 and takes a negative PEXPIRE as "delete
// now"). Redis accepts up to about math.MaxInt64 milliseconds from now;
// the largest duration, about 292 years, is far below that, so no
// lifetime the tier can compute is refused.
func px(d time.Duration) int64 {
	return max(d.Milliseconds(), 1)
}

// fromMS and fromUS turn a count of milliseconds (a PTTL) or of
// microseconds (an entry's times) into a duration, saturated.
func fromMS(ms int64) time.Duration { return mulSat(time.Duration(ms), time.Millisecond) }

func fromUS(us int64) time.Duration { return mulSat(time.Duration(us), time.Microsecond) }

// unixNanoAfter returns the Unix nanoseconds of now+d, saturated: a
// deadline past 2262 (which time.Time.UnixNano cannot give) is "never".
func unixNanoAfter(now time.Time, d time.Duration) int64 {
	return addSat(now.UnixNano(), int64(d))
}
