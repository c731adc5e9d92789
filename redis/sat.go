package flightredis

import (
	"math"
	"time"

	"github.com/flightcache/flightcache/remote"
)

// Saturated conversions between the tier's durations and what Redis
// stores. The windows of shared values are not added up here: their
// bounds are the Loader's rule, remote.Windows.Bounds, and an entry's
// age is placed with remote.Bounds.PhaseAt. A Timeout, RetryAfter or
// PollInterval of math.MaxInt64 still means "never": the sums and
// multiples the tier makes of them (a default LeaseTTL, a lock's
// lifetime, a deadline) must stay at the largest value instead of
// wrapping around to a short or negative one, which Redis would take as
// "expire now" or refuse. Every such sum and multiple goes through
// remote.Add and remote.Mul, the Loader's own saturating arithmetic.

// maxDuration is the largest time.Duration, about 292 years: "never".
const maxDuration = time.Duration(math.MaxInt64)

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
func fromMS(ms int64) time.Duration { return remote.Mul(time.Millisecond, ms) }

func fromUS(us int64) time.Duration { return remote.Mul(time.Microsecond, us) }

// unixNanoAfter returns the Unix nanoseconds of now+d, saturated: a
// deadline past 2262 (which time.Time.UnixNano cannot give) is "never".
func unixNanoAfter(now time.Time, d time.Duration) int64 {
	return int64(remote.Add(time.Duration(now.UnixNano()), d))
}
