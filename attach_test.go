package flightcache

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// attachingRemote is a fakeRemote that takes the Loader's rules
// (RemoteAttacher) and watches (RemoteWatcher), recording the order of
// the calls; attach, if set, is Attach's answer.
type attachingRemote struct {
	fakeRemote
	attach func(Rules[string, string]) error
	amu    sync.Mutex
	calls  []string
	rules  []Rules[string, string]
}

func (r *attachingRemote) Watch(LocalCache[string]) {
	r.amu.Lock()
	defer r.amu.Unlock()
	r.calls = append(r.calls, "watch")
}

func (r *attachingRemote) Attach(rules Rules[string, string]) error {
	r.amu.Lock()
	r.calls = append(r.calls, "attach")
	r.rules = append(r.rules, rules)
	r.amu.Unlock()
	if r.attach != nil {
		return r.attach(rules)
	}
	return nil
}

// New hands a RemoteAttacher the rules of the Options it validated, once,
// after Watch: the windows with their defaults, each value's windows
// (Freshness), the not-found rule, NotFoundTTL and the Version.
func TestNewAttachesTheRemote(t *testing.T) {
	errMine := errors.New("mine")
	r := &attachingRemote{fakeRemote: fakeRemote{shared: map[string]RemoteValue[string]{}}}
	opts := Options[string, string]{TTL: time.Minute, Jitter: 0.5, StaleWhileRevalidate: time.Second, StaleIfError: time.Hour,
		NotFoundTTL: 3 * time.Second, IsNotFound: func(err error) bool { return errors.Is(err, errMine) },
		Freshness: func(k, _ string) Freshness {
			if k == "short" {
				return Freshness{TTL: time.Second}
			}
			return Freshness{}
		},
		Version: func(v string) uint64 { return uint64(len(v)) }}
	want := opts.windows()
	opts.Remote = r
	newLoader(t, &downstream{}, opts)
	if len(r.calls) != 2 || r.calls[0] != "watch" || r.calls[1] != "attach" {
		t.Fatalf("calls to the Remote: %v; want [watch attach]", r.calls)
	}
	got := r.rules[0]
	switch {
	case got.Windows != want:
		t.Errorf("Attach: Windows %+v; want %+v (the windows without Freshness)", got.Windows, want)
	case got.NotFoundTTL != 3*time.Second:
		t.Errorf("Attach: NotFoundTTL %v; want 3s", got.NotFoundTTL)
	case got.NotFound == nil || !got.NotFound(errMine) || !got.NotFound(ErrNotFound) || got.NotFound(errBoom):
		t.Error("Attach: NotFound does not follow the Loader's IsNotFound")
	case got.WindowsOf == nil:
		t.Error("Attach: WindowsOf is nil; want the Loader's Freshness applied")
	case got.Version == nil || got.Version("abc") != 3:
		t.Error("Attach: Version does not follow the Loader's Version")
	}
	if w, ok := got.WindowsOf("short", "v"); !ok || w.Fresh != 500*time.Millisecond || w.StaleIfError != time.Hour {
		t.Errorf("Attach: WindowsOf(short) = %+v, %v; want 500ms fresh (Jitter 0.5), the Options' StaleIfError", w, ok)
	}
}

// An Attach that fails, or panics, fails New: New returns its error, or a
// *PanicError, and the Loader it was making is closed (goleak sees no
// goroutine left). A Remote that refuses a second Loader so fails the
// second New.
func TestNewFailsWhenAttachFails(t *testing.T) {
	errTaken := errors.New("remote: attached already")
	r := &attachingRemote{fakeRemote: fakeRemote{shared: map[string]RemoteValue[string]{}}}
	r.attach = func(Rules[string, string]) error {
		if len(r.rules) > 1 {
			return errTaken
		}
		return nil
	}
	d := &downstream{}
	opts := Options[string, string]{TTL: time.Minute, Remote: r}
	newLoader(t, d, opts)
	if l, err := New(d.load, opts); !errors.Is(err, errTaken) || l != nil {
		t.Errorf("a second New on the same Remote = %v, %v; want nil, the Remote's error", l, err)
	}

	p := &attachingRemote{fakeRemote: fakeRemote{shared: map[string]RemoteValue[string]{}}}
	p.attach = func(Rules[string, string]) error { panic("attach exploded") }
	var pe *PanicError
	if l, err := New(d.load, Options[string, string]{TTL: time.Minute, Remote: p}); !errors.As(err, &pe) || pe.Value != "attach exploded" || l != nil {
		t.Errorf("New with an Attach that panics = %v, %v; want nil, a *PanicError", l, err)
	}
}

// The rules a Loader gives a Remote are those of its Options, validated
// by New (bad ones never reach Attach).
func TestRules(t *testing.T) {
	bad := &attachingRemote{fakeRemote: fakeRemote{shared: map[string]RemoteValue[string]{}}}
	if _, err := New((&downstream{}).load, Options[string, string]{TTL: time.Second, StaleIfError: -1, Remote: bad}); err == nil ||
		!strings.Contains(err.Error(), "Options.StaleIfError ") || len(bad.rules) != 0 {
		t.Errorf("New with StaleIfError -1 = %v (rules attached: %d); want an error naming Options.StaleIfError, nothing attached", err, len(bad.rules))
	}
	errMine := errors.New("mine")
	o := Options[string, int]{TTL: 10 * time.Second, Jitter: 0.5, StaleIfError: time.Minute, NotFoundTTL: time.Second,
		IsNotFound: func(err error) bool { return errors.Is(err, errMine) }}
	r := o.withDefaults().rules()
	w := o.windows()
	switch {
	case r.Windows != w:
		t.Errorf("rules().Windows = %+v; want windows()' %+v", r.Windows, w)
	case r.WindowsOf != nil:
		t.Error("rules().WindowsOf is set without Options.Freshness; want nil")
	case r.NotFoundTTL != time.Second:
		t.Errorf("rules().NotFoundTTL = %v; want 1s", r.NotFoundTTL)
	case !r.NotFound(errMine), !r.NotFound(ErrNotFound), r.NotFound(errBoom):
		t.Error("rules().NotFound does not follow Options.NotFound")
	}
	o.Freshness = func(_ string, v int) Freshness { return Freshness{TTL: time.Duration(v) * time.Second} }
	r = o.withDefaults().rules()
	if r.WindowsOf == nil {
		t.Fatal("rules().WindowsOf is nil with Options.Freshness")
	}
	if got, ok := r.WindowsOf("k", 4); !ok || got.Fresh != 2*time.Second || got.StaleIfError != time.Minute {
		t.Errorf("rules().WindowsOf(4) = %+v, %v; want windowsOf's", got, ok)
	}
	if r.Windows.Fresh != 5*time.Second {
		t.Errorf("rules().Windows.Fresh = %v with Freshness; want the Options' 5s", r.Windows.Fresh)
	}
}
