package timing

import (
	"math"
	"math/big"
	"testing"
	"time"
)

// clampBig is x clamped to the Durations.
func clampBig(x *big.Int) time.Duration {
	switch {
	case x.Cmp(big.NewInt(math.MaxInt64)) > 0:
		return math.MaxInt64
	case x.Cmp(big.NewInt(math.MinInt64)) < 0:
		return math.MinInt64
	}
	return time.Duration(x.Int64())
}

func TestSaturatingArithmetic(t *testing.T) {
	const hi, lo = time.Duration(math.MaxInt64), time.Duration(math.MinInt64)
	for _, tt := range []struct{ a, b, want time.Duration }{
		{1, 2, 3}, {hi, 1, hi}, {hi, hi, hi}, {hi - 1, 1, hi}, {lo, -1, lo}, {lo, lo, lo},
		{lo, hi, -1}, {5, -3, 2}, {-5, 3, -2}, {0, 0, 0},
	} {
		if got := Add(tt.a, tt.b); got != tt.want {
			t.Errorf("Add(%d, %d) = %d; want %d", tt.a, tt.b, got, tt.want)
		}
	}
	for _, tt := range []struct {
		d    time.Duration
		n    int64
		want time.Duration
	}{
		{3, 2, 6}, {hi/2 + 1, 2, hi}, {hi / 2, 2, hi - 1}, {lo, 2, lo}, {lo, -1, hi}, {-1, math.MinInt64, hi},
		{lo / 2, 2, lo}, {hi, -1, -hi}, {hi, 0, 0}, {0, math.MinInt64, 0}, {-3, 4, -12},
	} {
		if got := Mul(tt.d, tt.n); got != tt.want {
			t.Errorf("Mul(%d, %d) = %d; want %d", tt.d, tt.n, got, tt.want)
		}
	}
	for _, tt := range []struct {
		d    time.Duration
		f    float64
		want time.Duration
	}{
		{10, 0.5, 5}, {hi, 1, hi}, {hi, 2, hi}, {hi, -2, lo}, {lo, 1, lo}, {lo, -1, hi}, {hi, math.Inf(1), hi},
		{-1, math.Inf(1), lo}, {hi, math.NaN(), 0}, {0, math.Inf(1), 0}, {1, 1e-300, 0}, {-7, 0.5, -3},
	} {
		if got := Scale(tt.d, tt.f); got != tt.want {
			t.Errorf("Scale(%d, %v) = %d; want %d", tt.d, tt.f, got, tt.want)
		}
	}
}

// FuzzSaturatingArithmetic: Add and Mul are the exact sum and
// product, clamped to the Durations; Scale is the product by a float to
// float64 precision, clamped likewise, and 0 for a NaN product.
func FuzzSaturatingArithmetic(f *testing.F) {
	f.Add(int64(math.MaxInt64), int64(1), 2.0)
	f.Add(int64(math.MinInt64), int64(-1), -1.0)
	f.Add(int64(math.MaxInt64/2+1), int64(2), 0.5)
	f.Add(int64(-1), int64(math.MinInt64), math.Inf(1))
	f.Add(int64(0), int64(0), math.NaN())
	f.Add(int64(1), int64(math.MaxInt64), 1e-300)
	f.Fuzz(func(t *testing.T, a, b int64, x float64) {
		da, db := time.Duration(a), time.Duration(b)
		if got, want := Add(da, db), clampBig(new(big.Int).Add(big.NewInt(a), big.NewInt(b))); got != want {
			t.Fatalf("Add(%d, %d) = %d; want %d", a, b, got, want)
		}
		if got, want := Mul(da, b), clampBig(new(big.Int).Mul(big.NewInt(a), big.NewInt(b))); got != want {
			t.Fatalf("Mul(%d, %d) = %d; want %d", a, b, got, want)
		}
		got := Scale(da, x)
		p := float64(a) * x
		if math.IsNaN(p) {
			if got != 0 {
				t.Fatalf("Scale(%d, %v) = %d; want 0 for a NaN product", a, x, got)
			}
			return
		}
		var want time.Duration
		switch {
		case math.IsInf(p, 1) && math.IsInf(x, 0):
			want = math.MaxInt64
		case math.IsInf(p, -1) && math.IsInf(x, 0):
			want = math.MinInt64
		default:
			exact, _ := new(big.Float).SetPrec(200).Mul(new(big.Float).SetInt64(a), big.NewFloat(x)).Int(nil)
			want = clampBig(exact)
		}
		slack := math.Abs(p)/(1<<51) + 1
		if diff := math.Abs(float64(got) - float64(want)); diff > slack {
			t.Fatalf("Scale(%d, %v) = %d; want %d (±%v)", a, x, got, want, slack)
		}
		if (got < 0 && p > 0) || (got > 0 && p < 0) {
			t.Fatalf("Scale(%d, %v) = %d: the sign of %v flipped", a, x, got, p)
		}
	})
}

// Add and Mul are symmetric in their operands, and saturate at either
// bound of a Duration.
func TestAddMulSymmetric(t *testing.T) {
	const maxI, minI = math.MaxInt64, math.MinInt64
	for _, tc := range []struct{ a, b, add, mul int64 }{
		{0, 0, 0, 0},
		{1, 2, 3, 2},
		{maxI, 0, maxI, 0},
		{maxI, 1, maxI, maxI},
		{maxI, maxI, maxI, maxI},
		{maxI, -1, maxI - 1, -maxI},
		{minI, -1, minI, maxI},
		{-1, minI, minI, maxI},
		{minI, 1, minI + 1, minI},
		{minI, minI, minI, maxI},
		{minI, maxI, -1, minI},
		{maxI / 2, 3, maxI/2 + 3, maxI},
		{maxI/2 + 1, 2, maxI/2 + 3, maxI},
		{maxI / 2, 2, maxI/2 + 2, maxI - 1},
		{-(maxI / 2), 3, -(maxI / 2) + 3, minI},
		{1 << 32, 1 << 31, 1<<32 + 1<<31, maxI}, // 2⁶³: one past the largest
		{1 << 32, 1<<31 - 1, 1<<32 + 1<<31 - 1, 1<<63 - 1<<32},
	} {
		a, b := time.Duration(tc.a), time.Duration(tc.b)
		if got := Add(a, b); got != time.Duration(tc.add) {
			t.Errorf("Add(%d, %d) = %d; want %d", tc.a, tc.b, got, tc.add)
		}
		if got := Add(b, a); got != time.Duration(tc.add) {
			t.Errorf("Add(%d, %d) = %d; want %d", tc.b, tc.a, got, tc.add)
		}
		if got := Mul(a, tc.b); got != time.Duration(tc.mul) {
			t.Errorf("Mul(%d, %d) = %d; want %d", tc.a, tc.b, got, tc.mul)
		}
		if got := Mul(b, tc.a); got != time.Duration(tc.mul) {
			t.Errorf("Mul(%d, %d) = %d; want %d", tc.b, tc.a, got, tc.mul)
		}
	}
	const forever = time.Duration(maxI)
	if got := Add(forever, time.Minute); got != forever {
		t.Errorf("Add(forever, 1m) = %v; want forever", got)
	}
	if got := Mul(forever/3, 4); got != forever {
		t.Errorf("Mul(forever/3, 4) = %v; want forever", got)
	}
}

// Later is t.Add(d) short of the end of time; past it, it stays within the
// last second a time.Time holds, never before t and never after Latest,
// instead of wrapping. A non-positive d leaves t as it is.
func TestLater(t *testing.T) {
	now := time.Now()
	forever := time.Duration(math.MaxInt64)
	for _, tc := range []struct {
		t    time.Time
		d    time.Duration
		want time.Time
	}{
		{now, 0, now},
		{now, -time.Hour, now},
		{now, time.Second, now.Add(time.Second)},
		{now, forever, now.Add(forever)},
		{Latest, 1, Latest},
		{Latest, forever, Latest},
		{Latest.Add(-time.Second), time.Second - 1, Latest.Add(-1)},
	} {
		if got := Later(tc.t, tc.d); !got.Equal(tc.want) {
			t.Errorf("Later(%v, %v) = %v; want %v", tc.t, tc.d, got, tc.want)
		}
	}
	for _, tc := range []struct {
		t time.Time
		d time.Duration
	}{
		{Latest.Add(-time.Hour), forever},
		{Latest.Add(-time.Second), time.Second + 1},
		{Latest.Add(-time.Second + 1), time.Second},
		{Latest.Add(-1), 2},
	} {
		if got := Later(tc.t, tc.d); got.Before(tc.t) || got.After(Latest) || Latest.Sub(got) >= time.Second {
			t.Errorf("Later(%v, %v) = %v; want in the last second before Latest, not before t", tc.t, tc.d, got)
		}
	}
	if Latest.Add(1).After(Latest) || Latest.Add(time.Second).After(Latest) {
		t.Errorf("a time.Time holds a time after Latest (%v)", Latest)
	}
}

// Offset is t−now within ±2⁶¹ns, and clamped beyond, keeping its sign.
func TestOffset(t *testing.T) {
	const limit = time.Duration(1) << 61
	now := time.Now()
	for _, tc := range []struct {
		t    time.Time
		want time.Duration
	}{
		{now, 0},
		{now.Add(time.Hour), time.Hour},
		{now.Add(-time.Hour), -time.Hour},
		{now.Add(limit), limit},
		{now.Add(limit + 1), limit},
		{now.Add(-limit - 1), -limit},
		{Latest, limit},
		{time.Time{}, -limit},
		{time.UnixMicro(math.MinInt64), -limit},
	} {
		if got := Offset(tc.t, now); got != tc.want {
			t.Errorf("Offset(%v, now) = %v; want %v", tc.t, got, tc.want)
		}
	}
}
