package flightcache

// checkKey asks Options.ValidateKey about key, on the caller's goroutine,
// before anything is counted, locked or looked up: nil when there is no
// ValidateKey or it accepts key; else the error key's caller gets
// (rejected), counted in Stats.InvalidKeys. ValidateKey is user code: a
// panic rejects the key, with its *PanicError (counted in Stats.Panics);
// a runtime.Goexit ends the caller's goroutine, which holds nothing of
// the Loader's yet.
func (l *Loader[K, V]) checkKey(key K) error {
	if l.opts.ValidateKey == nil {
		return nil
	}
	var err error
	if perr := l.user.guard(func() { err = l.opts.ValidateKey(key) }, nil); perr != nil {
		err = perr
	}
	if err == nil {
		return nil
	}
	l.stats.invalidKeys.Add(1)
	return l.user.rejected(err)
}

// rejected is the error of a key ValidateKey rejected with err (not nil):
// it matches ErrInvalidKey and err, and its text, read here once through
// the guard, names the option. If err's Error panics, the error wraps that
// panic's *PanicError instead, as if ValidateKey had panicked; if that
// one's text panics too (its Value formats through user code), the text
// says so.
func (u userCode) rejected(err error) error {
	text := "its error's text panicked"
	if !u.inspect(&err, func() { text = err.Error() }, nil) {
		e := err // the *PanicError
		u.guard(func() { text = e.Error() }, nil)
	}
	return &invalidKeyError{err: err, text: ErrInvalidKey.Error() + " (Options.ValidateKey): " + text}
}
