package remote

import (
	"time"

	"github.com/flightcache/flightcache/internal/timing"
)

// The sums and multiples a tier makes of the Loader's lifetimes (a lease
// held for LoadTimeout plus MaxWait, a lock's lifetime, a deadline)
// saturate at the largest (or smallest) Duration instead of overflowing:
// a window, timeout or interval of math.MaxInt64 is a natural "never",
// and must not wrap into a short or negative one. They are the Loader's
// own arithmetic.

// Add returns a + b, saturated at the bounds of a Duration.
func Add(a, b time.Duration) time.Duration { return timing.Add(a, b) }

// Mul returns d·n, saturated at the bounds of a Duration.
func Mul(d time.Duration, n int64) time.Duration { return timing.Mul(d, n) }

// Scale returns d·f rounded toward zero, saturated at the bounds of a
// Duration; a NaN product gives 0.
func Scale(d time.Duration, f float64) time.Duration { return timing.Scale(d, f) }
